package main

import (
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache/ssd"
	"github.com/tidepool-kv/tidepool/cache/tiered"
	"github.com/tidepool-kv/tidepool/cluster"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/rdma/auto"
	"github.com/tidepool-kv/tidepool/rdma/verbs"
)

// TestServeDefaultsAreTheComponents: a setting that configures one
// component takes that component's default, written once there.
func TestServeDefaultsAreTheComponents(t *testing.T) {
	d := DefaultConfig()
	sc, tc, rc := ssd.DefaultConfig(), tiered.DefaultConfig(), proxy.DefaultRouteConfig()
	for _, c := range []struct {
		key       string
		got, want any
	}{
		{"ssd_capacity", d.SSDCapacity, sc.Capacity},
		{"ssd_min_free", d.SSDMinFree, sc.MinFreeBytes},
		{"ssd_background_priority", d.SSDPriority, sc.BackgroundPriority},
		{"ssd_value_log_min", d.SSDValueLogMin, sc.ValueLogMin},
		{"demotion_queue", d.DemotionQueue, tc.QueueBytes},
		{"demotion_wait", d.DemotionWait, tc.DemotionWait},
		{"replicas", d.Replicas, cluster.DefaultRingConfig().Replicas},
		{"transport", d.Transport, auto.ModeAuto},
		{"rdma_gid_index", d.RDMAGIDIndex, verbs.DefaultConfig().GIDIndex},
		{"rebalance_rate", d.RebalanceRate, rc.RebalanceRate},
		{"rebalance_max_bytes", d.RebalanceMaxBytes, rc.RebalanceMaxBytes},
		{"hot_threshold", d.HotThreshold, rc.HotThreshold},
	} {
		if c.got != c.want {
			t.Errorf("%s default %v, component's %v", c.key, c.got, c.want)
		}
	}
}

// TestUserZeroIsOff: the settings whose documented 0 means "off" (or "no
// bound") reach the components as their explicit off (negative), never as
// a zero that a component would read as "the default"; other values pass
// unchanged, and the component configs validate either way.
func TestUserZeroIsOff(t *testing.T) {
	off := DefaultConfig()
	off.RebalanceRate, off.RebalanceMaxBytes, off.HotThreshold = 0, 0, 0
	off.SSDMinFree, off.StopSpillTimeout, off.ScrubRate = 0, 0, 0
	off.SSDValueLogMin = 0
	rc, tc := off.routeConfig(), off.storeConfig(64<<20)
	if rc.RebalanceRate >= 0 || rc.RebalanceMaxBytes >= 0 || rc.HotThreshold >= 0 {
		t.Fatalf("route config %+v: want rebalance and hot replication off (negative)", rc)
	}
	if tc.SSD.MinFreeBytes >= 0 || tc.StopSpillTimeout >= 0 || tc.SSD.ValueLogMin >= 0 {
		t.Fatalf("ssd MinFreeBytes %d, ValueLogMin %d, StopSpillTimeout %v: want off (negative)", tc.SSD.MinFreeBytes, tc.SSD.ValueLogMin, tc.StopSpillTimeout)
	}
	if _, on := off.scrubConfig(); on {
		t.Fatal("scrub_rate 0: scrubber on")
	}
	on := DefaultConfig()
	on.RebalanceRate, on.RebalanceMaxBytes, on.HotThreshold = 5<<20, 7<<20, 2
	on.SSDMinFree, on.StopSpillTimeout = 3<<20, 4*time.Second
	on.SSDValueLogMin = 1 << 20
	rc2, tc2 := on.routeConfig(), on.storeConfig(64<<20)
	if rc2.RebalanceRate != 5<<20 || rc2.RebalanceMaxBytes != 7<<20 || rc2.HotThreshold != 2 {
		t.Fatalf("route config %+v: values not passed through", rc2)
	}
	if tc2.SSD.MinFreeBytes != 3<<20 || tc2.StopSpillTimeout != 4*time.Second || tc2.SSD.ValueLogMin != 1<<20 {
		t.Fatalf("ssd MinFreeBytes %d, StopSpillTimeout %v: values not passed through", tc2.SSD.MinFreeBytes, tc2.StopSpillTimeout)
	}
	if sc, ok := on.scrubConfig(); !ok || sc.Rate != on.ScrubRate {
		t.Fatalf("scrub config %+v, on %v", sc, ok)
	}
	for _, c := range []Config{off, on} {
		c.ArenaDir, c.DataDir = t.TempDir(), t.TempDir()
		if err := c.routeConfig().Validate(); err != nil {
			t.Errorf("route config: %v", err)
		}
		if err := c.storeConfig(64 << 20).Validate(); err != nil {
			t.Errorf("store config: %v", err)
		}
	}
	if tc := on.storeConfig(0); tc.SSD != nil {
		t.Fatal("ssd capacity 0: SSD tier configured")
	}
	noHot := DefaultConfig()
	noHot.HotMaxBytes = 0
	if rc := noHot.routeConfig(); rc.HotThreshold >= 0 {
		t.Fatalf("hot_max_bytes 0: hot threshold %d, want hot replication off", rc.HotThreshold)
	}
}

// TestHotMaxBytesFollowsDRAM: hot_max_bytes left out is a sixteenth of
// the dram_capacity the sources settled on; written, it is taken as it is,
// 0 included.
func TestHotMaxBytesFollowsDRAM(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int64
	}{
		{[]string{"--dram-capacity", "256MiB"}, 16 << 20},
		{[]string{"--dram-capacity", "1GiB"}, 64 << 20},
		{[]string{"--dram-capacity", "1GiB", "--hot-max-bytes", "3MiB"}, 3 << 20},
		{[]string{"--dram-capacity", "1GiB", "--hot-max-bytes", "0"}, 0},
	} {
		cfg, err := parse(t, c.args, nil)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if cfg.HotMaxBytes != c.want {
			t.Errorf("%v: hot_max_bytes %d, want %d", c.args, cfg.HotMaxBytes, c.want)
		}
	}
	if _, err := parse(t, []string{"--hot-max-bytes", "-1"}, nil); err == nil {
		t.Error("hot_max_bytes -1 accepted")
	}
}
