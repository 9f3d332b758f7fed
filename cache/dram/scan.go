package dram

import "github.com/tidepool-kv/tidepool/cache"

// BlockRef describes one block present in the tier, for Scan (see
// cache.BlockRef).
type BlockRef = cache.BlockRef

// Scan calls fn for every block present in the tier until fn returns
// false. It copies one shard's entries at a time under that shard's lock and
// calls fn with no lock held, so fn may use the tier (Get, Delete, ...);
// blocks stored or removed during the scan may or may not be seen. Open
// reservations are not blocks yet and are not seen. Scan neither pins nor
// counts as a read: it does not change what the eviction policy keeps.
func (t *Tier) Scan(fn func(BlockRef) bool) {
	var refs []BlockRef
	for i := range t.shards {
		sh := &t.shards[i]
		refs = refs[:0]
		sh.mu.Lock()
		if sh.closed {
			sh.mu.Unlock()
			return
		}
		for _, m := range sh.m {
			for _, b := range m {
				refs = append(refs, BlockRef{Namespace: b.ns.name, Key: []byte(b.key), Size: b.size, Depth: b.depth, LowPriority: b.low})
			}
		}
		sh.mu.Unlock()
		for _, r := range refs {
			if !fn(r) {
				return
			}
		}
	}
}
