// Package dram is tidepool's DRAM tier: block bytes in large mmap-ed,
// file-backed arenas (never on the Go heap), carved by a size-class
// allocator (alloc.go), found through a sharded index, evicted through an
// evict.Policy.
//
// # Arenas
//
// The tier's Capacity (rounded up to 64 KiB pages) is split into arena files
// arena-0000.mem, arena-0001.mem, … of ArenaSize bytes (the last one may be
// shorter) in Config.Dir, normally a tmpfs volume shared with the engine.
// New removes arena files left by a previous run, checks the free space with
// statfs and reserves each file with fallocate, so that a short volume fails
// at New with ErrArenaSpace rather than with SIGBUS on a later write. Each
// file is mapped MAP_SHARED; Arenas lists them so that a client can map the
// same files, and a Lease tells where a block lives (arena, offset, length).
// Close unmaps, closes and removes the files.
//
// # Locks
//
// Lock order (a lock may only be taken while holding locks listed before it):
//
//	Tier.evictMu → shard.mu → Tier.pmu → {allocator.mu, Tier.zmu, Tier.rmu}
//
// evictMu serializes the slow path of making room (one evicter picks a
// victim at a time; OnEvict runs after evictMu is released, see evictOne);
// shard.mu guards one shard of the index and the pin state of its blocks;
// pmu guards the policy instance and the id → block map; allocator.mu and zmu
// (the set of unlinked but pinned blocks) and rmu (the open reservations)
// are leaves. The eviction path never
// holds pmu while taking a shard lock: it picks and removes the victim under
// pmu, releases it, then locks the victim's shard and re-checks.
//
// # Reads and leases
//
// A read pins its block with a lease (pin count and deadline
// Clock.Now()+lease) under the shard lock, copies or exposes the bytes
// without any lock, then unpins. Eviction passes over blocks pinned with a
// lease that has not expired. Delete and Clear unlink a pinned block from the
// index at once; its memory is freed by the last Release, or, once its lease
// has expired, by the next eviction pass. A lease whose block was reclaimed
// after expiry reports ErrLeaseExpired on Release (its bytes may have been
// reused); Get turns that into cache.ErrLeaseExpired and never returns the
// copy.
//
// # Chains (chain.go)
//
// While an eviction loses its block (no tier below takes it:
// Config.KeepsEvicted), a put never makes room by evicting its own chain
// parent: a chain larger than the room keeps a contiguous head and its
// deeper blocks are refused with cache.ErrNoSpace (the parent is
// PutOptions.Parent when the caller names it, else the block admitted
// just before, one level up). Refused blocks are shown to the policy as
// admitted and evicted at once.
//
// # Integrity (scrub.go)
//
// A block's CRC-32C is computed from the caller's bytes on Put and checked
// against the writer's on Commit. The reads that copy the bytes (Get, with
// the checksum fused into the copy; Pin, whose caller copies them into a
// socket answer) always check it; zero-copy reads in place (Acquire) only
// when Config.VerifyReads is set or the namespace is listed in
// VerifyReadsNamespaces. A block that fails is removed (removeDamaged:
// unlinked, counted in ChecksumFailures) and the read reports
// cache.ErrChecksum. Otherwise a Scrubber re-checks resident blocks at a
// bounded rate and removes those that fail the same way. A Put that
// carries PutOptions.Checksum (a block moved within the sidecar) is
// refused when its bytes do not match it.
//
// # Zero-copy puts (reserve.go)
//
// Reserve allocates a slot exactly as Put does (evicting if needed) and
// counts its footprint in the budget, but links it nowhere: Get, Stat,
// Acquire and eviction cannot see it, and the space check counts it as
// pinned. The caller writes the bytes in place (through Reservation.Bytes
// or its own MAP_SHARED mapping of the arena file), then Commit checksums
// the slot (verifying the caller's CRC-32C when given) and links the block
// as Put would; a key stored meanwhile wins and the slot is freed (existed).
// Abort frees the slot. A reservation past its deadline is reclaimed by the
// next Reap or slow-path put, and its Commit fails with
// cache.ErrLeaseExpired. Leases (Acquire) can be renewed (Lease.Renew)
// while their deadline has not passed.
//
// # Recency
//
// A read records its block id in its shard (under the shard lock it takes
// anyway); every 32 reads of a shard, and for all shards before an eviction,
// the ids are handed to the policy's Touch in one pmu critical section. The
// hot read path thus takes the policy lock once per 32 reads; recency is
// exact up to that batching. The tier relies on policies ignoring Touch and
// Remove of ids they no longer track.
//
// # Eviction
//
// Put reserves the footprint of the value against Capacity and allocates it;
// when either fails it evicts policy victims one at a time until both
// succeed. Before evicting anything it checks that the value could fit once
// every evictable block is gone (Capacity minus the footprint of pinned
// blocks); if not, it returns cache.ErrNoSpace and changes nothing. (Arena
// fragmentation by pinned blocks can still, rarely, make a put fail after
// some evictions.) Each victim is unlinked, then OnEvict is called with its
// bytes while no lock of the tier is held (OnEvict must not Put into this
// tier), then its memory is freed.
package dram

import (
	"errors"
	"fmt"
	"hash/maphash"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/evict"
	"github.com/tidepool-kv/tidepool/internal/clock"
)

// ErrArenaSpace reports that the arena volume is too small for Capacity.
var ErrArenaSpace = errors.New("dram: not enough space for the arenas")

// ArenaInfo describes one arena file (see cache.ArenaInfo).
type ArenaInfo = cache.ArenaInfo

var staleArena = regexp.MustCompile(`^arena-[0-9]{4,}\.mem$`)

func arenaPath(dir string, i int) string {
	return filepath.Join(dir, fmt.Sprintf("arena-%04d.mem", i))
}

// TierName is the name of this tier in cache.Info and cache.TierStats.
const TierName = "dram"

// Config configures a Tier. A zero field takes its default (DefaultConfig,
// applied once by New and Validate, in withDefaults); Dir has no default
// and must be set.
type Config struct {
	// Dir holds the arena files (arena-NNNN.mem, mode 0600). Created 0700 if
	// missing. Required: a zero Dir is an error (DefaultConfig suggests
	// /dev/shm/tidepool; serve derives one per socket).
	Dir string
	// Capacity is the byte budget of the tier: the sum of the footprints of
	// the stored values (a value's size rounded up to its size class or to
	// 64 KiB pages). It is also the total size of the arena files, rounded
	// up to 64 KiB. At least 1 MiB. Default 1 GiB.
	Capacity int64
	// ArenaSize is the size of one arena file in bytes, a multiple of 64 KiB
	// (default 256 MiB, capped at Capacity).
	ArenaSize int64
	// MaxValueSize is the largest value accepted, in bytes; at most ArenaSize
	// (default cache.DefaultMaxValueBytes, 64 MiB). A store behind the
	// proxy gets the proxy's cache.Limits.MaxValueBytes.
	MaxValueSize int64
	// MaxKeySize is the largest key accepted, in bytes (default
	// cache.DefaultMaxKeyBytes, 128; the proxy's cache.Limits.MaxKeyBytes
	// behind the proxy).
	MaxKeySize int
	// LeaseTimeout bounds how long a read may pin a block: Get pins for this
	// long, Acquire with lease ≤ 0 too (default 5s).
	LeaseTimeout time.Duration
	// MaxLease caps the lease an Acquire may ask for (default 1m).
	MaxLease time.Duration
	// ReserveTimeout is how long a Reserve with ttl ≤ 0 keeps its slot
	// before the tier may reclaim it (default 30s). A ttl asked for is
	// capped at max(MaxLease, ReserveTimeout).
	ReserveTimeout time.Duration
	// LazyFault skips faulting the arena pages in at New (about 0.3 s per
	// GiB): New is faster, the first write to each 4 KiB page pays a
	// fault instead. Default false.
	LazyFault bool
	// Policy makes the eviction policy (default evict.NewLRU).
	Policy evict.Factory
	// Clock is the time source for leases (default clock.Real).
	Clock clock.Clock
	// VerifyReads makes the zero-copy reads in place (Acquire) check a
	// block's bytes against its CRC-32C first, as the copying reads (Get,
	// Pin) always do: a block that fails is removed and the read reports
	// cache.ErrChecksum. Default false: the bytes were checked where they
	// entered (Put, Commit, a verified transfer, an SSD read) and only a
	// writer holding a reservation, or this process, can write the
	// arenas; the Scrubber re-checks resident blocks in the background
	// (docs/security.md, "Integrity").
	VerifyReads bool
	// VerifyReadsNamespaces lists namespaces whose reads are verified as
	// with VerifyReads, when VerifyReads is false.
	VerifyReadsNamespaces []string
	// OnEvict, if set, is called with each evicted block (never for Delete
	// or Clear), so that a tier below can take it (demotion). It runs with
	// no lock of the tier held, not even the eviction mutex: other puts
	// evict (and call OnEvict) meanwhile, so it may be called concurrently
	// and must be safe for that. The evicted block's memory stays allocated
	// until it returns. It must not Put into this tier. key and value are
	// valid only during the call and must not be modified.
	OnEvict func(ns string, key []byte, value []byte, info cache.Info)
	// KeepsEvicted, if set, reports whether OnEvict keeps the blocks it is
	// handed now (a tier below that takes writes). While it does, the
	// chain rule (chain.go) is off: evicting a chain's parent moves it
	// below instead of losing it, and a slot reservation, which has no
	// tier to go to instead, is not refused. nil: an eviction loses the
	// block, the rule is on.
	KeepsEvicted func() bool
	// Observer, if set, hears of every block linked into and unlinked from
	// the index (tier name "dram"), with a shard lock held (see
	// cache.Observer). nil: nobody is told.
	Observer cache.Observer
}

// DefaultConfig returns the defaults: a 1 GiB tier in /dev/shm/tidepool.
func DefaultConfig() Config {
	return Config{
		Dir:          "/dev/shm/tidepool",
		Capacity:     1 << 30,
		ArenaSize:    256 << 20,
		MaxValueSize: cache.DefaultMaxValueBytes,
		MaxKeySize:   cache.DefaultMaxKeyBytes,
		LeaseTimeout: 5 * time.Second,
		MaxLease:     time.Minute,
		Policy:       evict.NewLRU,

		ReserveTimeout: 30 * time.Second,
		Clock:          clock.Real{},
	}
}

// withDefaults fills the defaultable zero fields.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Capacity == 0 {
		c.Capacity = d.Capacity
	}
	if c.ArenaSize == 0 {
		c.ArenaSize = d.ArenaSize
	}
	if c.MaxValueSize == 0 {
		c.MaxValueSize = d.MaxValueSize
	}
	if c.MaxKeySize == 0 {
		c.MaxKeySize = d.MaxKeySize
	}
	if c.LeaseTimeout == 0 {
		c.LeaseTimeout = d.LeaseTimeout
	}
	if c.MaxLease == 0 {
		c.MaxLease = max(d.MaxLease, c.LeaseTimeout)
	}
	if c.ReserveTimeout == 0 {
		c.ReserveTimeout = d.ReserveTimeout
	}
	if c.Policy == nil {
		c.Policy = d.Policy
	}
	if c.Clock == nil {
		c.Clock = d.Clock
	}
	return c
}

// arenaLayout returns the total arena bytes and the effective arena size.
func (c Config) arenaLayout() (total, arenaSize int64) {
	total = (c.Capacity + pageSize - 1) &^ (pageSize - 1)
	return total, min(c.ArenaSize, total)
}

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("dram: config: "+format, args...))
	}
	if c.Dir == "" {
		bad("Dir is empty")
	}
	if c.Capacity < 1<<20 {
		bad("Capacity %d is below 1 MiB", c.Capacity)
	} else if c.Capacity/pageSize >= int64(noPage) {
		bad("Capacity %d is too large", c.Capacity)
	}
	if c.ArenaSize < 0 || c.ArenaSize%pageSize != 0 {
		bad("ArenaSize %d is not a positive multiple of 64 KiB", c.ArenaSize)
	}
	if c.MaxValueSize < 0 {
		bad("MaxValueSize %d is negative", c.MaxValueSize)
	} else if c.ArenaSize > 0 && c.ArenaSize%pageSize == 0 && c.Capacity > c.ArenaSize && c.MaxValueSize > c.ArenaSize {
		bad("MaxValueSize %d exceeds ArenaSize %d: such values could never be stored", c.MaxValueSize, c.ArenaSize)
	}
	if c.MaxKeySize < 0 || c.MaxKeySize > 1<<16 {
		bad("MaxKeySize %d is not in 1..65536", c.MaxKeySize)
	}
	if c.LeaseTimeout < 0 {
		bad("LeaseTimeout %v is negative", c.LeaseTimeout)
	}
	if c.ReserveTimeout < 0 {
		bad("ReserveTimeout %v is negative", c.ReserveTimeout)
	}
	if c.MaxLease < c.LeaseTimeout {
		bad("MaxLease %v is shorter than LeaseTimeout %v", c.MaxLease, c.LeaseTimeout)
	}
	return errors.Join(errs...)
}

// numShards is the number of index shards. A shard lock is held only for a
// map access and a pin update (tens of ns), so contention needs two requests
// on one shard at the same instant; 64 shards keep that rare for the few
// dozen request goroutines a sidecar runs on a 16–64 core node, while Clear,
// Stats and Close (which visit every shard) stay cheap. A power of two.
const numShards = 64

// touchBatch is how many reads a shard records before handing them to the
// policy in one pmu critical section.
const touchBatch = 32

// Tier is the DRAM tier. Safe for concurrent use.
type Tier struct {
	cfg       Config
	lg        *zap.Logger
	clk       clock.Clock
	arenas    []*arena
	arenaSize int64
	slots     *slotIndex // nil: none (slots.go)
	alloc     *allocator
	seed      maphash.Seed
	shards    [numShards]shard

	evictMu sync.Mutex
	// inEvict counts evictions whose OnEvict is running (their memory is
	// not freed yet); evictDone (on evictMu) is signalled as each ends.
	// Both guarded by evictMu.
	inEvict   int
	evictDone *sync.Cond
	// evictingKeys and evictingNS count, by block and by namespace, the
	// evictions whose OnEvict is running: Delete and Clear wait for those
	// of their blocks (awaitEvictions), so that when they return no
	// OnEvict of a block they removed is still to act on it (a demotion
	// would bring it back). Guarded by evictMu.
	evictingKeys map[evictKey]int
	evictingNS   map[*nsState]int

	pmu      sync.Mutex
	policy   evict.Policy
	byID     map[uint64]*block
	skipNow  int64                // time used by skip; set under pmu
	skipFunc func(id uint64) bool // t.skip, made once
	// tail is the block admitted last and refused the block the chain
	// rule refused last (chain.go); guarded by pmu. refusing is
	// refused.ok, read without pmu.
	tail, refused chainMark
	refusing      atomic.Bool

	zmu     sync.Mutex
	zombies map[*block]struct{} // unlinked blocks still pinned

	rmu           sync.Mutex
	reservations  map[*Reservation]struct{} // open reservations (reserve.go)
	reservedBytes atomic.Int64              // their footprint: never evictable
	unboundBytes  atomic.Int64              // of it, reservations not bound yet (ReserveUnbound)
	reclaimed     atomic.Int64              // reservations reclaimed after their deadline

	namespaces sync.Map        // string → *nsState
	verifyNS   map[string]bool // Config.VerifyReadsNamespaces; read only
	nextNS     atomic.Uint32
	nextID     atomic.Uint64

	used   atomic.Int64 // sum of footprints of allocated blocks
	closed atomic.Bool

	blocks, hits, misses, evictions, bytesIn, bytesOut, csumFails atomic.Int64
}

// VerifiesReads reports whether same-host reads of ns check the CRC-32C
// (Config.VerifyReads or VerifyReadsNamespaces).
func (t *Tier) VerifiesReads(ns string) bool {
	return t.cfg.VerifyReads || t.verifyNS[ns]
}

// nsState holds one namespace's id and counters.
// evictKey names a block whose eviction is in OnEvict.
type evictKey struct {
	ns  *nsState
	key string
}

type nsState struct {
	name string
	id   uint32
	// verify: same-host reads check the CRC-32C (Config.VerifyReads,
	// VerifyReadsNamespaces); set at creation, read only.
	verify                                       bool
	blocks, bytes, hits, misses, puts, evictions atomic.Int64
}

// shard is one part of the index.
type shard struct {
	mu sync.Mutex
	m  map[uint32]map[string]*block // namespace id → key → block
	// pinned is the footprint of this shard's pinned blocks (written under
	// mu, read atomically by the space check).
	pinned atomic.Int64
	// ops counts requests of this shard using arena memory; Close waits
	// for it to drop to zero before unmapping.
	ops     int
	closed  bool
	touches [touchBatch]uint64
	// nt is how many of touches are recorded (written under mu; read
	// without it by flushTouches, to pass over a shard with none).
	nt atomic.Int32
	_  [64]byte // keep neighbouring shards' locks off one cache line
}

// block is the metadata of one stored value.
type block struct {
	id    uint64
	ns    *nsState
	key   string
	off   int64 // global offset: arena index × arenaSize + offset
	size  int64
	foot  int64
	crc   uint32
	depth int32
	low   bool
	shard *shard
	// landed is when (tier clock, unix ns) the bytes were checked against
	// crc in place as they landed (Reservation.CommitChecked); 0 if not, or
	// once the first Pin used that check (Pin swaps it to 0).
	landed atomic.Int64

	// Guarded by shard.mu; pins and leaseExp are also read without it by
	// the eviction skip function (a hint, re-checked under the lock).
	linked bool
	pins   atomic.Int32 // every pin: leases and the tier's own
	// ipins counts the pins among pins that the tier holds for itself
	// (the copy of a Get, a scrub, a Pin for a socket write): they end
	// at their Release, never by a deadline, and never move leaseExp.
	ipins    atomic.Int32
	leaseExp atomic.Int64 // unix nanoseconds, latest deadline of the leases (Acquire) held now
	gen      uint32       // bumped when pins are revoked after expiry
}

// held reports whether b's bytes are protected at now: by a pin of the
// tier's own, or by a lease whose deadline has not passed. A lease past
// its deadline protects nothing, whatever pins came and went beside it.
func (b *block) held(now int64) bool {
	ip := b.ipins.Load()
	return ip > 0 || (b.pins.Load() > ip && b.leaseExp.Load() > now)
}

// pinLocked adds a pin to b (shard.mu held): one of the tier's own
// (internal) or a lease until deadline.
func (sh *shard) pinLocked(b *block, deadline int64, internal bool) {
	n := b.pins.Add(1)
	if n == 1 {
		sh.pinned.Add(b.foot)
	}
	if internal {
		b.ipins.Add(1)
		return
	}
	if n-b.ipins.Load() == 1 || deadline > b.leaseExp.Load() {
		b.leaseExp.Store(deadline) // the first lease, or a later deadline
	}
}

func (b *block) info() cache.Info {
	return cache.Info{Size: b.size, Checksum: b.crc, Depth: b.depth, Tier: TierName}
}

func (b *block) entry() evict.Entry {
	return evict.Entry{ID: b.id, Size: b.foot, Depth: b.depth, LowPriority: b.low}
}

// New validates cfg, creates and maps the arenas.
func New(cfg Config, lg *zap.Logger) (*Tier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if lg == nil {
		lg = zap.NewNop()
	}
	total, arenaSize := cfg.arenaLayout()
	al, err := newAllocator(total, arenaSize)
	if err != nil {
		return nil, err
	}
	if err := prepareDir(cfg.Dir); err != nil {
		return nil, err
	}
	if err := checkFree(cfg.Dir, total); err != nil {
		return nil, err
	}
	t := &Tier{
		cfg:       cfg,
		lg:        lg.Named("cache.dram"),
		clk:       cfg.Clock,
		arenaSize: arenaSize,
		alloc:     al,
		seed:      maphash.MakeSeed(),
		policy:    cfg.Policy(),
		byID:      make(map[uint64]*block),
		zombies:   make(map[*block]struct{}),

		reservations: make(map[*Reservation]struct{}),
	}
	t.skipFunc = t.skip
	t.evictDone = sync.NewCond(&t.evictMu)
	t.evictingKeys = make(map[evictKey]int)
	t.evictingNS = make(map[*nsState]int)
	for i := range t.shards {
		t.shards[i].m = make(map[uint32]map[string]*block)
	}
	if len(cfg.VerifyReadsNamespaces) > 0 {
		t.verifyNS = make(map[string]bool, len(cfg.VerifyReadsNamespaces))
		for _, ns := range cfg.VerifyReadsNamespaces {
			t.verifyNS[ns] = true
		}
	}
	for i, off := 0, int64(0); off < total; i, off = i+1, off+arenaSize {
		a, err := openArena(arenaPath(cfg.Dir, i), min(arenaSize, total-off), !cfg.LazyFault)
		if err != nil {
			for _, a := range t.arenas {
				a.close()
			}
			return nil, err
		}
		t.arenas = append(t.arenas, a)
	}
	// The slot index is for readers on this node (engines); the tier
	// works without it, and its readers then ask.
	if si, err := openSlotIndex(cfg.Dir, total, arenaSize); err != nil {
		t.lg.Warn("no slot index: engines ask the sidecar where each block lies", zap.Error(err))
	} else {
		t.slots = si
	}
	t.lg.Info("dram tier ready", zap.String("dir", cfg.Dir), zap.Int64("capacity", cfg.Capacity),
		zap.Int("arenas", len(t.arenas)), zap.Int64("arena_size", arenaSize))
	return t, nil
}

// Arenas describes the arena files, in index order.
func (t *Tier) Arenas() []ArenaInfo {
	out := make([]ArenaInfo, len(t.arenas))
	for i, a := range t.arenas {
		out[i] = ArenaInfo{Path: a.path, Size: int64(len(a.mem))}
	}
	return out
}

// SlotIndexPath returns the slot index file's path ("" when the tier has
// none): a table of where each block lies, for readers on this node
// (slots.go).
func (t *Tier) SlotIndexPath() string {
	if t.slots == nil {
		return ""
	}
	return t.slots.path
}

// bytes returns the arena memory of a value.
func (t *Tier) bytes(off, size int64) []byte {
	a := t.arenas[off/t.arenaSize].mem
	o := off % t.arenaSize
	return a[o : o+size : o+size]
}

// closeWait bounds how long Close waits for requests using arena memory.
var closeWait = 30 * time.Second

// Close stops the tier: new requests fail with cache.ErrClosed, requests in
// flight finish (and pins are released; past 30 s Close gives up waiting,
// logs it, and leaves the arenas mapped), then the arenas are unmapped,
// closed and removed. Leases still held lose their bytes (Lease.Bytes must
// not be used after Close). Safe to call twice.
func (t *Tier) Close() error {
	if !t.closed.CompareAndSwap(false, true) {
		return nil
	}
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		sh.closed = true
		sh.mu.Unlock()
	}
	// In-flight copies end in microseconds; pins (Pin) end when their
	// socket write does, which the engine API's drain bounds. Past
	// closeWait something holds a pin it will never release: the arenas
	// stay mapped then (a write still reading them must not fault) and
	// only their files go.
	deadline := time.Now().Add(closeWait)
	held := 0
	for i := range t.shards {
		sh := &t.shards[i]
		for {
			sh.mu.Lock()
			n := sh.ops
			sh.mu.Unlock()
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				held += n
				break
			}
			runtime.Gosched()
			time.Sleep(50 * time.Microsecond)
		}
	}
	errs := []error{t.slots.close()}
	for _, a := range t.arenas {
		if held > 0 {
			a.mem = nil // leave it mapped
		}
		errs = append(errs, a.close())
	}
	if held > 0 {
		t.lg.Error("dram tier closed with arena memory still in use; arenas left mapped",
			zap.Int("requests", held), zap.Duration("waited", closeWait))
		errs = append(errs, fmt.Errorf("dram: closed with %d requests still using arena memory", held))
	}
	t.lg.Info("dram tier closed")
	return errors.Join(errs...)
}

// Stats returns the tier's counters ("dram") and per-namespace counters
// sorted by namespace, from atomic counters (no lock held across shards).
func (t *Tier) Stats() cache.Stats {
	st := cache.Stats{Tiers: []cache.TierStats{{
		Name:             TierName,
		CapacityBytes:    t.cfg.Capacity,
		UsedBytes:        t.used.Load(),
		Blocks:           t.blocks.Load(),
		Hits:             t.hits.Load(),
		Misses:           t.misses.Load(),
		Evictions:        t.evictions.Load(),
		BytesIn:          t.bytesIn.Load(),
		BytesOut:         t.bytesOut.Load(),
		ChecksumFailures: t.csumFails.Load(),
	}}}
	t.namespaces.Range(func(_, v any) bool {
		n := v.(*nsState)
		st.Namespaces = append(st.Namespaces, cache.NamespaceStats{
			Namespace: n.name,
			Blocks:    n.blocks.Load(),
			Bytes:     n.bytes.Load(),
			Hits:      n.hits.Load(),
			Misses:    n.misses.Load(),
			Puts:      n.puts.Load(),
			Evictions: n.evictions.Load(),
		})
		return true
	})
	slices.SortFunc(st.Namespaces, func(a, b cache.NamespaceStats) int { return strings.Compare(a.Namespace, b.Namespace) })
	return st
}
