package proxy

// Routing across sidecars (DESIGN.md §6). A proxy with a cluster attached
// answers reads from its own tiers first and asks the owners of the keys it
// misses, batched per owner and in parallel; a fetched block is kept as a
// low-priority copy, or at full priority when it is fetched often (hot
// replicas, hot.go). Puts are stored locally and pushed to their owners
// through a bounded background queue (or synchronously when asked). After a
// membership change a rate-limited rebalancer pushes the hot blocks this
// node owned to their new owners (rebalance.go).

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/clock"
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

	// RebalanceRate bounds, in bytes per second, what the rebalancer pushes
	// to new owners after a membership change (rebalance.go). 0 turns the
	// rebalancer off (new owners then fill lazily only). Default 64 MiB/s.
	RebalanceRate int64
	// RebalanceDelay is how long after the last membership change a pass
	// starts: changes in a burst make one pass, and the placement view has
	// rebuilt its ring by then. Default 2 s.
	RebalanceDelay time.Duration
	// RebalanceMaxBytes bounds the bytes one pass plans to move, hottest
	// first; the rest fills lazily. 0: no bound. Default 1 GiB.
	RebalanceMaxBytes int64

	// HotThreshold is how many fetches of one block from other nodes,
	// within about HotWindow, make the next fetch keep it as a hot replica:
	// a full-priority copy instead of a low-priority one (hot.go). 0 turns
	// hot replication off. Default 3.
	HotThreshold int
	// HotWindow is the counting window of HotThreshold (fetches are counted
	// over the current and the previous window). Default 1 min.
	HotWindow time.Duration
	// HotTTL is how long a hot replica keeps full priority; it is then
	// demoted to a low-priority copy. Default 10 min.
	HotTTL time.Duration
	// HotMaxReplicas bounds the live hot replicas. Default 256.
	HotMaxReplicas int
	// HotMaxBytes bounds their bytes. Default 1 GiB.
	HotMaxBytes int64
	// HotTracked bounds the blocks whose fetches are counted in one window
	// (memory bound). Default 65536.
	HotTracked int

	// Clock times windows and TTLs. Default: the real clock.
	Clock clock.Clock
}

// DefaultRouteConfig returns the defaults documented on RouteConfig.
func DefaultRouteConfig() RouteConfig {
	return RouteConfig{
		FetchTimeout: 5 * time.Second, PushQueue: 1024, PushWorkers: 4,
		RebalanceRate: 64 << 20, RebalanceDelay: 2 * time.Second, RebalanceMaxBytes: 1 << 30,
		HotThreshold: 3, HotWindow: time.Minute, HotTTL: 10 * time.Minute, HotMaxReplicas: 256,
		HotMaxBytes: 1 << 30, HotTracked: 65536,
	}
}

// withDefaults fills the zero fields that have a default; RebalanceRate,
// RebalanceMaxBytes and HotThreshold keep 0 (off, no bound).
func (c RouteConfig) withDefaults() RouteConfig {
	d := DefaultRouteConfig()
	if c.FetchTimeout == 0 {
		c.FetchTimeout = d.FetchTimeout
	}
	if c.PushQueue == 0 {
		c.PushQueue = d.PushQueue
	}
	if c.PushWorkers == 0 {
		c.PushWorkers = d.PushWorkers
	}
	if c.RebalanceDelay == 0 {
		c.RebalanceDelay = d.RebalanceDelay
	}
	if c.HotWindow == 0 {
		c.HotWindow = d.HotWindow
	}
	if c.HotTTL == 0 {
		c.HotTTL = d.HotTTL
	}
	if c.HotMaxReplicas == 0 {
		c.HotMaxReplicas = d.HotMaxReplicas
	}
	if c.HotMaxBytes == 0 {
		c.HotMaxBytes = d.HotMaxBytes
	}
	if c.HotTracked == 0 {
		c.HotTracked = d.HotTracked
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	return c
}

// Validate reports every problem with c (after defaults) at once.
func (c RouteConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"FetchTimeout", int64(c.FetchTimeout)}, {"PushQueue", int64(c.PushQueue)}, {"PushWorkers", int64(c.PushWorkers)},
		{"RebalanceRate", c.RebalanceRate}, {"RebalanceDelay", int64(c.RebalanceDelay)}, {"RebalanceMaxBytes", c.RebalanceMaxBytes},
		{"HotThreshold", int64(c.HotThreshold)}, {"HotWindow", int64(c.HotWindow)}, {"HotTTL", int64(c.HotTTL)},
		{"HotMaxReplicas", int64(c.HotMaxReplicas)}, {"HotMaxBytes", c.HotMaxBytes}, {"HotTracked", int64(c.HotTracked)},
	} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("proxy: route %s is negative", f.name))
		}
	}
	return errors.Join(errs...)
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

	Rebalance RebalanceStats // rebalance.go
	Hot       HotStats       // hot.go
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
	store Store
	cfg   RouteConfig
	lg    *zap.Logger
	hot   *hotTracker // nil: hot replication off
	rebal *rebalancer // nil: rebalancer off

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
// before serving; DetachCluster stops the push workers, the rebalancer and
// the hot replica sweeper. cfg is validated (RouteConfig.Validate) and its
// zero fields take their defaults, except that a zero RebalanceRate or
// HotThreshold leaves that feature off.
func (p *Proxy) AttachCluster(c Cluster, peers Peers, cfg RouteConfig) error {
	if c == nil || peers == nil {
		return errors.New("proxy: nil cluster or peers")
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	r := &router{c: c, peers: peers, store: p.store, cfg: cfg, lg: p.lg.Named("route"),
		queue: make(chan pushJob, cfg.PushQueue), stop: make(chan struct{}), flights: map[string]*fetchFlight{}}
	for i := 0; i < cfg.PushWorkers; i++ {
		r.workers.Add(1)
		go r.pushWorker()
	}
	r.startHot()
	r.startRebalancer()
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
// timeout, a running rebalance pass is cancelled and hot replicas stay as
// they are. Safe to call when none is attached.
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
		Rebalance: r.rebal.stats(), Hot: r.hot.stats(),
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
		owned := r.owns(ns, k)
		if !owned {
			hot[i] = r.hot.note(fk)
		}
		g := fetchGroup{node: owners[0], keep: owned || hot[i]}
		groups[g] = append(groups[g], i)
	}
	// Ask each first owner for its keys in parallel; a key it lacks is
	// tried at its next owner (previous membership) one by one.
	ctx, cancel := context.WithTimeout(ctx, r.cfg.FetchTimeout)
	defer cancel()
	perNode(groups, keys, func(g fetchGroup, idx []int, batch [][]byte) {
		r.fetchFrom(ctx, g, ns, keys, idx, batch, errs)
	})
	for j, f := range mine {
		i := mineIdx[j]
		f.err = errs[i]
		fk := ns + "\x00" + string(keys[i])
		if hot[i] {
			r.hot.done(ctx, fk, ns, keys[i], errs[i] == nil, r.store)
		}
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

// fetchGroup is the keys of one fetch call: one node, and whether the
// blocks are kept at full priority.
type fetchGroup struct {
	node string
	keep bool
}

// fetchFrom fetches batch (keys[idx]) from g.node and sets errs[idx[j]];
// a key the node cannot give is tried at its other owners one by one.
func (r *router) fetchFrom(ctx context.Context, g fetchGroup, ns string, keys [][]byte, idx []int, batch [][]byte, errs []error) {
	r.remoteFetches.Add(int64(len(idx)))
	res, err := r.fetchCall(ctx, g.node, ns, batch, g.keep)
	for j, i := range idx {
		e := err
		if e == nil {
			e = res[j]
		}
		if e != nil && !errors.Is(e, cache.ErrNotFound) {
			r.fetchFailures.Add(1)
			r.lg.Debug("remote fetch failed", zap.String("node", g.node), zap.Error(e))
		}
		if e != nil {
			// Try the other owners of this key, in order.
			for _, next := range r.remoteOwners(ns, keys[i])[1:] {
				r.remoteFetches.Add(1)
				rr, ferr := r.fetchCall(ctx, next, ns, [][]byte{keys[i]}, g.keep)
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

// fetchCall is one Fetch, or FetchHot for blocks to keep at full priority
// (when the peers can).
func (r *router) fetchCall(ctx context.Context, node, ns string, keys [][]byte, keep bool) ([]error, error) {
	if hf, ok := r.peers.(HotFetcher); ok && keep {
		return hf.FetchHot(ctx, node, ns, keys)
	}
	return r.peers.Fetch(ctx, node, ns, keys)
}

// perNode calls fn for each group of key indexes (one per node, or per node
// and kind of fetch), in parallel, with the keys of the group, and returns
// when every call has. A single group (a single Get's miss) is asked from
// the calling goroutine.
func perNode[G comparable](groups map[G][]int, keys [][]byte, fn func(g G, idx []int, batch [][]byte)) {
	var wg sync.WaitGroup
	for g, idx := range groups {
		batch := make([][]byte, len(idx))
		for j, i := range idx {
			batch[j] = keys[i]
		}
		if len(groups) == 1 {
			fn(g, idx, batch)
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(g, idx, batch)
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
