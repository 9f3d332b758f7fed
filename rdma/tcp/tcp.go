// Package tcp is the default rdma.Transport: one-sided writes and reads over
// TCP streams, framed by protocol/frame.
//
// Each Peer handle keeps a pool of connections (at most MaxConnsPerPeer, one
// transfer at a time on each, like one RC queue pair per outstanding
// request). A transfer is cut into chunks of ChunkSize bytes, each with its
// own frame header and CRC-32C:
//
//   - Write: the initiator streams OpWrite chunks (FlagLast on the final one)
//     and waits for one OpWriteAck or OpError. The receiver reads each chunk
//     into a scratch buffer, verifies its checksum and only then copies it
//     into the region.
//   - Read: the initiator sends one OpRead per segment of at most
//     frame.MaxLength bytes; the owner answers with OpReadData chunks sent
//     straight from the region. The initiator reads each chunk into its
//     local region and verifies the checksum; a mismatch fails the call
//     with rdma.ErrChecksum.
//   - Summed (rdma.Op.SumKnown, frame.FlagSummed): the transfer is checked
//     once, end to end, against the CRC-32C the initiator holds, where the
//     bytes land: a summed read's chunks come without a CRC and the
//     initiator checksums the whole read; a summed write's chunks go
//     straight into the region and the owner checks the whole write
//     against the CRC on its last chunk.
//
// A new connection starts with an OpHello/OpHelloAck exchange, so a peer
// speaking another frame version is refused at connect time. Before that,
// with Config.Key, both ends authenticate each other (internal/peerauth)
// and may encrypt the connection; the port accepts through a guarded
// listener (connection cap, accept back-off, idle cap). Remote bytes are
// named by region id, key and address (the region's random base plus the
// offset), and a connection that names wrong ones is throttled, then cut
// off (docs/security.md).
package tcp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/internal/peerauth"
	"github.com/tidepool-kv/tidepool/protocol/frame"
	"github.com/tidepool-kv/tidepool/rdma"
	"github.com/tidepool-kv/tidepool/rdma/internal/counters"
	"github.com/tidepool-kv/tidepool/rdma/internal/region"
)

// Config configures a Transport. A zero field takes its default
// (DefaultConfig, applied once in withDefaults by New and Validate).
type Config struct {
	// ListenAddr is the TCP address to serve on. Default ":7950" (unless
	// Listener is set).
	ListenAddr string
	// AdvertiseAddr is what Addr returns, the endpoint peers dial (put it in
	// the node metadata). Default: the listener's address, which is only
	// dialable when ListenAddr names a concrete host.
	AdvertiseAddr string
	// Listener, when set, is used instead of listening on ListenAddr (a test
	// seam; the transport closes it).
	Listener net.Listener
	// Dial, when set, replaces net.Dialer.DialContext (a test seam).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// MaxConnsPerPeer bounds the connections, hence concurrent transfers, of
	// one Peer handle; more callers wait. Default 16.
	MaxConnsPerPeer int
	// ChunkSize is the payload bytes per frame. Default 256 KiB (small
	// enough that a chunk stays in cache between socket, checksum and
	// region copy: 1 MiB chunks cost ~1.5x the CPU per byte of writes with
	// 16 callers on loopback); at most
	// frame.MaxLength.
	ChunkSize int
	// MaxTransfer bounds Op.Len in bytes. Default 1 GiB.
	MaxTransfer uint64
	// DialTimeout bounds dialing plus the hello exchange. Default 3 s.
	DialTimeout time.Duration
	// IOTimeout bounds a transfer whose context has no deadline, and every
	// network read or write the server does inside a request. Default 30 s.
	IOTimeout time.Duration
	// IdleTimeout closes a served connection that sends no request for this
	// long. Default 5 min.
	IdleTimeout time.Duration
	// Key authenticates every connection both ways (peerauth) before a
	// frame is read or written: the port serves only peers that hold the
	// cluster secret, and a Peer moves bytes only with such a server. nil:
	// no handshake (insecure mode; both sides must agree).
	Key *peerauth.Key
	// MaxConns caps the served connections open at once; more are closed
	// as they come. Default 1024.
	MaxConns int
	// MaxHandshakes and MaxHandshakesPerSource are the budget of
	// connections still authenticating, in all and per source address,
	// apart from MaxConns (peerauth.ListenerConfig). Zero: peerauth's
	// defaults (64 and 16).
	MaxHandshakes, MaxHandshakesPerSource int
	// MaxKeyFailures closes a served connection after that many requests
	// naming a region it does not know or with the wrong key; each such
	// refusal is delayed by KeyFailureDelay times the failures so far.
	// Defaults 3 and 100 ms.
	MaxKeyFailures  int
	KeyFailureDelay time.Duration
	// Congestion lists TCP congestion control algorithms in order of
	// preference: each connection, dialed or accepted, gets the first the
	// kernel accepts (TCP_CONGESTION; congestion.go says why BBR is not
	// wanted here). SystemCongestion ("system") keeps the system's default;
	// so does a list the kernel refuses whole (logged once). Default
	// cubic, then reno.
	Congestion []string
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		ListenAddr:      ":7950",
		MaxConnsPerPeer: 16,
		ChunkSize:       256 << 10,
		MaxTransfer:     1 << 30,
		DialTimeout:     3 * time.Second,
		IOTimeout:       30 * time.Second,
		IdleTimeout:     5 * time.Minute,
		MaxConns:        1024,
		MaxKeyFailures:  3,
		KeyFailureDelay: 100 * time.Millisecond,
		Congestion:      []string{"cubic", "reno"},
	}
}

// withDefaults fills the zero fields with their defaults: the one place a
// zero field becomes its default.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.ListenAddr == "" && c.Listener == nil {
		c.ListenAddr = d.ListenAddr
	}
	if c.MaxConnsPerPeer == 0 {
		c.MaxConnsPerPeer = d.MaxConnsPerPeer
	}
	if c.ChunkSize == 0 {
		c.ChunkSize = d.ChunkSize
	}
	if c.MaxTransfer == 0 {
		c.MaxTransfer = d.MaxTransfer
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = d.DialTimeout
	}
	if c.IOTimeout == 0 {
		c.IOTimeout = d.IOTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = d.IdleTimeout
	}
	if c.MaxConns == 0 {
		c.MaxConns = d.MaxConns
	}
	if c.MaxKeyFailures == 0 {
		c.MaxKeyFailures = d.MaxKeyFailures
	}
	if c.KeyFailureDelay == 0 {
		c.KeyFailureDelay = d.KeyFailureDelay
	}
	if len(c.Congestion) == 0 {
		c.Congestion = d.Congestion
	}
	return c
}

// WithDefaults returns c with its zero fields defaulted (withDefaults), for
// configs that hold a tcp.Config (rdma/auto).
func (c Config) WithDefaults() Config { return c.withDefaults() }

// DefaultLocalConfig is DefaultConfig listening on a free loopback port with
// short timeouts, for tests.
func DefaultLocalConfig() Config {
	c := DefaultConfig()
	c.ListenAddr = "127.0.0.1:0"
	c.DialTimeout = time.Second
	c.IOTimeout = 10 * time.Second
	c.IdleTimeout = time.Minute
	return c
}

// Validate reports every problem with c (after defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.ListenAddr == "" && c.Listener == nil {
		errs = append(errs, errors.New("tcp: ListenAddr or Listener is required"))
	}
	if c.MaxConnsPerPeer <= 0 {
		errs = append(errs, fmt.Errorf("tcp: MaxConnsPerPeer %d must be > 0", c.MaxConnsPerPeer))
	}
	if c.ChunkSize <= 0 || c.ChunkSize > frame.MaxLength {
		errs = append(errs, fmt.Errorf("tcp: ChunkSize %d must be in (0, %d]", c.ChunkSize, frame.MaxLength))
	}
	if c.MaxTransfer == 0 {
		errs = append(errs, errors.New("tcp: MaxTransfer must be > 0"))
	}
	if c.DialTimeout <= 0 {
		errs = append(errs, fmt.Errorf("tcp: DialTimeout %v must be > 0", c.DialTimeout))
	}
	if c.IOTimeout <= 0 {
		errs = append(errs, fmt.Errorf("tcp: IOTimeout %v must be > 0", c.IOTimeout))
	}
	if c.IdleTimeout <= 0 {
		errs = append(errs, fmt.Errorf("tcp: IdleTimeout %v must be > 0", c.IdleTimeout))
	}
	if err := CheckCongestion(c.Congestion); err != nil {
		errs = append(errs, fmt.Errorf("tcp: Congestion: %w", err))
	}
	if c.MaxHandshakes < 0 || c.MaxHandshakesPerSource < 0 {
		errs = append(errs, fmt.Errorf("tcp: MaxHandshakes %d, MaxHandshakesPerSource %d: neither may be negative",
			c.MaxHandshakes, c.MaxHandshakesPerSource))
	}
	if c.MaxConns < 0 || c.MaxKeyFailures < 0 || c.KeyFailureDelay < 0 {
		errs = append(errs, fmt.Errorf("tcp: MaxConns %d, MaxKeyFailures %d, KeyFailureDelay %v: none may be negative",
			c.MaxConns, c.MaxKeyFailures, c.KeyFailureDelay))
	}
	return errors.Join(errs...)
}

// Transport is the TCP transport.
type Transport struct {
	cfg   Config
	lg    *zap.Logger
	ln    *peerauth.Listener
	addr  string
	table *region.Table
	serve counters.Serve
	// keyFails counts requests refused for an unknown region or wrong key;
	// keyCutoffs the connections closed for too many of them.
	keyFails, keyCutoffs atomic.Int64
	reqID                atomic.Uint64
	wg                   sync.WaitGroup // accept loop and served connections

	// fetch answers named reads (HandleFetch); nil: refused.
	fetch atomic.Pointer[rdma.FetchHandler]

	closed  atomic.Bool
	done    chan struct{} // closed by Close
	mu      sync.Mutex    // guards the maps below
	inbound map[net.Conn]struct{}
	peers   map[string]*counters.Peer
	handles map[*peer]struct{}

	// ccNext is the index in cfg.Congestion of the first algorithm the
	// kernel has not refused; ccLogged and ccWarned log the outcome once.
	ccNext             atomic.Int32
	ccLogged, ccWarned atomic.Bool
}

var (
	_ rdma.Transport   = (*Transport)(nil)
	_ rdma.FetchServer = (*Transport)(nil)
	_ rdma.Fetcher     = (*peer)(nil)
	_ rdma.MemFetcher  = (*peer)(nil)
)

// HandleFetch implements rdma.FetchServer.
func (t *Transport) HandleFetch(h rdma.FetchHandler) {
	if h == nil {
		t.fetch.Store(nil)
		return
	}
	t.fetch.Store(&h)
}

// New listens and starts serving.
func New(cfg Config, lg *zap.Logger) (*Transport, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if lg == nil {
		lg = zap.NewNop()
	}
	ln := cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", cfg.ListenAddr); err != nil {
			return nil, fmt.Errorf("tcp: listen %s: %w", cfg.ListenAddr, err)
		}
	}
	lg = lg.Named("rdma.tcp")
	t := &Transport{
		cfg: cfg, lg: lg, table: region.NewTable(),
		done:    make(chan struct{}),
		inbound: make(map[net.Conn]struct{}), peers: make(map[string]*counters.Peer),
		handles: make(map[*peer]struct{}),
	}
	t.setCongestion(ln) // before the first accept: accepted connections inherit it
	t.ln = peerauth.NewListener(ln, peerauth.ListenerConfig{
		Key: cfg.Key, Purpose: peerauth.PurposeTransfer, MaxConns: cfg.MaxConns, HandshakeTimeout: cfg.DialTimeout,
		MaxHandshakes: cfg.MaxHandshakes, MaxHandshakesPerSource: cfg.MaxHandshakesPerSource,
	}, lg)
	t.addr = cfg.AdvertiseAddr
	if t.addr == "" {
		t.addr = ln.Addr().String()
	}
	t.wg.Add(1)
	go t.acceptLoop()
	return t, nil
}

// Addr implements rdma.Transport.
func (t *Transport) Addr() string { return t.addr }

// Register implements rdma.Transport.
func (t *Transport) Register(buf []byte) (rdma.RegionDesc, error) {
	if t.closed.Load() {
		return rdma.RegionDesc{}, rdma.ErrClosed
	}
	return t.table.Register(buf)
}

// Deregister implements rdma.Transport. It waits for in-flight accesses to
// the region, which are bounded by IOTimeout or the callers' deadlines.
func (t *Transport) Deregister(id rdma.RegionID) error { return t.table.Deregister(id) }

// Stats implements rdma.Transport.
func (t *Transport) Stats() rdma.Stats {
	n, b := t.table.Len()
	t.mu.Lock()
	defer t.mu.Unlock()
	return counters.TransportStats(n, b, &t.serve, t.peers)
}

// GuardStats counts what the transfer port refused.
type GuardStats struct {
	Listener   peerauth.ListenerStats
	KeyFails   int64 // requests refused for an unknown region or wrong key
	KeyCutoffs int64 // connections closed for too many of those
}

// GuardStats returns a snapshot of the port's guard counters.
func (t *Transport) GuardStats() GuardStats {
	return GuardStats{Listener: t.ln.Stats(), KeyFails: t.keyFails.Load(), KeyCutoffs: t.keyCutoffs.Load()}
}

// Close stops the listener, breaks served connections and closes every Peer
// handle, then waits for the serving goroutines. Safe to call twice.
func (t *Transport) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	close(t.done)
	err := t.ln.Close()
	t.mu.Lock()
	for c := range t.inbound {
		_ = c.Close()
	}
	hs := t.handles
	t.handles = map[*peer]struct{}{}
	t.mu.Unlock()
	for p := range hs {
		p.shutdown()
	}
	t.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// Connect implements rdma.Transport: it dials one connection (hello
// included) to check that the peer is there and speaks our frame version.
func (t *Transport) Connect(ctx context.Context, addr string) (rdma.Peer, error) {
	p, err := t.ConnectFetch(ctx, addr)
	if err != nil {
		return nil, err
	}
	return p, nil
}

var _ rdma.FetchConnector = (*Transport)(nil)

// ConnectFetch implements rdma.FetchConnector: Connect, whose connections
// make named reads (fetch.go).
func (t *Transport) ConnectFetch(ctx context.Context, addr string) (rdma.FetchPeer, error) {
	if t.closed.Load() {
		return nil, rdma.ErrClosed
	}
	t.mu.Lock()
	c := t.peers[addr]
	if c == nil {
		c = &counters.Peer{Addr: addr}
		t.peers[addr] = c
	}
	p := &peer{t: t, addr: addr, c: c, sem: make(chan struct{}, t.cfg.MaxConnsPerPeer), done: make(chan struct{})}
	t.handles[p] = struct{}{}
	t.mu.Unlock()
	cn, err := p.dial(ctx)
	if err != nil {
		p.forget()
		return nil, fmt.Errorf("%w: %s: %w", rdma.ErrUnreachable, addr, err)
	}
	p.put(cn, true, false)
	return p, nil
}

// ---- initiator side ----

type peer struct {
	t    *Transport
	addr string
	c    *counters.Peer
	sem  chan struct{} // one token per connection in use
	done chan struct{} // closed by shutdown

	mu     sync.Mutex
	closed bool
	idle   []*conn
	all    map[*conn]struct{}
}

type conn struct {
	nc   net.Conn
	br   *bufio.Reader
	hdr  [frame.HeaderSize]byte
	rhdr [frame.HeaderSize]byte
}

func (p *peer) Addr() string          { return p.addr }
func (p *peer) Stats() rdma.PeerStats { return p.c.Snapshot() }

// Close implements rdma.Peer.
func (p *peer) Close() error {
	p.shutdown()
	p.forget()
	return nil
}

func (p *peer) forget() {
	p.t.mu.Lock()
	delete(p.t.handles, p)
	p.t.mu.Unlock()
}

// shutdown closes every connection; in-flight calls fail.
func (p *peer) shutdown() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.done)
	all := p.all
	p.all, p.idle = nil, nil
	p.mu.Unlock()
	for c := range all {
		_ = c.nc.Close()
		p.c.Conn(-1)
	}
}

func (p *peer) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

func (p *peer) dial(ctx context.Context) (*conn, error) {
	ctx, cancel := context.WithTimeout(ctx, p.t.cfg.DialTimeout)
	defer cancel()
	dial := p.t.cfg.Dial
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	nc, err := dial(ctx, "tcp", p.addr)
	if err != nil {
		p.c.DialFail()
		return nil, err
	}
	p.t.setCongestion(nc)
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(p.t.cfg.DialTimeout)
	}
	if k := p.t.cfg.Key; k != nil {
		ac, err := k.Client(nc, peerauth.PurposeTransfer, dl)
		if err != nil {
			_ = nc.Close()
			p.c.DialFail()
			return nil, err
		}
		nc = ac
	}
	c := &conn{nc: nc, br: bufio.NewReaderSize(nc, 64<<10)}
	_ = nc.SetDeadline(dl)
	h := frame.Header{Op: frame.OpHello, RequestID: p.t.reqID.Add(1)}
	if _, err = nc.Write(frame.Encode(c.hdr[:], h)); err == nil {
		var r frame.Header
		r, err = frame.ReadHeader(c.br, &c.rhdr)
		if err == nil && (r.Op != frame.OpHelloAck || r.RequestID != h.RequestID) {
			err = fmt.Errorf("%w: unexpected %s in answer to hello", rdma.ErrProtocol, r.Op)
		} else if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !isNetErr(err) {
			err = fmt.Errorf("%w: %w", rdma.ErrProtocol, err)
		}
	}
	if err != nil {
		_ = nc.Close()
		p.c.DialFail()
		return nil, fmt.Errorf("hello: %w", err)
	}
	_ = nc.SetDeadline(time.Time{})
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = nc.Close()
		return nil, rdma.ErrClosed
	}
	if p.all == nil {
		p.all = make(map[*conn]struct{})
	}
	p.all[c] = struct{}{}
	p.mu.Unlock()
	p.c.Conn(1)
	return c, nil
}

// get takes a connection token and an idle connection, dialing if none is
// idle. reused says the connection served an earlier transfer.
func (p *peer) get(ctx context.Context) (c *conn, reused bool, err error) {
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	case <-p.done:
		return nil, false, rdma.ErrClosed
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.sem
		return nil, false, rdma.ErrClosed
	}
	if n := len(p.idle); n > 0 {
		c = p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return c, true, nil
	}
	p.mu.Unlock()
	c, err = p.dial(ctx)
	if err != nil {
		<-p.sem
		if errors.Is(err, rdma.ErrClosed) {
			return nil, false, err
		}
		if ctx.Err() != nil || deadlinePassed(ctx) {
			return nil, false, fmt.Errorf("%w: dial: %v", context.DeadlineExceeded, err)
		}
		return nil, false, fmt.Errorf("%w: dial: %w", rdma.ErrPeerLost, err)
	}
	return c, false, nil
}

// put returns a connection to the pool, or closes it when it is not clean,
// and gives back the token get took (token is false for the connection
// Connect dials, which holds none).
func (p *peer) put(c *conn, clean, token bool) {
	p.mu.Lock()
	if clean && !p.closed {
		p.idle = append(p.idle, c)
		p.mu.Unlock()
	} else {
		_, tracked := p.all[c]
		delete(p.all, c)
		p.mu.Unlock()
		_ = c.nc.Close()
		if tracked {
			p.c.Conn(-1)
		}
	}
	if token {
		<-p.sem
	}
}

// Write implements rdma.Peer.
func (p *peer) Write(ctx context.Context, op rdma.Op) error { return p.do(ctx, op, true) }

// Read implements rdma.Peer.
func (p *peer) Read(ctx context.Context, op rdma.Op) error { return p.do(ctx, op, false) }

func (p *peer) do(ctx context.Context, op rdma.Op, write bool) error {
	start := time.Now()
	err := p.transfer(ctx, op, write)
	p.c.Done(write, op.Len, time.Since(start), err)
	if err != nil {
		verb := "read"
		if write {
			verb = "write"
		}
		return fmt.Errorf("tcp %s %s (%s): %w", verb, p.addr, op, err)
	}
	return nil
}

func (p *peer) transfer(ctx context.Context, op rdma.Op, write bool) error {
	if p.t.closed.Load() || p.isClosed() {
		return rdma.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if op.Len > p.t.cfg.MaxTransfer {
		return fmt.Errorf("%w: %d > %d", rdma.ErrTooLarge, op.Len, p.t.cfg.MaxTransfer)
	}
	// The descriptor's length lets us refuse a bad range without a round
	// trip; the owner checks again.
	if err := rdma.CheckRange(op.Remote.Len, op.RemoteOff, op.Len); err != nil {
		return fmt.Errorf("remote region %d: %w", op.Remote.ID, err)
	}
	span, err := p.t.table.Acquire(op.Local, 0, false, op.LocalOff, op.Len)
	if err != nil {
		return fmt.Errorf("local: %w", err)
	}
	defer span.Release()
	return p.exchange(ctx, func() bool { return true }, func(c *conn, id uint64) (bool, error) {
		return c.run(id, op, span.B, write, p.t.cfg.ChunkSize)
	})
}

// exchange runs one request on a pooled connection (run; ctx gets
// IOTimeout when it has no deadline). A pooled connection the peer closed
// while idle fails on first use: when the request may be repeated then
// (again reports it: transfers always, a named read before anything
// landed), it is tried once more on a fresh connection.
func (p *peer) exchange(ctx context.Context, again func() bool, run func(c *conn, id uint64) (clean bool, err error)) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.t.cfg.IOTimeout)
		defer cancel()
	}
	for attempt := 0; ; attempt++ {
		c, reused, err := p.get(ctx)
		if err != nil {
			return err
		}
		clean, err := c.bounded(ctx, func() (bool, error) { return run(c, p.t.reqID.Add(1)) })
		p.put(c, clean, true)
		if err != nil && p.isClosed() {
			return fmt.Errorf("%w: %w", rdma.ErrClosed, err)
		}
		if err != nil && !clean && reused && attempt == 0 && ctx.Err() == nil && errors.Is(err, rdma.ErrPeerLost) && again() {
			p.t.lg.Debug("retrying on a fresh connection", zap.String("peer", p.addr), zap.Error(err))
			continue
		}
		return err
	}
}

var aLongTimeAgo = time.Unix(1, 0)

// deadlinePassed reports whether ctx's deadline is behind us even if its
// timer has not fired yet (a network deadline can fire a hair earlier).
func deadlinePassed(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// run performs one transfer on c. clean reports whether the stream is still
// in sync, so that c may serve another transfer.
func (c *conn) run(id uint64, op rdma.Op, local []byte, write bool, chunk int) (clean bool, err error) {
	if write {
		return c.write(id, op, local, chunk)
	}
	return c.read(id, op, local)
}

// bounded runs one request/answer exchange on c (f) under ctx: its
// deadline bounds every read and write, and its cancellation breaks them
// (the connection is then not clean).
func (c *conn) bounded(ctx context.Context, f func() (bool, error)) (clean bool, err error) {
	dl, _ := ctx.Deadline()
	_ = c.nc.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(aLongTimeAgo) })
	defer func() {
		if !stop() {
			// ctx fired: the deadline is poisoned, the connection is done.
			clean = false
			if err != nil {
				err = fmt.Errorf("%w: %v", context.Cause(ctx), err)
			}
		} else if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
			err = fmt.Errorf("%w: %v", context.DeadlineExceeded, err)
		}
	}()
	return f()
}

func lost(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%w: %w", rdma.ErrPeerLost, err)
}

func (c *conn) write(id uint64, op rdma.Op, local []byte, chunk int) (bool, error) {
	for done := 0; ; {
		m := min(chunk, len(local)-done)
		payload := local[done : done+m]
		last := done+m == len(local)
		h := frame.Header{
			Op: frame.OpWrite, RequestID: id, Region: uint64(op.Remote.ID), Key: op.Remote.Key,
			Offset: op.Remote.Addr + op.RemoteOff + uint64(done), Length: uint32(m), // an address: base + offset
		}
		switch {
		case !op.SumKnown:
			h.CRC = frame.Checksum(payload)
		case last:
			h.Flags, h.CRC = frame.FlagSummed, op.Sum // the owner checks the whole write
		default:
			h.Flags = frame.FlagSummed
		}
		if last {
			h.Flags |= frame.FlagLast
		}
		bufs := net.Buffers{frame.Encode(c.hdr[:], h), payload}
		if _, err := bufs.WriteTo(c.nc); err != nil {
			return false, lost(err)
		}
		done += m
		if last {
			break
		}
	}
	r, err := c.response(id)
	if err != nil {
		return false, err
	}
	switch r.Op {
	case frame.OpWriteAck:
		return true, nil
	case frame.OpError:
		return c.remoteError(r)
	}
	return false, fmt.Errorf("%w: unexpected %s in answer to write", rdma.ErrProtocol, r.Op)
}

func (c *conn) read(id uint64, op rdma.Op, local []byte) (bool, error) {
	var sum uint32 // of the bytes read so far, when op.SumKnown
	for seg := 0; ; {
		l := min(frame.MaxLength, len(local)-seg)
		base := op.Remote.Addr + op.RemoteOff + uint64(seg) // an address: region base + offset
		h := frame.Header{Op: frame.OpRead, RequestID: id, Region: uint64(op.Remote.ID), Key: op.Remote.Key, Offset: base, Length: uint32(l)}
		if op.SumKnown {
			h.Flags = frame.FlagSummed // checked here, once, against op.Sum
		}
		if _, err := c.nc.Write(frame.Encode(c.hdr[:], h)); err != nil {
			return false, lost(err)
		}
		for got := 0; ; {
			r, err := c.response(id)
			if err != nil {
				return false, err
			}
			if r.Op == frame.OpError {
				return c.remoteError(r)
			}
			if r.Op != frame.OpReadData || r.Offset != base+uint64(got) || int(r.Length) > l-got {
				return false, fmt.Errorf("%w: unexpected %s at %d len %d", rdma.ErrProtocol, r.Op, r.Offset, r.Length)
			}
			dst := local[seg+got : seg+got+int(r.Length)]
			if _, err := io.ReadFull(c.br, dst); err != nil {
				return false, lost(err)
			}
			switch {
			case r.Summed() != op.SumKnown:
				return false, fmt.Errorf("%w: read chunk at %d: summed %v, asked %v", rdma.ErrProtocol, r.Offset, r.Summed(), op.SumKnown)
			case op.SumKnown:
				sum = frame.UpdateChecksum(sum, dst)
			case frame.Checksum(dst) != r.CRC:
				return false, fmt.Errorf("%w: read chunk at %d len %d", rdma.ErrChecksum, r.Offset, r.Length)
			}
			got += int(r.Length)
			if r.Last() {
				if got != l {
					return false, fmt.Errorf("%w: read ended after %d of %d bytes", rdma.ErrProtocol, got, l)
				}
				break
			}
		}
		seg += l
		if seg == len(local) {
			if op.SumKnown && sum != op.Sum {
				return true, fmt.Errorf("%w: read of %d bytes: crc %08x, want %08x", rdma.ErrChecksum, len(local), sum, op.Sum)
			}
			return true, nil
		}
	}
}

// response reads the next response header and checks its request id.
func (c *conn) response(id uint64) (frame.Header, error) {
	r, err := frame.ReadHeader(c.br, &c.rhdr)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isNetErr(err) {
			return r, lost(err)
		}
		return r, fmt.Errorf("%w: %w", rdma.ErrProtocol, err)
	}
	if r.RequestID != id {
		return r, fmt.Errorf("%w: response for request %d, want %d", rdma.ErrProtocol, r.RequestID, id)
	}
	return r, nil
}

// remoteError reads an OpError message and maps its status. The stream
// stays in sync.
func (c *conn) remoteError(r frame.Header) (bool, error) {
	if r.Length > maxErrMsg {
		return false, fmt.Errorf("%w: error message of %d bytes", rdma.ErrProtocol, r.Length)
	}
	msg := make([]byte, r.Length)
	if _, err := io.ReadFull(c.br, msg); err != nil {
		return false, lost(err)
	}
	if frame.Checksum(msg) != r.CRC {
		return false, fmt.Errorf("%w: error message", rdma.ErrChecksum)
	}
	return r.Status != frame.StatusShutdown, fmt.Errorf("remote: %w: %s", statusErr(r.Status), msg)
}

func isNetErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, net.ErrClosed)
}

// ---- status mapping (one table, both directions) ----

const maxErrMsg = 512

var statusTable = []struct {
	status frame.Status
	err    error
}{
	{frame.StatusUnknownRegion, rdma.ErrUnknownRegion},
	{frame.StatusOutOfRange, rdma.ErrOutOfRange},
	{frame.StatusChecksum, rdma.ErrChecksum},
	{frame.StatusTooLarge, rdma.ErrTooLarge},
	{frame.StatusBadRequest, rdma.ErrProtocol},
	{frame.StatusShutdown, rdma.ErrPeerLost},
	{frame.StatusUnsupported, rdma.ErrUnsupported},
}

func statusErr(s frame.Status) error {
	for _, e := range statusTable {
		if e.status == s {
			return e.err
		}
	}
	return fmt.Errorf("%w: remote %s", rdma.ErrProtocol, s)
}

func errStatus(err error) frame.Status {
	for _, e := range statusTable {
		if errors.Is(err, e.err) {
			return e.status
		}
	}
	return frame.StatusInternal
}
