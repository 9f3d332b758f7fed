package peerapi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	kclient "github.com/cloudwego/kitex/client"
	"github.com/cloudwego/kitex/pkg/connpool"
	"github.com/cloudwego/kitex/pkg/remote/codec"
	kconnpool "github.com/cloudwego/kitex/pkg/remote/connpool"
	"github.com/cloudwego/kitex/pkg/remote/trans/gonet"
	"github.com/cloudwego/kitex/pkg/rpcinfo"
	"github.com/cloudwego/kitex/transport"
	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/protocol/gen/peer"
	"github.com/tidepool-kv/tidepool/protocol/gen/peer/tidepoolpeer"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/wirecode"
	"github.com/tidepool-kv/tidepool/rdma"
)

// ClientConfig configures the peer API client.
type ClientConfig struct {
	Credentials
	// Resolve returns a node's peer API and transfer addresses
	// (clusterview.View.Addrs). Required.
	Resolve func(node string) (peerAddr, transferAddr string, ok bool)
	// Transport pulls the bytes (Pull); Regions are this node's registered
	// arenas, indexed like the store's arenas (registered with the
	// transport: cmd/tidepool's registerArenas). Required.
	Transport rdma.Transport
	Regions   []rdma.RegionDesc
	// Fetch makes named reads (fetch.go): the transport whose connections
	// the client then uses for every transfer, Pull included; normally
	// Transport itself (rdma/tcp, rdma/auto). nil: no named reads, every
	// fetch goes by Acquire and Pull.
	Fetch rdma.FetchConnector
	// Timeout bounds one RPC when the caller's context has no earlier
	// deadline. Default 5 s.
	Timeout time.Duration
	// ConnectTimeout bounds dialing a peer's API. Default 1 s.
	ConnectTimeout time.Duration
	// Lease is how long the owner keeps a fetched block pinned for the
	// transfer (released as soon as it is done). Default 10 s.
	Lease time.Duration
	// MaxMessageBytes bounds one framed message, either way: a request
	// this client encodes (a Push's Put call carries block bytes) and an
	// answer it decodes. It must not exceed the peers'
	// ServerConfig.MaxRequestBytes, or they refuse the largest calls;
	// cmd/tidepool sets both from max_request_size. Default
	// DefaultMaxMessageBytes, as the server's.
	MaxMessageBytes int
	// PushCallBytes bounds the encoded size of one Put call of a Push: the
	// blocks travel in calls of at most this many bytes, one after the
	// other, so that neither side holds more of a push in memory at once.
	// A block whose call alone is larger goes alone (up to
	// MaxMessageBytes). Default 16 MiB, or MaxMessageBytes when that is
	// smaller.
	PushCallBytes int
	// MaxIdleConns is the idle API connections kept per peer. Default 16.
	MaxIdleConns int
}

// DefaultClientConfig returns the defaults documented on ClientConfig.
func DefaultClientConfig() ClientConfig {
	return ClientConfig{
		Timeout: 5 * time.Second, ConnectTimeout: time.Second, Lease: 10 * time.Second,
		MaxMessageBytes: DefaultMaxMessageBytes, PushCallBytes: defaultPushCallBytes, MaxIdleConns: 16,
	}
}

// DefaultMaxMessageBytes is the default bound of one peer API message: a
// server's MaxRequestBytes and a client's MaxMessageBytes (the one place
// both defaults are written, so that a client never sends what a server
// with the same defaults refuses).
const DefaultMaxMessageBytes = 256 << 20

// defaultPushCallBytes is PushCallBytes' default: four 4 MiB blocks per
// call, a small share of the message bound and of a node's memory.
const defaultPushCallBytes = 16 << 20

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
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = d.MaxMessageBytes
	}
	if c.PushCallBytes == 0 {
		c.PushCallBytes = min(d.PushCallBytes, c.MaxMessageBytes)
	}
	if c.MaxIdleConns == 0 {
		c.MaxIdleConns = d.MaxIdleConns
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
	if c.Transport == nil {
		bad("Transport is required")
	}
	if len(c.Regions) == 0 {
		bad("Regions is empty (register the arenas with the transport)")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Timeout", c.Timeout}, {"ConnectTimeout", c.ConnectTimeout}, {"Lease", c.Lease}} {
		if d.v < 0 {
			bad("%s %v is negative", d.name, d.v)
		}
	}
	if c.MaxMessageBytes < 0 {
		bad("MaxMessageBytes %d is negative", c.MaxMessageBytes)
	}
	if c.PushCallBytes < 0 || c.PushCallBytes > c.MaxMessageBytes {
		bad("PushCallBytes %d outside [1, MaxMessageBytes %d]", c.PushCallBytes, c.MaxMessageBytes)
	}
	if c.MaxIdleConns < 0 {
		bad("MaxIdleConns %d is negative", c.MaxIdleConns)
	}
	return errors.Join(errs...)
}

// Client makes peer API calls and reads pinned blocks over the transfer
// layer; it implements proxy.Peers (the proxy drives fetches: fetch.go).
// Safe for concurrent use.
type Client struct {
	cfg  ClientConfig
	lg   *zap.Logger
	auth *peer.Auth

	mu     sync.Mutex
	closed bool
	apis   map[string]*apiConn // by peer API address
	xfers  map[string]xferConn // by transfer address

	// releases counts lease releases being sent from a timer; calls
	// counts every call in flight through any connection of this client,
	// forgotten ones too (apiConn). Close waits for both: no goroutine of
	// this client calls a peer after Close returns.
	releases, calls sync.WaitGroup
	// pending holds, per node, owner leases this client is done with, not
	// yet released: the next Acquire to that node carries them, or a
	// Release call does after releaseDelay.
	pending map[string]*pendingRelease
	// fetchable: the nodes whose last Acquire answer said they serve
	// named reads (fetch.go), and whether they describe blocks in them
	// (request version 2).
	fetchable map[string]bool
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

var _ proxy.Peers = (*Client)(nil)

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
		apis: map[string]*apiConn{}, xfers: map[string]xferConn{},
		pending: map[string]*pendingRelease{}, fetchable: map[string]bool{},
	}, nil
}

// Close sends the queued lease releases, refuses calls from then on, waits
// for the calls in flight (each bounded by Timeout) and closes every
// connection. Safe to call twice.
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
	c.apis, c.xfers = map[string]*apiConn{}, map[string]xferConn{}
	c.mu.Unlock()
	var errs []error
	for _, kc := range apis {
		if err := kc.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	c.calls.Wait() // the last call on each connection closes it
	for _, x := range xfers {
		errs = append(errs, x.p.Close())
	}
	return errors.Join(errs...)
}

// Forget closes the pooled peer API connections to addr (a member that
// left, is leaving or failed), so that its server, draining, is not held
// open by idle connections from here. Calls in flight finish; their
// connections are closed as they are returned; a call or a queued lease
// release that still holds the forgotten connection fails with ErrClosed
// (those pins expire with their lease). A later call to addr dials anew.
// Transfer connections are left alone: a transfer in flight ends as it
// would.
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
		// No RPC timeout: each call's bounds are put on its connection
		// (deadline.go), by this pool.
		kclient.WithConnectTimeout(c.cfg.ConnectTimeout),
		kclient.WithConnPool(deadlinePool{kconnpool.NewLongPool("tidepool-peer", *connpool.CheckPoolConfig(connpool.IdleConfig{
			MaxIdlePerAddress: c.cfg.MaxIdleConns,
			MaxIdleGlobal:     c.cfg.MaxIdleConns * 64,
			MaxIdleTimeout:    time.Minute,
		}))}),
		// Framed (Kitex's default, said here because the server's reader
		// relies on it: frame.go); the codec's limit bounds what is
		// encoded as well as what is decoded.
		kclient.WithTransportProtocol(transport.Framed),
		kclient.WithCodec(codec.NewDefaultCodecWithSizeLimit(c.cfg.MaxMessageBytes)),
		kclient.WithClientBasicInfo(&rpcinfo.EndpointBasicInfo{ServiceName: "tidepool-peer-client"}),
		kclient.WithTransHandlerFactory(gonet.NewCliTransHandlerFactory()),
		kclient.WithDialer(authDialer{key: c.cfg.Key}),
	)
	if err != nil {
		return nil, "", fmt.Errorf("peerapi: client for %s: %w", addr, err)
	}
	a := newAPIConn(kc, &c.calls, c.cfg.Timeout)
	c.apis[addr] = a
	return a, xfer, nil
}

// xferConn is one transfer connection: p for one-sided reads, and the
// same connection as f when it was made through ClientConfig.Fetch (named
// reads); f is nil otherwise.
type xferConn struct {
	p rdma.Peer
	f rdma.FetchPeer
}

// connect makes a transfer connection to addr: through Fetch when set,
// else through Transport.
func (c *Client) connect(ctx context.Context, addr string) (xferConn, error) {
	if c.cfg.Fetch != nil {
		f, err := c.cfg.Fetch.ConnectFetch(ctx, addr)
		return xferConn{p: f, f: f}, err
	}
	p, err := c.cfg.Transport.Connect(ctx, addr)
	return xferConn{p: p}, err
}

// xfer returns the transfer connection to addr, connecting once.
func (c *Client) xfer(ctx context.Context, addr string) (xferConn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return xferConn{}, ErrClosed
	}
	if x, ok := c.xfers[addr]; ok {
		c.mu.Unlock()
		return x, nil
	}
	c.mu.Unlock()
	x, err := c.connect(ctx, addr)
	if err != nil {
		return xferConn{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		x.p.Close()
		return xferConn{}, ErrClosed
	}
	if old, ok := c.xfers[addr]; ok {
		x.p.Close() // another caller connected first
		return old, nil
	}
	c.xfers[addr] = x
	return x, nil
}

// dropXfer forgets a broken transfer connection so the next call
// reconnects.
func (c *Client) dropXfer(addr string, p rdma.Peer) {
	c.mu.Lock()
	if c.xfers[addr].p == p {
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
	kc, _, err := c.api(node)
	if err != nil {
		return nil, err
	}
	res, err := kc.Lookup(ctx, &peer.LookupRequest{Auth: c.auth, Ns: ns, Keys: keys})
	if err != nil {
		return nil, callErr(node, err)
	}
	if len(res.Present) != len(keys) {
		return nil, fmt.Errorf("%w: lookup of %d keys answered %d", ErrProtocol, len(keys), len(res.Present))
	}
	return res.Present, nil
}

// Push stores blocks on node, each with its CRC-32C, in Put calls of at
// most PushCallBytes encoded bytes each (pushCalls), made one after the
// other. Per item: nil (stored or already present) or the error. A block
// whose call alone would exceed MaxMessageBytes is not sent: its error
// wraps cache.ErrTooLarge. A call that fails (node unreachable, refused,
// out of time) ends the push: err is its error, which is also the error
// of its items and of every item not yet sent; the items of earlier calls
// keep their answers.
func (c *Client) Push(ctx context.Context, node, ns string, items []proxy.PutItem) ([]error, error) {
	kc, _, err := c.api(node)
	if err != nil {
		return nil, err
	}
	wire := make([]*peer.PutItem, len(items))
	sizes := make([]int, len(items))
	for i, it := range items {
		wire[i] = putItem(it)
		sizes[i] = wire[i].BLength()
	}
	req := &peer.PutRequest{Auth: c.auth, Ns: ns, Items: []*peer.PutItem{}}
	base := req.BLength() + callOverhead
	out := make([]error, len(items))
	for _, call := range pushCalls(sizes, base, c.cfg.PushCallBytes) {
		lo, hi := call[0], call[1]
		if hi-lo == 1 && base+sizes[lo] > c.cfg.MaxMessageBytes {
			out[lo] = fmt.Errorf("%w: a push of %d bytes exceeds the peer message bound %d (max_request_size)",
				cache.ErrTooLarge, base+sizes[lo], c.cfg.MaxMessageBytes)
			continue
		}
		req.Items = wire[lo:hi]
		res, err := kc.Put(ctx, req)
		if err == nil && len(res.Codes) != hi-lo {
			err = fmt.Errorf("%w: put of %d items answered %d", ErrProtocol, hi-lo, len(res.Codes))
		} else if err != nil {
			err = callErr(node, err)
		}
		if err != nil {
			for i := lo; i < len(items); i++ {
				out[i] = err
			}
			return out, err
		}
		for j, code := range res.Codes {
			if e := codeErr(node, code, ""); e != nil && !errors.Is(e, cache.ErrExists) {
				out[lo+j] = e
			}
		}
	}
	return out, nil
}

// callOverhead bounds what a call adds to its request's encoded size: the
// frame length, the message header (version, method name, sequence id) and
// the arguments struct around the request.
const callOverhead = 64

// pushCalls cuts items, of the encoded sizes given, into the calls of a
// push: consecutive runs [lo, hi) whose request, base bytes plus their
// sizes, stays within budget; an item too large for that goes in a call
// of its own.
func pushCalls(sizes []int, base, budget int) [][2]int {
	var calls [][2]int
	lo, n := 0, base
	for i, sz := range sizes {
		if i > lo && n+sz > budget {
			calls = append(calls, [2]int{lo, i})
			lo, n = i, base
		}
		n += sz
	}
	if lo < len(sizes) {
		calls = append(calls, [2]int{lo, len(sizes)})
	}
	return calls
}

// putItem is the wire form of a pushed block.
func putItem(it proxy.PutItem) *peer.PutItem {
	// The checksum the block is known by when the caller has it (a block
	// read from this node's store): the receiver then refuses bytes
	// damaged here since they were checked.
	sum := it.Opts.Checksum
	if !it.Opts.HasChecksum {
		sum = cache.Checksum(it.Value)
	}
	w := &peer.PutItem{Key: it.Key, Value: it.Value, Depth: it.Opts.Depth, Checksum: int32(sum)}
	if m := it.Opts.Meta; m != nil {
		// The description travels so that the owner's KV events describe
		// the block (its tokens are for routers).
		w.TokenIds, w.ParentKey, w.BlockSize = wirecode.Tokens(m.Tokens), m.Parent, &m.BlockSize
	}
	return w
}

// Delete removes keys from node's local tiers. Per key: whether it was
// there.
func (c *Client) Delete(ctx context.Context, node, ns string, keys [][]byte) ([]bool, error) {
	kc, _, err := c.api(node)
	if err != nil {
		return nil, err
	}
	res, err := kc.Delete(ctx, &peer.DeleteRequest{Auth: c.auth, Ns: ns, Keys: keys})
	if err != nil {
		return nil, callErr(node, err)
	}
	if len(res.Deleted) != len(keys) {
		return nil, fmt.Errorf("%w: delete of %d keys answered %d", ErrProtocol, len(keys), len(res.Deleted))
	}
	return res.Deleted, nil
}

// Clear removes every block of ns from node's local tiers and returns how
// many there were.
func (c *Client) Clear(ctx context.Context, node, ns string) (int64, error) {
	kc, _, err := c.api(node)
	if err != nil {
		return 0, err
	}
	res, err := kc.Clear(ctx, &peer.ClearRequest{Auth: c.auth, Ns: ns})
	if err != nil {
		return 0, callErr(node, err)
	}
	return max(res.Removed, 0), nil
}

// Acquire asks node to pin the blocks of keys for this node to read: per
// key, where the block lies (its transfer endpoint, registered region and
// offset) or why it is not served. Leases this client is done with ride
// along (Release). The answer is bounded by opts.AnswerTimeout when set. An answer this side cannot use (a slot outside its region) is that
// key's error, and its pin is given back here.
func (c *Client) Acquire(ctx context.Context, node, ns string, keys [][]byte, opts proxy.FetchOptions) ([]proxy.RemoteBlock, error) {
	kc, resolvedXfer, err := c.api(node)
	if err != nil {
		return nil, err
	}
	lease := max(c.cfg.Lease.Milliseconds(), 1)
	ride := c.takeReleases(node)
	actx := ctx
	if d := opts.AnswerTimeout; d > 0 {
		// The owner must answer within d (a hung or partitioned owner costs
		// d, not the whole fetch); the pulls that follow use ctx.
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	req := &peer.AcquireRequest{Auth: c.auth, Ns: ns, Keys: keys, LeaseMs: int32(min(lease, 1<<31-1)), Release: ride}
	if opts.Describe {
		yes := true
		req.Describe = &yes
	}
	res, err := kc.Acquire(actx, req)
	if err != nil {
		c.release(node, kc, ride) // may not have reached the owner
		return nil, callErr(node, err)
	}
	if len(res.Items) != len(keys) {
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
	if res.GetFetch() && c.cfg.Fetch != nil {
		c.canFetch(node, res.GetFetchDescribe())
	} else {
		c.noFetch(node)
	}
	out := make([]proxy.RemoteBlock, len(keys))
	var unusable []int64
	for i, it := range res.Items {
		switch {
		case it == nil:
			out[i].Err = fmt.Errorf("%w: nil item", ErrProtocol)
		case it.Code != tp.ErrorCode_OK:
			out[i].Err = codeErr(node, it.Code, it.Message)
		default:
			s := it.Slot
			if s == nil || s.Length < 0 || s.Offset < 0 || s.RegionLen < 0 || s.Offset > s.RegionLen || s.Length > s.RegionLen-s.Offset {
				unusable = append(unusable, it.LeaseId)
				out[i].Err = fmt.Errorf("%w: bad slot %v", ErrProtocol, s)
				continue
			}
			addr := s.TransportAddr
			if addr == "" {
				addr = resolvedXfer
			}
			out[i] = proxy.RemoteBlock{
				Lease: it.LeaseId, Length: s.Length, Checksum: uint32(it.Checksum), Depth: it.Depth,
				Addr:   addr,
				Region: rdma.RegionDesc{ID: rdma.RegionID(s.RegionId), Len: uint64(s.RegionLen), Key: uint32(s.RegionKey), Addr: uint64(s.RegionAddr)},
				Offset: uint64(s.Offset),
				Meta:   wirecode.Meta(it.TokenIds, it.ParentKey, it.BlockSize),
			}
		}
	}
	c.release(node, kc, unusable)
	return out, nil
}

// Pull reads b's bytes from its owner into the reserved local slot into
// with a one-sided Read of the transfer layer, checked as they land
// against the owner's CRC-32C. It does not commit or abort into.
func (c *Client) Pull(ctx context.Context, node string, b proxy.RemoteBlock, into cache.Reservation) error {
	arena, off, n := into.Location()
	if arena < 0 || arena >= len(c.cfg.Regions) || n != b.Length {
		return fmt.Errorf("%w: local arena %d is not registered", cache.ErrUnavailable, arena)
	}
	x, err := c.xfer(ctx, b.Addr)
	if err != nil {
		return fmt.Errorf("peerapi: connect transfer %s: %w: %w", b.Addr, cache.ErrUnavailable, err)
	}
	p := x.p
	op := rdma.Op{
		Local: c.cfg.Regions[arena].ID, LocalOff: uint64(off),
		Remote: b.Region, RemoteOff: b.Offset, Len: uint64(n),
		// Checked once, end to end, against the owner's stored CRC-32C as
		// the bytes land: a transfer error and a block damaged on the
		// owner both fail the read.
		Sum: b.Checksum, SumKnown: true,
	}
	if err := p.Read(ctx, op); err != nil {
		if errors.Is(err, rdma.ErrPeerLost) || errors.Is(err, rdma.ErrClosed) || errors.Is(err, rdma.ErrUnreachable) || errors.Is(err, rdma.ErrProtocol) {
			c.dropXfer(b.Addr, p)
		}
		if errors.Is(err, rdma.ErrChecksum) {
			// The landed bytes do not match the owner's CRC-32C.
			return fmt.Errorf("peerapi: read from %s: %w: %w", b.Addr, cache.ErrChecksum, err)
		}
		return fmt.Errorf("peerapi: read from %s: %w: %w", b.Addr, cache.ErrUnavailable, err)
	}
	return nil
}

// Release gives back leases node granted: the next Acquire to node
// carries them, or a Release call does, in the background, after
// releaseDelay. When node cannot be resolved any more, the pins expire
// with their lease.
func (c *Client) Release(node string, ids []int64) {
	if len(ids) == 0 {
		return
	}
	kc, _, err := c.api(node)
	if err != nil {
		c.lg.Debug("lease release not sent", zap.String("node", node), zap.Int("leases", len(ids)), zap.Error(err))
		return
	}
	c.release(node, kc, ids)
}

// release queues the owner's pins for release: the next Acquire to node
// carries them, or a Release call does, in the background, after
// releaseDelay.
func (c *Client) release(node string, kc *apiConn, ids []int64) {
	if len(ids) == 0 {
		return
	}
	c.mu.Lock()
	if c.closed {
		// Close is flushing or done: send them now, from this goroutine
		// (a call on a closed connection fails at once).
		c.mu.Unlock()
		c.sendRelease(node, kc, ids)
		return
	}
	defer c.mu.Unlock()
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

// flushRelease sends node's queued lease ids in a Release call, from the
// timer's goroutine (counted in c.releases) or from Close (closing: the
// timer's call is then a no-op, Close flushes).
func (c *Client) flushRelease(node string, closing bool) {
	c.mu.Lock()
	p := c.pending[node]
	if p == nil || (c.closed && !closing) {
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
	c.releases.Add(1) // under mu, before closed is set or by Close itself: never races its Wait
	c.mu.Unlock()
	defer c.releases.Done()
	c.sendRelease(node, kc, ids)
}

// sendRelease releases ids in Release calls of at most maxRide; on failure
// (a connection closed by Forget or Close included) the pins expire with
// their lease.
func (c *Client) sendRelease(node string, kc *apiConn, ids []int64) {
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
