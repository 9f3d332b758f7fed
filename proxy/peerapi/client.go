package peerapi

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	kclient "github.com/cloudwego/kitex/client"
	"github.com/cloudwego/kitex/pkg/connpool"
	"github.com/cloudwego/kitex/pkg/remote/codec"
	"github.com/cloudwego/kitex/pkg/remote/trans/gonet"
	"github.com/cloudwego/kitex/pkg/rpcinfo"
	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/protocol/gen/peer"
	"github.com/tidepool-kv/tidepool/protocol/gen/peer/tidepoolpeer"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/rdma"
)

// ClientConfig configures the peer API client.
type ClientConfig struct {
	Credentials
	// Resolve returns a node's peer API and transfer addresses
	// (clusterview.View.Addrs). Required.
	Resolve func(node string) (peerAddr, transferAddr string, ok bool)
	// Store is this node's store: fetched blocks are reserved in its DRAM
	// arenas and committed there as low-priority copies. Required.
	Store proxy.ZeroCopyStore
	// Transport pulls the bytes; Regions are this node's registered arenas,
	// indexed like Store.Arenas (registered with the transport: cmd/tidepool's registerArenas). Required.
	Transport rdma.Transport
	Regions   []rdma.RegionDesc
	// Timeout bounds one RPC when the caller's context has no earlier
	// deadline. Default 5 s.
	Timeout time.Duration
	// ConnectTimeout bounds dialing a peer's API. Default 1 s.
	ConnectTimeout time.Duration
	// Lease is how long the owner keeps a fetched block pinned for the
	// transfer (released as soon as it is done). Default 10 s.
	Lease time.Duration
	// ReserveTTL is how long a local slot waits for its bytes. Default 10 s.
	ReserveTTL time.Duration
	// MaxResponseBytes bounds one framed response. Default 64 MiB.
	MaxResponseBytes int
	// MaxIdleConns is the idle API connections kept per peer. Default 16.
	MaxIdleConns int
	// Parallel bounds the transfers of one Fetch that run at once.
	// Default 8.
	Parallel int
}

// DefaultClientConfig returns the defaults documented on ClientConfig.
func DefaultClientConfig() ClientConfig {
	return ClientConfig{
		Timeout: 5 * time.Second, ConnectTimeout: time.Second, Lease: 10 * time.Second,
		ReserveTTL: 10 * time.Second, MaxResponseBytes: 64 << 20, MaxIdleConns: 16, Parallel: 8,
	}
}

func (c ClientConfig) withDefaults() ClientConfig {
	d := DefaultClientConfig()
	if c.Timeout == 0 {
		c.Timeout = d.Timeout
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = d.ConnectTimeout
	}
	if c.Lease == 0 {
		c.Lease = d.Lease
	}
	if c.ReserveTTL == 0 {
		c.ReserveTTL = d.ReserveTTL
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = d.MaxResponseBytes
	}
	if c.MaxIdleConns == 0 {
		c.MaxIdleConns = d.MaxIdleConns
	}
	if c.Parallel == 0 {
		c.Parallel = d.Parallel
	}
	return c
}

// Validate reports every problem with c (after defaults).
func (c ClientConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(f string, a ...any) { errs = append(errs, fmt.Errorf("peerapi: "+f, a...)) }
	if c.Resolve == nil {
		bad("Resolve is required")
	}
	if c.Store == nil {
		bad("Store is required")
	}
	if c.Transport == nil {
		bad("Transport is required")
	}
	if len(c.Regions) == 0 {
		bad("Regions is empty (register the arenas with the transport)")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Timeout", c.Timeout}, {"ConnectTimeout", c.ConnectTimeout}, {"Lease", c.Lease}, {"ReserveTTL", c.ReserveTTL}} {
		if d.v < 0 {
			bad("%s %v is negative", d.name, d.v)
		}
	}
	if c.MaxResponseBytes < 0 {
		bad("MaxResponseBytes %d is negative", c.MaxResponseBytes)
	}
	if c.MaxIdleConns < 0 {
		bad("MaxIdleConns %d is negative", c.MaxIdleConns)
	}
	if c.Parallel < 0 {
		bad("Parallel %d is negative", c.Parallel)
	}
	return errors.Join(errs...)
}

// PeerStats counts one peer's calls made by this client.
type PeerStats struct {
	Node          string
	Fetches       int64         // Fetch calls
	FetchedBlocks int64         // blocks brought in (or found local meanwhile)
	FetchedBytes  int64         // bytes pulled
	HotFetched    int64         // keys asked with FetchHot (kept at full priority)
	Misses        int64         // keys the peer did not hold
	Failures      int64         // keys or calls that failed (transfer, checksum, RPC)
	ChecksumFails int64         // fetched blocks whose bytes failed their CRC
	Lookups       int64         // Lookup calls
	Pushes        int64         // blocks pushed
	PushFailures  int64         // pushed blocks the peer did not store
	FetchLatency  time.Duration // summed over successful Fetch calls
}

// MeanFetchLatency is FetchLatency per Fetch call.
func (s PeerStats) MeanFetchLatency() time.Duration {
	if s.Fetches > 0 {
		return s.FetchLatency / time.Duration(s.Fetches)
	}
	return 0
}

type peerCounters struct {
	fetches, blocks, bytes, hot, misses, failures, csum, lookups, pushes, pushFails, latency atomic.Int64
}

// Client makes peer API calls and moves fetched bytes; it implements
// proxy.Peers. Safe for concurrent use.
type Client struct {
	cfg  ClientConfig
	lg   *zap.Logger
	auth *peer.Auth

	mu       sync.Mutex
	closed   bool
	apis     map[string]*apiConn      // by peer API address
	xfers    map[string]rdma.Peer     // by transfer address
	counters map[string]*peerCounters // by node

	releases sync.WaitGroup // asynchronous lease releases
	// pending holds, per node, owner leases this client is done with, not
	// yet released: the next Acquire to that node carries them, or a
	// Release call does after releaseDelay.
	pending map[string]*pendingRelease
}

// pendingRelease is one node's leases waiting to be released.
type pendingRelease struct {
	kc    *apiConn
	ids   []int64
	timer *time.Timer
}

// releaseDelay is how long finished leases wait for an Acquire to the same
// node to carry them before a Release call of their own. Short against any
// lease, long against the gap between a busy node's fetches.
const releaseDelay = 20 * time.Millisecond

// maxRide bounds the lease ids one Acquire carries (the owner's batch limit
// applies to them).
const maxRide = 256

var (
	_ proxy.Peers      = (*Client)(nil)
	_ proxy.HotFetcher = (*Client)(nil)
)

// NewClient validates cfg and returns a client; connections are made on
// first use. lg is used as given; nil is a no-op.
func NewClient(cfg ClientConfig, lg *zap.Logger) (*Client, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("peerapi: invalid client config: %w", err)
	}
	if lg == nil {
		lg = zap.NewNop()
	}
	return &Client{
		cfg: cfg, lg: lg, auth: cfg.Credentials.auth(),
		apis: map[string]*apiConn{}, xfers: map[string]rdma.Peer{}, counters: map[string]*peerCounters{},
		pending: map[string]*pendingRelease{},
	}, nil
}

// Close waits for pending lease releases and closes every connection. Safe
// to call twice.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	nodes := make([]string, 0, len(c.pending))
	for node := range c.pending {
		nodes = append(nodes, node)
	}
	c.mu.Unlock()
	for _, node := range nodes {
		c.flushRelease(node, true)
	}
	c.releases.Wait()
	c.mu.Lock()
	apis, xfers := c.apis, c.xfers
	c.apis, c.xfers = map[string]*apiConn{}, map[string]rdma.Peer{}
	c.mu.Unlock()
	var errs []error
	for _, kc := range apis {
		if err := kc.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range xfers {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}

// Forget closes the pooled peer API connections to addr (a member that
// left, is leaving or failed), so that its server, draining, is not held
// open by idle connections from here. Calls in flight finish; their
// connections are closed as they are returned. A later call to addr dials
// anew. Transfer connections are left alone: a transfer in flight ends as
// it would.
func (c *Client) Forget(addr string) {
	c.mu.Lock()
	a, ok := c.apis[addr]
	delete(c.apis, addr)
	c.mu.Unlock()
	if ok {
		if err := a.Close(); err != nil {
			c.lg.Debug("closing peer connections", zap.String("addr", addr), zap.Error(err))
		}
	}
}

func (c *Client) stats(node string) *peerCounters {
	c.mu.Lock()
	defer c.mu.Unlock()
	pc, ok := c.counters[node]
	if !ok {
		pc = &peerCounters{}
		c.counters[node] = pc
	}
	return pc
}

// Stats returns per-peer counters, sorted by node.
func (c *Client) Stats() []PeerStats {
	c.mu.Lock()
	out := make([]PeerStats, 0, len(c.counters))
	for node, pc := range c.counters {
		out = append(out, PeerStats{
			Node: node, Fetches: pc.fetches.Load(), FetchedBlocks: pc.blocks.Load(), FetchedBytes: pc.bytes.Load(), HotFetched: pc.hot.Load(),
			Misses: pc.misses.Load(), Failures: pc.failures.Load(), ChecksumFails: pc.csum.Load(),
			Lookups: pc.lookups.Load(), Pushes: pc.pushes.Load(), PushFailures: pc.pushFails.Load(),
			FetchLatency: time.Duration(pc.latency.Load()),
		})
	}
	c.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// api returns the Kitex client for node's peer API and its transfer
// address.
func (c *Client) api(node string) (*apiConn, string, error) {
	addr, xfer, ok := c.cfg.Resolve(node)
	if !ok || addr == "" {
		return nil, "", fmt.Errorf("%w: %q", ErrUnknownNode, node)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, "", ErrClosed
	}
	if kc, ok := c.apis[addr]; ok {
		return kc, xfer, nil
	}
	kc, err := kclient.NewClient(tidepoolpeer.NewServiceInfoForClient(),
		kclient.WithDestService("tidepool-peer"),
		kclient.WithHostPorts(addr),
		kclient.WithRPCTimeout(c.cfg.Timeout),
		kclient.WithConnectTimeout(c.cfg.ConnectTimeout),
		kclient.WithLongConnection(connpool.IdleConfig{
			MaxIdlePerAddress: c.cfg.MaxIdleConns,
			MaxIdleGlobal:     c.cfg.MaxIdleConns * 64,
			MaxIdleTimeout:    time.Minute,
		}),
		kclient.WithCodec(codec.NewDefaultCodecWithSizeLimit(c.cfg.MaxResponseBytes)),
		kclient.WithClientBasicInfo(&rpcinfo.EndpointBasicInfo{ServiceName: "tidepool-peer-client"}),
		kclient.WithTransHandlerFactory(gonet.NewCliTransHandlerFactory()),
		kclient.WithDialer(authDialer{key: c.cfg.Key}),
	)
	if err != nil {
		return nil, "", fmt.Errorf("peerapi: client for %s: %w", addr, err)
	}
	a := &apiConn{kc: kc}
	c.apis[addr] = a
	return a, xfer, nil
}

// xfer returns the transfer handle for addr, connecting once.
func (c *Client) xfer(ctx context.Context, addr string) (rdma.Peer, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if p, ok := c.xfers[addr]; ok {
		c.mu.Unlock()
		return p, nil
	}
	c.mu.Unlock()
	p, err := c.cfg.Transport.Connect(ctx, addr)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		p.Close()
		return nil, ErrClosed
	}
	if old, ok := c.xfers[addr]; ok {
		p.Close() // another caller connected first
		return old, nil
	}
	c.xfers[addr] = p
	return p, nil
}

// dropXfer forgets a broken transfer handle so the next call reconnects.
func (c *Client) dropXfer(addr string, p rdma.Peer) {
	c.mu.Lock()
	if c.xfers[addr] == p {
		delete(c.xfers, addr)
	} else {
		p = nil
	}
	c.mu.Unlock()
	if p != nil {
		p.Close()
	}
}

// Lookup reports, per key, whether node holds the block locally.
func (c *Client) Lookup(ctx context.Context, node, ns string, keys [][]byte) ([]bool, error) {
	pc := c.stats(node)
	pc.lookups.Add(1)
	kc, _, err := c.api(node)
	if err != nil {
		return nil, err
	}
	res, err := kc.Lookup(ctx, &peer.LookupRequest{Auth: c.auth, Ns: ns, Keys: keys})
	if err != nil {
		pc.failures.Add(1)
		return nil, callErr(node, err)
	}
	if len(res.Present) != len(keys) {
		pc.failures.Add(1)
		return nil, fmt.Errorf("%w: lookup of %d keys answered %d", ErrProtocol, len(keys), len(res.Present))
	}
	return res.Present, nil
}

// Push stores blocks on node, each with its CRC-32C. Per item: nil (stored
// or already present) or the error.
func (c *Client) Push(ctx context.Context, node, ns string, items []proxy.PutItem) ([]error, error) {
	pc := c.stats(node)
	kc, _, err := c.api(node)
	if err != nil {
		pc.pushFails.Add(int64(len(items)))
		return nil, err
	}
	req := &peer.PutRequest{Auth: c.auth, Ns: ns, Items: make([]*peer.PutItem, len(items))}
	for i, it := range items {
		// The checksum the block is known by when the caller has it (a
		// block read from this node's store): the receiver then refuses
		// bytes damaged here since they were checked.
		sum := it.Opts.Checksum
		if !it.Opts.HasChecksum {
			sum = cache.Checksum(it.Value)
		}
		req.Items[i] = &peer.PutItem{Key: it.Key, Value: it.Value, Depth: it.Opts.Depth, Checksum: int32(sum)}
	}
	res, err := kc.Put(ctx, req)
	if err != nil {
		pc.pushFails.Add(int64(len(items)))
		return nil, callErr(node, err)
	}
	if len(res.Codes) != len(items) {
		pc.pushFails.Add(int64(len(items)))
		return nil, fmt.Errorf("%w: put of %d items answered %d", ErrProtocol, len(items), len(res.Codes))
	}
	out := make([]error, len(items))
	for i, code := range res.Codes {
		if e := codeErr(node, code, ""); e != nil && !errors.Is(e, cache.ErrExists) {
			out[i] = e
			pc.pushFails.Add(1)
			continue
		}
		pc.pushes.Add(1)
	}
	return out, nil
}

// Delete removes keys from node's local tiers. Per key: whether it was
// there.
func (c *Client) Delete(ctx context.Context, node, ns string, keys [][]byte) ([]bool, error) {
	pc := c.stats(node)
	kc, _, err := c.api(node)
	if err != nil {
		pc.failures.Add(1)
		return nil, err
	}
	res, err := kc.Delete(ctx, &peer.DeleteRequest{Auth: c.auth, Ns: ns, Keys: keys})
	if err != nil {
		pc.failures.Add(1)
		return nil, callErr(node, err)
	}
	if len(res.Deleted) != len(keys) {
		pc.failures.Add(1)
		return nil, fmt.Errorf("%w: delete of %d keys answered %d", ErrProtocol, len(keys), len(res.Deleted))
	}
	return res.Deleted, nil
}

// Clear removes every block of ns from node's local tiers and returns how
// many there were.
func (c *Client) Clear(ctx context.Context, node, ns string) (int64, error) {
	pc := c.stats(node)
	kc, _, err := c.api(node)
	if err != nil {
		pc.failures.Add(1)
		return 0, err
	}
	res, err := kc.Clear(ctx, &peer.ClearRequest{Auth: c.auth, Ns: ns})
	if err != nil {
		pc.failures.Add(1)
		return 0, callErr(node, err)
	}
	return max(res.Removed, 0), nil
}

// Fetch brings the blocks of keys held by node into the local store as
// low-priority copies: the owner pins them (Acquire), each is pulled into
// a reserved local slot with a one-sided Read and committed only if its
// bytes match the owner's CRC-32C (else the slot is freed: a miss, never
// wrong bytes), then the owner's pins are released in one call. Per key:
// nil (local now), cache.ErrNotFound, or the error.
func (c *Client) Fetch(ctx context.Context, node, ns string, keys [][]byte) ([]error, error) {
	return c.fetch(ctx, node, ns, keys, true)
}

// FetchHot is Fetch, but the blocks are committed at full priority: the
// proxy's hot replicas, and blocks this node owns (a new owner filling
// lazily from the previous one). It implements proxy.HotFetcher.
func (c *Client) FetchHot(ctx context.Context, node, ns string, keys [][]byte) ([]error, error) {
	c.stats(node).hot.Add(int64(len(keys)))
	return c.fetch(ctx, node, ns, keys, false)
}

func (c *Client) fetch(ctx context.Context, node, ns string, keys [][]byte, low bool) ([]error, error) {
	start := time.Now()
	pc := c.stats(node)
	pc.fetches.Add(1)
	kc, resolvedXfer, err := c.api(node)
	if err != nil {
		pc.failures.Add(1)
		return nil, err
	}
	lease := max(c.cfg.Lease.Milliseconds(), 1)
	ride := c.takeReleases(node)
	actx := ctx
	if d, ok := proxy.AnswerTimeout(ctx); ok {
		// The owner must answer within d (a hung or partitioned owner costs
		// d, not the whole fetch); the pulls below use ctx.
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	res, err := kc.Acquire(actx, &peer.AcquireRequest{Auth: c.auth, Ns: ns, Keys: keys, LeaseMs: int32(min(lease, 1<<31-1)), Release: ride})
	if err != nil {
		c.release(node, kc, ride) // may not have reached the owner
		pc.failures.Add(1)
		return nil, callErr(node, err)
	}
	if len(res.Items) != len(keys) {
		pc.failures.Add(1)
		// Pins we cannot match to keys: give them back.
		var ids []int64
		for _, it := range res.Items {
			if it != nil && it.Code == tp.ErrorCode_OK {
				ids = append(ids, it.LeaseId)
			}
		}
		c.release(node, kc, ids)
		return nil, fmt.Errorf("%w: acquire of %d keys answered %d", ErrProtocol, len(keys), len(res.Items))
	}
	errs := make([]error, len(keys))
	var leases []int64
	pullOne := func(i int, it *peer.AcquireItem) {
		n, err := c.pull(ctx, ns, keys[i], it, resolvedXfer, low)
		errs[i] = err
		switch {
		case err == nil:
			pc.blocks.Add(1)
			pc.bytes.Add(n)
		case errors.Is(err, cache.ErrChecksum):
			pc.csum.Add(1)
			pc.failures.Add(1)
		default:
			pc.failures.Add(1)
		}
	}
	sem := make(chan struct{}, max(c.cfg.Parallel, 1))
	var wg sync.WaitGroup
	for i, it := range res.Items {
		if it == nil {
			errs[i] = fmt.Errorf("%w: nil item", ErrProtocol)
			continue
		}
		if it.Code != tp.ErrorCode_OK {
			errs[i] = codeErr(node, it.Code, it.Message)
			if errors.Is(errs[i], cache.ErrNotFound) {
				pc.misses.Add(1)
			} else {
				pc.failures.Add(1)
			}
			continue
		}
		leases = append(leases, it.LeaseId)
		if len(res.Items) == 1 {
			pullOne(i, it) // one block: pull it from here
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(i int, it *peer.AcquireItem) {
			defer func() { <-sem; wg.Done() }()
			pullOne(i, it)
		}(i, it)
	}
	wg.Wait()
	c.release(node, kc, leases)
	pc.latency.Add(int64(time.Since(start)))
	return errs, nil
}

// pull moves one acquired block into a reserved local slot and commits it.
// It returns the bytes pulled.
func (c *Client) pull(ctx context.Context, ns string, key []byte, it *peer.AcquireItem, resolvedXfer string, low bool) (int64, error) {
	s := it.Slot
	if s == nil || s.Length < 0 || s.Offset < 0 || s.RegionLen < 0 || s.Offset > s.RegionLen || s.Length > s.RegionLen-s.Offset {
		return 0, fmt.Errorf("%w: bad slot %v", ErrProtocol, s)
	}
	r, err := c.cfg.Store.Reserve(ctx, ns, key, s.Length, cache.PutOptions{Depth: it.Depth, LowPriority: low}, c.cfg.ReserveTTL)
	if errors.Is(err, cache.ErrExists) {
		return 0, nil // stored locally meanwhile
	}
	if err != nil {
		return 0, fmt.Errorf("peerapi: reserve %d bytes: %w", s.Length, err)
	}
	arena, off, n := r.Location()
	if arena < 0 || arena >= len(c.cfg.Regions) || n != s.Length {
		_ = r.Abort()
		return 0, fmt.Errorf("%w: local arena %d is not registered", cache.ErrUnavailable, arena)
	}
	if n > 0 {
		addr := s.TransportAddr
		if addr == "" {
			addr = resolvedXfer
		}
		p, err := c.xfer(ctx, addr)
		if err != nil {
			_ = r.Abort()
			return 0, fmt.Errorf("peerapi: connect transfer %s: %w: %w", addr, cache.ErrUnavailable, err)
		}
		op := rdma.Op{
			Local: c.cfg.Regions[arena].ID, LocalOff: uint64(off),
			Remote:    rdma.RegionDesc{ID: rdma.RegionID(s.RegionId), Len: uint64(s.RegionLen), Key: uint32(s.RegionKey), Addr: uint64(s.RegionAddr)},
			RemoteOff: uint64(s.Offset), Len: uint64(n),
			// Checked once, end to end, against the owner's stored
			// CRC-32C as the bytes land: a transfer error and a block
			// damaged on the owner both fail the read.
			Sum: uint32(it.Checksum), SumKnown: true,
		}
		if err := p.Read(ctx, op); err != nil {
			_ = r.Abort()
			if errors.Is(err, rdma.ErrPeerLost) || errors.Is(err, rdma.ErrClosed) || errors.Is(err, rdma.ErrUnreachable) || errors.Is(err, rdma.ErrProtocol) {
				c.dropXfer(addr, p)
			}
			if errors.Is(err, rdma.ErrChecksum) {
				// The landed bytes do not match the owner's CRC-32C.
				return 0, fmt.Errorf("peerapi: read from %s: %w: %w", addr, cache.ErrChecksum, err)
			}
			return 0, fmt.Errorf("peerapi: read from %s: %w: %w", addr, cache.ErrUnavailable, err)
		}
	}
	if n > 0 {
		_, err = r.CommitChecked(ctx, uint32(it.Checksum)) // the read checked the bytes
	} else {
		_, err = r.Commit(ctx, uint32(it.Checksum), true)
	}
	if err != nil {
		return 0, fmt.Errorf("peerapi: commit fetched block: %w", err)
	}
	return n, nil
}

// release queues the owner's pins for release: the next Acquire to node
// carries them, or a Release call does, in the background, after
// releaseDelay.
func (c *Client) release(node string, kc *apiConn, ids []int64) {
	if len(ids) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		c.releases.Add(1) // Close is flushing: send them now
		go c.sendRelease(node, kc, ids)
		return
	}
	p := c.pending[node]
	if p == nil {
		p = &pendingRelease{}
		c.pending[node] = p
	}
	p.kc = kc
	p.ids = append(p.ids, ids...)
	if p.timer == nil {
		p.timer = time.AfterFunc(releaseDelay, func() { c.flushRelease(node, false) })
	}
}

// takeReleases removes up to maxRide queued lease ids of node, for an
// Acquire to carry.
func (c *Client) takeReleases(node string) []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pending[node]
	if p == nil || len(p.ids) == 0 {
		return nil
	}
	n := min(len(p.ids), maxRide)
	ids := append([]int64(nil), p.ids[:n]...)
	p.ids = append(p.ids[:0], p.ids[n:]...)
	return ids
}

// flushRelease sends node's queued lease ids in a Release call: in the
// background from the timer, synchronously from Close (wait).
func (c *Client) flushRelease(node string, wait bool) {
	c.mu.Lock()
	p := c.pending[node]
	if p == nil {
		c.mu.Unlock()
		return
	}
	ids, kc := p.ids, p.kc
	p.ids = nil
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	if len(ids) == 0 {
		c.mu.Unlock()
		return
	}
	c.releases.Add(1)
	c.mu.Unlock()
	if wait {
		c.sendRelease(node, kc, ids)
	} else {
		go c.sendRelease(node, kc, ids)
	}
}

// sendRelease releases ids in Release calls of at most maxRide; on failure
// the pins expire with their lease. It marks one c.releases as done.
func (c *Client) sendRelease(node string, kc *apiConn, ids []int64) {
	defer c.releases.Done()
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
	defer cancel()
	for len(ids) > 0 {
		n := min(len(ids), maxRide)
		if _, err := kc.Release(ctx, &peer.ReleaseRequest{Auth: c.auth, LeaseIds: ids[:n]}); err != nil {
			c.lg.Debug("lease release failed", zap.String("node", node), zap.Error(err))
			return
		}
		ids = ids[n:]
	}
}
