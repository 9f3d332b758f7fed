package tcp

import (
	"reflect"
	"testing"
)

// TestZeroConfigIsDefault: a zero Config is DefaultConfig once the
// defaults are applied.
func TestZeroConfigIsDefault(t *testing.T) {
	if got, want := (Config{}).withDefaults(), DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Config{} with defaults\n got %+v\nwant %+v", got, want)
	}
}
