package proxy

import (
	"strings"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
)

// TestDefaultLimits checks that the proxy's limits are cache.Limits, with
// cache's defaults (one place per default).
func TestDefaultLimits(t *testing.T) {
	if got, want := DefaultConfig().Limits, cache.DefaultLimits(); got != want {
		t.Fatalf("DefaultConfig().Limits = %+v, want %+v", got, want)
	}
	c := DefaultConfig()
	c.MaxBatch = cache.MaxBatchBound + 1
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "max batch") {
		t.Fatalf("MaxBatch over the decoders' bound: Validate = %v", err)
	}
}

// TestHotMaxBytesDefault checks the one place HotMaxBytes gets its
// default: a sixteenth of DRAMBytes, 1 GiB when DRAMBytes is unknown, and
// an explicit value as given.
func TestHotMaxBytesDefault(t *testing.T) {
	fromDefault := DefaultRouteConfig()
	fromDefault.DRAMBytes = 64 << 20
	for _, tc := range []struct {
		name string
		cfg  RouteConfig
		want int64
	}{
		{"derived from DRAM", RouteConfig{DRAMBytes: 160 << 20}, 10 << 20},
		{"tiny DRAM", RouteConfig{DRAMBytes: 8}, 1},
		{"DRAM unknown", RouteConfig{}, 1 << 30},
		{"explicit", RouteConfig{DRAMBytes: 160 << 20, HotMaxBytes: 3 << 20}, 3 << 20},
		{"from DefaultRouteConfig", fromDefault, 4 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.cfg.withDefaults().HotMaxBytes; got != tc.want {
				t.Fatalf("HotMaxBytes = %d, want %d", got, tc.want)
			}
		})
	}
	if err := (RouteConfig{DRAMBytes: -1}).Validate(); err == nil || !strings.Contains(err.Error(), "DRAMBytes") {
		t.Fatalf("negative DRAMBytes: Validate = %v", err)
	}
}
