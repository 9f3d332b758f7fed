// Package tiered composes tidepool's DRAM tier and (optionally) its SSD
// tier into one block store with the method set the proxy needs (Put, Get,
// Stat, Delete, Clear, Stats) plus Prefetch and the zero-copy calls, which
// it forwards to the DRAM tier.
//
// # Movement between tiers
//
//   - Put lands in DRAM. A durable put (cache.PutOptions.Durable) is first
//     written through to SSD with its WAL synced, then put in DRAM; it is
//     refused (cache.ErrUnavailable) when the SSD tier is degraded or
//     absent, never acknowledged without being durable.
//   - Demotion: the DRAM tier calls the store for each block it evicts
//     (dram.Config.OnEvict, with no DRAM lock held, possibly from several
//     evicting puts at once). The store copies the bytes into a bounded
//     queue (QueueBlocks, QueueBytes) and returns;
//     a full queue drops the demotion and counts it (DemotionsDropped): by
//     default a Put never waits for the SSD. With DemotionWait, an
//     eviction that finds the queue full waits up to that long for room
//     before it drops the block, so that puts slow down to the SSD's pace
//     instead of losing blocks (DemotionWaits); reads by copy do not
//     promote while the queue is full, so they never wait for it, and a
//     block whose eviction is still copying or waiting is read from its
//     DRAM memory. Blocks the SSD tier already holds are not queued. One background writer drains the queue into SSD, with
//     the checksum the block had in DRAM (cache.PutOptions.Checksum: bytes
//     damaged in DRAM after they were checked are refused, not stored as
//     good). A block waiting in the queue is still served (Get, Stat) from
//     the queue.
//   - Promotion: a Get that misses DRAM reads SSD and copies the block into
//     DRAM (the copy stays in SSD too: the tiers are inclusive, so evicting
//     a promoted block again costs no write). Concurrent misses of one key
//     share one SSD read and one promotion (a flight per key, re-checked
//     inside the flight). A promotion may evict a DRAM victim, which is
//     demoted like any other.
//   - Prefetch queues keys present in SSD (and absent from DRAM) to be
//     promoted by background workers; a full prefetch queue drops keys.
//   - Watermarks: with an SSD tier and HighWatermark set, a background
//     loop evicts down to LowWatermark whenever DRAM use exceeds
//     HighWatermark, so that puts rarely evict inline. Without them the
//     loop is not started and demotion happens at eviction time only.
//   - Close stops the background work, drains the demotion queue, then
//     (StopSpillTimeout > 0) copies every DRAM block the SSD lacks into SSD,
//     closes SSD (which flushes its memtables) and finally DRAM. After a
//     clean Close the SSD holds every block the store held, within the
//     timeout and SSD capacity.
//
// What survives kill -9 and a clean stop in each mode is in docs/ssd.md.
//
// # Locks
//
// Lock order: demoteMu → (ssd's locks); qmu and the read flights' lock
// (internal/flight) are leaves.
// OnEvict runs with no DRAM lock held (dram releases its eviction mutex
// around it), may run concurrently with itself, and takes only qmu and
// the SSD tier's index lock (ssd.Stat); it never calls into the DRAM tier.
// demoteMu is held by the writer across "check the item is still wanted,
// write it to SSD" and by Delete and Clear around their SSD delete, so that
// a demotion racing with a delete never resurrects the block.
package tiered

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/cache/ssd"
	"github.com/tidepool-kv/tidepool/internal/flight"
)

// Config configures a Store. A zero field takes its default (DefaultConfig,
// applied once by New and Validate); a feature that can be turned off is
// turned off by a negative value.
type Config struct {
	// DRAM configures the DRAM tier. Its OnEvict must be nil: the store
	// sets it.
	DRAM dram.Config
	// SSD configures the SSD tier; nil runs DRAM only (durable puts are
	// then refused with ErrNotDurable: nothing could make them durable).
	SSD *ssd.Config
	// QueueBlocks bounds the demotion queue in blocks (default 1024).
	QueueBlocks int
	// QueueBytes bounds the demotion queue in value bytes, held on the Go
	// heap while they wait (default 256 MiB).
	QueueBytes int64
	// DemotionWait is how long an eviction that finds the demotion queue
	// full waits for room before the block is dropped. The eviction's put
	// (or the watermark loop) waits with it, and the evicted block keeps
	// its DRAM memory meanwhile: puts then go at the pace of the SSD
	// instead of dropping what it cannot keep up with. Default: off (0 or
	// negative): a full queue drops the block at once.
	DemotionWait time.Duration
	// HighWatermark and LowWatermark are fractions of the DRAM capacity:
	// above High, the background loop evicts (demotes) down to Low. Used
	// only with an SSD tier. Defaults 0.95 and 0.85; a
	// negative HighWatermark turns the loop off (LowWatermark is then
	// ignored).
	HighWatermark, LowWatermark float64
	// WatermarkInterval is how often the loop checks DRAM use
	// (default 50 ms).
	WatermarkInterval time.Duration
	// PrefetchQueue bounds the keys waiting to be prefetched (default 4096).
	PrefetchQueue int
	// PrefetchWorkers is how many goroutines promote prefetched keys
	// (default 2).
	PrefetchWorkers int
	// StopSpillTimeout bounds how long Close spends draining the demotion
	// queue and copying DRAM blocks the SSD lacks into SSD. Default: off
	// (0 or negative): no copy, and the queue is still drained for up to
	// DrainTimeout. serve turns it on (stop_spill_timeout).
	StopSpillTimeout time.Duration
	// DrainTimeout bounds how long Close drains the demotion queue when
	// StopSpillTimeout is off (default 10 s).
	DrainTimeout time.Duration
	// Observer, if set, is given to both tiers (dram.Config.Observer,
	// ssd.Config.Observer): it hears of every block entering and leaving
	// each tier. nil: nobody is told.
	Observer cache.Observer
	// Descriptions, if set, gives the description (token ids, parent,
	// block size) of a block copied from DRAM into SSD (a demotion, the
	// stop spill), which the SSD tier keeps in the block's record so that
	// it outlives a restart. nil: copies carry none (a durable put's own
	// cache.PutOptions.Meta is kept either way).
	Descriptions cache.Descriptions
}

// DefaultConfig returns the defaults: a default DRAM tier and no SSD tier.
func DefaultConfig() Config {
	return Config{
		DRAM:              dram.DefaultConfig(),
		QueueBlocks:       1024,
		QueueBytes:        256 << 20,
		HighWatermark:     0.95,
		LowWatermark:      0.85,
		WatermarkInterval: 50 * time.Millisecond,
		PrefetchQueue:     4096,
		PrefetchWorkers:   2,
		DrainTimeout:      10 * time.Second,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.QueueBlocks == 0 {
		c.QueueBlocks = d.QueueBlocks
	}
	if c.QueueBytes == 0 {
		c.QueueBytes = d.QueueBytes
	}
	if c.WatermarkInterval == 0 {
		c.WatermarkInterval = d.WatermarkInterval
	}
	if c.PrefetchQueue == 0 {
		c.PrefetchQueue = d.PrefetchQueue
	}
	if c.PrefetchWorkers == 0 {
		c.PrefetchWorkers = d.PrefetchWorkers
	}
	if c.HighWatermark == 0 {
		c.HighWatermark = d.HighWatermark
	}
	if c.LowWatermark == 0 {
		c.LowWatermark = d.LowWatermark
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = d.DrainTimeout
	}
	return c
}

// Validate reports every problem of c at once, the tiers' included.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("tiered: config: "+format, args...))
	}
	if err := c.DRAM.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.DRAM.OnEvict != nil {
		bad("DRAM.OnEvict must be nil (the store sets it)")
	}
	if c.SSD != nil {
		if err := c.SSD.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.QueueBlocks < 0 {
		bad("QueueBlocks %d is negative", c.QueueBlocks)
	}
	if c.QueueBytes < 0 {
		bad("QueueBytes %d is negative", c.QueueBytes)
	}
	if c.HighWatermark >= 0 && (c.HighWatermark > 1 || c.LowWatermark < 0 || c.LowWatermark > 1) {
		bad("watermarks %g/%g must be in [0, 1] (a negative HighWatermark turns them off)", c.HighWatermark, c.LowWatermark)
	} else if c.HighWatermark > 0 && c.LowWatermark >= c.HighWatermark {
		bad("LowWatermark %g must be below HighWatermark %g", c.LowWatermark, c.HighWatermark)
	}
	if c.WatermarkInterval < 0 {
		bad("WatermarkInterval %v is negative", c.WatermarkInterval)
	}
	if c.PrefetchQueue < 0 || c.PrefetchWorkers < 0 {
		bad("PrefetchQueue %d and PrefetchWorkers %d must not be negative", c.PrefetchQueue, c.PrefetchWorkers)
	}
	if c.DrainTimeout < 0 {
		bad("DrainTimeout %v is negative", c.DrainTimeout)
	}
	return errors.Join(errs...)
}

// Store is the tiered block store. Safe for concurrent use.
type Store struct {
	cfg  Config
	lg   *zap.Logger
	dram *dram.Tier
	ssd  *ssd.Tier // nil: DRAM only

	// Demotion queue (demote.go).
	qmu      sync.Mutex
	qcond    *sync.Cond // the writer's wake-up (queue not empty), drain's (queue emptier)
	roomCond *sync.Cond // evictions waiting for room in a full queue (DemotionWait)
	queue    []*item
	pending  map[string]*item   // queued or being written, by flight key
	evicting map[*item]struct{} // onEvicts not queued yet: copying, or waiting for room (fk, ns, info and src set)
	// removingKeys and removingNS count the Deletes (by fkey) and Clears
	// (by namespace) under way: evictions of their blocks give up
	// (removed).
	removingKeys map[string]int
	removingNS   map[string]int
	qbytes       int64
	qslots       int // queue places reserved by onEvicts still copying (they run concurrently)
	qstop        bool
	free         [][]byte // demotion buffers to reuse (demote.go, takeBuf)
	freeBytes    int64    // sum of their capacities, at most cfg.QueueBytes
	freeTrim     *time.Timer
	freeIdle     time.Duration // the queue idle this long drops free (test seam)
	lastWrite    time.Time     // when the writer last finished an item
	demoteMu     sync.Mutex
	writerWG     sync.WaitGroup
	hookWrite    func()                      // test seam: called by the writer before each SSD write
	hookEvict    func(ns string, key []byte) // test seam: called as onEvict starts, the block unlinked from DRAM

	// Read flights: concurrent misses of one key share one SSD read.
	flights *flight.Group[string, readResult]

	// Prefetch and watermark goroutines.
	prefetchCh chan prefetchReq
	stop       chan struct{}
	bg         sync.WaitGroup

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error

	promotions, demotions, demotionsDropped, demotionErrors atomic.Int64
	demotionWaits, demotionWaitNanos                        atomic.Int64
	queueHits, ssdReads, prefetchQueued, prefetchDropped    atomic.Int64
	spilled, spillMissed, watermarkEvictions                atomic.Int64
	durablePuts, prefetchReads                              atomic.Int64
	nsQueueHits                                             sync.Map // ns → *atomic.Int64
	nsPrefetchReads                                         sync.Map // ns → *atomic.Int64: SSD reads by the prefetcher
	nsSSDPuts                                               sync.Map // ns → *atomic.Int64: puts stored in SSD only
}

// nsCounter returns the counter of ns in m, creating it.
func nsCounter(m *sync.Map, ns string) *atomic.Int64 {
	c, _ := m.LoadOrStore(ns, new(atomic.Int64))
	return c.(*atomic.Int64)
}

// nsCount returns the counter of ns in m, 0 if none.
func nsCount(m *sync.Map, ns string) int64 {
	if c, ok := m.Load(ns); ok {
		return c.(*atomic.Int64).Load()
	}
	return 0
}

// fkey is the map key of (ns, key): uvarint(len(ns)) ‖ ns ‖ key.
func fkey(ns string, key []byte) string {
	b := make([]byte, 0, binary.MaxVarintLen64+len(ns)+len(key))
	b = binary.AppendUvarint(b, uint64(len(ns)))
	b = append(b, ns...)
	b = append(b, key...)
	return string(b)
}

// New validates cfg and opens the tiers: the SSD tier first (it may take a
// while to rebuild its index), then DRAM.
func New(cfg Config, lg *zap.Logger) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if lg == nil {
		lg = zap.NewNop()
	}
	s := &Store{
		cfg:          cfg,
		lg:           lg.Named("cache.tiered"),
		pending:      make(map[string]*item),
		evicting:     make(map[*item]struct{}),
		removingKeys: make(map[string]int),
		removingNS:   make(map[string]int),
		flights:      flight.New[string, readResult](nil),
		stop:         make(chan struct{}),
	}
	s.qcond = sync.NewCond(&s.qmu)
	s.roomCond = sync.NewCond(&s.qmu)
	s.freeIdle = freeIdle
	if cfg.SSD != nil {
		scfg := *cfg.SSD
		if cfg.Observer != nil {
			scfg.Observer = cfg.Observer
		}
		st, err := ssd.New(scfg, lg)
		if err != nil {
			return nil, err
		}
		s.ssd = st
	}
	dcfg := cfg.DRAM
	dcfg.OnEvict = s.onEvict
	if s.ssd != nil {
		// A DRAM eviction is a demotion while the SSD tier takes writes:
		// the DRAM chain rule applies only while it does not.
		dcfg.KeepsEvicted = func() bool { return !s.ssd.Degraded() }
	}
	if cfg.Observer != nil {
		dcfg.Observer = cfg.Observer
	}
	dt, err := dram.New(dcfg, lg)
	if err != nil {
		if s.ssd != nil {
			s.ssd.Close()
		}
		return nil, err
	}
	s.dram = dt
	s.prefetchCh = make(chan prefetchReq, cfg.PrefetchQueue)
	if s.ssd != nil {
		s.writerWG.Add(1)
		go s.writer()
		for range cfg.PrefetchWorkers {
			s.bg.Add(1)
			go s.prefetcher()
		}
		s.bg.Add(1)
		go s.prober()
		if cfg.HighWatermark > 0 {
			s.bg.Add(1)
			go s.watermarks(s.dram)
		}
	}
	return s, nil
}

// evicter is what the watermark loop needs from the DRAM tier
// (*dram.Tier; a test gives it a fake): evict policy victims (calling
// OnEvict for each) until the used bytes are at most target, returning how
// many were evicted.
type evicter interface {
	EvictTo(target int64) int
}

var _ evicter = (*dram.Tier)(nil)

// DRAM returns the DRAM tier (for its arenas and zero-copy calls).
func (s *Store) DRAM() *dram.Tier { return s.dram }

// SSD returns the SSD tier, or nil when the store runs DRAM only.
func (s *Store) SSD() *ssd.Tier { return s.ssd }

// ErrNotDurable is returned (it matches cache.ErrUnavailable) for a
// durable put on a store without an SSD tier.
var ErrNotDurable = fmt.Errorf("%w: tiered: no ssd tier, a durable put cannot be made durable", cache.ErrUnavailable)

// Put stores value under (ns, key) in DRAM. A key present in any tier is
// left as it is (existed = true). With opts.Durable and an SSD tier, the
// block is written to SSD with its WAL synced before Put returns, then put
// in DRAM; an SSD failure (degraded tier: cache.ErrUnavailable) fails the
// put, and without an SSD tier a durable put fails with ErrNotDurable.
// When DRAM cannot make room (every block pinned) a non-durable put goes
// to SSD directly. Errors are the
// tiers' (cache.ErrInvalidKey, cache.ErrTooLarge, cache.ErrNoSpace,
// cache.ErrUnavailable, cache.ErrClosed).
func (s *Store) Put(ctx context.Context, ns string, key, value []byte, opts cache.PutOptions) (existed bool, err error) {
	if s.closed.Load() {
		return false, cache.ErrClosed
	}
	if s.ssd == nil {
		if opts.Durable {
			return false, ErrNotDurable
		}
		return s.dram.Put(ctx, ns, key, value, opts)
	}
	fk := fkey(ns, key)
	if opts.Durable {
		sExisted, err := s.ssd.Put(ctx, ns, key, value, opts)
		if err != nil {
			return false, err
		}
		s.durablePuts.Add(1)
		if sExisted {
			return true, nil
		}
		if _, err := s.dram.Put(ctx, ns, key, value, opts); err != nil {
			nsCounter(&s.nsSSDPuts, ns).Add(1)
			s.lg.Debug("durable put kept in ssd only", zap.Error(err))
		}
		return false, nil
	}
	if _, ok := s.ssd.Stat(ctx, ns, key); ok {
		return true, nil
	}
	s.qmu.Lock()
	_, queued := s.pending[fk]
	s.qmu.Unlock()
	if queued {
		return true, nil
	}
	existed, err = s.dram.Put(ctx, ns, key, value, opts)
	if err != nil {
		if errors.Is(err, cache.ErrNoSpace) {
			// DRAM is pinned full: the block can still be cached below.
			dramErr := err
			existed, err = s.ssd.Put(ctx, ns, key, value, opts)
			if err == nil && !existed {
				nsCounter(&s.nsSSDPuts, ns).Add(1)
			}
			if err != nil && errors.Is(dramErr, dram.ErrChainRule) {
				// The SSD tier takes no writes (the only time DRAM applies
				// the chain rule): the answer is the rule's NO_SPACE.
				err = fmt.Errorf("%w (the ssd tier did not take it: %v)", dramErr, err)
			}
			return existed, err
		}
	}
	return existed, err
}

// Get copies the value of (ns, key) into dst (see dram.Tier.Get) from the
// fastest tier that has it: DRAM, the demotion queue, then SSD. A block
// read from SSD (or the queue) is promoted into DRAM. Bytes are verified
// against their checksum in every tier; a bad block is a miss
// (cache.ErrNotFound, wrapped with cache.ErrChecksum).
func (s *Store) Get(ctx context.Context, ns string, key []byte, dst []byte) ([]byte, cache.Info, error) {
	out, info, err := s.dram.Get(ctx, ns, key, dst)
	if err == nil || s.ssd == nil || !(errors.Is(err, cache.ErrNotFound) || errors.Is(err, cache.ErrChecksum)) {
		return out, info, err
	}
	if s.closed.Load() {
		return nil, cache.Info{}, cache.ErrClosed
	}
	v, info, err := s.fetch(ctx, ns, key)
	if err != nil {
		return nil, cache.Info{}, err
	}
	if int(cap(dst)) >= len(v) {
		dst = dst[:len(v)]
	} else {
		dst = make([]byte, len(v))
	}
	copy(dst, v)
	return dst, info, nil
}

// Stat returns the Info of (ns, key) from the first tier that has it
// (Info.Tier says which; a block waiting in the demotion queue reports
// "ssd").
func (s *Store) Stat(ctx context.Context, ns string, key []byte) (cache.Info, bool) {
	if info, ok := s.dram.Stat(ctx, ns, key); ok || s.ssd == nil {
		return info, ok
	}
	fk := fkey(ns, key)
	s.qmu.Lock()
	it := s.pending[fk]
	if it == nil {
		it = s.evictingLocked(fk)
	}
	s.qmu.Unlock()
	if it != nil {
		return it.info, true
	}
	return s.ssd.Stat(ctx, ns, key)
}

// Present returns how many of keys, from the first, are present in some
// tier, and with present set (len(present) == len(keys)) sets present[i]
// to whether key i is, for every key (see dram.Tier.Present): the DRAM
// tier answers for the keys it holds in one pass, and the keys it lacks
// are asked of each tier in turn, as Stat.
func (s *Store) Present(ctx context.Context, ns string, keys [][]byte, present []bool) int {
	n := s.dram.Present(ctx, ns, keys, present)
	if s.ssd == nil {
		return n
	}
	if present == nil {
		for ; n < len(keys); n++ {
			if _, ok := s.Stat(ctx, ns, keys[n]); !ok {
				break
			}
		}
		return n
	}
	n = len(keys)
	for i := range keys {
		if !present[i] {
			_, present[i] = s.Stat(ctx, ns, keys[i])
		}
		if !present[i] && n == len(keys) {
			n = i
		}
	}
	return n
}

// Delete removes (ns, key) from every tier (and from the demotion queue)
// and reports whether any held it.
func (s *Store) Delete(ctx context.Context, ns string, key []byte) (bool, error) {
	if s.closed.Load() {
		return false, cache.ErrClosed
	}
	if s.ssd == nil {
		return s.dram.Delete(ctx, ns, key)
	}
	// An eviction may have unlinked the block from DRAM just before the
	// DRAM Delete looks, its onEvict not registered yet: the mark makes
	// it give up, and the DRAM Delete returns only after it has.
	fk := fkey(ns, key)
	defer s.removing(s.removingKeys, fk)()
	queued := s.cancel(func(k string, _ *item) bool { return k == fk })
	d, err := s.dram.Delete(ctx, ns, key)
	if err != nil {
		return d, err
	}
	s.demoteMu.Lock()
	sd, err := s.ssd.Delete(ctx, ns, key)
	s.demoteMu.Unlock()
	return d || sd || queued > 0, err
}

// Clear removes every block of ns from every tier and returns how many
// copies were removed: a block held in both DRAM and SSD counts twice.
func (s *Store) Clear(ctx context.Context, ns string) (int64, error) {
	if s.closed.Load() {
		return 0, cache.ErrClosed
	}
	if s.ssd == nil {
		return s.dram.Clear(ctx, ns)
	}
	defer s.removing(s.removingNS, ns)() // as in Delete
	queued := s.cancel(func(_ string, it *item) bool { return it.ns == ns })
	n, err := s.dram.Clear(ctx, ns)
	if err != nil {
		return n, err
	}
	s.demoteMu.Lock()
	m, err := s.ssd.Clear(ctx, ns)
	s.demoteMu.Unlock()
	return n + m + int64(queued), err
}

// Stats returns the tiers' counters (dram, then ssd) and per-namespace
// counters summed over the tiers, so that each read the store serves
// counts once:
//   - Blocks and Bytes count copies (a block in both tiers counts twice).
//   - Hits are reads served by either tier or by the demotion queue; a
//     read that misses DRAM and is served by SSD is one hit (SSD's).
//   - Misses are reads no tier could serve (the SSD tier's misses: every
//     read that misses DRAM asks SSD).
//   - Puts are blocks stored by Put or a zero-copy commit: DRAM's, plus
//     those stored in SSD only (DRAM full, or a durable put whose DRAM copy
//     failed); promotions, demotions and the stop spill are movement, not
//     puts.
//   - Evictions are the SSD tier's (a DRAM eviction is a demotion).
//
// Reads by Prefetch are not reads of the caller: they count as neither
// hits nor misses, in the namespace and in the ssd tier figures (the
// caller's later read of the promoted block is a DRAM hit). Concurrent
// misses of one key that share one SSD read count one hit.
func (s *Store) Stats() cache.Stats {
	st := s.dram.Stats()
	if s.ssd == nil {
		return st
	}
	ss := s.ssd.Stats()
	for i := range ss.Tiers {
		ss.Tiers[i].Hits -= s.prefetchReads.Load()
	}
	st.Tiers = append(st.Tiers, ss.Tiers...)
	byNS := map[string]*cache.NamespaceStats{}
	for i := range st.Namespaces {
		n := &st.Namespaces[i]
		n.Misses, n.Evictions = 0, 0
		byNS[n.Namespace] = n
	}
	var extra []cache.NamespaceStats
	for _, n := range ss.Namespaces {
		if d := byNS[n.Namespace]; d != nil {
			d.Blocks += n.Blocks
			d.Bytes += n.Bytes
			d.Hits += n.Hits
			d.Misses = n.Misses
			d.Evictions = n.Evictions
			continue
		}
		n.Puts = 0
		extra = append(extra, n)
	}
	st.Namespaces = append(st.Namespaces, extra...)
	for i := range st.Namespaces {
		n := &st.Namespaces[i]
		n.Hits += nsCount(&s.nsQueueHits, n.Namespace) - nsCount(&s.nsPrefetchReads, n.Namespace)
		n.Puts += nsCount(&s.nsSSDPuts, n.Namespace)
	}
	slices.SortFunc(st.Namespaces, func(a, b cache.NamespaceStats) int { return strings.Compare(a.Namespace, b.Namespace) })
	return st
}

// Movement is a snapshot of the store's movement counters.
type Movement struct {
	// Promotions counts blocks copied from SSD (or the demotion queue)
	// into DRAM by a read or a prefetch.
	Promotions int64
	// Demotions counts evicted DRAM blocks written to SSD.
	Demotions int64
	// DemotionsDropped counts evicted DRAM blocks not written to SSD: the
	// queue was full, or the store was closing.
	DemotionsDropped int64
	// DemotionErrors counts demotions the SSD tier refused (degraded,
	// no space).
	DemotionErrors int64
	// DemotionWaits counts evictions that found the queue full and waited
	// for room (DemotionWait), and DemotionWaitTime is their total wait,
	// whether they got room or were dropped at the end of it.
	DemotionWaits    int64
	DemotionWaitTime time.Duration
	// QueueBlocks and QueueBytes are the demotions waiting now.
	QueueBlocks, QueueBytes int64
	// QueueHits counts reads served from the demotion queue.
	QueueHits int64
	// SSDReads counts reads of the SSD tier by the store (one per flight:
	// concurrent misses of one key share one).
	SSDReads int64
	// PrefetchQueued and PrefetchDropped count keys queued by Prefetch and
	// keys dropped because the prefetch queue was full.
	PrefetchQueued, PrefetchDropped int64
	// DurablePuts counts puts written through to SSD.
	DurablePuts int64
	// Spilled counts DRAM blocks copied to SSD by Close; SpillMissed those
	// it could not copy (timeout, SSD refused).
	Spilled, SpillMissed int64
	// WatermarkEvictions counts blocks evicted ahead of need.
	WatermarkEvictions int64
	// Watermarks is true when the watermark loop runs.
	Watermarks bool
	// SSD is the SSD tier's health (nil without an SSD tier).
	SSD *ssd.Health
}

// Movement returns the movement counters and the SSD tier's health.
func (s *Store) Movement() Movement {
	s.qmu.Lock()
	qb, qn := s.qbytes, int64(len(s.pending))
	s.qmu.Unlock()
	m := Movement{
		Promotions:         s.promotions.Load(),
		Demotions:          s.demotions.Load(),
		DemotionsDropped:   s.demotionsDropped.Load(),
		DemotionErrors:     s.demotionErrors.Load(),
		DemotionWaits:      s.demotionWaits.Load(),
		DemotionWaitTime:   time.Duration(s.demotionWaitNanos.Load()),
		QueueBlocks:        qn,
		QueueBytes:         qb,
		QueueHits:          s.queueHits.Load(),
		SSDReads:           s.ssdReads.Load(),
		PrefetchQueued:     s.prefetchQueued.Load(),
		PrefetchDropped:    s.prefetchDropped.Load(),
		DurablePuts:        s.durablePuts.Load(),
		Spilled:            s.spilled.Load(),
		SpillMissed:        s.spillMissed.Load(),
		WatermarkEvictions: s.watermarkEvictions.Load(),
	}
	if s.ssd != nil {
		m.Watermarks = s.cfg.HighWatermark > 0
		h := s.ssd.Health()
		m.SSD = &h
	}
	return m
}

// Close stops the store: background work stops, the demotion queue is
// drained, DRAM blocks the SSD lacks are copied into it (when
// StopSpillTimeout > 0), then the SSD tier is closed (flushing it) and the
// DRAM tier. Callers must have stopped calling the store. Safe to call
// twice.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		close(s.stop)
		s.bg.Wait()
		var errs []error
		if s.ssd != nil {
			wait := s.cfg.StopSpillTimeout
			if wait <= 0 {
				wait = s.cfg.DrainTimeout
			}
			deadline := time.Now().Add(wait)
			s.drain(deadline)
			s.stopWriter()
			if s.cfg.StopSpillTimeout > 0 {
				s.spill(deadline)
			}
			errs = append(errs, s.ssd.Close())
		}
		errs = append(errs, s.dram.Close())
		s.closeErr = errors.Join(errs...)
		m := s.Movement()
		s.lg.Info("tiered store closed", zap.Int64("demotions", m.Demotions),
			zap.Int64("demotions_dropped", m.DemotionsDropped), zap.Int64("promotions", m.Promotions),
			zap.Int64("spilled", m.Spilled), zap.Int64("spill_missed", m.SpillMissed))
	})
	return s.closeErr
}

// description is the block's description for its copy into SSD (nil:
// none known, or no Config.Descriptions).
func (s *Store) description(ns string, key []byte) *cache.BlockMeta {
	if s.cfg.Descriptions == nil {
		return nil
	}
	return s.cfg.Descriptions.Description(ns, key)
}

// spill copies DRAM blocks the SSD lacks into SSD until deadline. The
// blocks are listed by dram.Scan once the writers have stopped; each is
// re-checked, since it may have left DRAM since.
func (s *Store) spill(deadline time.Time) {
	var refs []cache.BlockRef
	s.dram.Scan(func(r cache.BlockRef) bool {
		refs = append(refs, r)
		return true
	})
	ctx := context.Background()
	var buf []byte
	for i, r := range refs {
		if time.Now().After(deadline) {
			s.spillMissed.Add(int64(len(refs) - i))
			s.lg.Warn("stop spill timed out", zap.Int("left", len(refs)-i))
			return
		}
		ns, key := r.Namespace, r.Key
		if _, ok := s.ssd.Stat(ctx, ns, key); ok {
			continue
		}
		v, info, err := s.dram.Get(ctx, ns, key, buf)
		if err != nil {
			continue // evicted or deleted since: nothing to spill
		}
		buf = v
		opts := cache.PutOptions{Depth: r.Depth, LowPriority: r.LowPriority, Checksum: info.Checksum, HasChecksum: true,
			Meta: s.description(ns, key)}
		if _, err := s.ssd.Put(ctx, ns, key, v, opts); err != nil {
			s.spillMissed.Add(1)
			continue
		}
		s.spilled.Add(1)
	}
}
