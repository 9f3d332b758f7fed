package peerauth

import (
	"container/list"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// ListenerConfig configures a guarded listener. A zero field means its
// default (DefaultListenerConfig, applied by withDefaults); a negative
// MaxConns or HandshakeTimeout is an error (Validate), a negative
// IdleTimeout means no cap (NoIdleTimeout).
type ListenerConfig struct {
	// Key authenticates every accepted connection before Accept returns
	// it; nil accepts without a handshake (insecure mode).
	Key *Key
	// Purpose is the port the handshake is bound to.
	Purpose Purpose
	// MaxConns caps the authenticated connections open at once; a new
	// connection while that many are open is closed at once, and so is one
	// that authenticates while they are. Default 1024.
	MaxConns int
	// MaxHandshakes caps the connections in their handshake at once, and
	// MaxHandshakesPerSource those of one source address: a budget of
	// their own, apart from MaxConns, so strangers holding connections
	// open cannot keep members out. A new connection over either budget
	// is let in and the one it displaces is closed: of that source (per
	// source) or of all (total), the oldest that has sent nothing yet,
	// else the oldest still waiting for its proof. A member sends its
	// hello at once and finishes in one round trip, so it is rarely the
	// one displaced, and a flood of silent connections, even from the
	// members' own address, only displaces itself. Defaults 64 and 16.
	MaxHandshakes, MaxHandshakesPerSource int
	// HandshakeTimeout bounds the handshake. Default 5 s.
	HandshakeTimeout time.Duration
	// IdleTimeout caps every read deadline of an accepted connection
	// (a read with no deadline, or a later one, gets now+IdleTimeout), so
	// a connection that sends nothing for that long is closed by its
	// reader. Default NoIdleTimeout (negative): no cap; zero takes that
	// default. The servers that want a cap set it (proxy/peerapi: 5 min).
	IdleTimeout time.Duration
}

// NoIdleTimeout is the IdleTimeout that caps nothing (any negative value
// does), DefaultListenerConfig's.
const NoIdleTimeout time.Duration = -1

// DefaultListenerConfig returns the defaults documented on ListenerConfig.
func DefaultListenerConfig() ListenerConfig {
	return ListenerConfig{MaxConns: 1024, MaxHandshakes: 64, MaxHandshakesPerSource: 16,
		HandshakeTimeout: 5 * time.Second, IdleTimeout: NoIdleTimeout}
}

// withDefaults fills the zero fields with their defaults: the one place a
// zero field becomes its default.
func (c ListenerConfig) withDefaults() ListenerConfig {
	d := DefaultListenerConfig()
	if c.MaxConns == 0 {
		c.MaxConns = d.MaxConns
	}
	if c.MaxHandshakes == 0 {
		c.MaxHandshakes = d.MaxHandshakes
	}
	if c.MaxHandshakesPerSource == 0 {
		c.MaxHandshakesPerSource = min(d.MaxHandshakesPerSource, c.MaxHandshakes)
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = d.HandshakeTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = d.IdleTimeout
	}
	return c
}

// Validate reports every problem with c (after defaults): a negative
// MaxConns, MaxHandshakes, MaxHandshakesPerSource or HandshakeTimeout.
func (c ListenerConfig) Validate() error {
	c = c.withDefaults()
	if c.MaxConns < 0 || c.MaxHandshakes < 0 || c.MaxHandshakesPerSource < 0 || c.HandshakeTimeout < 0 {
		return fmt.Errorf("peerauth: listener MaxConns %d, MaxHandshakes %d, MaxHandshakesPerSource %d, HandshakeTimeout %v: none may be negative",
			c.MaxConns, c.MaxHandshakes, c.MaxHandshakesPerSource, c.HandshakeTimeout)
	}
	return nil
}

// ListenerStats counts a guarded listener's connections.
type ListenerStats struct {
	Active       int64 // authenticated connections open now (under MaxConns)
	Handshaking  int64 // connections in their handshake now (under MaxHandshakes)
	Accepted     int64 // connections handed to the server (authenticated)
	OverLimit    int64 // connections closed because MaxConns were open
	AuthFailures int64 // connections closed for a failed or timed-out handshake
	Displaced    int64 // handshakes closed to make room for a newer connection (MaxHandshakes)
	AcceptErrors int64 // accept errors survived (EMFILE, ...)
}

// backoff bounds for accept errors.
const (
	minBackoff = 5 * time.Millisecond
	maxBackoff = time.Second
)

// Listener wraps a net.Listener: it accepts in its own goroutine, backing
// off and continuing on errors (too many open files and the like), closes
// connections over the cap, authenticates the others concurrently and
// hands out only those that passed. It owns the wrapped listener and closes
// it exactly once.
type Listener struct {
	ln  net.Listener
	cfg ListenerConfig
	lg  *zap.Logger

	conns chan net.Conn
	done  chan struct{}
	wg    sync.WaitGroup

	closeOnce sync.Once
	closeErr  error

	mu      sync.Mutex
	pending *list.List     // of *handshaking, oldest first
	sources map[string]int // handshakes per source address

	active, accepted, overLimit, authFails, displaced, acceptErrs atomic.Int64
	lastRefusalLog                                                atomic.Int64 // unix nanos: refusals are logged at most once a second
}

// NewListener wraps ln and starts accepting. lg is used as given (nil is a
// no-op). Zero fields of cfg take their defaults. cfg must pass Validate:
// NewListener has no error to return, and its callers (rdma/tcp,
// rdma/verbs, proxy/peerapi) refuse negative values in their own Validate;
// a negative MaxConns or HandshakeTimeout that got here anyway is not made
// a default but fails closed (every connection over the cap; with a Key,
// every handshake past its deadline).
func NewListener(ln net.Listener, cfg ListenerConfig, lg *zap.Logger) *Listener {
	cfg = cfg.withDefaults()
	if lg == nil {
		lg = zap.NewNop()
	}
	l := &Listener{ln: ln, cfg: cfg, lg: lg, conns: make(chan net.Conn), done: make(chan struct{}),
		pending: list.New(), sources: make(map[string]int)}
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

// Accept returns the next authenticated connection, or net.ErrClosed once
// the listener is closed.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Addr is the wrapped listener's address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// String names the listener by its address. Servers that log their
// options (Kitex prints WithListener with %+v) then read no field that the
// accept goroutine is updating.
func (l *Listener) String() string { return "peerauth.Listener(" + l.ln.Addr().String() + ")" }

// Close stops accepting, closes the wrapped listener (once) and the
// connections still handshaking, and waits for the accept goroutine.
// Accepted connections belong to whoever accepted them. Safe to call twice.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.done)
		l.closeErr = l.ln.Close()
		l.mu.Lock()
		for e := l.pending.Front(); e != nil; e = e.Next() {
			_ = e.Value.(*handshaking).nc.Close()
		}
		l.mu.Unlock()
		l.wg.Wait()
	})
	return l.closeErr
}

// Stats returns a snapshot of the counters.
func (l *Listener) Stats() ListenerStats {
	l.mu.Lock()
	hs := int64(l.pending.Len())
	l.mu.Unlock()
	return ListenerStats{Active: l.active.Load(), Handshaking: hs, Accepted: l.accepted.Load(), OverLimit: l.overLimit.Load(),
		AuthFailures: l.authFails.Load(), Displaced: l.displaced.Load(), AcceptErrors: l.acceptErrs.Load()}
}

func (l *Listener) closed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	delay := time.Duration(0)
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			if l.closed() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, aborted connection, ...: the port must
			// keep accepting once the condition clears.
			l.acceptErrs.Add(1)
			delay = min(max(2*delay, minBackoff), maxBackoff)
			l.lg.Warn("accept failed; retrying", zap.Error(err), zap.Duration("backoff", delay))
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-l.done:
				t.Stop()
				return
			}
			continue
		}
		delay = 0
		if l.active.Load() >= int64(l.cfg.MaxConns) {
			l.overLimit.Add(1)
			_ = nc.Close()
			continue
		}
		h := &handshaking{nc: nc, src: sourceOf(nc)}
		l.mu.Lock()
		if l.closed() {
			l.mu.Unlock()
			_ = nc.Close()
			return
		}
		victim, ok := l.admitLocked(h)
		if ok {
			l.wg.Add(1)
		}
		l.mu.Unlock()
		if victim != nil {
			l.displaced.Add(1)
			_ = victim.Close() // its handshake fails and ends
		}
		if ok {
			go l.handshake(h)
		}
	}
}

// handshaking is a connection in its handshake.
type handshaking struct {
	nc    net.Conn
	src   string
	el    *list.Element // in pending; nil once removed
	hello atomic.Bool   // its hello arrived: it is waiting for its proof (set without mu: never behind the accept loop)
}

// sourceOf is the address a connection comes from, without the port.
func sourceOf(nc net.Conn) string {
	if a, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	host, _, err := net.SplitHostPort(nc.RemoteAddr().String())
	if err != nil {
		return nc.RemoteAddr().String()
	}
	return host
}

// admitLocked adds h to the handshakes and returns the connection it
// displaces (nil if none): when h's source, or all sources, are at their
// budget, the oldest of them that has not sent its hello, else the oldest.
// A budget of none (a negative one that got past Validate) fails closed:
// h itself is displaced and not admitted.
func (l *Listener) admitLocked(h *handshaking) (victim net.Conn, admitted bool) {
	if l.cfg.MaxHandshakes <= 0 || l.cfg.MaxHandshakesPerSource <= 0 {
		return h.nc, false
	}
	var old *handshaking
	switch {
	case l.sources[h.src] >= l.cfg.MaxHandshakesPerSource:
		old = l.oldestLocked(h.src)
	case l.pending.Len() >= l.cfg.MaxHandshakes:
		old = l.oldestLocked("")
	}
	if old != nil {
		l.removeLocked(old)
		victim = old.nc
	}
	h.el = l.pending.PushBack(h)
	l.sources[h.src]++
	return victim, true
}

// oldestLocked returns the oldest handshake of src ("": of any source)
// that has not sent a byte, else the oldest of src; nil if none. Bytes
// waiting unread count as sent: a member's hello follows its connect at
// once, before its handshake goroutine may have run.
func (l *Listener) oldestLocked(src string) *handshaking {
	var first *handshaking
	for e := l.pending.Front(); e != nil; e = e.Next() {
		h := e.Value.(*handshaking)
		if src != "" && h.src != src {
			continue
		}
		if !h.hello.Load() && !hasBytes(h.nc) {
			return h
		}
		if first == nil {
			first = h
		}
	}
	return first
}

// hasBytes reports whether bytes wait unread on nc, without reading them
// or waiting (and without the read lock that the handshake's blocked
// Read holds).
func hasBytes(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	waiting := false
	_ = rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		waiting = err == nil && n > 0
	})
	return waiting
}

// removeLocked takes h out of the handshakes; false if it was not there
// (displaced).
func (l *Listener) removeLocked(h *handshaking) bool {
	if h.el == nil {
		return false
	}
	l.pending.Remove(h.el)
	h.el = nil
	if l.sources[h.src]--; l.sources[h.src] <= 0 {
		delete(l.sources, h.src)
	}
	return true
}

func (l *Listener) handshake(h *handshaking) {
	defer l.wg.Done()
	nc := h.nc
	var err error
	ac := nc
	if l.cfg.Key != nil {
		ac, err = l.cfg.Key.server(nc, l.cfg.Purpose, time.Now().Add(l.cfg.HandshakeTimeout), func() { h.hello.Store(true) })
	}
	l.mu.Lock()
	displaced := !l.removeLocked(h)
	l.mu.Unlock()
	if displaced {
		_ = nc.Close()
		return // counted as displaced
	}
	if err == nil && l.active.Add(1) > int64(l.cfg.MaxConns) {
		// Members filled the cap while this one authenticated.
		l.active.Add(-1)
		l.overLimit.Add(1)
		_ = nc.Close()
		return
	}
	if err != nil {
		l.authFails.Add(1)
		if now, last := time.Now().UnixNano(), l.lastRefusalLog.Load(); !l.closed() && now-last >= int64(time.Second) &&
			l.lastRefusalLog.CompareAndSwap(last, now) {
			// At most once a second: a prober must not flood the log.
			l.lg.Warn("connection refused: authentication failed", zap.Stringer("remote", nc.RemoteAddr()),
				zap.Error(err), zap.Int64("refused_so_far", l.authFails.Load()))
		}
		_ = nc.Close()
		return
	}
	c := &Conn{Conn: ac, idle: l.cfg.IdleTimeout, active: &l.active}
	_ = c.SetReadDeadline(time.Time{}) // the idle cap holds from the start
	l.accepted.Add(1)                  // counted before the server can use it
	select {
	case l.conns <- c:
	case <-l.done:
		l.accepted.Add(-1)
		_ = c.Close()
	}
}

// Conn is an accepted connection: its Close releases its place under the
// cap (once), and its read deadlines are capped by the idle timeout.
type Conn struct {
	net.Conn
	idle      time.Duration
	active    *atomic.Int64
	closeOnce sync.Once
	closeErr  error
}

// Raw is the wrapped connection (the *net.TCPConn for writev through
// net.Buffers, unless the connection is encrypted).
func (c *Conn) Raw() net.Conn { return c.Conn }

// Close closes the connection once; later calls return the first result.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		c.closeErr = c.Conn.Close()
		c.active.Add(-1)
	})
	return c.closeErr
}

// SetReadDeadline sets t, capped at now plus the idle timeout.
func (c *Conn) SetReadDeadline(t time.Time) error {
	return c.Conn.SetReadDeadline(c.capped(t))
}

// SetDeadline sets t for writes and t capped for reads.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.Conn.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetReadDeadline(c.capped(t))
}

func (c *Conn) capped(t time.Time) time.Time {
	if c.idle <= 0 {
		return t
	}
	if limit := time.Now().Add(c.idle); t.IsZero() || t.After(limit) {
		return limit
	}
	return t
}
