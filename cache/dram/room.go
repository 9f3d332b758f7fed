package dram

import (
	"fmt"

	"github.com/tidepool-kv/tidepool/cache"
)

// reserve adds foot to the used budget if it fits.
func (t *Tier) reserve(foot int64) bool {
	for {
		u := t.used.Load()
		if u+foot > t.cfg.Capacity {
			return false
		}
		if t.used.CompareAndSwap(u, u+foot) {
			return true
		}
	}
}

// makeRoom reserves foot bytes of budget and allocates a value of size
// bytes for block nb, evicting as needed but never by the chain rule
// (chain.go); it returns the value's global offset.
func (t *Tier) makeRoom(size, foot int64, nb *chainBlock) (int64, error) {
	if foot > t.cfg.Capacity {
		return 0, fmt.Errorf("%w: value of %d bytes exceeds the dram capacity %d", cache.ErrNoSpace, size, t.cfg.Capacity)
	}
	if nb != nil && t.cfg.KeepsEvicted != nil && t.cfg.KeepsEvicted() {
		nb = nil // evictions move blocks below: the chain rule is off
	}
	if err := t.refusedChain(nb); err != nil {
		return 0, err
	}
	// Fast path: budget and arena room without evicting.
	reserved := t.reserve(foot)
	if reserved {
		if off, ok := t.alloc.alloc(size); ok {
			return off, nil
		}
	}

	t.evictMu.Lock()
	defer t.evictMu.Unlock()
	now := t.now()
	t.reapZombies(now)
	t.reapReservations(now)
	if !t.couldFit(foot, now) {
		if reserved {
			t.used.Add(-foot)
		}
		return 0, fmt.Errorf("%w: %d bytes needed, the rest of the dram tier is pinned", cache.ErrNoSpace, foot)
	}
	t.flushTouches()
	for !reserved {
		if reserved = t.reserve(foot); reserved {
			break
		}
		ok, err := t.makeProgress(now, nb)
		if err != nil {
			return 0, err
		}
		if !ok {
			return 0, fmt.Errorf("%w: %d bytes needed, nothing left to evict", cache.ErrNoSpace, foot)
		}
	}
	for {
		if off, ok := t.alloc.alloc(size); ok {
			return off, nil
		}
		ok, err := t.makeProgress(now, nb)
		if err != nil || !ok {
			t.used.Add(-foot)
		}
		if err != nil {
			return 0, err
		}
		if !ok {
			return 0, fmt.Errorf("%w: %d bytes needed, arena too fragmented by pinned blocks", cache.ErrNoSpace, foot)
		}
	}
}

// couldFit reports whether foot bytes would fit once every evictable block
// is gone. The quick answer counts every pinned block as unevictable; when
// that says no, the exact answer ignores pins whose lease has expired.
func (t *Tier) couldFit(foot, now int64) bool {
	var pinned int64
	for i := range t.shards {
		pinned += t.shards[i].pinned.Load()
	}
	pinned += t.reservedBytes.Load()
	if foot <= t.cfg.Capacity-pinned {
		return true
	}
	pinned = t.reservedBytes.Load()
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		if sh.pinned.Load() > 0 {
			for _, m := range sh.m {
				for _, b := range m {
					if b.held(now) {
						pinned += b.foot
					}
				}
			}
		}
		sh.mu.Unlock()
	}
	t.zmu.Lock()
	for b := range t.zombies {
		pinned += b.foot // reapZombies left only unexpired ones
	}
	t.zmu.Unlock()
	return foot <= t.cfg.Capacity-pinned
}

// reapZombies frees unlinked blocks whose leases have all expired.
func (t *Tier) reapZombies(now int64) {
	t.zmu.Lock()
	if len(t.zombies) == 0 {
		t.zmu.Unlock()
		return
	}
	var expired []*block
	for b := range t.zombies {
		if !b.held(now) {
			expired = append(expired, b)
		}
	}
	t.zmu.Unlock()
	for _, b := range expired {
		sh := b.shard
		sh.mu.Lock()
		t.zmu.Lock()
		_, still := t.zombies[b]
		if still && b.pins.Load() > 0 && !b.held(now) {
			delete(t.zombies, b)
			t.zmu.Unlock()
			t.revokeLocked(sh, b)
			t.freeBlockMem(b)
		} else {
			t.zmu.Unlock()
		}
		sh.mu.Unlock()
	}
}

// skip is the policy's skip function: blocks pinned with a live lease.
// Called under pmu.
func (t *Tier) skip(id uint64) bool {
	b := t.byID[id]
	return b == nil || b.held(t.skipNow)
}

// makeProgress evicts one victim for block nb or, when the policy
// has none left but other evictions are still in OnEvict, waits until one
// of them has freed its memory. It reports whether room may have been
// made; false means nothing is left to evict, an error that the chain rule
// refuses the block. Called with evictMu held and no other lock.
func (t *Tier) makeProgress(now int64, nb *chainBlock) (bool, error) {
	ok, err := t.evictOne(now, nb)
	if ok || err != nil {
		return ok, err
	}
	if t.inEvict == 0 {
		return false, nil
	}
	t.evictDone.Wait()
	return true, nil
}

// awaitEvictions waits until no eviction that busy reports (evictMu held)
// is in OnEvict. Delete and Clear call it after removing their blocks: an
// eviction unlinks its victim before OnEvict runs, so a block can be out
// of the index (Delete finds nothing) and still about to be demoted.
func (t *Tier) awaitEvictions(busy func() bool) {
	if t.cfg.OnEvict == nil {
		return
	}
	t.evictMu.Lock()
	for busy() {
		t.evictDone.Wait()
	}
	t.evictMu.Unlock()
}

// evictOne evicts the policy's next victim to make room for block nb
// (nil: no block in particular) and reports whether there was one; an
// error when the victim is the chain tail nb continues (chain.go), which
// is then left in place. Called with evictMu held and no other lock; it
// releases evictMu while OnEvict runs, so callers must not rely on state
// they read under evictMu before the call.
func (t *Tier) evictOne(now int64, nb *chainBlock) (bool, error) {
	for {
		t.pmu.Lock()
		t.skipNow = now
		id, ok := t.policy.Victim(t.skipFunc)
		if !ok {
			t.pmu.Unlock()
			return false, nil
		}
		if err := t.refuseTailLocked(nb, id); err != nil {
			t.pmu.Unlock()
			return false, err
		}
		b := t.byID[id]
		t.policy.Remove(id)
		delete(t.byID, id)
		t.pmu.Unlock()
		if b == nil {
			continue
		}

		sh := b.shard
		sh.mu.Lock()
		if !b.linked {
			sh.mu.Unlock() // deleted meanwhile
			continue
		}
		if b.pins.Load() > 0 {
			if b.held(now) {
				// Pinned since the policy looked: it is being read, so
				// keep it as most recently used.
				t.pmu.Lock()
				t.policy.Admit(b.entry()) // not a new block: the chain tail stays
				t.byID[b.id] = b
				t.pmu.Unlock()
				sh.mu.Unlock()
				continue
			}
			t.revokeLocked(sh, b)
		}
		m := sh.m[b.ns.id]
		delete(m, b.key)
		if len(m) == 0 {
			delete(sh.m, b.ns.id)
		}
		b.linked = false
		t.observeRemoved(b)
		sh.mu.Unlock()

		// b is unlinked and unpinned: nothing else can reach or free it.
		// OnEvict runs without evictMu (a demotion copies the bytes, tens
		// of µs per MiB and more under load): puts and promotions that
		// need room meanwhile evict their own victims instead of queueing
		// behind this one's copy.
		if f := t.cfg.OnEvict; f != nil {
			k := evictKey{b.ns, b.key}
			t.inEvict++
			t.evictingKeys[k]++
			t.evictingNS[b.ns]++
			t.evictMu.Unlock()
			f(b.ns.name, []byte(b.key), t.bytes(b.off, b.size), b.info())
			t.evictMu.Lock()
			t.inEvict--
			if t.evictingKeys[k]--; t.evictingKeys[k] == 0 {
				delete(t.evictingKeys, k)
			}
			if t.evictingNS[b.ns]--; t.evictingNS[b.ns] == 0 {
				delete(t.evictingNS, b.ns)
			}
			defer t.evictDone.Broadcast()
		}
		t.freeBlockMem(b)
		t.blocks.Add(-1)
		t.evictions.Add(1)
		b.ns.blocks.Add(-1)
		b.ns.bytes.Add(-b.size)
		b.ns.evictions.Add(1)
		return true, nil
	}
}
