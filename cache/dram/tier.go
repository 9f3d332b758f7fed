package dram

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/maphash"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/crc32c"
)

// namespace returns the state of ns, creating it on first use.
func (t *Tier) namespace(ns string) *nsState {
	if v, ok := t.namespaces.Load(ns); ok {
		return v.(*nsState)
	}
	n := &nsState{name: ns, id: t.nextNS.Add(1), verify: t.VerifiesReads(ns)}
	v, _ := t.namespaces.LoadOrStore(ns, n)
	return v.(*nsState)
}

// lookupNamespace returns the state of ns, or nil if it was never used.
func (t *Tier) lookupNamespace(ns string) *nsState {
	if v, ok := t.namespaces.Load(ns); ok {
		return v.(*nsState)
	}
	return nil
}

func (t *Tier) shardFor(nsID uint32, key []byte) *shard {
	h := maphash.Bytes(t.seed, key) ^ uint64(nsID)*0x9e3779b97f4a7c15
	return &t.shards[(h^h>>32)&(numShards-1)]
}

func (t *Tier) checkKey(key []byte) error {
	if len(key) == 0 {
		return fmt.Errorf("%w: empty key", cache.ErrInvalidKey)
	}
	if len(key) > t.cfg.MaxKeySize {
		return fmt.Errorf("%w: key of %d bytes exceeds %d", cache.ErrInvalidKey, len(key), t.cfg.MaxKeySize)
	}
	return nil
}

func (t *Tier) now() int64 { return t.clk.Now().UnixNano() }

// Put stores value under (ns, key). Putting a key that is present is a no-op
// that returns existed=true. Errors: cache.ErrInvalidKey, cache.ErrTooLarge
// (value over MaxValueSize), cache.ErrNoSpace (the value cannot fit even
// after evicting every evictable block; nothing is evicted then),
// cache.ErrClosed.
func (t *Tier) Put(ctx context.Context, ns string, key, value []byte, opts cache.PutOptions) (existed bool, err error) {
	return t.put(ctx, ns, key, value, opts, true)
}

// Promote is Put for a copy of a block read from a slower tier: the same,
// except that it does not count as a put of the namespace
// (NamespaceStats.Puts counts blocks stored by callers, not movement).
func (t *Tier) Promote(ctx context.Context, ns string, key, value []byte, opts cache.PutOptions) (existed bool, err error) {
	return t.put(ctx, ns, key, value, opts, false)
}

func (t *Tier) put(ctx context.Context, ns string, key, value []byte, opts cache.PutOptions, countPut bool) (existed bool, err error) {
	if err := t.checkKey(key); err != nil {
		return false, err
	}
	size := int64(len(value))
	if size > t.cfg.MaxValueSize {
		return false, fmt.Errorf("%w: value of %d bytes exceeds %d", cache.ErrTooLarge, size, t.cfg.MaxValueSize)
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	nss := t.namespace(ns)
	sh := t.shardFor(nss.id, key)
	sh.mu.Lock()
	if sh.closed {
		sh.mu.Unlock()
		return false, cache.ErrClosed
	}
	if _, ok := sh.m[nss.id][string(key)]; ok {
		sh.mu.Unlock()
		return true, nil
	}
	sh.ops++
	sh.mu.Unlock()

	foot := footprint(size)
	off, err := t.makeRoom(size, foot, blockAt(nss, key, foot, opts))
	if err != nil {
		t.opDone(sh)
		return false, err
	}
	// The checksum is of the caller's bytes, so that a fault in the arena
	// copy is caught by the scrubber or a verified read.
	crc := crc32c.Copy(t.bytes(off, size), value) // one pass: copy and checksum fused
	if opts.HasChecksum && crc != opts.Checksum {
		t.freeBlockMem(&block{off: off, size: size, foot: foot})
		t.opDone(sh)
		return false, fmt.Errorf("%w: value of %d bytes has CRC-32C %08x, its block %08x", cache.ErrChecksum, size, crc, opts.Checksum)
	}

	b := &block{
		id: t.nextID.Add(1), ns: nss, off: off, size: size, foot: foot, crc: crc,
		depth: opts.Depth, low: opts.LowPriority, shard: sh,
	}
	sh.mu.Lock()
	sh.ops--
	m := sh.m[nss.id]
	if _, ok := m[string(key)]; ok || sh.closed {
		sh.mu.Unlock()
		t.freeBlockMem(b)
		if ok {
			return true, nil
		}
		return false, cache.ErrClosed
	}
	if m == nil {
		m = make(map[string]*block)
		sh.m[nss.id] = m
	}
	b.key = string(key)
	b.linked = true
	m[b.key] = b
	t.pmu.Lock()
	b.id = t.policyID(nss.id, b.key)
	t.admitLocked(b)
	t.pmu.Unlock()
	t.observeStored(b)
	sh.mu.Unlock()

	t.blocks.Add(1)
	t.bytesIn.Add(size)
	nss.blocks.Add(1)
	nss.bytes.Add(size)
	if countPut {
		nss.puts.Add(1)
	}
	return false, nil
}

func (t *Tier) opDone(sh *shard) {
	sh.mu.Lock()
	sh.ops--
	sh.mu.Unlock()
}

// freeBlockMem returns a block's memory to the allocator and the budget.
func (t *Tier) freeBlockMem(b *block) {
	t.alloc.free(b.off, b.size)
	t.used.Add(-b.foot)
}

// Get copies the value of (ns, key) into dst (reused when its capacity is
// enough, else a new slice of exactly the value's size) and returns it with
// the block's Info. The checksum of the copy is checked, computed in the
// same pass as the copy (whatever Config.VerifyReads says): on a mismatch
// Get removes the block (the next Put stores a good copy), counts a miss
// and a checksum failure, and returns cache.ErrChecksum and no bytes.
// Errors: cache.ErrNotFound, cache.ErrInvalidKey, cache.ErrChecksum,
// cache.ErrLeaseExpired (the copy outlived its lease and the block was
// reclaimed), cache.ErrClosed.
func (t *Tier) Get(ctx context.Context, ns string, key []byte, dst []byte) ([]byte, cache.Info, error) {
	if err := t.checkKey(key); err != nil {
		return nil, cache.Info{}, err
	}
	if err := ctx.Err(); err != nil {
		return nil, cache.Info{}, err
	}
	var l Lease
	nss := t.namespace(ns)
	if err := t.acquire(&l, nss, key, t.cfg.LeaseTimeout, true, countRead); err != nil {
		return nil, cache.Info{}, err
	}
	b := l.b
	if int64(cap(dst)) >= b.size {
		dst = dst[:b.size]
	} else {
		dst = make([]byte, b.size)
	}
	// One pass: the checksum is of the bytes as read from the arena, the
	// very bytes the copy writes, so what the caller gets is what was put
	// (and a caller writing into dst meanwhile cannot fail the check).
	sum := t.copyOut(&l, dst, t.bytes(b.off, b.size))
	if err := t.release(&l); err != nil {
		return nil, cache.Info{}, err
	}
	if sum != b.crc {
		// Counted as a hit when pinned; it was a miss.
		t.misses.Add(1)
		b.ns.misses.Add(1)
		return nil, cache.Info{}, t.checksumMismatch(b, sum, true)
	}
	return dst, b.info(), nil
}

// copyOut copies src, the bytes of l's block, to dst and returns their
// CRC-32C. A fault writing dst (a caller's mapping that shrank: the engine
// API's buffer socket recovers it) releases l before it goes on up.
func (t *Tier) copyOut(l *Lease, dst, src []byte) uint32 {
	defer func() {
		if r := recover(); r != nil {
			_ = t.release(l)
			panic(r)
		}
	}()
	return crc32c.Copy(dst, src)
}

// checksumMismatch handles a read of b whose bytes have CRC-32C sum:
// removes b (removeDamaged) and returns the error the read reports. The
// caller has released its pin; the read's hit, if it counted one (hit), is
// taken back here.
func (t *Tier) checksumMismatch(b *block, sum uint32, hit bool) error {
	if hit {
		t.hits.Add(-1)
		b.ns.hits.Add(-1)
		t.bytesOut.Add(-b.size)
	}
	t.removeDamaged(b, sum, "read")
	return fmt.Errorf("%w: dram block of %d bytes (removed)", cache.ErrChecksum, b.size)
}

// removeDamaged counts and logs a block whose bytes were found to have
// CRC-32C sum instead of b.crc (by a verified read or by the scrubber, as
// by says), and removes it, so that Stat and Lookup stop reporting it and
// the next Put stores a good copy. It reports whether b was still in the
// index (not deleted, evicted or removed by another reader meanwhile).
func (t *Tier) removeDamaged(b *block, sum uint32, by string) bool {
	t.csumFails.Add(1)
	removed := t.unlink(b)
	t.lg.Error("checksum mismatch", zap.String("by", by), zap.String("ns", b.ns.name),
		zap.String("key", hex.EncodeToString([]byte(b.key))),
		zap.Int64("size", b.size), zap.Uint32("want", b.crc), zap.Uint32("got", sum), zap.Bool("removed", removed))
	return removed
}

// unlink removes b from the index if it is still there (not deleted,
// evicted or replaced meanwhile) and reports whether it did. Its memory is
// freed as Delete frees it (at once, or at the last release of a pin).
func (t *Tier) unlink(b *block) bool {
	sh, nss := b.shard, b.ns
	sh.mu.Lock()
	m := sh.m[nss.id]
	if sh.closed || m[b.key] != b {
		sh.mu.Unlock()
		return false
	}
	t.unlinkLocked(sh, nss, m, b)
	sh.mu.Unlock()
	return true
}

// unlinkLocked removes b, found in m (sh.m[nss.id]), from the index and the
// policy, counts it, and frees or parks its memory. sh.mu held.
func (t *Tier) unlinkLocked(sh *shard, nss *nsState, m map[string]*block, b *block) {
	delete(m, b.key)
	if len(m) == 0 {
		delete(sh.m, nss.id)
	}
	b.linked = false
	t.observeRemoved(b)
	t.pmu.Lock()
	t.policy.Remove(b.id)
	delete(t.byID, b.id)
	t.pmu.Unlock()
	t.dropLocked(sh, b, t.now())
	t.blocks.Add(-1)
	nss.blocks.Add(-1)
	nss.bytes.Add(-b.size)
}

// Stat returns the Info of (ns, key) and whether it is present. It neither
// pins nor counts as a read.
func (t *Tier) Stat(ctx context.Context, ns string, key []byte) (cache.Info, bool) {
	if t.checkKey(key) != nil || ctx.Err() != nil {
		return cache.Info{}, false
	}
	nss := t.lookupNamespace(ns)
	if nss == nil {
		return cache.Info{}, false
	}
	sh := t.shardFor(nss.id, key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closed {
		return cache.Info{}, false
	}
	b, ok := sh.m[nss.id][string(key)]
	if !ok {
		return cache.Info{}, false
	}
	return b.info(), true
}

// Present returns how many of keys, from the first, are present: the
// index of the first missing (or invalid) key, or len(keys). With present
// nil it stops there; else (len(present) == len(keys)) it goes on to the
// end and sets present[i] to whether key i is present, for every key. It
// resolves the namespace once and holds each key's shard lock only for the
// index lookup: the path of Lookup, which asks about hundreds of keys per
// call. Like Stat it neither pins nor counts as a read.
func (t *Tier) Present(ctx context.Context, ns string, keys [][]byte, present []bool) int {
	clear(present)
	if ctx.Err() != nil {
		return 0
	}
	nss := t.lookupNamespace(ns)
	if nss == nil {
		return 0
	}
	prefix := len(keys)
	for i, key := range keys {
		ok := t.checkKey(key) == nil
		if ok {
			sh := t.shardFor(nss.id, key)
			sh.mu.Lock()
			_, ok = sh.m[nss.id][string(key)]
			ok = ok && !sh.closed
			sh.mu.Unlock()
		}
		switch {
		case present != nil:
			present[i] = ok
			if !ok && prefix == len(keys) {
				prefix = i
			}
		case !ok:
			return i
		}
	}
	return prefix
}

// Delete removes (ns, key) and reports whether it was present. A pinned
// block leaves the index at once; its memory is freed when the last lease
// is released or expires. OnEvict is not called, and when Delete returns
// no OnEvict of the key is running: an eviction of it that was already in
// OnEvict has returned.
func (t *Tier) Delete(ctx context.Context, ns string, key []byte) (bool, error) {
	if err := t.checkKey(key); err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	nss := t.lookupNamespace(ns)
	if nss == nil {
		if t.closed.Load() {
			return false, cache.ErrClosed
		}
		return false, nil
	}
	sh := t.shardFor(nss.id, key)
	sh.mu.Lock()
	if sh.closed {
		sh.mu.Unlock()
		return false, cache.ErrClosed
	}
	m := sh.m[nss.id]
	b, ok := m[string(key)]
	if ok {
		t.unlinkLocked(sh, nss, m, b)
	}
	sh.mu.Unlock()
	k := evictKey{nss, string(key)}
	t.awaitEvictions(func() bool { return t.evictingKeys[k] > 0 })
	return ok, nil
}

// Clear removes every block of ns and returns how many were removed. Pinned
// blocks are handled as in Delete; OnEvict is not called, and when Clear
// returns no OnEvict of a block of ns is running.
func (t *Tier) Clear(ctx context.Context, ns string) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if t.closed.Load() {
		return 0, cache.ErrClosed
	}
	nss := t.lookupNamespace(ns)
	if nss == nil {
		return 0, nil
	}
	var n, bytes int64
	now := t.now()
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		if sh.closed {
			sh.mu.Unlock()
			return n, cache.ErrClosed
		}
		m := sh.m[nss.id]
		if len(m) == 0 {
			sh.mu.Unlock()
			continue
		}
		delete(sh.m, nss.id)
		t.pmu.Lock()
		for _, b := range m {
			t.policy.Remove(b.id)
			delete(t.byID, b.id)
		}
		t.pmu.Unlock()
		for _, b := range m {
			b.linked = false
			t.slots.remove(b)
			t.dropLocked(sh, b, now)
			n++
			bytes += b.size
		}
		sh.mu.Unlock()
	}
	t.blocks.Add(-n)
	nss.blocks.Add(-n)
	nss.bytes.Add(-bytes)
	if o := t.cfg.Observer; o != nil && n > 0 {
		o.Cleared(ns, tierName)
	}
	t.awaitEvictions(func() bool { return t.evictingNS[nss] > 0 })
	return n, nil
}

// tierName is this tier's name toward a cache.Observer.
const tierName = "dram"

// observeStored and observeRemoved tell the slot index and the Observer,
// if any, that b was linked into or unlinked from the index (before its
// memory can be freed). The shard lock is held.
func (t *Tier) observeStored(b *block) {
	t.slots.add(b)
	if o := t.cfg.Observer; o != nil {
		o.Stored(b.ns.name, []byte(b.key), tierName, nil)
	}
}

func (t *Tier) observeRemoved(b *block) {
	t.slots.remove(b)
	if o := t.cfg.Observer; o != nil {
		o.Removed(b.ns.name, []byte(b.key), tierName)
	}
}

// dropLocked disposes of the memory of a block just unlinked by Delete or
// Clear: freed now if unpinned or if its lease expired (the pins are
// revoked), else parked as a zombie until its last Release or its expiry.
// sh.mu must be held.
func (t *Tier) dropLocked(sh *shard, b *block, now int64) {
	if b.pins.Load() > 0 {
		if b.held(now) {
			t.zmu.Lock()
			t.zombies[b] = struct{}{}
			t.zmu.Unlock()
			return
		}
		t.revokeLocked(sh, b)
	}
	t.freeBlockMem(b)
}

// revokeLocked drops the expired pins of b: their holders' Release reports
// ErrLeaseExpired. sh.mu must be held.
func (t *Tier) revokeLocked(sh *shard, b *block) {
	b.gen++
	b.pins.Store(0)
	sh.pinned.Add(-b.foot)
}

// policyID returns the id under which the policy knows (namespace, key): a
// hash of both, so that a block evicted and stored again keeps its history
// in policies that remember ids after Remove (evict.NewPrefix counts reuse
// that way; a fresh id per admission made it no better than LRU). Hashed
// ids have the top bit set; on the rare collision with a block present now
// it falls back to a sequential id (top bit clear). Called under pmu.
func (t *Tier) policyID(nsID uint32, key string) uint64 {
	var h maphash.Hash
	h.SetSeed(t.seed)
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], nsID)
	h.Write(b[:])
	h.WriteString(key)
	id := h.Sum64() | 1<<63
	for t.byID[id] != nil {
		id = t.nextID.Add(1) &^ (1 << 63)
	}
	return id
}
