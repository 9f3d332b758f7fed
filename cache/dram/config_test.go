package dram

import (
	"reflect"
	"testing"
)

// TestZeroConfigIsDefault: a zero Config (but for the required Dir) is
// DefaultConfig once the defaults are applied.
func TestZeroConfigIsDefault(t *testing.T) {
	got := Config{Dir: "/x"}.withDefaults()
	want := DefaultConfig()
	want.Dir = "/x"
	if got.Policy == nil {
		t.Fatal("Policy not defaulted")
	}
	got.Policy, want.Policy = nil, nil // funcs do not compare
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("zero config with defaults\n got %+v\nwant %+v", got, want)
	}
	if err := (Config{Dir: "/x"}).Validate(); err != nil {
		t.Fatalf("Validate(zero config): %v", err)
	}
}

// TestZeroScrubConfigIsDefault: the same for ScrubConfig.
func TestZeroScrubConfigIsDefault(t *testing.T) {
	if got, want := (ScrubConfig{}).withDefaults(), DefaultScrubConfig(); !reflect.DeepEqual(got, want) {
		t.Fatalf("ScrubConfig{} with defaults %+v, want %+v", got, want)
	}
}
