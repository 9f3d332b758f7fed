package ssd

import (
	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
)

// relocateSparse is the share of a sealed segment's bytes below which its
// live blocks are moved to the newest segment so that it can be deleted.
// With it, the value log's files hold at most about twice the live bytes
// (plus the active segment) once relocation has run.
const relocateSparse = 0.5

// maybeRelocateLocked starts a background relocation when the value log's
// dead bytes exceed two segments and an eighth of the capacity, and some
// sealed segment is sparse. wmu held. The relocation has its own wait
// group, which Close waits for without holding wmu (a move takes wmu).
func (t *Tier) maybeRelocateLocked() {
	if t.vlog == nil || t.closed.Load() || t.relocating.Load() {
		return
	}
	ids := t.relocatable()
	if len(ids) == 0 || !t.relocating.CompareAndSwap(false, true) {
		return
	}
	t.relocWG.Add(1)
	go func() {
		defer t.relocWG.Done()
		defer t.relocating.Store(false)
		// Deletes go on while it runs: look again after each pass, until
		// nothing is left to do or a pass could move nothing (blocks that
		// read bad stay until a read drops them).
		for len(ids) > 0 {
			moved, stop := t.relocate(ids)
			if stop || moved == 0 {
				return
			}
			ids = t.relocatable()
		}
	}()
}

// relocatable returns the sparse segments to relocate, when the value
// log's dead bytes exceed two segments and an eighth of the capacity.
func (t *Tier) relocatable() []uint32 {
	disk, live := t.vlog.usage()
	if disk-live < max(2*t.cfg.ValueLogSegmentSize, t.cfg.Capacity/8) {
		return nil
	}
	return t.vlog.sparse(relocateSparse)
}

// relocate moves the live blocks of the segments ids (emptiest first) to
// the active segment, one block per hold of wmu, so that puts wait for one
// move at most. It stops when the tier closes or degrades.
func (t *Tier) relocate(ids []uint32) (moved int64, stop bool) {
	want := make(map[uint32]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	bySeg := make(map[uint32][]*entry, len(ids))
	t.mu.Lock()
	for _, e := range t.index {
		if want[e.seg] {
			bySeg[e.seg] = append(bySeg[e.seg], e)
		}
	}
	t.mu.Unlock()
	var bytes int64
	for _, id := range ids {
		for _, e := range bySeg[id] {
			ok, halt := t.moveOne(e)
			if halt {
				t.lg.Info("ssd value log relocation stopped", zap.Int64("blocks", moved), zap.Int64("bytes", bytes))
				return moved, true
			}
			if ok {
				moved++
				bytes += e.size
				t.relocations.Add(1)
			}
		}
	}
	t.lg.Debug("ssd value log relocated", zap.Int("segments", len(ids)), zap.Int64("blocks", moved), zap.Int64("bytes", bytes))
	return moved, false
}

// moveOne copies e's bytes to the active segment and points its record
// there. ok: moved; stop: the tier closed or degraded. A block that is gone
// or reads bad is left where it is (a read drops a bad one).
func (t *Tier) moveOne(e *entry) (ok, stop bool) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if t.closed.Load() || t.degraded.Load() {
		return false, true
	}
	t.mu.Lock()
	cur := t.index[e.skey] == e
	t.mu.Unlock()
	if !cur {
		return false, false // removals hold wmu: it stays current until we unlock
	}
	data, buf, err := t.vlog.read(e.seg, e.off, e.size)
	if err != nil {
		return false, false
	}
	defer putAligned(buf)
	if cache.Checksum(data) != e.sum {
		return false, false
	}
	seg, off, err := t.vlog.append(data)
	if err != nil {
		t.writeErrors.Add(1)
		t.degradeLocked("value log write failed", zap.Error(err))
		return false, true
	}
	t.mu.Lock()
	ne := *e
	t.mu.Unlock()
	ne.seg, ne.off = seg, off
	m := ne.meta()
	if err := t.write(&batch{metaSet: [][2][]byte{{ne.encKey(), m.encode()}}, wal: true}, false); err != nil {
		t.vlog.free(seg, off, e.size)
		t.writeErrors.Add(1)
		t.degradeLocked("write failed", zap.Error(err))
		return false, true
	}
	t.mu.Lock()
	// Copy again: a read may have touched e since (access, dirty).
	ne2 := *e
	ne2.seg, ne2.off = seg, off
	t.index[e.skey] = &ne2
	t.byID[e.id] = &ne2
	t.mu.Unlock()
	t.vlog.free(e.seg, e.off, e.size)
	return true, false
}
