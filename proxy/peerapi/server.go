// Package peerapi is the Thrift edge of the peer API (idl/peer.thrift): the
// Kitex server a sidecar answers its peers with, over a *proxy.Proxy, and
// the client that implements proxy.Peers. It is an adapter: each call
// converts, makes or serves the RPC, and converts back (errors through
// proxy/wirecode). Control messages travel over Kitex; block bytes move
// through the transfer layer (rdma/): the owner pins a block (Acquire) and
// names where it lies in its registered arenas, and the client's Pull reads
// it with a one-sided Read into a slot the proxy reserved. The fetch itself
// (reserve, pull, commit, release) is the proxy's: proxy/fetch.go.
//
// With Credentials.Key every connection is mutually authenticated with the
// cluster secret (internal/peerauth) before Kitex reads or writes a byte of
// it; the server accepts through a guarded listener (cap, accept back-off,
// idle cap) and serves with Kitex's Go net transport (docs/security.md).
package peerapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudwego/kitex/pkg/remote/trans/gonet"
	"github.com/cloudwego/kitex/pkg/rpcinfo"
	"github.com/cloudwego/kitex/server"
	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cluster"
	"github.com/tidepool-kv/tidepool/internal/peerauth"
	"github.com/tidepool-kv/tidepool/protocol/gen/peer"
	"github.com/tidepool-kv/tidepool/protocol/gen/peer/tidepoolpeer"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/protocol/safecodec"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/wirecode"
	"github.com/tidepool-kv/tidepool/rdma"
)

// Credentials are what every call carries (client) and checks (server).
type Credentials struct {
	// NodeID is this node's name, sent with every call (informational).
	NodeID string
	// Label is the cluster label; a call with another label is refused.
	// Default "" (the label must then be empty on both sides).
	Label string
	// Token is the shared secret; a call with another token is refused
	// (compared in constant time). Default "" (no token). It is checked
	// only after the call is decoded: Key is what keeps strangers out.
	Token string
	// Key authenticates every connection (both ways) before anything on
	// it is decoded: the server accepts only peers that prove they hold
	// the cluster secret, the client talks only to such servers. nil: no
	// handshake (insecure mode; both sides must agree).
	Key *peerauth.Key
}

func (c Credentials) auth() *peer.Auth {
	return &peer.Auth{NodeId: c.NodeID, ClusterLabel: c.Label, ProtocolVersion: int32(cluster.ProtocolVersion), Token: c.Token}
}

// ServerConfig configures the peer API server.
type ServerConfig struct {
	Credentials
	// Transport serves the transfers out of the registered arenas; its Addr
	// is what Acquire answers as the transport address. Required.
	Transport rdma.Transport
	// Regions are the registered arenas, indexed like dram.Tier.Arenas
	// (registered with the transport: cmd/tidepool's registerArenas). Required.
	Regions []rdma.RegionDesc
	// MaxRequestBytes bounds one framed request (a Put carries block bytes
	// inline); the peers' ClientConfig.MaxMessageBytes must not exceed it.
	// Default DefaultMaxMessageBytes.
	MaxRequestBytes int
	// DrainTimeout bounds how long Close waits for in-flight calls.
	// Default 10 s.
	DrainTimeout time.Duration
	// MaxLease caps the lease a peer may ask for in Acquire. Default 30 s.
	MaxLease time.Duration
	// MaxConns caps the peer API connections open at once (more are
	// closed as they come). Default 1024.
	MaxConns int
	// IdleTimeout closes a connection that sends nothing for that long.
	// Default 5 min (clients drop idle pooled connections after 1 min).
	IdleTimeout time.Duration
	// HandshakeTimeout bounds the authentication of a new connection.
	// Default 5 s.
	HandshakeTimeout time.Duration
	// MaxHandshakes and MaxHandshakesPerSource are the budget of
	// connections still authenticating, in all and per source address,
	// apart from MaxConns (peerauth.ListenerConfig). Defaults 64 and 16.
	MaxHandshakes, MaxHandshakesPerSource int
	// Fetch serves named reads (fetch.go) on the transfer port: the
	// transport's named-read server, normally Transport itself (rdma/tcp,
	// rdma/auto). nil: no named reads; peers then fetch by Acquire and a
	// one-sided read.
	Fetch rdma.FetchServer
}

// DefaultServerConfig returns the defaults documented on ServerConfig.
func DefaultServerConfig() ServerConfig {
	return ServerConfig{MaxRequestBytes: DefaultMaxMessageBytes, DrainTimeout: 10 * time.Second, MaxLease: 30 * time.Second,
		MaxConns: 1024, IdleTimeout: 5 * time.Minute, HandshakeTimeout: 5 * time.Second}
}

func (c ServerConfig) withDefaults() ServerConfig {
	d := DefaultServerConfig()
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = d.MaxRequestBytes
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = d.DrainTimeout
	}
	if c.MaxLease == 0 {
		c.MaxLease = d.MaxLease
	}
	if c.MaxConns == 0 {
		c.MaxConns = d.MaxConns
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = d.IdleTimeout
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = d.HandshakeTimeout
	}
	return c
}

// Validate reports every problem with c (after defaults).
func (c ServerConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.Transport == nil {
		errs = append(errs, errors.New("peerapi: Transport is required"))
	}
	if len(c.Regions) == 0 {
		errs = append(errs, errors.New("peerapi: Regions is empty (register the arenas with the transport)"))
	}
	if c.MaxRequestBytes < 0 {
		errs = append(errs, fmt.Errorf("peerapi: MaxRequestBytes %d is negative", c.MaxRequestBytes))
	}
	if c.DrainTimeout < 0 {
		errs = append(errs, fmt.Errorf("peerapi: DrainTimeout %v is negative", c.DrainTimeout))
	}
	if c.MaxLease < 0 {
		errs = append(errs, fmt.Errorf("peerapi: MaxLease %v is negative", c.MaxLease))
	}
	if c.MaxHandshakes < 0 || c.MaxHandshakesPerSource < 0 {
		errs = append(errs, fmt.Errorf("peerapi: MaxHandshakes %d, MaxHandshakesPerSource %d: neither may be negative",
			c.MaxHandshakes, c.MaxHandshakesPerSource))
	}
	if c.MaxConns < 0 || c.IdleTimeout < 0 || c.HandshakeTimeout < 0 {
		errs = append(errs, fmt.Errorf("peerapi: MaxConns %d, IdleTimeout %v, HandshakeTimeout %v: none may be negative",
			c.MaxConns, c.IdleTimeout, c.HandshakeTimeout))
	}
	return errors.Join(errs...)
}

// ServerStats is a snapshot of the server's counters.
type ServerStats struct {
	Refused  int64 // calls refused for their credentials
	Lookups  int64 // keys looked up
	Acquired int64 // blocks pinned for peers
	Released int64 // leases released by peers
	Puts     int64 // blocks stored from pushes
	PutFails int64 // pushed blocks refused (checksum, space, ...)
	Deletes  int64 // blocks deleted for peers (cluster-wide Delete and Clear)
	Fetched  int64 // blocks sent by named reads (fetch.go)
}

// Server serves the peer API over a TCP listener.
type Server struct {
	cfg   ServerConfig
	lg    *zap.Logger
	h     *handler
	svr   server.Server
	ln    *peerauth.Listener
	ready chan struct{}
	done  chan struct{}
	exit  chan error // closed by Close: Kitex's Run returns, draining first
	err   error      // what Run returned

	startOnce, closeOnce sync.Once
	closeErr             error
}

// NewServer makes a Kitex server for p on ln. The server owns ln from now on
// and closes it exactly once. Connections are accepted by a guarded
// listener (peerauth): capped, authenticated with cfg.Key before Kitex
// reads a byte of them, and closed when idle; Kitex serves them with its
// Go net transport (netpoll would take over the descriptor).
// lg is used as given (name it, e.g. lg.Named("peerapi")); nil is a no-op.
func NewServer(cfg ServerConfig, p *proxy.Proxy, ln net.Listener, lg *zap.Logger) (*Server, error) {
	if p == nil || ln == nil {
		return nil, errors.New("peerapi: nil proxy or listener")
	}
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("peerapi: invalid server config: %w", err)
	}
	if lg == nil {
		lg = zap.NewNop()
	}
	sum := sha256.Sum256([]byte(cfg.Token))
	h := &handler{p: p, cfg: cfg, lg: lg, tokenSum: sum, addr: cfg.Transport.Addr()}
	s := &Server{
		cfg: cfg, lg: lg, h: h,
		ready: make(chan struct{}),
		done:  make(chan struct{}),
		exit:  make(chan error),
	}
	s.ln = peerauth.NewListener(ln, peerauth.ListenerConfig{
		Key: cfg.Key, Purpose: peerauth.PurposePeerAPI, MaxConns: cfg.MaxConns,
		MaxHandshakes: cfg.MaxHandshakes, MaxHandshakesPerSource: cfg.MaxHandshakesPerSource,
		HandshakeTimeout: cfg.HandshakeTimeout, IdleTimeout: cfg.IdleTimeout,
	}, lg)
	s.svr = tidepoolpeer.NewServer(h,
		// Requests are read whole frames at a time (frame.go).
		server.WithListener(frameListener{s.ln}),
		server.WithTransServerFactory(gonet.NewTransServerFactory()),
		server.WithTransHandlerFactory(gonet.NewSvrTransHandlerFactory()),
		server.WithCodec(safecodec.New(cfg.MaxRequestBytes)),
		server.WithExitWaitTime(cfg.DrainTimeout),
		// Stopped by Close only (not by Kitex's own SIGTERM handler), and
		// stopped even when Close comes before Run has got going (Kitex's
		// Stop is a no-op until then, and Run would serve forever).
		server.WithExitSignal(func() <-chan error { return s.exit }),
		server.WithServerBasicInfo(&rpcinfo.EndpointBasicInfo{ServiceName: "tidepool-peer"}),
	)
	return s, nil
}

// Start serves in the background. Ready is closed once the server runs.
func (s *Server) Start(ctx context.Context) error {
	s.startOnce.Do(func() {
		if s.cfg.Fetch != nil {
			s.cfg.Fetch.HandleFetch(s.h.fetchBlock)
			s.h.fetch.Store(true)
		}
		go func() {
			defer close(s.done)
			close(s.ready)
			if err := s.svr.Run(); err != nil {
				s.lg.Error("peer api server stopped", zap.Error(err))
				s.err = err
			}
		}()
	})
	return nil
}

// Ready is closed when the server accepts calls.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Done is closed when the server has stopped.
func (s *Server) Done() <-chan struct{} { return s.done }

// Close stops accepting, drains in-flight calls (up to DrainTimeout) and
// closes the listener. Safe to call twice.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		started := true
		s.startOnce.Do(func() { started = false; close(s.ready); close(s.done) })
		if s.h.fetch.Swap(false) {
			s.cfg.Fetch.HandleFetch(nil)
		}
		close(s.exit)
		if started {
			<-s.done
			s.closeErr = s.err
		}
		_ = s.ln.Close() // Kitex closed it when it ran; never twice
	})
	return s.closeErr
}

// ListenerStats returns the connection counters of the peer API port.
func (s *Server) ListenerStats() peerauth.ListenerStats { return s.ln.Stats() }

// Stats returns a snapshot of the counters.
func (s *Server) Stats() ServerStats {
	h := s.h
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stats
}

// handler implements peer.TidepoolPeer.
type handler struct {
	p        *proxy.Proxy
	cfg      ServerConfig
	lg       *zap.Logger
	tokenSum [32]byte
	addr     string
	// fetch: named reads are served on the transport (fetch.go).
	fetch atomic.Bool
	// undescribed (tests only: export_test.go) makes the handler answer
	// as a node that predates descriptions: no description in Acquire
	// answers, no fetch_describe, named reads of version 2 refused.
	undescribed atomic.Bool

	mu    sync.Mutex
	stats ServerStats
}

var _ peer.TidepoolPeer = (*handler)(nil)

func (h *handler) count(f func(*ServerStats)) {
	h.mu.Lock()
	f(&h.stats)
	h.mu.Unlock()
}

// check refuses a call whose credentials do not match; nothing else is
// looked at first.
func (h *handler) check(a *peer.Auth) *peer.PeerError {
	ok := a != nil && a.ClusterLabel == h.cfg.Label && a.ProtocolVersion == int32(cluster.ProtocolVersion)
	if a != nil {
		sum := sha256.Sum256([]byte(a.Token))
		if subtle.ConstantTimeCompare(sum[:], h.tokenSum[:]) != 1 {
			ok = false
		}
	}
	if ok {
		return nil
	}
	h.count(func(s *ServerStats) { s.Refused++ })
	node := ""
	if a != nil {
		node = a.NodeId
	}
	h.lg.Warn("peer call refused", zap.String("node", node))
	return refusal()
}

// Lookup reports, per key, whether this node holds the block locally.
func (h *handler) Lookup(ctx context.Context, req *peer.LookupRequest) (*peer.LookupResponse, error) {
	if e := h.check(req.GetAuth()); e != nil {
		return nil, e
	}
	held, err := h.p.Held(ctx, req.Ns, req.Keys)
	if err != nil {
		return nil, peerErr(err)
	}
	h.count(func(s *ServerStats) { s.Lookups += int64(len(held)) })
	return &peer.LookupResponse{Present: held}, nil
}

// Acquire pins local blocks for a peer and says where they lie.
func (h *handler) Acquire(ctx context.Context, req *peer.AcquireRequest) (*peer.AcquireResponse, error) {
	if e := h.check(req.GetAuth()); e != nil {
		return nil, e
	}
	if len(req.Release) > 0 {
		// Releases riding along (Client.release): as Release, but a
		// refusal (too many ids) must not fail the Acquire; those pins
		// expire with their lease.
		_ = h.release(ctx, req.Release)
	}
	lease := time.Duration(req.LeaseMs) * time.Millisecond
	if lease < 0 {
		lease = 0
	}
	lease = min(lease, h.cfg.MaxLease)
	res, err := h.p.Acquire(ctx, req.Ns, req.Keys, lease, proxy.ScopeLocal)
	if err != nil {
		return nil, peerErr(err)
	}
	out := &peer.AcquireResponse{Items: make([]*peer.AcquireItem, len(res))}
	var got int64
	var orphans []int64
	for i, r := range res {
		it := &peer.AcquireItem{}
		out.Items[i] = it
		if r.Err != nil {
			it.Code, it.Message = wirecode.Code(r.Err), r.Err.Error()
			continue
		}
		if r.Slot.Arena < 0 || r.Slot.Arena >= len(h.cfg.Regions) {
			// An arena the transport does not know: unpin and refuse.
			orphans = append(orphans, r.LeaseID)
			err := fmt.Errorf("%w: arena %d is not registered for transfers", cache.ErrUnavailable, r.Slot.Arena)
			it.Code, it.Message = wirecode.Code(err), err.Error()
			continue
		}
		d := h.cfg.Regions[r.Slot.Arena]
		it.Slot = &peer.RemoteSlot{
			TransportAddr: h.addr,
			RegionId:      int64(d.ID),
			RegionLen:     int64(d.Len),
			RegionKey:     int32(d.Key),
			RegionAddr:    int64(d.Addr),
			Offset:        r.Slot.Offset,
			Length:        r.Slot.Length,
		}
		it.LeaseId = r.LeaseID
		it.Checksum = int32(r.Info.Checksum)
		it.Depth = r.Info.Depth
		if req.GetDescribe() && !h.undescribed.Load() {
			if m := h.p.Description(req.Ns, req.Keys[i]); m != nil {
				it.TokenIds, it.ParentKey, it.BlockSize = wirecode.Tokens(m.Tokens), m.Parent, &m.BlockSize
			}
		}
		got++
	}
	if len(orphans) > 0 {
		_, _ = h.p.Release(ctx, orphans)
	}
	h.count(func(s *ServerStats) { s.Acquired += got })
	if h.fetch.Load() {
		yes := true
		out.Fetch = &yes
		if !h.undescribed.Load() {
			out.FetchDescribe = &yes
		}
	}
	return out, nil
}

// Release unpins blocks a peer has read.
func (h *handler) Release(ctx context.Context, req *peer.ReleaseRequest) (*peer.ReleaseResponse, error) {
	if e := h.check(req.GetAuth()); e != nil {
		return nil, e
	}
	if err := h.release(ctx, req.LeaseIds); err != nil {
		return nil, peerErr(err)
	}
	return &peer.ReleaseResponse{}, nil
}

// release unpins leases granted to peers and counts those released.
func (h *handler) release(ctx context.Context, ids []int64) error {
	res, err := h.p.Release(ctx, ids)
	if err != nil {
		return err
	}
	var n int64
	for _, e := range res {
		if e == nil {
			n++
		}
	}
	h.count(func(s *ServerStats) { s.Released += n })
	return nil
}

// Put stores pushed blocks as owned blocks, each verified against its
// checksum first.
func (h *handler) Put(ctx context.Context, req *peer.PutRequest) (*peer.PutResponse, error) {
	if e := h.check(req.GetAuth()); e != nil {
		return nil, e
	}
	if max := h.p.Config().MaxBatch; len(req.Items) > max {
		return nil, peerErr(fmt.Errorf("%w: %d items, limit %d", proxy.ErrBatchTooLarge, len(req.Items), max))
	}
	out := &peer.PutResponse{Codes: make([]tp.ErrorCode, len(req.Items))}
	var ok, failed int64
	for i, it := range req.Items {
		if it == nil {
			out.Codes[i] = wirecode.Code(proxy.ErrInvalidArgument)
			failed++
			continue
		}
		if sum := cache.Checksum(it.Value); sum != uint32(it.Checksum) {
			out.Codes[i] = wirecode.Code(cache.ErrChecksum)
			failed++
			continue
		}
		_, err := h.p.PutLocal(ctx, req.Ns, it.Key, it.Value, cache.PutOptions{Depth: it.Depth, Meta: wirecode.Meta(it.TokenIds, it.ParentKey, it.BlockSize)})
		out.Codes[i] = wirecode.Code(err)
		if err != nil {
			failed++
		} else {
			ok++
		}
	}
	h.count(func(s *ServerStats) { s.Puts += ok; s.PutFails += failed })
	return out, nil
}

// Delete removes blocks from this node's local tiers for a peer (its
// cluster-wide Delete).
func (h *handler) Delete(ctx context.Context, req *peer.DeleteRequest) (*peer.DeleteResponse, error) {
	if e := h.check(req.GetAuth()); e != nil {
		return nil, e
	}
	if max := h.p.Config().MaxBatch; len(req.Keys) > max {
		return nil, peerErr(fmt.Errorf("%w: %d keys, limit %d", proxy.ErrBatchTooLarge, len(req.Keys), max))
	}
	out := &peer.DeleteResponse{Deleted: make([]bool, len(req.Keys))}
	var n int64
	for i, k := range req.Keys {
		ok, err := h.p.Delete(ctx, req.Ns, k, proxy.ScopeLocal)
		if err != nil {
			return nil, peerErr(err)
		}
		if ok {
			out.Deleted[i] = true
			n++
		}
	}
	h.count(func(s *ServerStats) { s.Deletes += n })
	return out, nil
}

// Clear removes a namespace from this node's local tiers for a peer (its
// cluster-wide Clear).
func (h *handler) Clear(ctx context.Context, req *peer.ClearRequest) (*peer.ClearResponse, error) {
	if e := h.check(req.GetAuth()); e != nil {
		return nil, e
	}
	n, err := h.p.Clear(ctx, req.Ns, proxy.ScopeLocal)
	if err != nil {
		return nil, peerErr(err)
	}
	h.count(func(s *ServerStats) { s.Deletes += n })
	return &peer.ClearResponse{Removed: n}, nil
}
