package ssd

import (
	"reflect"
	"testing"
)

// TestZeroConfigIsDefault: a zero Config (but for the required Dir) is
// DefaultConfig once the defaults are applied, so zero means "the default"
// for every field.
func TestZeroConfigIsDefault(t *testing.T) {
	got := Config{Dir: "/d"}.withDefaults()
	want := DefaultConfig()
	want.Dir = "/d"
	if got.Policy == nil || got.Clock == nil {
		t.Fatalf("Policy or Clock not defaulted: %+v", got)
	}
	got.Policy, want.Policy = nil, nil // funcs do not compare
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("zero config with defaults\n got %+v\nwant %+v", got, want)
	}
}

// TestExplicitOff: the features that can be turned off take a negative
// value, and the tier runs with them off.
func TestExplicitOff(t *testing.T) {
	cfg := Config{Dir: t.TempDir(), Capacity: 64 * mib, MinFreeBytes: -1, CompactAfter: -1}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	tr, err := New(cfg, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer tr.Close()
	if _, ok := tr.freeSpace(); ok {
		t.Fatal("MinFreeBytes -1: free-space check still on")
	}
	if tr.cfg.CompactAfter != -1 {
		t.Fatalf("CompactAfter %d, want -1 (off)", tr.cfg.CompactAfter)
	}
	// The default keeps the check on.
	on := Config{Dir: t.TempDir(), Capacity: 64 * mib}.withDefaults()
	if on.MinFreeBytes != DefaultConfig().MinFreeBytes {
		t.Fatalf("MinFreeBytes 0 took %d, want the default", on.MinFreeBytes)
	}
}
