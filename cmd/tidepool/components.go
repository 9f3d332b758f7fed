package main

import (
	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/cache/ssd"
	"github.com/tidepool-kv/tidepool/cache/tiered"
	"github.com/tidepool-kv/tidepool/proxy"
)

// This file is where the settings of `tidepool serve` become component
// configs. The two speak different conventions, on purpose (docs/config.md,
// "What zero means", is the one place both are written, with their
// exceptions):
//
//   - a user setting keeps the meaning docs/config.md gives it: for
//     rebalance_rate, rebalance_max_bytes, hot_threshold, ssd_min_free,
//     ssd_value_log_min, stop_spill_timeout and scrub_rate, 0 means "off"
//     (or "no bound");
//   - a component Config reads a zero field as "the default" (applied once,
//     in its withDefaults) and spells "off" as a negative value.
//
// userOff is the one translation between them; the embedded defaults of
// the settings come from each component's DefaultConfig (config.go).

// userOff turns a user setting whose documented 0 means "off" (or "no
// bound") into the components' spelling of off: a negative value.
func userOff[T ~int | ~int64](v T) T {
	if v == 0 {
		return -1
	}
	return v
}

// limits are the request limits of cfg, built once: the proxy enforces them
// at the edge and the tiers get the same values. The namespace bound is
// not a setting and keeps its default.
func (c Config) limits() cache.Limits {
	l := cache.DefaultLimits()
	l.MaxKeyBytes, l.MaxValueBytes, l.MaxBatch = c.MaxKeySize, c.MaxValueSize, c.MaxBatch
	return l
}

// storeConfig is the block store's config: the DRAM tier, and the SSD tier
// under data_dir/ssd with ssdCapacity bytes (0: no SSD tier; ssd_capacity
// 0 means that, see ssdCapacity).
func (c Config) storeConfig(ssdCapacity int64) tiered.Config {
	tc := tiered.DefaultConfig()
	tc.DRAM = dram.DefaultConfig()
	tc.DRAM.Dir = c.ArenaDir
	tc.DRAM.Capacity = c.DRAMCapacity
	tc.DRAM.ArenaSize = min(c.ArenaSize, c.DRAMCapacity)
	lim := c.limits()
	tc.DRAM.MaxValueSize = lim.MaxValueBytes
	tc.DRAM.MaxKeySize = lim.MaxKeyBytes
	tc.DRAM.LeaseTimeout = c.LeaseTimeout
	tc.DRAM.Policy = policies[c.EvictionPolicy]
	tc.DRAM.VerifyReads = c.VerifyReads
	tc.DRAM.VerifyReadsNamespaces = c.VerifyReadsNamespaces
	tc.QueueBytes = c.DemotionQueue
	tc.DemotionWait = c.DemotionWait // 0 is the store's "off" too
	// The spill is one part of a stop bounded by shutdown_timeout.
	tc.StopSpillTimeout = userOff(min(c.StopSpillTimeout, c.ShutdownTimeout/2))
	if ssdCapacity > 0 {
		sc := ssd.DefaultConfig()
		sc.Dir = ssdDir(c.DataDir)
		sc.Capacity = ssdCapacity
		sc.MaxValueSize = lim.MaxValueBytes
		sc.MaxKeySize = lim.MaxKeyBytes
		sc.MaxNamespaceSize = lim.MaxNamespaceBytes
		sc.MinFreeBytes = userOff(c.SSDMinFree)
		sc.BackgroundPriority = c.SSDPriority
		sc.ValueLogMin = userOff(c.SSDValueLogMin)
		sc.Policy = policies[c.EvictionPolicy]
		tc.SSD = &sc
	}
	return tc
}

// routeConfig is the proxy's routing config in cluster mode.
func (c Config) routeConfig() proxy.RouteConfig {
	rc := proxy.DefaultRouteConfig()
	rc.RemoteTimeout, rc.PeerDownFor = c.RemoteTimeout, c.PeerDownFor
	rc.RebalanceRate, rc.RebalanceDelay, rc.RebalanceMaxBytes = userOff(c.RebalanceRate), c.RebalanceDelay, userOff(c.RebalanceMaxBytes)
	rc.HotThreshold, rc.HotWindow, rc.HotTTL = userOff(c.HotThreshold), c.HotWindow, c.HotTTL
	rc.HotMaxReplicas, rc.HotMaxBytes = c.HotMaxReplicas, c.HotMaxBytes
	if c.HotMaxBytes == 0 {
		// No bytes for hot replicas: none are made (the proxy's 0 would
		// be its default share).
		rc.HotThreshold = -1
	}
	rc.DRAMBytes = c.DRAMCapacity
	return rc
}

// scrubConfig is the DRAM scrubber's config; false: no scrubber
// (scrub_rate 0).
func (c Config) scrubConfig() (dram.ScrubConfig, bool) {
	return dram.ScrubConfig{Rate: c.ScrubRate}, c.ScrubRate > 0
}
