package tiered

import (
	"reflect"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache/dram"
)

// TestZeroConfigIsDefault: a zero Config is DefaultConfig once the
// defaults are applied (the DRAM tier applies its own: see dram's test).
func TestZeroConfigIsDefault(t *testing.T) {
	got := Config{}.withDefaults()
	want := DefaultConfig()
	got.DRAM, want.DRAM = dram.Config{}, dram.Config{}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("zero config with defaults\n got %+v\nwant %+v", got, want)
	}
}

// TestExplicitOff: a negative HighWatermark turns the watermark loop off,
// a zero one takes the default (on); a negative StopSpillTimeout is off
// and valid.
func TestExplicitOff(t *testing.T) {
	for _, tc := range []struct {
		name       string
		high, low  float64
		watermarks bool
	}{
		{"default", 0, 0, true},
		{"off", -1, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, 8*mib, t.TempDir())
			cfg.HighWatermark, cfg.LowWatermark = tc.high, tc.low
			cfg.StopSpillTimeout = -time.Second
			s := newStore(t, cfg)
			if got := s.Movement().Watermarks; got != tc.watermarks {
				t.Fatalf("Movement().Watermarks = %v, want %v", got, tc.watermarks)
			}
		})
	}
}
