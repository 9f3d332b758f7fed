package cache

import (
	"strings"
	"testing"
)

func TestLimitsValidate(t *testing.T) {
	if err := DefaultLimits().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Limits)
		want []string // substrings of the error; nil: valid
	}{
		{"bounds are inclusive", func(l *Limits) {
			l.MaxKeyBytes, l.MaxValueBytes, l.MaxBatch, l.MaxNamespaceBytes = MaxKeyBytesBound, MaxValueBytesBound, MaxBatchBound, 1
		}, nil},
		{"zero is not a limit", func(l *Limits) { *l = Limits{} },
			[]string{"max key bytes 0", "max value bytes 0", "max namespace bytes 0", "max batch 0"}},
		{"over the bounds", func(l *Limits) {
			l.MaxKeyBytes, l.MaxValueBytes, l.MaxBatch = MaxKeyBytesBound+1, MaxValueBytesBound+1, MaxBatchBound+1
		}, []string{"max key bytes 4097", "max value bytes 2147483649", "max batch 1048577"}},
		{"negative", func(l *Limits) { l.MaxNamespaceBytes = -1 }, []string{"max namespace bytes -1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := DefaultLimits()
			tc.edit(&l)
			err := l.Validate()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate accepted invalid limits")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate error lacks %q: %v", w, err)
				}
			}
		})
	}
}
