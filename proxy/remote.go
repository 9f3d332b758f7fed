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
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/clock"
	"github.com/tidepool-kv/tidepool/internal/flight"
	"github.com/tidepool-kv/tidepool/rdma"
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

// The calls this node makes on other sidecars, one interface per user:
// fetches (fetch.go, buffers.go) read blocks, lookups (remote.go,
// rebalance.go) ask who holds them, pushes (remote.go, rebalance.go) store
// them on their owners, cluster-wide deletes (proxy.go) remove them.
// proxy/peerapi implements all four (Peers); the proxy drives a fetch
// itself: Acquire, then per block Reserve a local slot, Pull, Commit, and
// Release.

// RemoteFetcher reads blocks other nodes hold.
type RemoteFetcher interface {
	// Acquire asks node to pin the blocks of keys for this node to read.
	// Per key: where the block lies, or why it is not served
	// (RemoteBlock.Err: cache.ErrNotFound, ...). The lease of every block
	// without Err MUST be given back with Release. The node's answer is
	// bounded by opts.AnswerTimeout when set.
	Acquire(ctx context.Context, node, ns string, keys [][]byte, opts FetchOptions) ([]RemoteBlock, error)
	// Pull reads b's bytes from node into the reserved local slot into,
	// checking them against b.Checksum as they land: an error wrapping
	// cache.ErrChecksum when they do not match, cache.ErrUnavailable when
	// the transfer failed. It neither commits nor aborts into.
	Pull(ctx context.Context, node string, b RemoteBlock, into cache.Reservation) error
	// Fetch reads the block of key from node in one exchange, where node
	// serves named reads (it said so in an earlier Acquire answer): node
	// pins the block, sends it and unpins it. land is called before the
	// bytes arrive, with the block's Length, Checksum and Depth (no lease,
	// no location), and returns the reserved local slot they go into, or
	// an error, which Fetch then returns. Landed bytes are checked against
	// the Checksum as they come (cache.ErrChecksum); an empty block is
	// landed too. Fetch neither commits nor aborts the slot. Errors:
	// ErrNoFetch, with nothing sent, when node is not known to serve named
	// reads (use Acquire and Pull); cache.ErrNotFound; the others of Pull.
	Fetch(ctx context.Context, node, ns string, key []byte, opts FetchOptions, land func(RemoteBlock) (cache.Reservation, error)) error
	// FetchTo is Fetch with the bytes landing in memory land returns
	// (exactly the block's Length bytes, which the caller keeps valid
	// until FetchTo returns) rather than in a reserved slot. ErrNoFetch,
	// with nothing sent, also where node's bytes cannot land in plain
	// memory (an RDMA connection to it).
	FetchTo(ctx context.Context, node, ns string, key []byte, opts FetchOptions, land func(RemoteBlock) ([]byte, error)) error
	// Release gives back leases node granted. It does not wait for the
	// network: the ids may ride on the next Acquire to node.
	Release(node string, leases []int64)
}

// RemoteLookup asks other nodes which blocks they hold.
type RemoteLookup interface {
	// Lookup reports, per key, whether node holds the block locally.
	Lookup(ctx context.Context, node, ns string, keys [][]byte) ([]bool, error)
}

// RemotePusher stores blocks on other nodes.
type RemotePusher interface {
	// Push stores blocks on node. Per item: nil (stored or present) or the
	// error. err is a call that failed (the node did not answer, refused,
	// ...); the answers then cover every item (those not stored carry an
	// error), or are nil when nothing reached the node.
	Push(ctx context.Context, node, ns string, items []PutItem) ([]error, error)
}

// RemoteDeleter removes blocks from other nodes (cluster-wide Delete and
// Clear).
type RemoteDeleter interface {
	// Delete removes keys from node's local tiers. Per key: whether it was
	// there.
	Delete(ctx context.Context, node, ns string, keys [][]byte) ([]bool, error)
	// Clear removes every block of ns from node's local tiers and returns
	// how many there were.
	Clear(ctx context.Context, node, ns string) (int64, error)
}

// Peers is every call on other sidecars: what AttachCluster takes.
// Implemented by proxy/peerapi.
type Peers interface {
	RemoteFetcher
	RemoteLookup
	RemotePusher
	RemoteDeleter
}

// ErrNoFetch is Peers.Fetch's answer when the node is not known to serve
// named reads: nothing was sent, and the caller uses Acquire and Pull.
var ErrNoFetch = errors.New("proxy: node not known to serve named reads")

// RemoteBlock is a block another node pinned for this node to read: what
// Peers.Acquire answers per key.
type RemoteBlock struct {
	// Err is why the node does not serve the block (cache.ErrNotFound,
	// ...); nothing else is set then, and there is no lease.
	Err error
	// Lease is the node's pin, given back with Peers.Release.
	Lease int64
	// Length, Checksum (CRC-32C) and Depth describe the block.
	Length   int64
	Checksum uint32
	Depth    int32
	// Where the bytes lie on the node: its transfer endpoint, and the
	// registered region and the offset in it.
	Addr   string
	Region rdma.RegionDesc
	Offset uint64
	// Meta is the block's description as the node knows it (token ids,
	// parent key, block size), when the call asked for it
	// (FetchOptions.Describe) and the node knows one; nil otherwise. Not yet
	// checked: the proxy checks it as a put's before landing the block.
	Meta *cache.BlockMeta
}

// FetchOptions are what the router asks of each fetch call on a node
// (RemoteFetcher's Acquire, Fetch and FetchTo).
type FetchOptions struct {
	// AnswerTimeout bounds how long the node may take to answer the
	// request (the Acquire, or the metadata of a named read: whether it
	// holds the blocks and where); the transfer of the bytes that follows
	// is bounded by ctx alone. 0: ctx alone. The router sets
	// RouteConfig.RemoteTimeout.
	AnswerTimeout time.Duration
	// Describe asks for each block's description (RemoteBlock.Meta): the
	// router asks when it has a KV-event publisher (Deps.Notes), so that a
	// fetched block's local copy is described in its events too. A node
	// that predates descriptions sends none; FetchTo never asks.
	Describe bool
}

// RouteConfig tunes routing. A zero field takes its default
// (DefaultRouteConfig, applied once in withDefaults); a feature that can be
// turned off, or a bound that can be lifted, is spelled with a negative
// value (Off).
type RouteConfig struct {
	// FetchTimeout bounds one remote fetch (the owner's answer and the
	// transfer of the bytes), a push per 16 MiB it carries (pushTimeout),
	// and a cluster-wide Delete or Clear. Default 5 s.
	FetchTimeout time.Duration
	// RemoteTimeout bounds the remote part of a read, far below the time a
	// prefill takes: all the owners asked by one Lookup, Exists or
	// BatchExists, and the owner's answer in a Get, BatchGet or Acquire
	// fetch (whether and where it holds the blocks; the bytes then move
	// within FetchTimeout). Past it the read is a miss. At most
	// FetchTimeout. Default 500 ms (FetchTimeout when that is shorter).
	RemoteTimeout time.Duration
	// FetchParallel bounds the blocks of one fetch call pulled at once.
	// Default 8.
	FetchParallel int
	// ReserveTTL is how long the local slot of a fetched block waits for
	// its bytes. Default 10 s.
	ReserveTTL time.Duration
	// PeerDownFor is how long a node that failed a call (timed out,
	// refused, unreachable) is not called again: reads that would ask it
	// miss at once, pushes to it fail at once. Then one call probes it; a
	// success ends the period, a failure starts another. Default 2 s.
	PeerDownFor time.Duration
	// PushQueue is the capacity of the background push queue, in batches.
	// A full queue drops the push and counts it. Default 1024.
	PushQueue int
	// PushWorkers drain the queue. Default 4.
	PushWorkers int

	// RebalanceRate bounds, in bytes per second, what the rebalancer pushes
	// to new owners after a membership change (rebalance.go). Default
	// 64 MiB/s; Off (negative) turns the rebalancer off (new owners then
	// fill lazily only, and failed pushes are not pushed again: owed.go).
	RebalanceRate int64
	// RebalanceDelay is how long after the last membership change a pass
	// starts: changes in a burst make one pass, and the placement view has
	// rebuilt its ring by then. Default 2 s.
	RebalanceDelay time.Duration
	// RebalanceMaxBytes bounds the bytes one pass plans to move, hottest
	// first; the rest fills lazily. Default 1 GiB; Off (negative): no
	// bound.
	RebalanceMaxBytes int64

	// HotThreshold is how many fetches of one block from other nodes,
	// within about HotWindow, make the next fetch keep it as a hot replica:
	// a full-priority copy instead of a low-priority one (hot.go). Default
	// 3; Off (negative) turns hot replication off.
	HotThreshold int
	// HotWindow is the counting window of HotThreshold (fetches are counted
	// over the current and the previous window). Default 1 min.
	HotWindow time.Duration
	// HotTTL is how long a hot replica keeps full priority; it is then
	// demoted to a low-priority copy. Default 10 min.
	HotTTL time.Duration
	// HotMaxReplicas bounds the live hot replicas. Default 256.
	HotMaxReplicas int
	// HotMaxBytes bounds their bytes. Default: a sixteenth of DRAMBytes
	// (at least 1), or 1 GiB when DRAMBytes is 0.
	HotMaxBytes int64
	// DRAMBytes is the capacity of this node's DRAM tier, from which
	// HotMaxBytes takes its default; 0: unknown.
	DRAMBytes int64
	// HotTracked bounds the blocks whose fetches are counted in one window
	// (memory bound). Default 65536.
	HotTracked int

	// Clock times windows and TTLs. Default: the real clock.
	Clock clock.Clock
}

// DefaultRouteConfig returns the defaults documented on RouteConfig
// (HotMaxBytes stays 0: withDefaults derives it from DRAMBytes).
func DefaultRouteConfig() RouteConfig {
	return RouteConfig{
		FetchTimeout: 5 * time.Second, RemoteTimeout: 500 * time.Millisecond, PeerDownFor: 2 * time.Second,
		FetchParallel: 8, ReserveTTL: 10 * time.Second,
		PushQueue: 1024, PushWorkers: 4,
		RebalanceRate: 64 << 20, RebalanceDelay: 2 * time.Second, RebalanceMaxBytes: 1 << 30,
		HotThreshold: 3, HotWindow: time.Minute, HotTTL: 10 * time.Minute, HotMaxReplicas: 256,
		HotTracked: 65536,
	}
}

// Off, in a RouteConfig field that allows it (RebalanceRate,
// RebalanceMaxBytes, HotThreshold), turns the feature off or lifts the
// bound; any negative value does.
const Off = -1

// withDefaults fills the zero fields with their defaults: the one place a
// zero field becomes its default.
func (c RouteConfig) withDefaults() RouteConfig {
	d := DefaultRouteConfig()
	if c.FetchTimeout == 0 {
		c.FetchTimeout = d.FetchTimeout
	}
	if c.RemoteTimeout == 0 {
		c.RemoteTimeout = min(d.RemoteTimeout, c.FetchTimeout)
	}
	if c.PeerDownFor == 0 {
		c.PeerDownFor = d.PeerDownFor
	}
	if c.FetchParallel == 0 {
		c.FetchParallel = d.FetchParallel
	}
	if c.ReserveTTL == 0 {
		c.ReserveTTL = d.ReserveTTL
	}
	if c.PushQueue == 0 {
		c.PushQueue = d.PushQueue
	}
	if c.PushWorkers == 0 {
		c.PushWorkers = d.PushWorkers
	}
	if c.RebalanceRate == 0 {
		c.RebalanceRate = d.RebalanceRate
	}
	if c.RebalanceDelay == 0 {
		c.RebalanceDelay = d.RebalanceDelay
	}
	if c.RebalanceMaxBytes == 0 {
		c.RebalanceMaxBytes = d.RebalanceMaxBytes
	}
	if c.HotThreshold == 0 {
		c.HotThreshold = d.HotThreshold
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
		// Hot replicas compete with owned blocks for DRAM: the default
		// is a small share of it (the one place this default is decided).
		c.HotMaxBytes = 1 << 30
		if c.DRAMBytes > 0 {
			c.HotMaxBytes = max(c.DRAMBytes/16, 1)
		}
	}
	if c.HotTracked == 0 {
		c.HotTracked = d.HotTracked
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	return c
}

// Validate reports every problem with c (after defaults) at once. Only
// RebalanceRate, RebalanceMaxBytes and HotThreshold may be negative (Off).
func (c RouteConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"FetchTimeout", int64(c.FetchTimeout)}, {"RemoteTimeout", int64(c.RemoteTimeout)}, {"PeerDownFor", int64(c.PeerDownFor)}, {"FetchParallel", int64(c.FetchParallel)}, {"ReserveTTL", int64(c.ReserveTTL)}, {"PushQueue", int64(c.PushQueue)}, {"PushWorkers", int64(c.PushWorkers)},
		{"RebalanceDelay", int64(c.RebalanceDelay)},
		{"HotWindow", int64(c.HotWindow)}, {"HotTTL", int64(c.HotTTL)},
		{"HotMaxReplicas", int64(c.HotMaxReplicas)}, {"HotMaxBytes", c.HotMaxBytes}, {"DRAMBytes", c.DRAMBytes}, {"HotTracked", int64(c.HotTracked)},
	} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("proxy: route %s is negative", f.name))
		}
	}
	if c.RemoteTimeout > c.FetchTimeout {
		errs = append(errs, fmt.Errorf("proxy: route RemoteTimeout %v exceeds FetchTimeout %v", c.RemoteTimeout, c.FetchTimeout))
	}
	return errors.Join(errs...)
}

// RouteStats is a snapshot of the routing counters.
type RouteStats struct {
	RemoteLookups   int64 // keys asked of other nodes by Lookup/Exists
	RemoteFetches   int64 // keys fetched from other nodes
	RemoteHits      int64 // fetched keys found
	ReadsThrough    int64 // reads served from the owner without a copy here (no room for one)
	FetchFailures   int64 // fetches that failed (node down, transfer error, checksum)
	Pushes          int64 // blocks pushed to owners
	PushFailures    int64 // pushes that failed
	PushesDropped   int64 // pushes dropped because the queue was full
	PushQueueDepth  int64 // batches waiting now
	CoalescedMisses int64 // misses that joined another caller's fetch
	FastFails       int64 // remote calls not made: the node failed a call within PeerDownFor
	PeerDownOpens   int64 // times a node was marked down after a failed call
	PeersDown       int   // nodes marked down now
	RemoteDeletes   int64 // Delete and Clear calls made on other nodes
	RemoteDeleteErr int64 // of those, failed (the node keeps its blocks)

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
	c Cluster
	// The calls on other nodes, each through its counters (peerstats.go).
	fetcher RemoteFetcher
	lookup  RemoteLookup
	pusher  RemotePusher
	deleter RemoteDeleter
	store   Store
	notes   BlockNotes // nil: the rebalancer's pushes and fetches carry no description
	cfg     RouteConfig
	fopts   FetchOptions // every fetch call's: RemoteTimeout, descriptions with notes
	// checkMeta and describe are the proxy's: a fetched block's
	// description is checked and handed to the notes as a put's.
	checkMeta func(*cache.BlockMeta) error
	describe  func(ns string, key []byte, m *cache.BlockMeta) func(error)
	lg        *zap.Logger
	hot       *hotTracker // nil: hot replication off
	rebal     *rebalancer // nil: rebalancer off
	brk       *breaker    // nodes that failed recently
	pushWarn  *failureLog // pushes that failed, logged per node now and then

	queue   chan pushJob
	stop    chan struct{}
	workers sync.WaitGroup

	zcs     ZeroCopyStore                   // where fetched blocks land
	flights *flight.Group[string, struct{}] // one fetch per key at a time (fetch.go)
	stats   peerStats                       // per node (peerstats.go)

	remoteLookups, remoteFetches, remoteHits, fetchFailures atomic.Int64
	pushes, pushFailures, pushesDropped, coalesced          atomic.Int64
	remoteDeletes, remoteDeleteErrs                         atomic.Int64
	readThroughs                                            atomic.Int64 // pinned.go, readThrough
}

// AttachCluster makes the proxy route across the cluster. Call it once,
// before serving; DetachCluster stops the push workers, the rebalancer and
// the hot replica sweeper. cfg is validated (RouteConfig.Validate) and its
// zero fields take their defaults; a negative (Off) RebalanceRate or
// HotThreshold turns that feature off.
func (p *Proxy) AttachCluster(c Cluster, peers Peers, cfg RouteConfig) error {
	if c == nil || peers == nil {
		return errors.New("proxy: nil cluster or peers")
	}
	if p.zcs == nil {
		return errors.New("proxy: routing across the cluster needs the store's arenas (Deps.ZeroCopy): fetched blocks land there")
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	r := &router{c: c, store: p.store, zcs: p.zcs, notes: p.notes, cfg: cfg, lg: p.lg.Named("route"),
		checkMeta: p.checkMeta, describe: p.describe,
		queue: make(chan pushJob, cfg.PushQueue), stop: make(chan struct{}), flights: flight.New[string, struct{}](nil),
		brk: newBreaker(cfg.PeerDownFor, cfg.Clock)}
	r.pushWarn = newFailureLog(r.lg, "pushes to a node failed (tidepool_push_failures_total)", pushWarnEvery, cfg.Clock)
	r.fopts = FetchOptions{AnswerTimeout: cfg.RemoteTimeout, Describe: p.notes != nil}
	cp := counted{peers, &r.stats}
	r.fetcher, r.lookup, r.pusher, r.deleter = cp, cp, cp, cp
	for i := 0; i < cfg.PushWorkers; i++ {
		r.workers.Add(1)
		go r.pushWorker()
	}
	r.startHot()
	r.startRebalancer(p.scan)
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
		ReadsThrough:  r.readThroughs.Load(),
		FetchFailures: r.fetchFailures.Load(), Pushes: r.pushes.Load(), PushFailures: r.pushFailures.Load(),
		PushesDropped: r.pushesDropped.Load(), PushQueueDepth: int64(len(r.queue)), CoalescedMisses: r.coalesced.Load(),
		FastFails: r.brk.fastFails.Load(), PeerDownOpens: r.brk.opens.Load(), PeersDown: len(r.brk.down()),
		RemoteDeletes: r.remoteDeletes.Load(), RemoteDeleteErr: r.remoteDeleteErrs.Load(),
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
// The slice may be the cluster view's own: callers only read it.
func (r *router) remoteOwners(ns string, key []byte) []string {
	self := r.c.Self()
	all := r.c.Owners(ns, key)
	if !slices.Contains(all, self) {
		return all
	}
	out := make([]string, 0, len(all)-1)
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

// localOpts are a put's options for this node's tiers: a block owned
// elsewhere is stored here as a copy (LowPriority), and the chain hint
// (Parent) is kept only for a parent this node owns, whose absence here
// means the block would be an orphan; a parent owned elsewhere is its
// owner's to hold. A nil router (no cluster) changes nothing.
func (r *router) localOpts(ns string, key []byte, opts cache.PutOptions) cache.PutOptions {
	if r == nil {
		return opts
	}
	if !r.owns(ns, key) {
		opts.LowPriority = true
	}
	if len(opts.Parent) > 0 && !r.owns(ns, opts.Parent) {
		opts.Parent = nil
	}
	return opts
}

// pushesElsewhere reports whether a put of (ns, key) here goes to another node: one
// of the first R owners is not this node.
func (r *router) pushesElsewhere(ns string, key []byte) bool {
	self := r.c.Self()
	for i, n := range r.c.Owners(ns, key) {
		if i >= r.c.Replicas() {
			break
		}
		if n != self {
			return true
		}
	}
	return false
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
// parallel, within RemoteTimeout: first each key's first remote owner,
// then, for keys still absent, the next owner (R > 1, or the previous
// owner after a membership change), and so on. present[i] is set for keys
// some owner holds; the returned holders[i] names that owner.
func (r *router) lookupRemote(ctx context.Context, ns string, keys [][]byte, present []bool) (holders []string) {
	owners := make([][]string, len(keys))
	for i, k := range keys {
		if !present[i] {
			owners[i] = r.remoteOwners(ns, k)
		}
	}
	return r.askOwners(ctx, ns, keys, owners, present)
}

// askOwners is lookupRemote with each absent key's remote owners given
// (owners[i], in the order to ask them).
func (r *router) askOwners(ctx context.Context, ns string, keys [][]byte, owners [][]string, present []bool) (holders []string) {
	holders = make([]string, len(keys))
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RemoteTimeout)
	defer cancel()
	var mu sync.Mutex
	for round := 0; ctx.Err() == nil; round++ {
		byNode := map[string][]int{}
		for i := range keys {
			if !present[i] && round < len(owners[i]) {
				n := owners[i][round]
				byNode[n] = append(byNode[n], i)
			}
		}
		if len(byNode) == 0 {
			break
		}
		perNode(byNode, keys, func(node string, idx []int, batch [][]byte) {
			ok, probe := r.brk.allow(node)
			if !ok {
				return // failed recently: the key's next owner, if any, is asked next round
			}
			r.remoteLookups.Add(int64(len(idx)))
			res, err := r.lookup.Lookup(ctx, node, ns, batch)
			r.brk.done(node, probe, outcomeOf(parent, err))
			if err != nil {
				r.lg.Debug("remote lookup failed", zap.String("node", node), zap.Error(err))
				return
			}
			mu.Lock()
			for j, i := range idx {
				if j < len(res) && res[j] {
					present[i], holders[i] = true, node
				}
			}
			mu.Unlock()
		})
	}
	return holders
}

// everywhere calls fn on every other member that may hold blocks (alive,
// suspect or leaving; not left or failed), in parallel, within
// FetchTimeout, and returns an error wrapping cache.ErrUnavailable naming
// the members where fn failed or that failed a call recently. Used by
// cluster-wide Delete and Clear.
func (r *router) everywhere(ctx context.Context, fn func(ctx context.Context, node string) error) error {
	self := r.c.Self()
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, r.cfg.FetchTimeout)
	defer cancel()
	var mu sync.Mutex
	var failed []string
	var wg sync.WaitGroup
	for _, m := range r.c.Members() {
		if m.Name == self || m.Self || m.State == "left" || m.State == "failed" {
			continue
		}
		wg.Add(1)
		go func(node string) {
			defer wg.Done()
			ok, probe := r.brk.allow(node)
			var err error
			if !ok {
				err = ErrPeerDown
			} else {
				r.remoteDeletes.Add(1)
				err = fn(ctx, node)
				r.brk.done(node, probe, outcomeOf(parent, err))
			}
			if err != nil {
				r.remoteDeleteErrs.Add(1)
				r.lg.Debug("cluster-wide delete failed", zap.String("node", node), zap.Error(err))
				mu.Lock()
				failed = append(failed, node)
				mu.Unlock()
			}
		}(m.Name)
	}
	wg.Wait()
	if len(failed) > 0 {
		sort.Strings(failed)
		return fmt.Errorf("%w: not reached: %s (they may still hold the blocks; retry)", cache.ErrUnavailable, strings.Join(failed, ", "))
	}
	return nil
}

// push sends items to the owners of their keys: synchronously when sync is
// positive (waiting for that many owners per item), else through the queue.
// owned says the items' values are the caller's to give away; otherwise
// the push sends copies (an inline put's value is the request's buffer,
// lent only until the call returns: safecodec/borrow.go; and a queued push,
// or a synchronous one that timed out while Kitex still writes it, reads
// the value after push returns). The items' descriptions (Opts.Meta, for
// the owners' KV events) are always copied: an inline put's parent key is
// in the request's buffer too.
func (r *router) push(ctx context.Context, ns string, items []PutItem, syncN int, owned bool) error {
	byNode := map[string][]PutItem{}
	need := map[string]int{}
	var copies [][]byte // by item, made once for all its owners
	var orphans []PutItem
	for k, it := range items {
		it.Opts.Meta = it.Opts.Meta.Clone()
		elsewhere := false
		for i, n := range r.c.Owners(ns, it.Key) {
			if i >= r.c.Replicas() {
				break
			}
			if n == r.c.Self() {
				continue
			}
			if !owned {
				if copies == nil {
					copies = make([][]byte, len(items))
				}
				if copies[k] == nil {
					copies[k] = bytes.Clone(it.Value)
				}
				it.Value = copies[k]
			}
			byNode[n] = append(byNode[n], it)
			need[n]++
			elsewhere = true
		}
		if !elsewhere && it.Opts.LowPriority {
			orphans = append(orphans, it)
		}
	}
	// Stored as a copy of a block owned elsewhere, whose owner then left
	// the ring: owed to it, for when it is back (owed.go).
	r.owe(ns, orphans)
	if syncN <= 0 {
		for node, its := range byNode {
			select {
			case r.queue <- pushJob{node: node, ns: ns, items: its}:
			default:
				r.pushesDropped.Add(int64(len(its)))
				r.owe(ns, its) // the rebalancer pushes them later
			}
		}
		return nil
	}
	parent := ctx
	longest := time.Duration(0)
	for _, its := range byNode {
		longest = max(longest, r.pushTimeout(its))
	}
	ctx, cancel := context.WithTimeout(ctx, longest)
	defer cancel()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for node, its := range byNode {
		wg.Add(1)
		go func(node string, its []PutItem) {
			defer wg.Done()
			if err := r.pushNow(ctx, parent, node, ns, its); err != nil {
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

// pushNow pushes items to node, unless node failed a call recently.
// parent is the caller's context (without the router's deadline). The
// items that failed are owed to their owners (owed.go): the rebalancer
// pushes them again.
func (r *router) pushNow(ctx, parent context.Context, node, ns string, items []PutItem) error {
	ok, probe := r.brk.allow(node)
	if !ok {
		r.pushFailures.Add(int64(len(items)))
		r.owe(ns, items)
		return fmt.Errorf("%w: %s", ErrPeerDown, node)
	}
	res, err := r.pusher.Push(ctx, node, ns, items)
	r.brk.done(node, probe, outcomeOf(parent, err))
	failed := pushFailed(res, err, len(items))
	r.pushes.Add(int64(len(items) - failed))
	r.pushFailures.Add(int64(failed))
	if failed == 0 {
		return nil
	}
	if res == nil {
		r.owe(ns, items)
	} else {
		var owed []PutItem
		for i, e := range res {
			// A block too large for the owner's bound stays so: not owed.
			if e != nil && !errors.Is(e, cache.ErrExists) && !errors.Is(e, cache.ErrTooLarge) && i < len(items) {
				owed = append(owed, items[i])
			}
		}
		r.owe(ns, owed)
	}
	if err == nil {
		for _, e := range res {
			if e != nil {
				err = e
				break
			}
		}
	}
	r.pushWarn.failed(node, failed, err)
	return err
}

// pushBytesPerTimeout is how many bytes of a push FetchTimeout bounds: a
// push travels in calls of about this size (peerapi.ClientConfig's
// PushCallBytes), and a large one must not time out for being large.
const pushBytesPerTimeout = 16 << 20

// pushTimeout bounds a push of items to one node: FetchTimeout per
// pushBytesPerTimeout bytes it carries, started or not.
func (r *router) pushTimeout(items []PutItem) time.Duration {
	var n int64
	for _, it := range items {
		n += int64(len(it.Value))
	}
	return r.cfg.FetchTimeout * time.Duration(1+n/pushBytesPerTimeout)
}

func (r *router) pushWorker() {
	defer r.workers.Done()
	for {
		select {
		case job := <-r.queue:
			ctx, cancel := context.WithTimeout(context.Background(), r.pushTimeout(job.items))
			r.pushNow(ctx, context.Background(), job.node, job.ns, job.items)
			cancel()
		case <-r.stop:
			// Finish what is queued, then stop.
			for {
				select {
				case job := <-r.queue:
					ctx, cancel := context.WithTimeout(context.Background(), r.pushTimeout(job.items))
					r.pushNow(ctx, context.Background(), job.node, job.ns, job.items)
					cancel()
				default:
					return
				}
			}
		}
	}
}
