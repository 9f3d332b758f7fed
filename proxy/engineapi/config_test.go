package engineapi

import (
	"strings"
	"testing"
)

// TestZeroConfigIsDefault: a zero Config is DefaultConfig once the
// defaults are applied; negative values are errors, not defaults.
func TestZeroConfigIsDefault(t *testing.T) {
	if got, want := (Config{}).withDefaults(), DefaultConfig(); got.MaxRequestBytes != want.MaxRequestBytes ||
		got.DrainTimeout != want.DrainTimeout || got.MaxConnections != want.MaxConnections ||
		got.IdleTimeout != want.IdleTimeout || got.Build != want.Build || got.Observer != nil {
		t.Fatalf("Config{} with defaults\n got %+v\nwant %+v", got, want)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("Config{}.Validate: %v", err)
	}
	err := Config{MaxRequestBytes: -1, DrainTimeout: -1}.Validate()
	for _, w := range []string{"max request bytes", "DrainTimeout"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Validate() = %v, missing %s", err, w)
		}
	}
}
