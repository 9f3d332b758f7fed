// Package auto is the transport serve uses: rdma/tcp always, and rdma/verbs
// next to it where the binary has the binding and the host a device, on the
// one transfer port.
//
//   - Mode "tcp": TCP only. "auto": verbs when New finds a device, TCP
//     otherwise; to each peer, RDMA when the peer answers the verbs
//     handshake on its transfer port (it advertises RDMA by serving it),
//     TCP otherwise. "rdma": like auto, but New fails without a local
//     device.
//   - One port: the listener is shared. The first bytes of a connection
//     tell the protocols apart (peerauth's hello names its purpose,
//     PurposeTransfer or PurposeVerbs; unauthenticated, tcp frames start
//     with "TPXF" and a verbs hello with its own message), so the cluster
//     metadata and the peer API need no new field.
//   - One descriptor: each region is registered with tcp, then with verbs
//     under tcp's descriptor (random id, key, base). The peer API hands it
//     out as before; a verbs initiator resolves it to the rkey and address
//     over its authenticated control connection.
//   - Fallback: a verbs transfer that fails for a transport reason (peer
//     lost, protocol, unreachable) is retried over TCP at once, and that
//     peer uses TCP for RetryAfter before verbs is tried again. A checksum
//     or unknown-region failure over verbs is retried over TCP too (the
//     answer there is authoritative) without marking the path down.
//     Context expiry, out-of-range and too-large are returned as they are.
package auto

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/rdma"
	"github.com/tidepool-kv/tidepool/rdma/internal/counters"
	"github.com/tidepool-kv/tidepool/rdma/tcp"
	"github.com/tidepool-kv/tidepool/rdma/verbs"
)

// Modes.
const (
	ModeAuto = "auto"
	ModeTCP  = "tcp"
	ModeRDMA = "rdma"
)

// ErrMode: an unknown Config.Mode.
var ErrMode = errors.New("auto: transport must be auto, tcp or rdma")

// Config configures a Transport. A zero field means its default
// (DefaultConfig, applied by withDefaults; TCP and Verbs by their own
// packages' rules); a negative RetryAfter is an error.
type Config struct {
	// Mode is ModeAuto, ModeTCP or ModeRDMA. Default ModeAuto.
	Mode string
	// TCP configures the tcp transport; its ListenAddr (or Listener) is the
	// shared transfer port. Zero fields: tcp's defaults (tcp.DefaultConfig).
	TCP tcp.Config
	// Verbs configures the verbs transport (device, GID index, QPs); its
	// listener, key and advertised address are taken from TCP. Zero
	// fields: verbs' defaults, but for its documented exceptions
	// (GIDIndex 0 is index 0; QPTimeout, QPRetry 0 are values): start
	// from verbs.DefaultConfig, as DefaultConfig does.
	Verbs verbs.Config
	// RetryAfter is how long a peer whose RDMA path failed is served over
	// TCP before verbs is tried again. Default 30 s; negative is an error.
	RetryAfter time.Duration
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{Mode: ModeAuto, TCP: tcp.DefaultConfig(), Verbs: verbs.DefaultConfig(), RetryAfter: 30 * time.Second}
}

// withDefaults fills the zero fields with their defaults: the one place a
// zero field becomes its default (TCP's and Verbs' through their packages).
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Mode == "" {
		c.Mode = d.Mode
	}
	c.TCP = c.TCP.WithDefaults()
	c.Verbs = c.Verbs.WithDefaults()
	if c.RetryAfter == 0 {
		c.RetryAfter = d.RetryAfter
	}
	return c
}

// Validate reports every problem with c (after defaults): an unknown Mode
// (ErrMode), a negative RetryAfter, and the problems of TCP, and of Verbs
// unless Mode is ModeTCP.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	switch c.Mode {
	case ModeAuto, ModeTCP, ModeRDMA:
	default:
		errs = append(errs, fmt.Errorf("%w: %q", ErrMode, c.Mode))
	}
	if c.RetryAfter < 0 {
		errs = append(errs, fmt.Errorf("auto: RetryAfter %v must not be negative", c.RetryAfter))
	}
	if err := c.TCP.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Mode != ModeTCP {
		if err := c.Verbs.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// verbsTransport is what auto needs of rdma/verbs beyond rdma.Transport
// (present only in builds with the verbs tag).
type verbsTransport interface {
	rdma.Transport
	RegisterAs(buf []byte, d rdma.RegionDesc) error
	Device() verbs.DeviceInfo
	QPs() int
	Health() []verbs.DeviceHealth
	SliceRetries() uint64
}

// Transport is the composite.
type Transport struct {
	cfg  Config
	lg   *zap.Logger
	mux  *demux
	tcp  *tcp.Transport
	vt   verbsTransport // nil: TCP only
	mu   sync.Mutex
	regs map[rdma.RegionID]bool // registered with vt too
	pc   map[string]*counters.Peer

	closed atomic.Bool

	// Per transport, for metrics.
	rdmaOps, rdmaBytes, rdmaErrs, fallbacks atomic.Uint64
	tcpOps, tcpBytes, tcpErrs               atomic.Uint64
}

var (
	_ rdma.Transport   = (*Transport)(nil)
	_ rdma.FetchServer = (*Transport)(nil)
	_ rdma.Fetcher     = (*peer)(nil)
	_ rdma.MemFetcher  = (*peer)(nil)
)

// New starts the transport.
func New(cfg Config, lg *zap.Logger) (*Transport, error) {
	if lg == nil {
		lg = zap.NewNop()
	}
	tlg := lg // tcp and verbs name their own loggers
	lg = lg.Named("rdma.auto")
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ln := cfg.TCP.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", cfg.TCP.ListenAddr); err != nil {
			return nil, fmt.Errorf("tcp: listen %s: %w", cfg.TCP.ListenAddr, err)
		}
	}
	t := &Transport{cfg: cfg, lg: lg, regs: map[rdma.RegionID]bool{}, pc: map[string]*counters.Peer{}}
	t.mux = newDemux(ln, cfg.TCP.DialTimeout)
	tc := cfg.TCP
	tc.Listener = t.mux.tcp
	var err error
	if t.tcp, err = tcp.New(tc, tlg); err != nil {
		t.mux.Close()
		return nil, err
	}
	if cfg.Mode != ModeTCP {
		vc := cfg.Verbs
		vc.Listener = t.mux.verbs
		vc.AdvertiseAddr = t.tcp.Addr()
		vc.Key = cfg.TCP.Key
		v, err := verbs.New(vc, tlg)
		switch {
		case err == nil:
			t.vt = v.(verbsTransport)
			d := t.vt.Device()
			lg.Info("transfers over RDMA where peers support it", zap.String("device", d.Name),
				zap.Int("gid_index", d.GIDIndex), zap.Int("mtu", d.ActiveMTU))
		case cfg.Mode == ModeRDMA:
			_ = t.tcp.Close()
			t.mux.Close()
			return nil, fmt.Errorf("transport rdma: %w", err)
		default:
			lg.Info("transfers over TCP: no RDMA", zap.Error(err))
		}
	}
	if t.vt == nil {
		t.mux.dropVerbs()
	}
	return t, nil
}

// RDMA reports whether this node serves and uses RDMA.
func (t *Transport) RDMA() bool { return t.vt != nil }

// Device returns the RDMA device in use (zero without RDMA).
func (t *Transport) Device() verbs.DeviceInfo {
	if t.vt == nil {
		return verbs.DeviceInfo{}
	}
	return t.vt.Device()
}

// Addr implements rdma.Transport: the shared transfer port.
func (t *Transport) Addr() string { return t.tcp.Addr() }

// TCP returns the tcp transport (its guard counters).
func (t *Transport) TCP() *tcp.Transport { return t.tcp }

// Register implements rdma.Transport.
func (t *Transport) Register(buf []byte) (rdma.RegionDesc, error) {
	d, err := t.tcp.Register(buf)
	if err != nil || t.vt == nil {
		return d, err
	}
	if err := t.vt.RegisterAs(buf, d); err != nil {
		_ = t.tcp.Deregister(d.ID)
		return rdma.RegionDesc{}, err
	}
	t.mu.Lock()
	t.regs[d.ID] = true
	t.mu.Unlock()
	return d, nil
}

// Deregister implements rdma.Transport.
func (t *Transport) Deregister(id rdma.RegionID) error {
	t.mu.Lock()
	v := t.regs[id]
	delete(t.regs, id)
	t.mu.Unlock()
	if v {
		if err := t.vt.Deregister(id); err != nil && !errors.Is(err, rdma.ErrClosed) {
			return err
		}
	}
	return t.tcp.Deregister(id)
}

// TransportStats counts initiated transfers per transport.
type TransportStats struct {
	Ops, Bytes, Errors uint64
}

// Counters is a snapshot for metrics.
type Counters struct {
	RDMA, TCP TransportStats
	Fallbacks uint64 // verbs transfers retried over TCP
	QPs       int    // queue pairs open now
	Device    string // "" without RDMA
	// Devices: each RDMA device's state and asynchronous events.
	Devices []verbs.DeviceHealth
	// SliceRetries: parts of RDMA transfers moved again on another device.
	SliceRetries uint64
}

// Counters returns the per-transport counters.
func (t *Transport) Counters() Counters {
	c := Counters{
		RDMA:      TransportStats{t.rdmaOps.Load(), t.rdmaBytes.Load(), t.rdmaErrs.Load()},
		TCP:       TransportStats{t.tcpOps.Load(), t.tcpBytes.Load(), t.tcpErrs.Load()},
		Fallbacks: t.fallbacks.Load(),
	}
	if t.vt != nil {
		c.QPs = t.vt.QPs()
		c.Device = t.vt.Device().Name
		c.Devices = t.vt.Health()
		c.SliceRetries = t.vt.SliceRetries()
	}
	return c
}

// Stats implements rdma.Transport: peers as the composite's handles saw
// them, serve counters of both transports summed.
func (t *Transport) Stats() rdma.Stats {
	s := t.tcp.Stats()
	if t.vt != nil {
		v := t.vt.Stats().Serve
		s.Serve.Writes += v.Writes
		s.Serve.Reads += v.Reads
		s.Serve.Errors += v.Errors
		s.Serve.BytesIn += v.BytesIn
		s.Serve.BytesOut += v.BytesOut
		s.Serve.Conns += v.Conns
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s.Peers = counters.TransportStats(0, 0, &counters.Serve{}, t.pc).Peers
	return s
}

// Close implements rdma.Transport.
func (t *Transport) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	var errs []error
	if t.vt != nil {
		errs = append(errs, t.vt.Close())
	}
	errs = append(errs, t.tcp.Close())
	t.mux.Close()
	return errors.Join(errs...)
}

// Connect implements rdma.Transport: a tcp handle always, and a verbs
// handle when both sides have RDMA.
func (t *Transport) Connect(ctx context.Context, addr string) (rdma.Peer, error) {
	p, err := t.ConnectFetch(ctx, addr)
	if err != nil {
		return nil, err
	}
	return p, nil
}

var _ rdma.FetchConnector = (*Transport)(nil)

// ConnectFetch implements rdma.FetchConnector: Connect, whose handles make
// named reads over TCP (Fetch, FetchMem).
func (t *Transport) ConnectFetch(ctx context.Context, addr string) (rdma.FetchPeer, error) {
	if t.closed.Load() {
		return nil, rdma.ErrClosed
	}
	tp, err := t.tcp.ConnectFetch(ctx, addr)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	c := t.pc[addr]
	if c == nil {
		c = &counters.Peer{Addr: addr}
		t.pc[addr] = c
	}
	t.mu.Unlock()
	p := &peer{t: t, addr: addr, tp: tp, c: c}
	if t.vt != nil {
		p.dialVerbs(ctx)
	}
	return p, nil
}

type peer struct {
	t    *Transport
	addr string
	tp   rdma.FetchPeer // the TCP connection: transfers without RDMA, and named reads
	c    *counters.Peer

	mu        sync.Mutex
	vp        rdma.Peer
	downUntil time.Time
	closed    bool
}

func (p *peer) Addr() string          { return p.addr }
func (p *peer) Stats() rdma.PeerStats { return p.c.Snapshot() }

// dialVerbs connects the verbs handle; a peer that does not answer it
// (no RDMA there, or an old node) is served over TCP for RetryAfter.
func (p *peer) dialVerbs(ctx context.Context) {
	vp, err := p.t.vt.Connect(ctx, p.addr)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil || p.closed {
		p.downUntil = time.Now().Add(p.t.cfg.RetryAfter)
		if vp != nil {
			_ = vp.Close()
		}
		p.t.lg.Debug("peer without RDMA: TCP", zap.String("peer", p.addr), zap.Error(err))
		return
	}
	p.vp = vp
}

func (p *peer) verbs(ctx context.Context) rdma.Peer {
	if p.t.vt == nil {
		return nil
	}
	p.mu.Lock()
	vp, retry := p.vp, p.vp == nil && !p.closed && time.Now().After(p.downUntil)
	p.mu.Unlock()
	if retry {
		p.dialVerbs(ctx)
		p.mu.Lock()
		vp = p.vp
		p.mu.Unlock()
	}
	return vp
}

func (p *peer) markDown(vp rdma.Peer) {
	p.mu.Lock()
	if p.vp == vp {
		p.vp = nil
		p.downUntil = time.Now().Add(p.t.cfg.RetryAfter)
	}
	p.mu.Unlock()
	_ = vp.Close()
}

// Close implements rdma.Peer.
func (p *peer) Close() error {
	p.mu.Lock()
	p.closed = true
	vp := p.vp
	p.vp = nil
	p.mu.Unlock()
	if vp != nil {
		_ = vp.Close()
	}
	return p.tp.Close()
}

func (p *peer) Write(ctx context.Context, op rdma.Op) error { return p.do(ctx, op, true) }
func (p *peer) Read(ctx context.Context, op rdma.Op) error  { return p.do(ctx, op, false) }

func (p *peer) do(ctx context.Context, op rdma.Op, write bool) error {
	start := time.Now()
	err := p.transfer(ctx, op, write)
	p.c.Done(write, op.Len, time.Since(start), err)
	return err
}

func call(pr rdma.Peer, ctx context.Context, op rdma.Op, write bool) error {
	if write {
		return pr.Write(ctx, op)
	}
	return pr.Read(ctx, op)
}

func (p *peer) transfer(ctx context.Context, op rdma.Op, write bool) error {
	t := p.t
	if vp := p.verbs(ctx); vp != nil {
		err := call(vp, ctx, op, write)
		if err == nil {
			t.rdmaOps.Add(1)
			t.rdmaBytes.Add(op.Len)
			return nil
		}
		t.rdmaErrs.Add(1)
		switch {
		case ctx.Err() != nil, errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
			errors.Is(err, rdma.ErrOutOfRange), errors.Is(err, rdma.ErrTooLarge):
			return err
		case errors.Is(err, rdma.ErrClosed) && (t.closed.Load() || p.isClosed()):
			return err
		case errors.Is(err, rdma.ErrChecksum), errors.Is(err, rdma.ErrUnknownRegion):
			// Ask TCP; the RDMA path itself is fine.
		default:
			p.markDown(vp)
			t.lg.Warn("RDMA transfer failed: falling back to TCP", zap.String("peer", p.addr), zap.Error(err))
		}
		t.fallbacks.Add(1)
	}
	err := call(p.tp, ctx, op, write)
	if err != nil {
		t.tcpErrs.Add(1)
		return err
	}
	t.tcpOps.Add(1)
	t.tcpBytes.Add(op.Len)
	return nil
}

// HandleFetch implements rdma.FetchServer: named reads are served on the
// TCP side of the port.
func (t *Transport) HandleFetch(h rdma.FetchHandler) { t.tcp.HandleFetch(h) }

// Fetch implements rdma.Fetcher over TCP. With a verbs connection to the
// peer it answers rdma.ErrUnsupported: there a one-sided read moves the
// bytes without the owner's CPU, and the caller takes that path.
func (p *peer) Fetch(ctx context.Context, req []byte, land rdma.Lander) ([]byte, error) {
	if vp := p.verbs(ctx); vp != nil {
		return nil, fmt.Errorf("%w: %s has an RDMA connection: read it one-sided", rdma.ErrUnsupported, p.addr)
	}
	return p.fetchCounted(func(n *uint64) ([]byte, error) {
		return p.tp.Fetch(ctx, req, func(meta []byte, size uint64, sum uint32) (rdma.RegionID, uint64, error) {
			*n = size
			return land(meta, size, sum)
		})
	})
}

// FetchMem implements rdma.MemFetcher over TCP, as Fetch does.
func (p *peer) FetchMem(ctx context.Context, req []byte, land rdma.MemLander) ([]byte, error) {
	if vp := p.verbs(ctx); vp != nil {
		return nil, fmt.Errorf("%w: %s has an RDMA connection: read it one-sided", rdma.ErrUnsupported, p.addr)
	}
	return p.fetchCounted(func(n *uint64) ([]byte, error) {
		return p.tp.FetchMem(ctx, req, func(meta []byte, size uint64, sum uint32) ([]byte, error) {
			*n = size
			return land(meta, size, sum)
		})
	})
}

// fetchCounted runs one named read over TCP (fetch sets the bytes it
// moves) and counts it.
func (p *peer) fetchCounted(fetch func(n *uint64) ([]byte, error)) ([]byte, error) {
	start := time.Now()
	var n uint64
	meta, err := fetch(&n)
	if err != nil {
		n = 0
		p.t.tcpErrs.Add(1)
	} else {
		p.t.tcpOps.Add(1)
		p.t.tcpBytes.Add(n)
	}
	p.c.Done(false, n, time.Since(start), err)
	return meta, err
}

func (p *peer) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// ---- one port for both protocols ----

// demux accepts on the transfer port and hands each connection to the tcp
// or the verbs listener by its first bytes.
type demux struct {
	ln      net.Listener
	timeout time.Duration
	tcp     *subListener
	verbs   *subListener
	sem     chan struct{} // connections being classified
	tcpOnly atomic.Bool
	wg      sync.WaitGroup
	once    sync.Once
}

// newDemux serves ln; timeout (> 0: Config.TCP.DialTimeout after
// defaults) bounds reading a connection's first bytes.
func newDemux(ln net.Listener, timeout time.Duration) *demux {
	d := &demux{ln: ln, timeout: timeout, sem: make(chan struct{}, 256)}
	d.tcp = &subListener{d: d, ch: make(chan net.Conn), done: make(chan struct{})}
	d.verbs = &subListener{d: d, ch: make(chan net.Conn), done: make(chan struct{})}
	d.wg.Add(1)
	go d.loop()
	return d
}

func (d *demux) loop() {
	defer d.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		c, err := d.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(backoff) // accept errors (EMFILE): back off, like peerauth.Listener
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		if d.tcpOnly.Load() {
			// No verbs side: hand over at once, so that the tcp port's
			// guard (connection cap, handshake timeout) sees the
			// connection exactly as without the demux.
			d.tcp.deliver(c)
			continue
		}
		select {
		case d.sem <- struct{}{}:
		default:
			_ = c.Close() // too many connections saying nothing
			continue
		}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			defer func() { <-d.sem }()
			d.classify(c)
		}()
	}
}

var (
	authHello  = []byte("TPA2")
	frameMagic = []byte("TPXF")
)

// purposeVerbs is peerauth.PurposeVerbs (one byte after the magic).
const purposeVerbs = 3

func (d *demux) classify(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(d.timeout))
	br := bufio.NewReaderSize(c, 64)
	b, err := br.Peek(5)
	if err != nil {
		_ = c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	to := d.tcp
	switch {
	case bytes.Equal(b[:4], authHello):
		if b[4] == purposeVerbs {
			to = d.verbs
		}
	case bytes.Equal(b[:4], frameMagic):
	case b[0] == 1 && b[1] == 0 && b[3] == 'T' && b[4] == 'P': // a verbs hello, unauthenticated
		to = d.verbs
	}
	to.deliver(&peekedConn{Conn: c, r: br})
}

func (d *demux) dropVerbs() {
	d.tcpOnly.Store(true)
	_ = d.verbs.Close()
}

// Close closes the port and both sides.
func (d *demux) Close() {
	d.once.Do(func() {
		_ = d.ln.Close()
		_ = d.tcp.Close()
		_ = d.verbs.Close()
		d.wg.Wait()
	})
}

type subListener struct {
	d    *demux
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func (s *subListener) deliver(c net.Conn) {
	select {
	case s.ch <- c:
	case <-s.done:
		_ = c.Close()
	}
}

func (s *subListener) Accept() (net.Conn, error) {
	select {
	case c := <-s.ch:
		return c, nil
	case <-s.done:
		return nil, net.ErrClosed
	}
}

func (s *subListener) Close() error {
	s.once.Do(func() { close(s.done) })
	return nil
}

func (s *subListener) Addr() net.Addr { return s.d.ln.Addr() }

// SyscallConn is the shared listening socket's: the tcp transport sets its
// connections' congestion control there (tcp.Config.Congestion), before
// any peer knows the address, and every connection accepted on the port
// inherits it.
func (s *subListener) SyscallConn() (syscall.RawConn, error) {
	sc, ok := s.d.ln.(syscall.Conn)
	if !ok {
		return nil, errors.New("auto: the transfer listener is not a socket")
	}
	return sc.SyscallConn()
}

// peekedConn replays the bytes classify peeked.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
