package ssd

import (
	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
)

// maybeRelocateLocked starts a background relocation when the value log's
// dead bytes (see relocatable) call for one. wmu held. Close waits for it
// without holding wmu (a move takes wmu).
func (t *Tier) maybeRelocateLocked() {
	if t.vlog == nil || t.closed.Load() || t.relocating.Load() {
		return
	}
	ids := t.relocatable()
	if len(ids) == 0 {
		return
	}
	t.relocMu.Lock()
	defer t.relocMu.Unlock()
	if t.closed.Load() || !t.relocating.CompareAndSwap(false, true) {
		return
	}
	done := make(chan struct{})
	t.relocDone = done
	go func() {
		defer close(done)
		defer t.relocating.Store(false)
		// Deletes go on while it runs: look again after each pass, until
		// nothing is left to do or a pass could move nothing (blocks that
		// read bad stay until a read drops them).
		for len(ids) > 0 {
			n, stop := t.relocate(ids)
			if stop || n == 0 {
				return
			}
			ids = t.relocatable()
		}
	}()
}

// relocatable returns the segments to empty, by the value log's dead bytes
// (its files' size less the live bytes):
//
//   - over the soft limit, the sealed segments at most half live, the
//     most dead first, until they hold the dead bytes above half the soft
//     limit: their live blocks are moved (writing at most what is freed);
//   - over the hard limit, also segments more than half live, the most
//     dead first, until they hold the dead bytes above half the hard
//     limit: their blocks are evicted (evictSegment), as the policy's
//     victims are, since moving them would write more than it frees.
//
// So the files stay within the live bytes + the hard limit + the segment
// being filled (+ the one being moved into): about 1.07 × Capacity for a
// large tier, inside the emptyDir volume of docs/kubernetes.md.
func (t *Tier) relocatable() []segUse {
	soft, hard := t.deadLimits()
	disk, live := t.vlog.usage()
	dead := disk - live
	if dead < soft {
		return nil
	}
	var out []segUse
	want := dead - soft/2
	if dead >= hard {
		want = dead - hard/2
	}
	for _, s := range t.vlog.deadest(dead) {
		if want <= 0 {
			break
		}
		if s.live*2 > s.size && dead < hard {
			continue
		}
		out = append(out, s)
		want -= s.size - s.live
	}
	return out
}

// deadLimits are the value log's soft and hard limits of dead space: a
// thirty-second and a sixteenth of the capacity, at least two and four
// segments.
func (t *Tier) deadLimits() (soft, hard int64) {
	seg := t.segmentSize()
	return max(2*seg, t.cfg.Capacity/32), max(4*seg, t.cfg.Capacity/16)
}

// segmentSize is the size of the value log's segments: ValueLogSegmentSize,
// at most a sixteenth of the capacity (and at least 1 MiB), so that the
// segment being filled, which holds dead blocks until it is sealed, stays
// small beside the budget.
func (t *Tier) segmentSize() int64 {
	return max(min(t.cfg.ValueLogSegmentSize, t.cfg.Capacity/16&^(dioAlign-1)), 1<<20)
}

// relocate empties the segments segs: the live blocks of one at most half
// live move to the active segment, one block per hold of wmu, so that puts
// wait for one move at most; those of a fuller one are evicted. done
// counts the blocks moved or evicted. It stops when the tier closes or
// degrades.
func (t *Tier) relocate(segs []segUse) (done int64, stop bool) {
	want := make(map[uint32]bool, len(segs))
	for _, s := range segs {
		want[s.id] = true
	}
	bySeg := make(map[uint32][]*entry, len(segs))
	t.mu.Lock()
	for _, e := range t.index {
		if want[e.seg] {
			bySeg[e.seg] = append(bySeg[e.seg], e)
		}
	}
	t.mu.Unlock()
	var moved, evicted int64
	for _, s := range segs {
		if s.live*2 > s.size {
			n, halt := t.evictSegment(bySeg[s.id])
			evicted += n
			if halt {
				return moved + evicted, true
			}
			continue
		}
		for _, e := range bySeg[s.id] {
			ok, halt := t.moveOne(e)
			if halt {
				t.lg.Info("ssd value log relocation stopped", zap.Int64("moved", moved), zap.Int64("evicted", evicted))
				return moved + evicted, true
			}
			if ok {
				moved++
				t.relocations.Add(1)
			}
		}
	}
	t.lg.Debug("ssd value log relocated", zap.Int("segments", len(segs)), zap.Int64("moved", moved), zap.Int64("evicted", evicted))
	return moved + evicted, false
}

// evictSegment evicts the blocks es (of one segment) that are still
// indexed, as policy victims are evicted.
func (t *Tier) evictSegment(es []*entry) (n int64, stop bool) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if t.closed.Load() || t.degraded.Load() {
		return 0, true
	}
	var gone []*entry
	var keys [][]byte
	t.mu.Lock()
	for _, e := range es {
		if t.index[e.skey] == e {
			t.removeLocked(e)
			t.nsLocked(e.ns).evictions++
			gone = append(gone, e)
			keys = append(keys, e.encKey())
		}
	}
	t.mu.Unlock()
	for len(keys) > 0 {
		k := min(1024, len(keys))
		t.deleteOnDiskLocked(keys[:k])
		keys = keys[k:]
	}
	t.evictions.Add(int64(len(gone)))
	t.spaceEvictions.Add(int64(len(gone)))
	t.countDurableEvictions(gone)
	t.freeValuesLocked(gone)
	return int64(len(gone)), false
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
