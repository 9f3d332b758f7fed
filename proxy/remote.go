package proxy

// Routing across sidecars (DESIGN.md §6). A proxy with a cluster attached
// answers reads from its own tiers first and asks the owners of the keys it
// misses, batched per owner and in parallel; a fetched block is kept as a
// low-priority copy. Puts are stored locally and pushed to their owners
// through a bounded background queue (or synchronously when asked).

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
)

// Cluster is the proxy's view of the cluster: who owns a key. Implemented
// over cluster.Cluster and cluster.Ring by the wiring in cmd.
type Cluster interface {
	// Self is this node's name.
	Self() string
	// Owners returns the live nodes that own (ns, key), best first, followed
	// by the owners under the previous membership (a new owner fills
	// lazily: a miss asks the previous owner). Self may be among them.
	Owners(ns string, key []byte) []string
	// Replicas is how many of the first Owners hold a block (R).
	Replicas() int
	// Members lists the cluster view.
	Members() []MemberInfo
}

// Peers makes calls on other sidecars. Implemented by proxy/peerapi.
type Peers interface {
	// Lookup reports, per key, whether node holds the block locally.
	Lookup(ctx context.Context, node, ns string, keys [][]byte) ([]bool, error)
	// Fetch brings the blocks of keys held by node into this node's store as
	// low-priority copies, checksums verified. Per key: nil,
	// cache.ErrNotFound or the error.
	Fetch(ctx context.Context, node, ns string, keys [][]byte) ([]error, error)
	// Push stores blocks on node. Per item: nil (stored or present) or the
	// error.
	Push(ctx context.Context, node, ns string, items []PutItem) ([]error, error)
}

// RouteConfig tunes routing.
type RouteConfig struct {
	// FetchTimeout bounds one remote fetch or lookup. Default 5s.
	FetchTimeout time.Duration
	// PushQueue is the capacity of the background push queue, in batches.
	// A full queue drops the push and counts it. Default 1024.
	PushQueue int
	// PushWorkers drain the queue. Default 4.
	PushWorkers int
}

// DefaultRouteConfig returns the defaults documented on RouteConfig.
func DefaultRouteConfig() RouteConfig {
	return RouteConfig{FetchTimeout: 5 * time.Second, PushQueue: 1024, PushWorkers: 4}
}

// RouteStats is a snapshot of the routing counters.
type RouteStats struct {
	RemoteLookups   int64 // keys asked of other nodes by Lookup/Exists
	RemoteFetches   int64 // keys fetched from other nodes
	RemoteHits      int64 // fetched keys found
	FetchFailures   int64 // fetches that failed (node down, transfer error, checksum)
	Pushes          int64 // blocks pushed to owners
	PushFailures    int64 // pushes that failed
	PushesDropped   int64 // pushes dropped because the queue was full
	PushQueueDepth  int64 // batches waiting now
	CoalescedMisses int64 // misses that joined another caller's fetch
}

type pushJob struct {
	node  string
	ns    string
	items []PutItem
}

// router is a proxy's routing state.
type router struct {
	c     Cluster
	peers Peers
	cfg   RouteConfig
	lg    *zap.Logger

	queue   chan pushJob
	stop    chan struct{}
	workers sync.WaitGroup

	fmu     sync.Mutex
	flights map[string]*fetchFlight

	remoteLookups, remoteFetches, remoteHits, fetchFailures atomic.Int64
	pushes, pushFailures, pushesDropped, coalesced          atomic.Int64
}

type fetchFlight struct {
	done chan struct{}
	err  error
}

// AttachCluster makes the proxy route across the cluster. Call it once,
// before serving; DetachCluster (or Close) stops the push workers.
func (p *Proxy) AttachCluster(c Cluster, peers Peers, cfg RouteConfig) error {
	if c == nil || peers == nil {
		return errors.New("proxy: nil cluster or peers")
	}
	def := DefaultRouteConfig()
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = def.FetchTimeout
	}
	if cfg.PushQueue <= 0 {
		cfg.PushQueue = def.PushQueue
	}
	if cfg.PushWorkers <= 0 {
		cfg.PushWorkers = def.PushWorkers
	}
	r := &router{c: c, peers: peers, cfg: cfg, lg: p.lg.Named("route"),
		queue: make(chan pushJob, cfg.PushQueue), stop: make(chan struct{}), flights: map[string]*fetchFlight{}}
	for i := 0; i < cfg.PushWorkers; i++ {
		r.workers.Add(1)
		go r.pushWorker()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.route != nil {
		close(r.stop)
		r.workers.Wait()
		return errors.New("proxy: cluster already attached")
	}
	p.route = r
	return nil
}

// DetachCluster stops routing; queued pushes are finished first for up to
// timeout. Safe to call when none is attached.
func (p *Proxy) DetachCluster(timeout time.Duration) {
	p.mu.Lock()
	r := p.route
	p.route = nil
	p.mu.Unlock()
	if r == nil {
		return
	}
	close(r.stop)
	done := make(chan struct{})
	go func() { r.workers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		r.lg.Warn("push workers did not finish in time", zap.Int("queued", len(r.queue)))
	}
}

func (p *Proxy) router() *router {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.route
}

// RouteStats returns the routing counters (zero on a single node).
func (p *Proxy) RouteStats() RouteStats {
	r := p.router()
	if r == nil {
		return RouteStats{}
	}
	return RouteStats{
		RemoteLookups: r.remoteLookups.Load(), RemoteFetches: r.remoteFetches.Load(), RemoteHits: r.remoteHits.Load(),
		FetchFailures: r.fetchFailures.Load(), Pushes: r.pushes.Load(), PushFailures: r.pushFailures.Load(),
		PushesDropped: r.pushesDropped.Load(), PushQueueDepth: int64(len(r.queue)), CoalescedMisses: r.coalesced.Load(),
	}
}

// clusterRouter returns the router when scope asks for the cluster.
func (p *Proxy) clusterRouter(scope Scope) *router {
	if scope == ScopeLocal {
		return nil
	}
	return p.router()
}

// remoteOwners are the owners of (ns, key) other than this node.
func (r *router) remoteOwners(ns string, key []byte) []string {
	self := r.c.Self()
	all := r.c.Owners(ns, key)
	out := all[:0:0]
	for _, n := range all {
		if n != self {
			out = append(out, n)
		}
	}
	return out
}

// owns reports whether this node is among the first R owners of the key.
func (r *router) owns(ns string, key []byte) bool {
	self := r.c.Self()
	owners := r.c.Owners(ns, key)
	for i, n := range owners {
		if i >= r.c.Replicas() {
			break
		}
		if n == self {
			return true
		}
	}
	return false
}

// fetch brings keys that missed locally into the local store, asking each
// key's owners in order; one fetch per key at a time (concurrent misses on
// one key join the flight). Per key: nil (now local) or why not.
func (r *router) fetch(ctx context.Context, ns string, keys [][]byte) []error {
	errs := make([]error, len(keys))
	// Group by first remote owner; keys with no remote owner miss.
	leaders := map[string][]int{}
	var waits []struct {
		i int
		f *fetchFlight
	}
	var mine []*fetchFlight
	var mineIdx []int
	for i, k := range keys {
		owners := r.remoteOwners(ns, k)
		if len(owners) == 0 {
			errs[i] = cache.ErrNotFound
			continue
		}
		fk := ns + "\x00" + string(k)
		r.fmu.Lock()
		if f, ok := r.flights[fk]; ok {
			r.fmu.Unlock()
			r.coalesced.Add(1)
			waits = append(waits, struct {
				i int
				f *fetchFlight
			}{i, f})
			continue
		}
		f := &fetchFlight{done: make(chan struct{})}
		r.flights[fk] = f
		r.fmu.Unlock()
		mine = append(mine, f)
		mineIdx = append(mineIdx, i)
		leaders[owners[0]] = append(leaders[owners[0]], i)
	}
	// Ask each first owner for its keys in parallel; a key it lacks is
	// tried at its next owner (previous membership) one by one.
	ctx, cancel := context.WithTimeout(ctx, r.cfg.FetchTimeout)
	defer cancel()
	perNode(leaders, keys, func(node string, idx []int, batch [][]byte) {
		r.remoteFetches.Add(int64(len(idx)))
		res, err := r.peers.Fetch(ctx, node, ns, batch)
		for j, i := range idx {
			e := err
			if e == nil {
				e = res[j]
			}
			if e != nil && !errors.Is(e, cache.ErrNotFound) {
				r.fetchFailures.Add(1)
				r.lg.Debug("remote fetch failed", zap.String("node", node), zap.Error(e))
			}
			if e != nil {
				// Try the other owners of this key, in order.
				for _, next := range r.remoteOwners(ns, keys[i])[1:] {
					r.remoteFetches.Add(1)
					rr, ferr := r.peers.Fetch(ctx, next, ns, [][]byte{keys[i]})
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
	})
	for j, f := range mine {
		f.err = errs[mineIdx[j]]
		fk := ns + "\x00" + string(keys[mineIdx[j]])
		r.fmu.Lock()
		delete(r.flights, fk)
		r.fmu.Unlock()
		close(f.done)
	}
	for _, w := range waits {
		select {
		case <-w.f.done:
			errs[w.i] = w.f.err
		case <-ctx.Done():
			errs[w.i] = ctx.Err()
		}
	}
	return errs
}

// perNode calls fn for each node's group of key indexes, in parallel, with
// the keys of the group, and returns when every call has.
func perNode(groups map[string][]int, keys [][]byte, fn func(node string, idx []int, batch [][]byte)) {
	var wg sync.WaitGroup
	for node, idx := range groups {
		batch := make([][]byte, len(idx))
		for j, i := range idx {
			batch[j] = keys[i]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(node, idx, batch)
		}()
	}
	wg.Wait()
}

// lookupRemote asks owners whether they hold keys, batched per owner in
// parallel. present[i] is set for keys some owner holds.
func (r *router) lookupRemote(ctx context.Context, ns string, keys [][]byte, present []bool) {
	byNode := map[string][]int{}
	for i, k := range keys {
		if present[i] {
			continue
		}
		owners := r.remoteOwners(ns, k)
		if len(owners) > 0 {
			byNode[owners[0]] = append(byNode[owners[0]], i)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.FetchTimeout)
	defer cancel()
	var mu sync.Mutex
	perNode(byNode, keys, func(node string, idx []int, batch [][]byte) {
		r.remoteLookups.Add(int64(len(idx)))
		res, err := r.peers.Lookup(ctx, node, ns, batch)
		if err != nil {
			r.lg.Debug("remote lookup failed", zap.String("node", node), zap.Error(err))
			return
		}
		mu.Lock()
		for j, i := range idx {
			if j < len(res) && res[j] {
				present[i] = true
			}
		}
		mu.Unlock()
	})
}

// push sends items to the owners of their keys: synchronously when sync is
// positive (waiting for that many owners per item), else through the queue.
func (r *router) push(ctx context.Context, ns string, items []PutItem, syncN int) error {
	byNode := map[string][]PutItem{}
	need := map[string]int{}
	for _, it := range items {
		for i, n := range r.c.Owners(ns, it.Key) {
			if i >= r.c.Replicas() {
				break
			}
			if n == r.c.Self() {
				continue
			}
			byNode[n] = append(byNode[n], it)
			need[n]++
		}
	}
	if syncN <= 0 {
		for node, its := range byNode {
			select {
			case r.queue <- pushJob{node: node, ns: ns, items: its}:
			default:
				r.pushesDropped.Add(int64(len(its)))
			}
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.FetchTimeout)
	defer cancel()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for node, its := range byNode {
		wg.Add(1)
		go func(node string, its []PutItem) {
			defer wg.Done()
			if err := r.pushNow(ctx, node, ns, its); err != nil {
				failed.Add(1)
			}
		}(node, its)
	}
	wg.Wait()
	if n := failed.Load(); n > 0 && int(int64(len(byNode))-n) < min(syncN, len(byNode)) {
		return fmt.Errorf("%w: %d of %d owners did not store the blocks", cache.ErrUnavailable, n, len(byNode))
	}
	return nil
}

func (r *router) pushNow(ctx context.Context, node, ns string, items []PutItem) error {
	res, err := r.peers.Push(ctx, node, ns, items)
	if err == nil {
		for _, e := range res {
			if e != nil {
				err = e
				break
			}
		}
	}
	if err != nil {
		r.pushFailures.Add(int64(len(items)))
		r.lg.Debug("push failed", zap.String("node", node), zap.Error(err))
		return err
	}
	r.pushes.Add(int64(len(items)))
	return nil
}

func (r *router) pushWorker() {
	defer r.workers.Done()
	for {
		select {
		case job := <-r.queue:
			ctx, cancel := context.WithTimeout(context.Background(), r.cfg.FetchTimeout)
			r.pushNow(ctx, job.node, job.ns, job.items)
			cancel()
		case <-r.stop:
			// Finish what is queued, then stop.
			for {
				select {
				case job := <-r.queue:
					ctx, cancel := context.WithTimeout(context.Background(), r.cfg.FetchTimeout)
					r.pushNow(ctx, job.node, job.ns, job.items)
					cancel()
				default:
					return
				}
			}
		}
	}
}
