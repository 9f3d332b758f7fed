package ssd

import (
	"errors"
	"fmt"

	"github.com/tidepool-kv/tidepool/cache"
	"go.uber.org/zap"
)

// shared is one RocksDB read shared by every concurrent Get of a block
// (Tier.flights): the leader reads, each participant copies data and Leaves
// the flight, and after the last one the group releases the pinned bytes
// and the read lock on the store they came from (releaseRead).
type shared struct {
	p     *pinned // a RocksDB block's pinned bytes
	buf   []byte  // a value log block's read buffer (getAligned)
	data  []byte
	info  cache.Info
	entry *entry
}

// releaseRead is the flight group's release: it runs once per successful
// read, after its last participant.
func (t *Tier) releaseRead(r shared) {
	if r.p != nil {
		r.p.release()
	}
	if r.buf != nil {
		putAligned(r.buf)
	}
	t.dbMu.RUnlock()
}

// read performs the flight's read of (sk, ek). On success the result keeps
// the store's read lock until the last participant leaves. drop is a block
// found unreadable, for the caller to remove once the flight is finished.
func (t *Tier) read(sk string, ek []byte) (r shared, drop *entry, err error) {
	// Re-check inside the flight: the block may have gone since the caller
	// looked.
	t.mu.Lock()
	e := t.index[sk]
	t.mu.Unlock()
	if e == nil {
		return r, nil, cache.ErrNotFound
	}
	if t.hookBeforeRead != nil {
		t.hookBeforeRead()
	}
	t.dbMu.RLock()
	if t.st == nil {
		t.dbMu.RUnlock()
		return r, nil, fmt.Errorf("%w: ssd: store not open", cache.ErrUnavailable)
	}
	t.reads.Add(1)
	if e.seg != 0 {
		return t.readLogged(e, false)
	}
	p, found, err := t.st.getPinned(ek)
	switch {
	case err != nil && isOutOfDescriptors(err):
		// RocksDB could not open the block's file: the block is fine, the
		// process is short of descriptors for now. A miss, not a drop.
		t.dbMu.RUnlock()
		t.readErrors.Add(1)
		return r, nil, fmt.Errorf("%w: ssd: read: %v", cache.ErrUnavailable, err)
	case err != nil && isCorruption(err):
		t.dbMu.RUnlock()
		t.readErrors.Add(1)
		t.checksumFailures.Add(1)
		t.lg.Warn("ssd block unreadable, deleted", zap.String("ns", e.ns), zap.Error(err))
		return r, e, fmt.Errorf("%w: %w: %w: %v", ErrCorrupt, cache.ErrChecksum, cache.ErrNotFound, err)
	case err != nil:
		t.dbMu.RUnlock()
		return r, nil, fmt.Errorf("%w: ssd: read: %v", cache.ErrUnavailable, err)
	case !found:
		t.dbMu.RUnlock()
		t.stale.Add(1)
		return r, e, cache.ErrNotFound
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
		return r, e, fmt.Errorf("%w: %w: %w", ErrCorrupt, cache.ErrChecksum, cache.ErrNotFound)
	}
	return shared{p: p, data: data, entry: e, info: e.info()}, nil, nil
}

// readLogged is read of a block in the value log. dbMu is read-locked;
// it stays so on success, as for a RocksDB read.
func (t *Tier) readLogged(e *entry, retried bool) (r shared, drop *entry, err error) {
	if t.vlog == nil {
		t.dbMu.RUnlock()
		return r, nil, fmt.Errorf("%w: ssd: value log not open", cache.ErrUnavailable)
	}
	data, buf, err := t.vlog.read(e.seg, e.off, e.size)
	switch {
	case errors.Is(err, errSegmentGone):
		// Moved (relocate replaces the entry) or deleted since the caller
		// looked, or lost.
		t.mu.Lock()
		now := t.index[e.skey]
		t.mu.Unlock()
		switch {
		case now == e:
			t.dbMu.RUnlock()
			t.stale.Add(1)
			t.lg.Warn("ssd block's value log segment missing, deleted", zap.String("ns", e.ns), zap.Error(err))
			return r, e, cache.ErrNotFound
		case now != nil && now.seg != 0 && !retried:
			return t.readLogged(now, true)
		}
		t.dbMu.RUnlock()
		return r, nil, cache.ErrNotFound
	case err != nil:
		t.dbMu.RUnlock()
		t.readErrors.Add(1)
		t.checksumFailures.Add(1)
		t.lg.Warn("ssd block unreadable, deleted", zap.String("ns", e.ns), zap.Error(err))
		return r, e, fmt.Errorf("%w: %w: %w: %v", ErrCorrupt, cache.ErrChecksum, cache.ErrNotFound, err)
	}
	if got := cache.Checksum(data); got != e.sum {
		putAligned(buf)
		t.dbMu.RUnlock()
		t.checksumFailures.Add(1)
		t.lg.Warn("ssd block checksum mismatch, deleted",
			zap.String("ns", e.ns), zap.Int64("size", e.size), zap.Uint32("segment", e.seg),
			zap.Int64("offset", e.off), zap.Uint32("want", e.sum), zap.Uint32("got", got))
		return r, e, fmt.Errorf("%w: %w: %w", ErrCorrupt, cache.ErrChecksum, cache.ErrNotFound)
	}
	return shared{buf: buf, data: data, entry: e, info: e.info()}, nil, nil
}

// freeValuesLocked gives the value log space of removed blocks back, once
// their records are deleted (or the deletes were tried), and starts a
// relocation if the log has become sparse (looked at only when something
// was freed: most puts evict nothing). wmu held.
func (t *Tier) freeValuesLocked(es []*entry) {
	if t.vlog == nil {
		return
	}
	freed := false
	for _, e := range es {
		if e.seg != 0 {
			t.vlog.free(e.seg, e.off, e.size)
			freed = true
		}
	}
	if freed {
		t.maybeRelocateLocked()
	}
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
	t.freeValuesLocked([]*entry{e})
	t.noteGarbageLocked(e.blobBytes())
}
