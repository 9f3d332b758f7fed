package proxy

// The zero-copy calls (DESIGN.md §4, docs/zerocopy.md): the engine maps the
// DRAM tier's arena files, writes reserved slots in place and reads pinned
// blocks in place; only small control messages cross the socket.
//
// The proxy keeps two tables of handles, by random 63-bit id: open
// reservations (token → cache.Reservation) and held leases (lease id →
// cache.Lease). An id leaves its table at Commit/Abort/Release, or when it
// is found past its deadline. Expiry needs no goroutine: every zero-copy
// call sweeps the tables when the last sweep is older than sweepEvery, and
// ZeroCopyStats sweeps always (so a metrics scrape keeps the counters and
// the tables current on an idle node). The memory itself never waits for a
// sweep: an expired lease no longer protects its block from eviction, and
// the tier reclaims expired reservations when a put needs room.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
)

// Errors of the zero-copy calls. Both id errors map to LEASE_EXPIRED.
var (
	// ErrNoReservation: the token is unknown, was already committed or
	// aborted, or its deadline passed.
	ErrNoReservation = errors.New("proxy: unknown or expired reservation token")
	// ErrNoLease: the lease id is unknown, was already released, or its
	// deadline passed.
	ErrNoLease = errors.New("proxy: lease not held")
	// ErrNoArenas: the proxy has no ZeroCopyStore (Deps.ZeroCopy).
	ErrNoArenas = errors.New("proxy: the store has no shared arenas")
)

// ArenaLayoutVersion is the version of the arena layout that Hello reports:
// a slot is the byte range [offset, offset+length) of arena file `arena`,
// holding exactly the value's bytes (no header), and the checksum is the
// CRC-32C (Castagnoli) of those bytes. Clients refuse other versions.
const ArenaLayoutVersion = 1

// sweepEvery is the least time between two sweeps of the handle tables by
// the zero-copy calls.
const sweepEvery = 250 * time.Millisecond

// maxHandles bounds each table, so that a runaway client cannot grow the
// sidecar's heap without bound (each lease also pins DRAM).
const maxHandles = 1 << 20

// Slot is where a reserved or pinned block's bytes lie in the shared arenas.
type Slot struct {
	Arena  int
	Offset int64
	Length int64
}

// ReserveItem is one slot asked for by Reserve. An Unbound one has no Key:
// it is given at Commit (CommitItem.Key), so that a writer can hold a slot
// ready before it knows what it will put there.
type ReserveItem struct {
	Key     []byte
	Size    int64
	Depth   int32
	Unbound bool
}

// ReserveResult is one item of Reserve: Err is nil (write Size bytes at
// Slot, then Commit Token before Deadline), cache.ErrExists (the key is
// present: nothing to write), or the item's error.
type ReserveResult struct {
	Slot     Slot
	Token    int64
	Deadline time.Time
	Err      error
}

// CommitItem is one reservation to publish. When HasChecksum, Checksum is
// the CRC-32C of the bytes written and is verified; else the server
// computes it. Key and Depth are those of an unbound reservation (empty
// for one made with its key). NextSize > 0 asks CommitNext for an unbound
// reservation of that size in the same namespace, for the writer's next
// put.
type CommitItem struct {
	Token       int64
	Checksum    uint32
	HasChecksum bool
	Key         []byte
	Depth       int32
	NextSize    int64
	// Meta describes the block for KV events (optional).
	Meta *cache.BlockMeta
}

// AcquireResult is one key of Acquire: Err is nil (the block is pinned at
// Slot until Release or Deadline), cache.ErrNotFound, or the item's error.
type AcquireResult struct {
	Slot     Slot
	LeaseID  int64
	Info     cache.Info
	Deadline time.Time
	Err      error
}

// ZeroCopyStats is a snapshot of the zero-copy counters.
type ZeroCopyStats struct {
	LiveReservations int64 // open reservations (gauge)
	// ReservedAhead is how many of them are slots reserved ahead (unbound:
	// their key comes with Commit) (gauge).
	ReservedAhead int64
	LiveLeases    int64 // held leases (gauge)
	Reserved      int64 // slots reserved
	Committed     int64 // reservations published
	CommitExists  int64 // commits that found the key already stored
	Aborted       int64 // reservations aborted by the client
	// ReservationsReclaimed counts reservations dropped because their
	// deadline passed before Commit or Abort.
	ReservationsReclaimed int64
	Acquired              int64 // leases granted
	Released              int64 // leases released in time
	Renewed               int64 // lease renewals
	// LeaseExpirations counts leases whose deadline passed before Release
	// (found by a sweep, a late Release or a late Renew).
	LeaseExpirations int64
}

// reserved is an open reservation with what a cluster push needs.
type reserved struct {
	r    cache.Reservation
	ns   string
	key  []byte // nil until an unbound reservation is bound
	opts cache.PutOptions
	ttl  time.Duration // as asked (CommitNext's reservations get the same)
}

// zcState is a proxy's zero-copy state (the field Proxy.zc).
type zcState struct {
	mu           sync.Mutex
	reservations map[int64]*reserved
	leases       map[int64]cache.Lease
	lastSweep    time.Time

	reserved, committed, commitExists, aborted, reclaimed     atomic.Int64
	acquired, released, renewed, leaseExpirations, liveLeases atomic.Int64
	liveReservations                                          atomic.Int64
}

// newZCState returns empty handle tables (New makes one per Proxy).
func newZCState() *zcState {
	return &zcState{reservations: map[int64]*reserved{}, leases: map[int64]cache.Lease{}}
}

// zeroCopyStore returns the store's zero-copy view, and the state.
func (p *Proxy) zeroCopyStore() (ZeroCopyStore, *zcState, error) {
	if p.zcs == nil {
		return nil, nil, ErrNoArenas
	}
	p.zc.maybeSweep(p.zcs)
	return p.zcs, p.zc, nil
}

// Arenas describes the shared arena files for Hello (nil when the store has
// none) and the layout version.
func (p *Proxy) Arenas() ([]cache.ArenaInfo, int) {
	if p.zcs == nil {
		return nil, ArenaLayoutVersion
	}
	return p.zcs.Arenas(), ArenaLayoutVersion
}

// SlotIndexPath returns the path of the store's slot index, a table of
// where each DRAM block lies that engines on this node read without a
// call (cache/dram/slots.go); "" when the store has none.
func (p *Proxy) SlotIndexPath() string {
	if si, ok := p.zcs.(interface{ SlotIndexPath() string }); ok {
		return si.SlotIndexPath()
	}
	return ""
}

// newID returns a random positive id not in use (s.mu held): ids are hard
// to guess, so that one client cannot release another's lease by accident
// or on purpose.
func newID[T any](m map[int64]T) int64 {
	for {
		id := rand.Int64()
		if _, taken := m[id]; id != 0 && !taken {
			return id
		}
	}
}

func (s *zcState) maybeSweep(zs ZeroCopyStore) {
	s.mu.Lock()
	due := time.Since(s.lastSweep) >= sweepEvery
	s.mu.Unlock()
	if due {
		s.sweep(zs)
	}
}

// sweep drops expired handles from the tables and lets the store reap (zs
// nil: a proxy without shared arenas, whose tables are empty).
func (s *zcState) sweep(zs ZeroCopyStore) {
	var rs []cache.Reservation
	var ls []cache.Lease
	s.mu.Lock()
	s.lastSweep = time.Now()
	for id, e := range s.reservations {
		if e.r.Expired() {
			delete(s.reservations, id)
			rs = append(rs, e.r)
		}
	}
	for id, l := range s.leases {
		if l.Expired() {
			delete(s.leases, id)
			ls = append(ls, l)
		}
	}
	s.mu.Unlock()
	for _, r := range rs {
		_ = r.Abort() // may have been reclaimed by the tier already
	}
	for _, l := range ls {
		_ = l.Release()
	}
	s.reclaimed.Add(int64(len(rs)))
	s.liveReservations.Add(-int64(len(rs)))
	s.leaseExpirations.Add(int64(len(ls)))
	s.liveLeases.Add(-int64(len(ls)))
	if zs != nil {
		zs.Reap()
	}
}

// ZeroCopyStats sweeps the handle tables and returns the counters.
func (p *Proxy) ZeroCopyStats() ZeroCopyStats {
	s := p.zc
	s.sweep(p.zcs)
	return ZeroCopyStats{
		LiveReservations:      s.liveReservations.Load(),
		ReservedAhead:         s.reservedAhead(),
		LiveLeases:            s.liveLeases.Load(),
		Reserved:              s.reserved.Load(),
		Committed:             s.committed.Load(),
		CommitExists:          s.commitExists.Load(),
		Aborted:               s.aborted.Load(),
		ReservationsReclaimed: s.reclaimed.Load(),
		Acquired:              s.acquired.Load(),
		Released:              s.released.Load(),
		Renewed:               s.renewed.Load(),
		LeaseExpirations:      s.leaseExpirations.Load(),
	}
}

func checkDuration(name string, d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("%w: %s %v is negative", ErrInvalidArgument, name, d)
	}
	return nil
}

func checkIDs(p *Proxy, n int) error {
	if n == 0 {
		return nil
	}
	return p.checkBatch(n)
}

// Reserve allocates slots for blocks of ns that the caller writes in place
// and then publishes with Commit (or frees with Abort) before their
// deadline (ttl ≤ 0: the store's default). A request-level problem is
// returned as err; per-item outcomes are in results, in order.
func (p *Proxy) Reserve(ctx context.Context, ns string, items []ReserveItem, ttl time.Duration, durable bool) ([]ReserveResult, error) {
	if err := p.checkBatch(len(items)); err != nil {
		return nil, err
	}
	if err := checkDuration("reservation ttl", ttl); err != nil {
		return nil, err
	}
	if err := p.admitNamespace(ns); err != nil {
		return nil, err
	}
	zs, s, err := p.zeroCopyStore()
	if err != nil {
		return nil, err
	}
	out := make([]ReserveResult, len(items))
	for i, it := range items {
		if it.Unbound {
			if len(it.Key) != 0 {
				out[i].Err = fmt.Errorf("%w: an unbound reservation has no key (it is given at Commit)", ErrInvalidArgument)
				continue
			}
			out[i] = p.reserveUnbound(ctx, zs, s, ns, it.Size, cache.PutOptions{Depth: it.Depth, Durable: durable}, ttl)
			continue
		}
		if out[i].Err = p.checkKey(it.Key); out[i].Err != nil {
			continue
		}
		if out[i].Err = p.checkSize(it.Size); out[i].Err != nil {
			continue
		}
		opts := p.router().localOpts(ns, it.Key, cache.PutOptions{Depth: it.Depth, Durable: durable}) // as in Put
		r, err := zs.Reserve(ctx, ns, it.Key, it.Size, opts, ttl)
		if err != nil {
			out[i].Err = err
			continue
		}
		out[i] = s.addReservation(&reserved{r: r, ns: ns, key: bytes.Clone(it.Key), opts: opts, ttl: ttl})
	}
	return out, nil
}

func (p *Proxy) checkSize(size int64) error {
	switch {
	case size < 0:
		return fmt.Errorf("%w: size %d is negative", ErrInvalidArgument, size)
	case size > p.cfg.MaxValueBytes:
		return fmt.Errorf("%w: reservation of %d bytes, limit %d", cache.ErrTooLarge, size, p.cfg.MaxValueBytes)
	}
	return nil
}

// reserveUnbound reserves a slot of size bytes in ns whose key is given at
// Commit.
func (p *Proxy) reserveUnbound(ctx context.Context, zs ZeroCopyStore, s *zcState, ns string, size int64, opts cache.PutOptions, ttl time.Duration) ReserveResult {
	if err := p.checkSize(size); err != nil {
		return ReserveResult{Err: err}
	}
	r, err := zs.ReserveUnbound(ctx, ns, size, opts, ttl)
	if err != nil {
		return ReserveResult{Err: err}
	}
	return s.addReservation(&reserved{r: r, ns: ns, opts: opts, ttl: ttl})
}

// addReservation gives e a token, or aborts it when the table is full.
func (s *zcState) addReservation(e *reserved) ReserveResult {
	s.mu.Lock()
	if len(s.reservations) >= maxHandles {
		s.mu.Unlock()
		_ = e.r.Abort()
		return ReserveResult{Err: fmt.Errorf("%w: %d reservations open", cache.ErrNoSpace, maxHandles)}
	}
	id := newID(s.reservations)
	s.reservations[id] = e
	s.mu.Unlock()
	s.reserved.Add(1)
	s.liveReservations.Add(1)
	a, off, n := e.r.Location()
	return ReserveResult{Slot: Slot{Arena: a, Offset: off, Length: n}, Token: id, Deadline: e.r.Deadline()}
}

// reservedAhead counts the unbound reservations in the table.
func (s *zcState) reservedAhead() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, e := range s.reservations {
		if e.key == nil {
			n++
		}
	}
	return n
}

// takeReservation removes a token from the table.
func (s *zcState) takeReservation(token int64) (*reserved, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reservations[token]
	if ok {
		delete(s.reservations, token)
		s.liveReservations.Add(-1)
	}
	return r, ok
}

// Commit publishes reserved slots. Per item: nil, cache.ErrExists (the key
// was stored meanwhile; the slot is freed), ErrNoReservation (unknown,
// already committed or aborted, or expired token), cache.ErrChecksum (the
// bytes do not match the checksum given; the slot is freed).
// CommitItem.NextSize is ignored (see CommitNext).
func (p *Proxy) Commit(ctx context.Context, items []CommitItem) ([]error, error) {
	out, _, err := p.commit(ctx, items, false)
	return out, err
}

// CommitNext is Commit that also reserves, for each item with NextSize >
// 0, an unbound slot of that size in the item's namespace with its ttl and
// durability (next[i]; next is nil when no item asked). An item's next
// reservation does not depend on its commit succeeding.
func (p *Proxy) CommitNext(ctx context.Context, items []CommitItem) (out []error, next []ReserveResult, err error) {
	return p.commit(ctx, items, true)
}

func (p *Proxy) commit(ctx context.Context, items []CommitItem, withNext bool) ([]error, []ReserveResult, error) {
	if err := checkIDs(p, len(items)); err != nil {
		return nil, nil, err
	}
	zs, s, err := p.zeroCopyStore()
	if err != nil {
		return nil, nil, err
	}
	out := make([]error, len(items))
	var next []ReserveResult
	rt := p.router()
	var pushes map[string][]PutItem // ns → committed blocks for their owners
	for i, it := range items {
		e, ok := s.takeReservation(it.Token)
		if !ok {
			out[i] = fmt.Errorf("%w: token %d", ErrNoReservation, it.Token)
			continue
		}
		if withNext && it.NextSize > 0 {
			if next == nil {
				next = make([]ReserveResult, len(items))
			}
			next[i] = p.reserveUnbound(ctx, zs, s, e.ns, it.NextSize, cache.PutOptions{Durable: e.opts.Durable}, e.ttl)
		}
		if err := p.bind(e, it, rt); err != nil {
			if errors.Is(err, cache.ErrExists) {
				s.commitExists.Add(1)
			}
			_ = e.r.Abort()
			out[i] = err
			continue
		}
		if err := p.checkMeta(it.Meta); err != nil {
			_ = e.r.Abort()
			out[i] = err
			continue
		}
		r := e.r
		var value []byte
		push := rt != nil && rt.pushesElsewhere(e.ns, e.key)
		if (push || e.opts.Durable) && !r.Expired() {
			// The slot is still reserved (stable, not evictable): copy it
			// for the other owners and the persistent tier now, since once
			// published it may be evicted. A block only this node owns is
			// not copied.
			value = bytes.Clone(r.Bytes())
		}
		done := p.describe(e.ns, e.key, it.Meta)
		existed, err := r.Commit(ctx, it.Checksum, it.HasChecksum)
		done(err)
		opts := e.opts
		opts.Meta = it.Meta // kept with the durable copy, sent to the owners
		if err == nil && !existed && e.opts.Durable && value != nil {
			// A durable reservation is acknowledged only once the block is
			// on persistent storage, as a durable Put is: the store writes
			// it through (its DRAM copy is already there, so that half is a
			// no-op). A store without a persistent tier ignores Durable.
			if _, perr := p.store.Put(ctx, e.ns, e.key, value, opts); perr != nil {
				err = fmt.Errorf("committed, but not made durable: %w", perr)
			}
		}
		if err == nil && !existed && value != nil && push {
			if pushes == nil {
				pushes = map[string][]PutItem{}
			}
			pushes[e.ns] = append(pushes[e.ns], PutItem{Key: e.key, Value: value, Opts: opts})
		}
		if err == nil && !existed && !push && e.opts.LowPriority && rt != nil {
			// Reserved as a copy of a block owned elsewhere, whose owner
			// has left the ring since: owed to it (owed.go).
			rt.owe(e.ns, []PutItem{{Key: e.key}})
		}
		switch {
		case errors.Is(err, cache.ErrLeaseExpired):
			s.reclaimed.Add(1)
			out[i] = fmt.Errorf("%w: token %d: %w", ErrNoReservation, it.Token, err)
		case err != nil:
			out[i] = err
		case existed:
			s.commitExists.Add(1)
			out[i] = cache.ErrExists
		default:
			s.committed.Add(1)
		}
	}
	// Like any put: committed blocks go to their owners, in the background
	// (a reservation carries no SyncReplicas: the wire's Reserve and Commit
	// have no sync_replicas).
	for ns, its := range pushes {
		if err := rt.push(ctx, ns, its, 0, true); err != nil {
			p.lg.Debug("push of committed blocks failed", zap.String("ns", ns), zap.Error(err))
		}
	}
	return out, next, nil
}

// bind gives an unbound reservation the key, depth and priority of its
// commit item; a bound one must come without a key.
func (p *Proxy) bind(e *reserved, it CommitItem, rt *router) error {
	if e.key != nil {
		if len(it.Key) != 0 {
			return fmt.Errorf("%w: token %d was reserved with its key; commit it without one", ErrInvalidArgument, it.Token)
		}
		return nil
	}
	if len(it.Key) == 0 {
		return fmt.Errorf("%w: token %d is unbound: its commit needs the key", ErrInvalidArgument, it.Token)
	}
	if err := p.checkKey(it.Key); err != nil {
		return err
	}
	opts := e.opts
	opts.Depth = it.Depth
	opts.LowPriority = rt != nil && !rt.owns(e.ns, it.Key) // a copy of a block owned elsewhere, as in Put
	if err := e.r.Bind(it.Key, opts); err != nil {
		return err
	}
	e.key, e.opts = bytes.Clone(it.Key), opts
	return nil
}

// Abort frees reserved slots. Per item: nil or ErrNoReservation.
func (p *Proxy) Abort(ctx context.Context, tokens []int64) ([]error, error) {
	if err := checkIDs(p, len(tokens)); err != nil {
		return nil, err
	}
	_, s, err := p.zeroCopyStore()
	if err != nil {
		return nil, err
	}
	out := make([]error, len(tokens))
	for i, tok := range tokens {
		e, ok := s.takeReservation(tok)
		if !ok {
			out[i] = fmt.Errorf("%w: token %d", ErrNoReservation, tok)
			continue
		}
		if err := e.r.Abort(); err != nil {
			s.reclaimed.Add(1)
			out[i] = fmt.Errorf("%w: token %d: %w", ErrNoReservation, tok, err)
			continue
		}
		s.aborted.Add(1)
	}
	return out, nil
}

// Acquire pins blocks of ns in the shared arenas for lease (≤ 0: the
// store's default; capped by it), bringing a block found in a slower tier
// into DRAM first. Per key: nil (pinned at Slot: Release it before
// Deadline), cache.ErrNotFound, or the item's error. The caller MUST
// Release every lease it gets, or let it expire.
func (p *Proxy) Acquire(ctx context.Context, ns string, keys [][]byte, lease time.Duration, scope Scope) ([]AcquireResult, error) {
	if err := p.checkBatch(len(keys)); err != nil {
		return nil, err
	}
	if err := checkDuration("lease", lease); err != nil {
		return nil, err
	}
	if err := p.checkNamespace(ns); err != nil {
		return nil, err
	}
	zs, s, err := p.zeroCopyStore()
	if err != nil {
		return nil, err
	}
	out := make([]AcquireResult, len(keys))
	for i, k := range keys {
		res := &out[i]
		if res.Err = p.checkKey(k); res.Err != nil {
			continue
		}
		l, err := zs.Acquire(ctx, ns, k, lease)
		if errors.Is(err, cache.ErrNotFound) && p.fetchRemote(ctx, ns, k, scope) {
			l, err = zs.Acquire(ctx, ns, k, lease)
		}
		if err != nil {
			res.Err = err
			continue
		}
		s.mu.Lock()
		if len(s.leases) >= maxHandles {
			s.mu.Unlock()
			_ = l.Release()
			res.Err = fmt.Errorf("%w: %d leases held", cache.ErrNoSpace, maxHandles)
			continue
		}
		id := newID(s.leases)
		s.leases[id] = l
		s.mu.Unlock()
		s.acquired.Add(1)
		s.liveLeases.Add(1)
		a, off, n := l.Location()
		*res = AcquireResult{Slot: Slot{Arena: a, Offset: off, Length: n}, LeaseID: id, Info: l.Info(), Deadline: l.Deadline()}
	}
	return out, nil
}

// fetchRemote brings a block that the store's Acquire missed (the store
// looked in its slower tiers already) from its owner straight into the
// arenas, for a cluster-scope read on a clustered node, and reports whether
// it is there now.
func (p *Proxy) fetchRemote(ctx context.Context, ns string, key []byte, scope Scope) bool {
	r := p.clusterRouter(scope)
	return r != nil && r.fetch(ctx, ns, [][]byte{key})[0] == nil
}

// takeLease removes a lease id from the table.
func (s *zcState) takeLease(id int64) (cache.Lease, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.leases[id]
	if ok {
		delete(s.leases, id)
		s.liveLeases.Add(-1)
	}
	return l, ok
}

// Release unpins leased blocks. Per item: nil, ErrNoLease (unknown or
// already released id), or cache.ErrLeaseExpired (released after its
// deadline: bytes read through it since may be wrong; the pin is dropped
// all the same).
func (p *Proxy) Release(ctx context.Context, ids []int64) ([]error, error) {
	if err := checkIDs(p, len(ids)); err != nil {
		return nil, err
	}
	_, s, err := p.zeroCopyStore()
	if err != nil {
		return nil, err
	}
	out := make([]error, len(ids))
	for i, id := range ids {
		l, ok := s.takeLease(id)
		if !ok {
			out[i] = fmt.Errorf("%w: lease %d (unknown, released or expired)", ErrNoLease, id)
			continue
		}
		expired := l.Expired()
		if err := l.Release(); err != nil || expired {
			s.leaseExpirations.Add(1)
			out[i] = fmt.Errorf("%w: lease %d released after its deadline", cache.ErrLeaseExpired, id)
			continue
		}
		s.released.Add(1)
	}
	return out, nil
}

// Renew extends leases to lease from now (≤ 0: the store's default).
// Per item: nil, ErrNoLease, or cache.ErrLeaseExpired (the deadline had
// passed: the lease is dropped). deadline is the earliest new deadline of
// the renewed leases (zero when none was).
func (p *Proxy) Renew(ctx context.Context, ids []int64, lease time.Duration) (results []error, deadline time.Time, err error) {
	if err := checkIDs(p, len(ids)); err != nil {
		return nil, time.Time{}, err
	}
	if err := checkDuration("lease", lease); err != nil {
		return nil, time.Time{}, err
	}
	_, s, err := p.zeroCopyStore()
	if err != nil {
		return nil, time.Time{}, err
	}
	out := make([]error, len(ids))
	for i, id := range ids {
		s.mu.Lock()
		l, ok := s.leases[id]
		s.mu.Unlock()
		if !ok {
			out[i] = fmt.Errorf("%w: lease %d (unknown, released or expired)", ErrNoLease, id)
			continue
		}
		d, err := l.Renew(lease)
		if err != nil {
			if l2, ok := s.takeLease(id); ok && l2 == l {
				_ = l.Release()
				s.leaseExpirations.Add(1)
			}
			out[i] = fmt.Errorf("lease %d: %w", id, err)
			continue
		}
		s.renewed.Add(1)
		if deadline.IsZero() || d.Before(deadline) {
			deadline = d
		}
	}
	return out, deadline, nil
}
