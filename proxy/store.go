package proxy

// What the proxy needs from the block store, in one place: the store
// itself, and three optional abilities that the wiring passes to New in
// Deps (nil = that feature off). The proxy never discovers an ability by
// type assertion, so this file is the whole contract. cache/tiered.Store
// implements all four (cmd/tidepool wires it); a cache/dram.Tier alone
// implements all four too (tests use it).

import (
	"context"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
)

// Store is the block store: every Proxy needs one.
type Store interface {
	Put(ctx context.Context, ns string, key, value []byte, opts cache.PutOptions) (existed bool, err error)
	Get(ctx context.Context, ns string, key, dst []byte) ([]byte, cache.Info, error)
	Stat(ctx context.Context, ns string, key []byte) (cache.Info, bool)
	// Present returns how many of keys, from the first, are present, as
	// Stat would say key by key, in one pass (Lookup). With present set
	// (as long as keys) it goes on past the first missing key and sets
	// present[i] to whether key i is present, for every key.
	Present(ctx context.Context, ns string, keys [][]byte, present []bool) int
	Delete(ctx context.Context, ns string, key []byte) (bool, error)
	Clear(ctx context.Context, ns string) (int64, error)
	Stats() cache.Stats
}

// ZeroCopyStore is the store's shared arenas (the DRAM tier's): what the
// zero-copy calls (Reserve, Commit, Abort, Acquire, Release, Renew) and
// in-place reads (GetPinned) need. Without it the zero-copy calls fail with
// ErrNoArenas and Gets copy.
type ZeroCopyStore interface {
	// Arenas describes the arena files, in index order (for Hello).
	Arenas() []cache.ArenaInfo
	// Reserve allocates a slot of size bytes for (ns, key) that stays
	// reserved for ttl (≤ 0: the store's default). cache.ErrExists when the
	// key is present in any tier.
	Reserve(ctx context.Context, ns string, key []byte, size int64, opts cache.PutOptions, ttl time.Duration) (cache.Reservation, error)
	// ReserveUnbound is Reserve for a value whose key is given later, by
	// the reservation's Bind (before Commit).
	ReserveUnbound(ctx context.Context, ns string, size int64, opts cache.PutOptions, ttl time.Duration) (cache.Reservation, error)
	// Acquire pins (ns, key) in the arenas for lease (≤ 0: the store's
	// default), bringing a block found in a slower tier into the arenas
	// first. It counts as a read.
	Acquire(ctx context.Context, ns string, key []byte, lease time.Duration) (cache.Lease, error)
	// Pin pins (ns, key) where it lies in the arenas, checksum verified as
	// reads are, until Release (no deadline): Get without the copy. It does
	// not look in slower tiers; a miss is not counted (the caller's Get
	// that follows counts it).
	Pin(ctx context.Context, ns string, key []byte) (cache.Lease, error)
	// Reap frees expired reservations and leases now, and returns how many
	// reservations it reclaimed.
	Reap() int
}

// Prefetcher brings blocks into the store's fastest tier in the
// background, and returns how many keys it queued. Without it Prefetch
// queues nothing.
type Prefetcher interface {
	Prefetch(ctx context.Context, ns string, keys [][]byte) int
}

// Scanner enumerates the blocks of the store's fastest tier (the DRAM
// tier: the blocks the eviction policy judged hot), for the rebalancer.
// Scan calls fn for each block until fn returns false; fn may use the
// store. Without it the rebalancer is off.
type Scanner interface {
	Scan(fn func(cache.BlockRef) bool)
}

// BlockNotes is the KV-event publisher's ear for what only the engine
// knows of a block (proxy/kvevents): the token ids, parent key and block
// size a put carries. Describe is called before the block is stored, so
// that the store's notification of it (cache.Observer) finds the
// description; Forget when the put then failed. Description gives it back
// (nil: none known), for the rebalancer's pushes to a block's new owners.
// None may block.
type BlockNotes interface {
	Describe(ns string, key []byte, meta *cache.BlockMeta)
	Forget(ns string, key []byte)
	Description(ns string, key []byte) *cache.BlockMeta
}

// Deps is what New needs from the rest of the sidecar. Store is required;
// each other field, when nil, turns its feature off.
type Deps struct {
	Store    Store
	ZeroCopy ZeroCopyStore // zero-copy calls and in-place reads
	Prefetch Prefetcher    // Prefetch
	Scan     Scanner       // the rebalancer (with RouteConfig.RebalanceRate)
	GPU      GPU           // the GPU calls (gpu.go)
	Notes    BlockNotes    // block descriptions for KV events
}
