package dram

// EvictTo evicts policy victims (each through OnEvict, as any eviction)
// until the tier's used bytes are at most target, or nothing evictable is
// left; it returns how many blocks it evicted. The tiered store calls it
// from its watermark loop so that demotion runs ahead of need and puts
// rarely wait for room.
func (t *Tier) EvictTo(target int64) int {
	if t.closed.Load() {
		return 0
	}
	t.evictMu.Lock()
	defer t.evictMu.Unlock()
	now := t.now()
	t.reapZombies(now)
	t.flushTouches()
	n := 0
	for t.used.Load() > target {
		if ok, _ := t.evictOne(now, nil); !ok {
			break
		}
		n++
	}
	return n
}
