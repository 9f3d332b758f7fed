package tiered

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/ssd"
	"github.com/tidepool-kv/tidepool/internal/crc32c"
)

// item is one demotion waiting for the writer. value is the store's own
// copy, checked against info.Checksum when it was made; it is never
// modified while queued.
type item struct {
	fk        string
	ns        string
	key       []byte
	value     []byte
	info      cache.Info
	low       bool
	desc      *cache.BlockMeta // its description (Config.Descriptions), for its SSD record
	cancelled bool             // guarded by qmu: deleted meanwhile, do not write
	// shared (guarded by qmu) is set when a reader took value from the
	// queue: its buffer may then be referenced after the item is done and
	// is left to the garbage collector instead of being reused.
	shared bool
	// src is the evicted DRAM block's bytes while the item is in
	// s.evicting (its onEvict has not returned, so the memory is still
	// the block's); nil once it leaves.
	src []byte
}

// Written demotion buffers are kept for the next evictions, up to the
// queue's own byte bound (QueueBytes, memory the queue may hold anyway),
// and dropped once the queue has been idle for freeIdle. Reusing them
// spares each demoted block a fresh MiB-sized allocation (page faults on
// memory the Go heap got back from the OS, garbage-collector work) and lets
// the copy and its checksum be one pass (crc32c.Copy). A spill that comes
// in bursts (a queue that fills, drains and fills again) reuses them all.
const freeIdle = 5 * time.Second

// takeBuf returns a reusable buffer of capacity at least n (and at most
// 2n, so that small blocks do not pin large buffers), or nil. qmu held.
func (s *Store) takeBuf(n int) []byte {
	for i := len(s.free) - 1; i >= 0; i-- {
		b := s.free[i]
		if c := cap(b); c >= n && c <= 2*n {
			last := len(s.free) - 1
			s.free[i] = s.free[last]
			s.free[last] = nil
			s.free = s.free[:last]
			s.freeBytes -= int64(cap(b))
			return b[:n]
		}
	}
	return nil
}

// putBuf keeps b for reuse if there is room and the writer is not stopped.
// No reader may hold b. qmu held.
func (s *Store) putBuf(b []byte) {
	if b == nil || s.qstop || s.freeBytes+int64(cap(b)) > s.cfg.QueueBytes {
		return
	}
	s.free = append(s.free, b)
	s.freeBytes += int64(cap(b))
	if s.freeTrim == nil {
		s.freeTrim = time.AfterFunc(s.freeIdle, s.trimFree)
	}
}

// trimFree drops the kept buffers once the queue has been idle for
// freeIdle, and otherwise looks again freeIdle later.
func (s *Store) trimFree() {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if len(s.pending) == 0 && len(s.queue) == 0 && time.Since(s.lastWrite) >= s.freeIdle {
		clear(s.free)
		s.free, s.freeBytes, s.freeTrim = nil, 0, nil
		return
	}
	s.freeTrim.Reset(s.freeIdle)
}

// onEvict is the DRAM tier's OnEvict: it runs with no DRAM lock held, maybe
// concurrently with itself, and must not call into the DRAM tier. It copies
// the block into the queue unless the SSD already holds it or the queue is
// full; a full queue drops it at once, or after waiting up to DemotionWait
// for room (room).
func (s *Store) onEvict(ns string, key, value []byte, info cache.Info) {
	fk := fkey(ns, key)
	if s.ssd == nil {
		return
	}
	if s.hookEvict != nil {
		s.hookEvict(ns, key)
	}
	if _, ok := s.ssd.Stat(context.Background(), ns, key); ok {
		return // promoted or durable: already below
	}
	size := int64(len(value))
	// it is registered in evicting until it is queued or given up, so that
	// a Delete or Clear meanwhile (which no longer finds the block in DRAM)
	// cancels it rather than have the demotion bring the block back.
	it := &item{fk: fk, ns: ns, src: value, info: info}
	it.info.Tier = ssd.TierName
	s.qmu.Lock()
	if _, ok := s.pending[fk]; ok {
		s.qmu.Unlock()
		return
	}
	s.evicting[it] = struct{}{}
	if !s.room(it, size) || s.removed(it) {
		delete(s.evicting, it)
		it.src = nil
		s.qmu.Unlock()
		if !it.cancelled {
			s.demotionsDropped.Add(1)
		}
		return
	}
	s.qbytes += size
	s.qslots++
	buf := s.takeBuf(len(value))
	s.qmu.Unlock()

	// Copy outside qmu (a MiB copy takes tens of µs); the bytes and the
	// place were reserved above so both bounds hold while several
	// evictions copy at once.
	//
	// The copy is checked against the block's DRAM checksum here rather
	// than by the SSD tier when the writer gets to it: a block damaged in
	// DRAM after it was checked is not moved down, and the copy, private
	// to the queue from here on, goes to SSD with that checksum
	// (ssd.PutVerified) without another pass over its bytes. Into a reused
	// buffer, copy and checksum are one pass (crc32c.Copy: the sum is of
	// the bytes as stored in buf); a fresh buffer is filled by append,
	// which does not zero it first.
	var sum uint32
	if buf != nil {
		sum = crc32c.Copy(buf, value)
	} else {
		buf = append([]byte(nil), value...)
		sum = cache.Checksum(buf)
	}
	damaged := sum != info.Checksum
	it.key = append([]byte(nil), key...)
	it.desc = s.description(ns, key)
	s.qmu.Lock()
	it.value = buf
	s.qslots--
	delete(s.evicting, it)
	it.src = nil
	if _, ok := s.pending[fk]; ok || s.qstop || damaged || s.removed(it) {
		s.qbytes -= size
		s.putBuf(buf)
		s.qmu.Unlock()
		s.roomCond.Broadcast()
		switch {
		case damaged:
			s.demotionErrors.Add(1)
			s.lg.Error("demoted block does not match its checksum: dropped", zap.String("ns", ns),
				zap.Uint32("want", info.Checksum))
		case it.cancelled:
		case s.qstop:
			s.demotionsDropped.Add(1)
		}
		return
	}
	s.pending[fk] = it
	s.queue = append(s.queue, it)
	s.qmu.Unlock()
	s.qcond.Signal()
}

// room reports whether the queue has a place, and size bytes, for it, a
// demotion of size bytes. When the queue is full it waits up to
// DemotionWait for the writer to make room, woken by each block written
// (roomCond), unless it is cancelled meanwhile, and counts the wait. qmu
// held (released while waiting).
func (s *Store) room(it *item, size int64) bool {
	if s.qstop {
		return false
	}
	if !s.full(size) {
		return true
	}
	wait := s.cfg.DemotionWait
	if wait <= 0 || size > s.cfg.QueueBytes {
		return false
	}
	start := time.Now()
	deadline := start.Add(wait)
	t := time.AfterFunc(wait, func() {
		// As in drain: taking qmu orders the wake-up after a waiter
		// that checked its deadline is parked in Wait.
		s.qmu.Lock()
		//lint:ignore SA2001 the empty critical section is the point
		s.qmu.Unlock()
		s.roomCond.Broadcast()
	})
	defer t.Stop()
	for !s.qstop && !s.removed(it) && s.full(size) && time.Now().Before(deadline) {
		s.roomCond.Wait()
	}
	s.demotionWaits.Add(1)
	s.demotionWaitNanos.Add(int64(time.Since(start)))
	return !s.qstop && !s.full(size)
}

// writer drains the queue into the SSD tier until stopWriter.
func (s *Store) writer() {
	defer s.writerWG.Done()
	ctx := context.Background()
	for {
		s.qmu.Lock()
		for len(s.queue) == 0 && !s.qstop {
			s.qcond.Wait()
		}
		if len(s.queue) == 0 {
			s.qmu.Unlock()
			return
		}
		it := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		s.qmu.Unlock()

		if s.hookWrite != nil {
			s.hookWrite()
		}
		s.demoteMu.Lock()
		s.qmu.Lock()
		skip := it.cancelled
		s.qmu.Unlock()
		var err error
		if !skip {
			// The copy was checked against the DRAM block's checksum
			// when it was made (onEvict).
			_, err = s.ssd.PutVerified(ctx, it.ns, it.key, it.value, it.info.Checksum,
				cache.PutOptions{Depth: it.info.Depth, LowPriority: it.low, Meta: it.desc})
		}
		s.demoteMu.Unlock()
		switch {
		case skip:
		case errors.Is(err, cache.ErrChecksum):
			s.demotionErrors.Add(1)
			s.lg.Error("demoted block does not match its checksum: dropped", zap.String("ns", it.ns), zap.Error(err))
		case err != nil:
			s.demotionErrors.Add(1)
			s.lg.Debug("demotion failed", zap.Error(err))
		default:
			s.demotions.Add(1)
		}
		s.qmu.Lock()
		if s.pending[it.fk] == it {
			delete(s.pending, it.fk)
		}
		s.qbytes -= int64(len(it.value))
		s.lastWrite = time.Now()
		if !it.shared {
			// Out of pending (or never readable: cancelled items left
			// it at cancel), so no reader can take it any more.
			s.putBuf(it.value)
		}
		it.value = nil
		s.qmu.Unlock()
		s.qcond.Broadcast()    // wake drain
		s.roomCond.Broadcast() // and evictions waiting for room
	}
}

// removed reports whether demotion it is cancelled, and cancels it when a
// Delete or Clear of its block is under way (removing): that block may
// have been unlinked from DRAM by this eviction before the Delete looked,
// and the Delete waits for this onEvict to return (dram's Delete), so it
// must not queue the block. qmu held.
func (s *Store) removed(it *item) bool {
	if !it.cancelled && (s.removingKeys[it.fk] > 0 || s.removingNS[it.ns] > 0) {
		it.cancelled = true
	}
	return it.cancelled
}

// removing marks a Delete (m removingKeys, k its fkey) or a Clear (m
// removingNS, k its namespace) under way until the returned func is
// called: evictions of its blocks give up (removed).
func (s *Store) removing(m map[string]int, k string) (done func()) {
	s.qmu.Lock()
	m[k]++
	s.qmu.Unlock()
	return func() {
		s.qmu.Lock()
		if m[k]--; m[k] == 0 {
			delete(m, k)
		}
		s.qmu.Unlock()
	}
}

// cancel marks the queued demotions matching fn as cancelled (the writer
// skips them) and removes them from the read path; it returns how many.
// Demotions not queued yet (copying, or waiting for room: reads find them
// too) that match are cancelled and counted as well: they are given up.
func (s *Store) cancel(fn func(fk string, it *item) bool) int {
	n := 0
	s.qmu.Lock()
	waiting := false
	for it := range s.evicting {
		if fn(it.fk, it) && !it.cancelled {
			it.cancelled = true
			waiting = true
			n++
		}
	}
	if waiting {
		s.roomCond.Broadcast() // a cancelled eviction stops waiting for room
	}
	for fk, it := range s.pending {
		if fn(fk, it) {
			it.cancelled = true
			delete(s.pending, fk)
			n++
		}
	}
	s.qmu.Unlock()
	return n
}

// drain waits until the queue is empty or deadline passes.
func (s *Store) drain(deadline time.Time) {
	t := time.AfterFunc(time.Until(deadline), func() {
		// Taking qmu orders this wake-up after a waiter that checked
		// the condition is parked in Wait, so the broadcast is not lost.
		s.qmu.Lock()
		//lint:ignore SA2001 the empty critical section is the point
		s.qmu.Unlock()
		s.qcond.Broadcast()
	})
	defer t.Stop()
	s.qmu.Lock()
	defer s.qmu.Unlock()
	for len(s.pending) > 0 && time.Now().Before(deadline) {
		s.qcond.Wait()
	}
}

// stopWriter stops the writer after the item it is writing; what is still
// queued is dropped and counted.
func (s *Store) stopWriter() {
	s.qmu.Lock()
	s.qstop = true
	left := len(s.queue)
	for _, it := range s.queue {
		delete(s.pending, it.fk)
		s.qbytes -= int64(len(it.value))
	}
	s.queue = nil
	s.qmu.Unlock()
	s.qcond.Broadcast()
	s.roomCond.Broadcast()
	s.writerWG.Wait()
	s.qmu.Lock()
	if s.freeTrim != nil {
		s.freeTrim.Stop()
	}
	clear(s.free)
	s.free, s.freeBytes = nil, 0
	s.qmu.Unlock()
	if left > 0 {
		s.demotionsDropped.Add(int64(left))
		s.lg.Warn("demotions dropped at close", zap.Int("blocks", left))
	}
}

// WaitIdle waits until the demotion queue is empty (every demotion so far
// written or failed), or ctx ends.
func (s *Store) WaitIdle(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		// Taking qmu orders this wake-up after a waiter that checked
		// the condition is parked in Wait, so the broadcast is not lost.
		s.qmu.Lock()
		//lint:ignore SA2001 the empty critical section is the point
		s.qmu.Unlock()
		s.qcond.Broadcast()
	})
	defer stop()
	s.qmu.Lock()
	defer s.qmu.Unlock()
	for len(s.pending) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		s.qcond.Wait()
	}
	return nil
}

// --- reads below DRAM ------------------------------------------------------

// readResult is what one read below DRAM gives every caller that shared it.
type readResult struct {
	value []byte
	info  cache.Info
}

// fetch returns the bytes of (ns, key) from the demotion queue or SSD and
// promotes them into DRAM. Concurrent fetches of one key share one read
// (s.flights); the leader re-checks DRAM first (a flight that just ended
// promoted it). The returned slice is shared: callers copy it.
func (s *Store) fetch(ctx context.Context, ns string, key []byte) ([]byte, cache.Info, error) {
	return s.fetchFor(ctx, ns, key, false)
}

// fetchFor is fetch; prefetch marks a read by the prefetcher, which is not
// a read of the caller's and is not counted as a hit (see Stats).
func (s *Store) fetchFor(ctx context.Context, ns string, key []byte, prefetch bool) ([]byte, cache.Info, error) {
	fk := fkey(ns, key)
	r, err, _ := s.flights.Do(ctx, fk, func() (readResult, error) {
		// The flight serves every waiter: the leader's cancellation must
		// not fail the others (each waiter still honours its own ctx).
		v, info, err := s.readBelow(context.WithoutCancel(ctx), fk, ns, key, prefetch)
		return readResult{v, info}, err
	})
	return r.value, r.info, err
}

func (s *Store) readBelow(ctx context.Context, fk, ns string, key []byte, prefetch bool) ([]byte, cache.Info, error) {
	// Re-check DRAM inside the flight: a flight that ended between our
	// miss and now has promoted the block. Stat first, so that the usual
	// case (still absent) does not count a second DRAM miss.
	if _, ok := s.dram.Stat(ctx, ns, key); ok {
		if v, info, err := s.dram.Get(ctx, ns, key, nil); err == nil {
			return v, info, nil
		}
	}
	s.qmu.Lock()
	it := s.pending[fk]
	var v []byte
	var info cache.Info
	if it != nil {
		// The buffer is not reused once a reader has it (writer).
		it.shared = true
		v, info = it.value, it.info
	} else if it = s.evictingLocked(fk); it != nil {
		// Evicted from DRAM but not queued yet (copying, or waiting
		// for room): copied from the block's memory, which stays the
		// block's until its onEvict leaves s.evicting, and checked.
		v, info = make([]byte, len(it.src)), it.info
		if crc32c.Copy(v, it.src) != info.Checksum {
			it, v = nil, nil
		}
	}
	s.qmu.Unlock()
	if it != nil {
		if !prefetch {
			s.queueHits.Add(1)
			nsCounter(&s.nsQueueHits, ns).Add(1)
		}
	} else {
		var err error
		s.ssdReads.Add(1)
		v, info, err = s.ssd.Get(ctx, ns, key, nil)
		if err != nil {
			return nil, cache.Info{}, err
		}
		if prefetch {
			s.prefetchReads.Add(1)
			nsCounter(&s.nsPrefetchReads, ns).Add(1)
		}
	}
	s.promote(ctx, ns, key, v, info)
	return v, info, nil
}

// evictingLocked returns the eviction of fk that is not queued yet and not
// cancelled, or nil. qmu held.
func (s *Store) evictingLocked(fk string) *item {
	for it := range s.evicting {
		if it.fk == fk && !it.cancelled {
			return it
		}
	}
	return nil
}

// queueFull reports whether the demotion queue has no place, or not size
// bytes, for one more block now.
func (s *Store) queueFull(size int64) bool {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	return s.full(size)
}

// full is queueFull with qmu held.
func (s *Store) full(size int64) bool {
	return len(s.queue)+s.qslots >= s.cfg.QueueBlocks || s.qbytes+size > s.cfg.QueueBytes
}

// promote copies a block read below into DRAM. Failure (DRAM pinned full)
// is not an error: the read is served anyway. With DemotionWait, a block
// is not promoted while the demotion queue is full, so that reads by copy
// never wait for room in it (a later read promotes it); Acquire, which
// needs the block in DRAM, promotes it anyway (promoteNow).
func (s *Store) promote(ctx context.Context, ns string, key, v []byte, info cache.Info) {
	if s.closed.Load() {
		return
	}
	if s.cfg.DemotionWait > 0 && s.queueFull(int64(len(v))) {
		// Making room for it would evict a block into a full queue and
		// wait for the SSD (DemotionWait): the read is served without
		// the promotion rather than stalled behind a spill.
		return
	}
	s.promoteNow(ctx, ns, key, v, info)
}

// promoteNow is promote without the check of the queue: making room may
// wait for it (Acquire, which needs the block in DRAM).
func (s *Store) promoteNow(ctx context.Context, ns string, key, v []byte, info cache.Info) {
	opts := cache.PutOptions{Depth: info.Depth}
	existed, err := s.dram.Promote(ctx, ns, key, v, opts)
	switch {
	case err != nil:
		if !errors.Is(err, cache.ErrNoSpace) && !errors.Is(err, cache.ErrClosed) {
			s.lg.Debug("promotion failed", zap.Error(err))
		}
	case !existed:
		s.promotions.Add(1)
	}
}

// --- prefetch and watermarks ----------------------------------------------

type prefetchReq struct {
	ns  string
	key []byte
}

// Prefetch queues the keys of ns that are below DRAM (in SSD or in the
// demotion queue) to be promoted into DRAM in the background, and returns
// how many it queued. Keys already in DRAM, absent keys, and keys that do
// not fit the prefetch queue (counted in PrefetchDropped) are not queued.
// ctx bounds only the call, not the background work.
func (s *Store) Prefetch(ctx context.Context, ns string, keys [][]byte) int {
	if s.ssd == nil || s.closed.Load() {
		return 0
	}
	n := 0
	for _, k := range keys {
		if ctx.Err() != nil {
			break
		}
		if _, ok := s.dram.Stat(ctx, ns, k); ok {
			continue
		}
		if _, ok := s.Stat(ctx, ns, k); !ok {
			continue
		}
		select {
		case s.prefetchCh <- prefetchReq{ns: ns, key: append([]byte(nil), k...)}:
			n++
			s.prefetchQueued.Add(1)
		default:
			s.prefetchDropped.Add(1)
		}
	}
	return n
}

func (s *Store) prefetcher() {
	defer s.bg.Done()
	ctx := context.Background()
	for {
		select {
		case <-s.stop:
			return
		case r := <-s.prefetchCh:
			if _, ok := s.dram.Stat(ctx, r.ns, r.key); ok {
				continue
			}
			_, _, _ = s.fetchFor(ctx, r.ns, r.key, true)
		}
	}
}

// probeTick is how often prober looks at the SSD tier; the tier itself
// tries the disk at most once per its ProbeInterval (5 s by default).
const probeTick = time.Second

// prober lets a degraded SSD tier try the disk again (ssd.Tier.Probe)
// while no put does, so that it recovers, and /readyz says so, once the
// disk or descriptors are back, also on an idle sidecar.
func (s *Store) prober() {
	defer s.bg.Done()
	tk := time.NewTicker(probeTick)
	defer tk.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tk.C:
		}
		if s.ssd.Degraded() {
			s.ssd.Probe()
		}
	}
}

// watermarks evicts DRAM down to the low watermark whenever it is above
// the high one, while the SSD tier takes writes: evicting ahead only
// serves demotion, and while the tier is degraded each eviction loses its
// block, so DRAM keeps its blocks until a put needs the room (and then
// the DRAM chain rule applies).
func (s *Store) watermarks(ev evicter) {
	defer s.bg.Done()
	tk := time.NewTicker(s.cfg.WatermarkInterval)
	defer tk.Stop()
	capacity := float64(s.cfg.DRAM.Capacity)
	high, low := int64(capacity*s.cfg.HighWatermark), int64(capacity*s.cfg.LowWatermark)
	for {
		select {
		case <-s.stop:
			return
		case <-tk.C:
		}
		if s.ssd.Degraded() {
			continue
		}
		st := s.dram.Stats()
		if len(st.Tiers) > 0 && st.Tiers[0].UsedBytes > high {
			s.watermarkEvictions.Add(int64(ev.EvictTo(low)))
		}
	}
}
