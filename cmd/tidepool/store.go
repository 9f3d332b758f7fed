package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/cache/tiered"
	"github.com/tidepool-kv/tidepool/internal/units"
	"github.com/tidepool-kv/tidepool/proxy"
)

// ssdDir is where the SSD tier lives under data_dir.
func ssdDir(dataDir string) string { return filepath.Join(dataDir, "ssd") }

// openStore builds the block store: the DRAM tier, and the SSD tier under
// data_dir/ssd unless ssd_capacity is 0, composed by cache/tiered.
func openStore(cfg Config, lg *zap.Logger) (*tiered.Store, error) {
	return openObservedStore(cfg, nil, nil, lg)
}

// openObservedStore is openStore whose tiers report every block entering
// and leaving them to obs (nil: nobody), and whose copies into SSD keep
// the descriptions desc gives (nil: none).
func openObservedStore(cfg Config, obs cache.Observer, desc cache.Descriptions, lg *zap.Logger) (*tiered.Store, error) {
	if lg == nil {
		lg = zap.NewNop()
	}
	capacity, err := ssdCapacity(cfg, lg)
	if err != nil {
		return nil, err
	}
	tc := cfg.storeConfig(capacity)
	tc.Observer = obs
	tc.Descriptions = desc
	s, err := tiered.New(tc, lg)
	if err != nil {
		return nil, fmt.Errorf("block store: %w", err)
	}
	return s, nil
}

// ssdCapacity is ssd_capacity capped by what the disk can hold: the free
// space of data_dir's filesystem plus what the tier already uses there,
// less ssd_min_free. 0: no SSD tier.
func ssdCapacity(cfg Config, lg *zap.Logger) (int64, error) {
	if cfg.SSDCapacity == 0 {
		return 0, nil
	}
	dir := ssdDir(cfg.DataDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, fmt.Errorf("data_dir: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("data_dir: statfs: %w", err)
	}
	free := int64(st.Bavail) * st.Bsize
	var used int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				used += fi.Size()
			}
		}
		return nil
	})
	room := free + used - cfg.SSDMinFree
	if room >= cfg.SSDCapacity {
		return cfg.SSDCapacity, nil
	}
	if room < 64<<20 || room < cfg.MaxValueSize {
		// Not DRAM only: that acknowledged durable puts it could not keep.
		// The tier opens degraded (read-only when RocksDB has no room to
		// write) and refuses puts until space is freed. Its budget keeps
		// room for what it already holds, so that opening it evicts
		// nothing (docs/ssd.md).
		capacity := min(cfg.SSDCapacity, max(64<<20, cfg.MaxValueSize, used))
		lg.Warn("not enough disk for the ssd tier: it starts degraded",
			zap.String("dir", dir), zap.String("free", units.FormatBytes(free)),
			zap.String("ssd_min_free", units.FormatBytes(cfg.SSDMinFree)),
			zap.String("ssd_capacity", units.FormatBytes(capacity)))
		return capacity, nil
	}
	lg.Warn("ssd_capacity capped by the free disk space",
		zap.String("ssd_capacity", units.FormatBytes(cfg.SSDCapacity)), zap.String("capped_to", units.FormatBytes(room)))
	return room, nil
}

// reportRecovery logs and prints what the SSD tier found on disk.
func reportRecovery(s *tiered.Store, lg *zap.Logger, stdout io.Writer) {
	t := s.SSD()
	if t == nil {
		fmt.Fprintln(stdout, "ssd tier disabled (DRAM only)")
		return
	}
	blocks, bytes, took := t.Recovered()
	lg.Info("ssd tier recovered", zap.Int64("blocks", blocks), zap.Int64("bytes", bytes), zap.Duration("took", took))
	note := ""
	if n := storeNotes(s); len(n) > 0 {
		note = " (degraded: " + strings.Join(n, "; ") + ")"
	}
	fmt.Fprintf(stdout, "ssd tier: recovered %d blocks (%s) in %s%s\n", blocks, units.FormatBytes(bytes), took.Round(100_000), note)
}

// storeNotes lists what /readyz reports about the store while the sidecar
// serves (and so stays ready): an SSD tier that refuses blocks, has no
// database open, or started empty after quarantining a corrupt one.
func storeNotes(s *tiered.Store) []string {
	t := s.SSD()
	if t == nil {
		return nil
	}
	h := t.Health()
	var notes []string
	switch {
	case !h.Open:
		notes = append(notes, "ssd tier has no database open (disk full?): puts refused, ssd reads miss")
	case h.ReadOnly:
		notes = append(notes, "ssd tier open read-only (disk full at open): its blocks are served, puts and durable puts refused until space is back")
	case h.Degraded:
		why := "disk full or failing"
		if h.Reason != "" {
			why = h.Reason
		}
		notes = append(notes, "ssd tier refuses new blocks ("+why+"); durable puts refused, retried every ssd probe interval")
	}
	if h.Quarantines > 0 {
		notes = append(notes, "ssd database was corrupt, moved to "+h.QuarantinedTo+"; started with an empty ssd tier")
	}
	return notes
}

// movementCollector exports the tiered store's movement counters and the
// SSD tier's health at scrape time.
type movementCollector struct {
	s *tiered.Store

	promotions, demotions, dropped, demoteErrs, qBlocks, qBytes, pfQueued, pfDropped *prometheus.Desc
	waits, waitSeconds                                                               *prometheus.Desc
	degraded, degradedEvents, recoveries, diskBytes, writeErrs, readErrs, recBlocks  *prometheus.Desc
	recBytes                                                                         *prometheus.Desc
	ssdOpen, ssdReadOnly, quarantined                                                *prometheus.Desc
	vlogBytes, vlogLive, vlogSegments, relocations, spaceEvictions                   *prometheus.Desc
	durableEvictions                                                                 *prometheus.Desc
}

func newMovementCollector(s *tiered.Store) *movementCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &movementCollector{
		s:                s,
		promotions:       d("tidepool_promotions_total", "Blocks copied from SSD (or the demotion queue) into DRAM by a read or a prefetch."),
		demotions:        d("tidepool_demotions_total", "Blocks evicted from DRAM and written to SSD."),
		dropped:          d("tidepool_demotions_dropped_total", "Blocks evicted from DRAM and not written to SSD because the demotion queue was full."),
		waits:            d("tidepool_demotion_waits_total", "Evictions that found the demotion queue full and waited for room (demotion_wait)."),
		waitSeconds:      d("tidepool_demotion_wait_seconds_total", "Time evictions spent waiting for room in the demotion queue (demotion_wait)."),
		demoteErrs:       d("tidepool_demotion_errors_total", "Demotions the SSD tier refused (degraded, no space)."),
		qBlocks:          d("tidepool_demotion_queue_blocks", "Evicted DRAM blocks waiting to be written to SSD."),
		qBytes:           d("tidepool_demotion_queue_bytes", "Bytes of evicted DRAM blocks waiting to be written to SSD."),
		pfQueued:         d("tidepool_prefetch_queued_total", "Keys queued by Prefetch to be promoted into DRAM."),
		pfDropped:        d("tidepool_prefetch_dropped_total", "Keys Prefetch dropped because its queue was full."),
		degraded:         d("tidepool_ssd_degraded", "1 while the SSD tier refuses new blocks (disk full or failing), else 0."),
		degradedEvents:   d("tidepool_ssd_degraded_events_total", "Entries of the SSD tier into degraded mode."),
		recoveries:       d("tidepool_ssd_recoveries_total", "Exits of the SSD tier from degraded mode (a probe found the disk and RocksDB taking writes again)."),
		diskBytes:        d("tidepool_ssd_disk_bytes", "Size of the SSD tier's live SST and blob files and of its value log's segment files."),
		writeErrs:        d("tidepool_ssd_write_errors_total", "Failed writes and flushes of the SSD tier."),
		readErrs:         d("tidepool_ssd_read_errors_total", "SSD reads that failed in RocksDB: a damaged block (dropped; counted as a checksum failure too), or a file RocksDB could not open for lack of descriptors (a miss; the block is kept)."),
		recBlocks:        d("tidepool_ssd_recovered_blocks", "Blocks the SSD tier found on disk at start."),
		recBytes:         d("tidepool_ssd_recovered_bytes", "Value bytes the SSD tier found on disk at start."),
		ssdOpen:          d("tidepool_ssd_open", "1 while the SSD tier has its database open, 0 while it has none (disk full at start, failed reopen)."),
		ssdReadOnly:      d("tidepool_ssd_read_only", "1 while the SSD tier's database is open read-only (the disk was full when it opened): its blocks are served, puts refused."),
		quarantined:      d("tidepool_ssd_quarantined_total", "Corrupt SSD databases moved aside at start (the tier then started empty)."),
		vlogBytes:        d("tidepool_ssd_value_log_bytes", "Size of the SSD tier's value log segment files (blocks of ssd_value_log_min and up)."),
		vlogLive:         d("tidepool_ssd_value_log_live_bytes", "Bytes of the value log's segment files that live blocks take (each rounded up to 4 KiB)."),
		vlogSegments:     d("tidepool_ssd_value_log_segments", "Segment files of the SSD tier's value log."),
		relocations:      d("tidepool_ssd_relocations_total", "Blocks moved out of value log segments at most half live so that their files could be deleted."),
		durableEvictions: d("tidepool_ssd_durable_evictions_total", "Blocks written by a durable put that the SSD tier evicted to make room (a durable block survives a crash or restart, not eviction: docs/ssd.md)."),
		spaceEvictions:   d("tidepool_ssd_space_evictions_total", "Blocks evicted from value log segments more than half live, when the log's dead space passed its hard limit."),
	}
}

func (c *movementCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.promotions, c.demotions, c.dropped, c.waits, c.waitSeconds, c.demoteErrs, c.qBlocks, c.qBytes, c.pfQueued, c.pfDropped,
		c.degraded, c.degradedEvents, c.recoveries, c.diskBytes, c.writeErrs, c.readErrs, c.recBlocks, c.recBytes, c.ssdOpen, c.ssdReadOnly, c.quarantined,
		c.vlogBytes, c.vlogLive, c.vlogSegments, c.relocations, c.spaceEvictions, c.durableEvictions} {
		ch <- d
	}
}

func (c *movementCollector) Collect(ch chan<- prometheus.Metric) {
	mv := c.s.Movement()
	g, ctr := prometheus.GaugeValue, prometheus.CounterValue
	m := prometheus.MustNewConstMetric
	ch <- m(c.promotions, ctr, float64(mv.Promotions))
	ch <- m(c.demotions, ctr, float64(mv.Demotions))
	ch <- m(c.dropped, ctr, float64(mv.DemotionsDropped))
	ch <- m(c.waits, ctr, float64(mv.DemotionWaits))
	ch <- m(c.waitSeconds, ctr, mv.DemotionWaitTime.Seconds())
	ch <- m(c.demoteErrs, ctr, float64(mv.DemotionErrors))
	ch <- m(c.qBlocks, g, float64(mv.QueueBlocks))
	ch <- m(c.qBytes, g, float64(mv.QueueBytes))
	ch <- m(c.pfQueued, ctr, float64(mv.PrefetchQueued))
	ch <- m(c.pfDropped, ctr, float64(mv.PrefetchDropped))
	if h := mv.SSD; h != nil {
		deg := 0.0
		if h.Degraded {
			deg = 1
		}
		blocks, bytes, _ := c.s.SSD().Recovered()
		ch <- m(c.degraded, g, deg)
		ch <- m(c.degradedEvents, ctr, float64(h.DegradedEvents))
		ch <- m(c.recoveries, ctr, float64(h.Recoveries))
		ch <- m(c.diskBytes, g, float64(h.DiskBytes))
		ch <- m(c.vlogBytes, g, float64(h.ValueLogBytes))
		ch <- m(c.vlogLive, g, float64(h.ValueLogLiveBytes))
		ch <- m(c.vlogSegments, g, float64(h.ValueLogSegments))
		ch <- m(c.relocations, ctr, float64(h.Relocations))
		ch <- m(c.spaceEvictions, ctr, float64(h.SpaceEvictions))
		ch <- m(c.durableEvictions, ctr, float64(h.DurableEvictions))
		ch <- m(c.writeErrs, ctr, float64(h.WriteErrors))
		ch <- m(c.readErrs, ctr, float64(h.ReadErrors))
		ch <- m(c.recBlocks, g, float64(blocks))
		ch <- m(c.recBytes, g, float64(bytes))
		open := 0.0
		if h.Open {
			open = 1
		}
		ch <- m(c.ssdOpen, g, open)
		ro := 0.0
		if h.ReadOnly {
			ro = 1
		}
		ch <- m(c.ssdReadOnly, g, ro)
		ch <- m(c.quarantined, ctr, float64(h.Quarantines))
	}
}

// startScrubber starts the DRAM tier's scrubber at scrub_rate; nil when
// scrub_rate is 0. The caller closes it before the store.
func startScrubber(ctx context.Context, cfg Config, s *tiered.Store, lg *zap.Logger) (*dram.Scrubber, error) {
	scfg, on := cfg.scrubConfig()
	if !on {
		lg.Warn("dram scrubber disabled (scrub_rate 0): a DRAM block damaged in place is found only by a verified read")
		return nil, nil
	}
	sc, err := dram.NewScrubber(s.DRAM(), scfg, lg)
	if err != nil {
		return nil, err
	}
	sc.Start(ctx)
	return sc, nil
}

// scrubCollector exports the DRAM scrubber's counters at scrape time.
type scrubCollector struct {
	s                                   *dram.Scrubber
	rate, bytes, blocks, failed, passes *prometheus.Desc
	lastPass                            *prometheus.Desc
}

func newScrubCollector(s *dram.Scrubber) *scrubCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &scrubCollector{
		s:        s,
		rate:     d("tidepool_scrub_rate_bytes", "Bytes per second the DRAM scrubber may check (scrub_rate; 0: disabled)."),
		bytes:    d("tidepool_scrub_bytes_total", "Bytes of resident DRAM blocks the scrubber checked against their CRC-32C."),
		blocks:   d("tidepool_scrub_blocks_total", "Resident DRAM blocks the scrubber checked against their CRC-32C."),
		failed:   d("tidepool_scrub_failed_blocks_total", "DRAM blocks the scrubber found damaged (bytes not matching their CRC-32C) and removed; also counted in tidepool_tier_checksum_failures_total{tier=\"dram\"}."),
		passes:   d("tidepool_scrub_passes_total", "Complete passes of the scrubber over the DRAM tier."),
		lastPass: d("tidepool_scrub_pass_seconds", "How long the scrubber's last complete pass over the DRAM tier took (0 before the first)."),
	}
}

func (c *scrubCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.rate, c.bytes, c.blocks, c.failed, c.passes, c.lastPass} {
		ch <- d
	}
}

func (c *scrubCollector) Collect(ch chan<- prometheus.Metric) {
	var st dram.ScrubStats
	var rate float64
	if c.s != nil {
		st = c.s.Stats()
		rate = float64(c.s.Rate())
	}
	g, ctr := prometheus.GaugeValue, prometheus.CounterValue
	m := prometheus.MustNewConstMetric
	ch <- m(c.rate, g, rate)
	ch <- m(c.bytes, ctr, float64(st.Bytes))
	ch <- m(c.blocks, ctr, float64(st.Blocks))
	ch <- m(c.failed, ctr, float64(st.Failed))
	ch <- m(c.passes, ctr, float64(st.Passes))
	ch <- m(c.lastPass, g, st.LastPass.Seconds())
}

// slotIndexCollector exports the DRAM tier's slot index counters at scrape
// time (docs/zerocopy.md, "Reads without a call").
type slotIndexCollector struct {
	t                            *dram.Tier
	capacity, entries, unindexed *prometheus.Desc
}

func newSlotIndexCollector(t *dram.Tier) *slotIndexCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &slotIndexCollector{
		t:         t,
		capacity:  d("tidepool_slot_index_capacity", "Entries of the DRAM tier's slot index (0: none)."),
		entries:   d("tidepool_slot_index_entries", "DRAM blocks the slot index lists now."),
		unindexed: d("tidepool_slot_index_unindexed_total", "DRAM blocks stored but not listed in the slot index (every entry of their window taken): engines read them through Acquire."),
	}
}

func (c *slotIndexCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.capacity, c.entries, c.unindexed} {
		ch <- d
	}
}

func (c *slotIndexCollector) Collect(ch chan<- prometheus.Metric) {
	var st dram.SlotIndexStats
	if c.t != nil {
		st = c.t.SlotIndexStats()
	}
	g, m := prometheus.GaugeValue, prometheus.MustNewConstMetric
	ch <- m(c.capacity, g, float64(st.Capacity))
	ch <- m(c.entries, g, float64(st.Entries))
	ch <- m(c.unindexed, prometheus.CounterValue, float64(st.Unindexed))
}

// storeDeps is what the proxy gets from the block store: the tiered store
// serves every one of the proxy's interfaces (proxy/store.go), so every
// feature is on: zero-copy calls and in-place reads through the DRAM
// tier's arenas, Prefetch into DRAM, and the rebalancer's scan of DRAM.
func storeDeps(s *tiered.Store) proxy.Deps {
	return proxy.Deps{Store: s, ZeroCopy: s, Prefetch: s, Scan: s}
}
