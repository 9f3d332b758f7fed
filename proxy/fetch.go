package proxy

// The remote fetch, in one place: a read that missed locally (GetPinned,
// BatchGetPinned, Acquire) calls router.fetch, which
//
//  1. joins or leads the key's flight (internal/flight): concurrent misses
//     on one key make one fetch, and the leader re-checks the store first;
//  2. groups the keys it leads by first remote owner and asks each owner in
//     parallel (fetchFrom), trying a key's other owners one by one when the
//     first cannot give it;
//  3. per owner (fetchCall → fetchBlocks): Peers.Acquire pins the blocks
//     on the owner and says where they lie; per block (land), a slot is
//     Reserved in this node's arenas, Peers.Pull reads the bytes into it
//     over the transfer layer (checked against the owner's CRC-32C as they
//     land), and the slot is committed (CommitChecked: not checksummed
//     again) as a low-priority copy, or at full priority for a block this
//     node owns or a hot replica (hot.go); a failure aborts the slot, so a
//     fetch never leaves wrong or partial bytes;
//  4. gives the owner's pins back (Peers.Release, which may ride on the
//     next Acquire to that owner), and finishes the flights.
//
// The caller then reads the block from its own store.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/flight"
)

// fetch brings keys that missed locally into the local store, asking each
// key's owners in order; one fetch per key at a time (concurrent misses on
// one key join the flight). A fetched block is kept as a low-priority copy,
// except when this node owns it (a new owner filling lazily from the
// previous one) or it is fetched often (a hot replica, hot.go): those are
// kept at full priority. Per key: nil (now local) or why not.
func (r *router) fetch(ctx context.Context, ns string, keys [][]byte) []error {
	errs := make([]error, len(keys))
	// Group by first remote owner (and by kept at full priority or not);
	// keys with no remote owner miss.
	groups := map[fetchGroup][]int{}
	hot := make([]bool, len(keys))
	type member struct {
		i  int
		fk string
		c  *flight.Call[string, struct{}]
	}
	var mine, waits []member
	for i, k := range keys {
		owners := r.remoteOwners(ns, k)
		if len(owners) == 0 {
			errs[i] = cache.ErrNotFound
			continue
		}
		fk := ns + "\x00" + string(k)
		c, leader := r.flights.Join(fk)
		if !leader {
			r.coalesced.Add(1)
			waits = append(waits, member{i, fk, c})
			continue
		}
		mine = append(mine, member{i, fk, c})
		// A flight that ended between the caller's local miss and now
		// left the block here: do not fetch it again (as groupcache
		// re-checks its cache inside the single-flight).
		if _, ok := r.store.Stat(ctx, ns, k); ok {
			continue
		}
		owned := r.owns(ns, k)
		if !owned {
			hot[i] = r.hot.note(fk)
		}
		g := fetchGroup{node: owners[0], keep: owned || hot[i]}
		groups[g] = append(groups[g], i)
	}
	// Ask each first owner for its keys in parallel; a key it lacks is
	// tried at its next owner (previous membership) one by one. The owner
	// must answer within RemoteTimeout; the bytes then move within
	// FetchTimeout.
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, r.cfg.FetchTimeout)
	defer cancel()
	perNode(groups, keys, func(g fetchGroup, idx []int, batch [][]byte) {
		r.fetchFrom(ctx, parent, g, ns, keys, idx, batch, errs)
	})
	for _, m := range mine {
		if hot[m.i] {
			r.hot.done(ctx, m.fk, ns, keys[m.i], errs[m.i] == nil, r.store)
		}
		m.c.Finish(struct{}{}, errs[m.i])
		m.c.Leave()
	}
	for _, w := range waits {
		_, errs[w.i] = w.c.Wait(ctx)
		w.c.Leave()
	}
	return errs
}

// fetchGroup is the keys of one fetch call: one node, and whether the
// blocks are kept at full priority.
type fetchGroup struct {
	node string
	keep bool
}

// fetchFrom fetches batch (keys[idx]) from g.node and sets errs[idx[j]];
// a key the node cannot give is tried at its other owners one by one.
// parent is the caller's context (without the router's deadlines).
func (r *router) fetchFrom(ctx, parent context.Context, g fetchGroup, ns string, keys [][]byte, idx []int, batch [][]byte, errs []error) {
	res, err := r.fetchCall(ctx, parent, g.node, ns, batch, g.keep)
	for j, i := range idx {
		e := err
		if e == nil {
			e = res[j]
		}
		if e != nil && !errors.Is(e, cache.ErrNotFound) && !errors.Is(e, ErrPeerDown) {
			r.fetchFailures.Add(1)
			r.lg.Debug("remote fetch failed", zap.String("node", g.node), zap.Error(e))
		}
		if e != nil {
			// Try the other owners of this key, in order. The ring may have
			// changed since the keys were grouped: g.node may have left it,
			// and no other node may own the key any more.
			for _, next := range r.remoteOwners(ns, keys[i]) {
				if next == g.node {
					continue
				}
				rr, ferr := r.fetchCall(ctx, parent, next, ns, [][]byte{keys[i]}, g.keep)
				if ferr == nil && rr[0] == nil {
					e = nil
					break
				}
			}
		}
		if e == nil {
			r.remoteHits.Add(1)
		}
		errs[i] = e
	}
}

// fetchCall is one fetch of keys from node (fetchBlocks), unless node
// failed a call recently (ErrPeerDown); its outcome feeds the breaker.
func (r *router) fetchCall(ctx, parent context.Context, node, ns string, keys [][]byte, keep bool) ([]error, error) {
	ok, probe := r.brk.allow(node)
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrPeerDown, node)
	}
	r.remoteFetches.Add(int64(len(keys)))
	res, err := r.fetchBlocks(ctx, node, ns, keys, keep)
	o := outcomeOf(parent, err)
	if err == nil {
		o = perKeyOutcome(parent, res)
	}
	r.brk.done(node, probe, o)
	return res, err
}

// fetchBlocks brings the blocks of keys held by node into the local store,
// kept at full priority when keep, else as low-priority copies: with one
// named read per block where node serves them (fetchNamed), else node
// pins them (Acquire), each is landed (land) and node's pins are given
// back (fetchAcquired). Per key: nil (local now), cache.ErrNotFound, or
// the error.
func (r *router) fetchBlocks(ctx context.Context, node, ns string, keys [][]byte, keep bool) ([]error, error) {
	start := time.Now()
	pc := r.stats.of(node)
	pc.fetches.Add(1)
	if keep {
		pc.hot.Add(int64(len(keys)))
	}
	errs, err := r.fetchNamed(ctx, node, ns, keys, keep, pc)
	if err == nil {
		pc.latency.Add(int64(time.Since(start))) // calls the node answered
	}
	return errs, err
}

// fetchAcquired is fetchBlocks by Acquire, Pull and Release.
func (r *router) fetchAcquired(ctx context.Context, node, ns string, keys [][]byte, keep bool, pc *peerCounters) ([]error, error) {
	blocks, err := r.fetcher.Acquire(ctx, node, ns, keys, r.fopts)
	if err == nil && len(blocks) != len(keys) {
		err = fmt.Errorf("%w: %s answered %d blocks for %d keys", cache.ErrUnavailable, node, len(blocks), len(keys))
		var leases []int64
		for _, b := range blocks {
			if b.Err == nil {
				leases = append(leases, b.Lease)
			}
		}
		r.fetcher.Release(node, leases)
	}
	if err != nil {
		pc.failures.Add(1)
		return nil, err
	}
	errs := make([]error, len(keys))
	var leases []int64
	landOne := func(i int) {
		n, err := r.land(ctx, node, ns, keys[i], blocks[i], !keep)
		errs[i] = err
		pc.landed(n, err)
	}
	var pinned []int
	for i, b := range blocks {
		if b.Err != nil {
			errs[i] = b.Err
			pc.landed(0, b.Err)
			continue
		}
		leases = append(leases, b.Lease)
		pinned = append(pinned, i)
	}
	r.each(len(blocks), pinned, landOne)
	r.fetcher.Release(node, leases)
	return errs, nil
}

// fetchNamed lands the blocks of keys from node with one named read each
// (Peers.Fetch), FetchParallel at a time; the keys node is not known to
// serve that way (ErrNoFetch, nothing sent) go by fetchAcquired, in one
// batch. When none went by named reads, its call-level error is returned
// as it is (the breaker reads it).
func (r *router) fetchNamed(ctx context.Context, node, ns string, keys [][]byte, keep bool, pc *peerCounters) ([]error, error) {
	errs := make([]error, len(keys))
	var (
		mu   sync.Mutex
		rest []int // keys to fetch by Acquire
	)
	one := func(i int) {
		n, err := r.landNamed(ctx, node, ns, keys[i], !keep)
		if errors.Is(err, ErrNoFetch) {
			mu.Lock()
			rest = append(rest, i)
			mu.Unlock()
			return
		}
		pc.named.Add(1)
		errs[i] = err
		pc.landed(n, err)
	}
	all := make([]int, len(keys))
	for i := range all {
		all[i] = i
	}
	r.each(len(keys), all, one)
	if len(rest) == len(keys) {
		return r.fetchAcquired(ctx, node, ns, keys, keep, pc)
	}
	if len(rest) > 0 {
		slices.Sort(rest)
		batch := make([][]byte, len(rest))
		for j, i := range rest {
			batch[j] = keys[i]
		}
		res, err := r.fetchAcquired(ctx, node, ns, batch, keep, pc)
		for j, i := range rest {
			if err != nil {
				errs[i] = err
			} else {
				errs[i] = res[j]
			}
		}
	}
	return errs, nil
}

// each runs f(i) for every i of idx, FetchParallel at a time; from here
// when the call is about one block only (of n).
func (r *router) each(n int, idx []int, f func(i int)) {
	if n == 1 {
		for _, i := range idx {
			f(i)
		}
		return
	}
	sem := make(chan struct{}, r.cfg.FetchParallel)
	var wg sync.WaitGroup
	for _, i := range idx {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			f(i)
		}()
	}
	wg.Wait()
}

// land moves one block node pinned into a reserved local slot and commits
// it; low keeps it as a low-priority copy. It returns the bytes pulled (0
// when the block was stored here meanwhile).
func (r *router) land(ctx context.Context, node, ns string, key []byte, b RemoteBlock, low bool) (int64, error) {
	slot, err := r.reserveFetched(ctx, node, ns, key, b, low)
	if errors.Is(err, cache.ErrExists) {
		return 0, nil // stored locally meanwhile
	}
	if err != nil {
		return 0, err
	}
	if b.Length > 0 {
		if err := r.fetcher.Pull(ctx, node, b, slot); err != nil {
			_ = slot.Abort()
			return 0, err
		}
	}
	return b.Length, r.commitFetched(ctx, ns, key, slot, b)
}

// landNamed is land with a named read: node pins, sends and unpins the
// block in one exchange, into a slot reserved once its length is known.
func (r *router) landNamed(ctx context.Context, node, ns string, key []byte, low bool) (int64, error) {
	var (
		slot cache.Reservation
		b    RemoteBlock
	)
	err := r.fetcher.Fetch(ctx, node, ns, key, r.fopts, func(got RemoteBlock) (cache.Reservation, error) {
		b = got
		s, err := r.reserveFetched(ctx, node, ns, key, got, low)
		slot = s
		return s, err
	})
	if errors.Is(err, cache.ErrExists) {
		return 0, nil // stored locally meanwhile
	}
	if err != nil {
		if slot != nil {
			_ = slot.Abort()
		}
		return 0, err
	}
	if slot == nil {
		return 0, fmt.Errorf("%w: %s: a named read landed nothing", cache.ErrUnavailable, node)
	}
	return b.Length, r.commitFetched(ctx, ns, key, slot, b)
}

// reserveFetched reserves the local slot of fetched block b: exactly
// b.Length bytes; cache.ErrExists when the block is stored here now. A
// block whose description (b.Meta) a put could not carry is refused
// first (ErrInvalidArgument): nothing is reserved, moved or described.
func (r *router) reserveFetched(ctx context.Context, node, ns string, key []byte, b RemoteBlock, low bool) (cache.Reservation, error) {
	if b.Length < 0 {
		return nil, fmt.Errorf("%w: %s: block of %d bytes", cache.ErrUnavailable, node, b.Length)
	}
	if err := r.checkMeta(b.Meta); err != nil {
		// Bad data from a node that answers, as a wrong checksum is: a
		// miss, not a reason to stop asking it (the breaker).
		return nil, fmt.Errorf("proxy: %s described a fetched block badly: %w", node, err)
	}
	slot, err := r.zcs.Reserve(ctx, ns, key, b.Length, cache.PutOptions{Depth: b.Depth, LowPriority: low}, r.cfg.ReserveTTL)
	if errors.Is(err, cache.ErrExists) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("proxy: reserve %d bytes for a fetched block: %w", b.Length, err)
	}
	if _, _, n := slot.Location(); n != b.Length {
		_ = slot.Abort()
		return nil, fmt.Errorf("%w: reserved %d bytes for a block of %d", cache.ErrUnavailable, n, b.Length)
	}
	return slot, nil
}

// commitFetched commits a slot whose bytes were checked as they landed (an
// empty one is checked here), with the block's description handed to the
// notes first (as a put's), so that the local copy's events carry it.
func (r *router) commitFetched(ctx context.Context, ns string, key []byte, slot cache.Reservation, b RemoteBlock) error {
	done := r.describe(ns, key, b.Meta)
	var err error
	if b.Length == 0 {
		_, err = slot.Commit(ctx, b.Checksum, true)
	} else {
		_, err = slot.CommitChecked(ctx, b.Checksum) // checked as it landed
	}
	done(err)
	if err != nil {
		return fmt.Errorf("proxy: commit fetched block: %w", err)
	}
	return nil
}
