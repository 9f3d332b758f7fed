package ssd

import (
	"time"

	"go.uber.org/zap"
)

// freeSpace returns the bytes available to us on Dir's filesystem; ok is
// false when the check is disabled or fails.
func (t *Tier) freeSpace() (int64, bool) {
	if t.cfg.MinFreeBytes < 0 && t.hookFreeSpace == nil {
		return 0, false
	}
	return t.diskFree()
}

// degradeLocked enters degraded mode (once; later calls are no-ops). wmu
// held.
func (t *Tier) degradeLocked(reason string, fields ...zap.Field) {
	if !t.degraded.CompareAndSwap(false, true) {
		return
	}
	t.degradedEvents.Add(1)
	why := reason
	for _, f := range fields {
		if f.Key == "error" {
			if e, ok := f.Interface.(error); ok {
				why += ": " + e.Error()
			}
		}
	}
	t.degradedWhy.Store(why)
	t.nextProbe = t.clk.Now().Add(t.cfg.ProbeInterval)
	t.lg.Warn("ssd tier degraded: not admitting blocks, still serving reads",
		append(fields, zap.String("reason", reason), zap.Duration("probe_in", t.cfg.ProbeInterval))...)
}

// Probe tries to leave degraded mode now, as a put does: at most once per
// ProbeInterval, and only if no write is in progress (it never waits for
// one). It reports whether the tier admits blocks. A store calls it
// periodically so that a degraded tier recovers (and Health says so)
// without waiting for a put.
func (t *Tier) Probe() bool {
	if !t.degraded.Load() {
		return true
	}
	if !t.wmu.TryLock() {
		return false
	}
	defer t.wmu.Unlock()
	if t.closed.Load() {
		return false
	}
	return t.tryRecoverLocked()
}

// tryRecoverLocked checks, at most once per ProbeInterval, whether the
// disk takes writes again, and leaves degraded mode if so. RocksDB stops
// all writes after a hard background error (a flush that hit ENOSPC);
// grocksdb has no DB::Resume, so the tier closes and reopens the database,
// which also rebuilds the index (blocks whose flush failed are gone). wmu
// held.
func (t *Tier) tryRecoverLocked() bool {
	now := t.clk.Now()
	if now.Before(t.nextProbe) {
		return false
	}
	t.nextProbe = now.Add(t.cfg.ProbeInterval)
	if free, ok := t.freeSpace(); ok && free < max(t.cfg.MinFreeBytes, 0) {
		return false
	}
	if free, ok := t.diskFree(); ok && free < openMinFree && t.readOnlyLocked() {
		return false // a reopen would be read-only again
	}
	stamp := []byte(now.UTC().Format(time.RFC3339Nano))
	if t.probe(stamp) != nil {
		if err := t.reopenLocked(); err != nil {
			t.lg.Warn("ssd reopen after disk error failed", zap.Error(err))
			return false
		}
		if err := t.probe(stamp); err != nil {
			return false
		}
	}
	t.degraded.Store(false)
	t.recoveries.Add(1)
	t.lg.Info("ssd tier recovered, admitting blocks again")
	return true
}

func (t *Tier) probe(stamp []byte) error {
	if t.hookBeforeWrite != nil {
		if err := t.hookBeforeWrite(); err != nil {
			return err
		}
	}
	if err := checkDescriptors(t.null); err != nil {
		return err
	}
	t.dbMu.RLock()
	defer t.dbMu.RUnlock()
	if t.st == nil {
		return errNoStore
	}
	return t.st.probe(stamp)
}

// reopenLocked closes and reopens the database and rebuilds the index.
// wmu held.
func (t *Tier) reopenLocked() error {
	t.stopCompactionLocked()
	t.dbMu.Lock()
	if t.st != nil {
		t.st.close()
		t.st = nil
	}
	st, err := t.openChecked()
	if err == nil && t.vlog == nil {
		// The tier started without a database: the value log was not
		// opened either.
		if t.vlog, err = openValueLog(t.cfg.Dir, t.segmentSize()); err != nil {
			st.close()
		}
	}
	if err == nil {
		t.st = st
	}
	t.dbMu.Unlock()
	if err != nil {
		return err
	}
	blocks, bytes, err := t.rebuild()
	t.lg.Info("ssd database reopened", zap.Int64("blocks", blocks), zap.Int64("bytes", bytes))
	return err
}

// noteGarbageLocked records dropped bytes and starts a background
// compaction of the data family once CompactAfter bytes were dropped, so
// that RocksDB deletes (or GC-rewrites) blob files holding dead blocks.
// wmu held.
func (t *Tier) noteGarbageLocked(n int64) {
	if t.cfg.CompactAfter < 0 || n <= 0 {
		return
	}
	t.garbage += n
	limit := t.cfg.CompactAfter
	if limit == 0 {
		limit = t.cfg.Capacity / 8
	}
	if t.garbage < limit || !t.compactOn.CompareAndSwap(false, true) {
		return
	}
	t.garbage = 0
	t.bg.Add(1)
	go func() {
		defer t.bg.Done()
		defer t.compactOn.Store(false)
		t.dbMu.RLock()
		defer t.dbMu.RUnlock()
		if t.st != nil {
			t.st.compactData()
			t.compactions.Add(1)
		}
	}()
}

// stopCompactionLocked aborts a running background compaction and waits
// for it. wmu held (so no new one starts).
func (t *Tier) stopCompactionLocked() {
	t.dbMu.RLock()
	if t.st != nil {
		t.st.pauseCompaction()
	}
	t.dbMu.RUnlock()
	t.bg.Wait()
}
