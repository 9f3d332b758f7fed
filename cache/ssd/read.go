package ssd

import (
	"fmt"

	"github.com/tidepool-kv/tidepool/cache"
	"go.uber.org/zap"
)

// flight is one RocksDB read shared by every concurrent Get of a block.
// The leader fills it and closes done; then each participant copies data
// and calls leaveFlight; the last one releases the pinned bytes and the
// read lock on the store they came from.
type flight struct {
	done chan struct{}
	refs int // guarded by Tier.fmu

	// Set by the leader before done is closed.
	p     *pinned
	data  []byte
	info  cache.Info
	entry *entry
	err   error
}

func (t *Tier) joinFlight(sk string) (f *flight, leader bool) {
	t.fmu.Lock()
	defer t.fmu.Unlock()
	if f = t.flights[sk]; f != nil {
		f.refs++
		return f, false
	}
	f = &flight{done: make(chan struct{}), refs: 1}
	t.flights[sk] = f
	return f, true
}

func (t *Tier) leaveFlight(f *flight) {
	t.fmu.Lock()
	f.refs--
	last := f.refs == 0
	t.fmu.Unlock()
	if last && f.p != nil {
		f.p.release()
		f.p = nil
		t.dbMu.RUnlock()
	}
}

// runFlight performs the read for f. On success f keeps the store's read
// lock until the last participant leaves.
func (t *Tier) runFlight(f *flight, sk string, ek []byte) {
	var drop *entry
	defer func() {
		t.fmu.Lock()
		delete(t.flights, sk)
		t.fmu.Unlock()
		close(f.done)
		if drop != nil {
			t.dropBad(drop)
		}
	}()
	// Re-check inside the flight: the block may have gone since the caller
	// looked.
	t.mu.Lock()
	e := t.index[sk]
	t.mu.Unlock()
	if e == nil {
		f.err = cache.ErrNotFound
		return
	}
	if t.hookBeforeRead != nil {
		t.hookBeforeRead()
	}
	t.dbMu.RLock()
	if t.st == nil {
		t.dbMu.RUnlock()
		f.err = fmt.Errorf("%w: ssd: store not open", cache.ErrUnavailable)
		return
	}
	t.reads.Add(1)
	p, found, err := t.st.getPinned(ek)
	switch {
	case err != nil && isCorruption(err):
		t.dbMu.RUnlock()
		t.readErrors.Add(1)
		t.checksumFailures.Add(1)
		t.lg.Warn("ssd block unreadable, deleted", zap.String("ns", e.ns), zap.Error(err))
		f.err = fmt.Errorf("%w: %w: %w: %v", ErrCorrupt, cache.ErrChecksum, cache.ErrNotFound, err)
		drop = e
		return
	case err != nil:
		t.dbMu.RUnlock()
		f.err = fmt.Errorf("%w: ssd: read: %v", cache.ErrUnavailable, err)
		return
	case !found:
		t.dbMu.RUnlock()
		t.stale.Add(1)
		f.err = cache.ErrNotFound
		drop = e
		return
	}
	data := p.bytes()
	if int64(len(data)) != e.size || cache.Checksum(data) != e.sum {
		got := cache.Checksum(data)
		p.release()
		t.dbMu.RUnlock()
		t.checksumFailures.Add(1)
		t.lg.Warn("ssd block checksum mismatch, deleted",
			zap.String("ns", e.ns), zap.Int64("size", e.size), zap.Int("read", len(data)),
			zap.Uint32("want", e.sum), zap.Uint32("got", got))
		f.err = fmt.Errorf("%w: %w: %w", ErrCorrupt, cache.ErrChecksum, cache.ErrNotFound)
		drop = e
		return
	}
	f.p, f.data, f.entry, f.info = p, data, e, e.info()
}

// dropBad removes a block that could not be read correctly, if the index
// still holds that very entry.
func (t *Tier) dropBad(e *entry) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if t.closed.Load() {
		return
	}
	t.mu.Lock()
	if t.index[e.skey] != e {
		t.mu.Unlock()
		return
	}
	t.removeLocked(e)
	t.mu.Unlock()
	t.deleteOnDiskLocked([][]byte{e.encKey()})
	t.noteGarbageLocked(e.size)
}
