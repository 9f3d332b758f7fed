package peerauth

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
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
	// MaxConns caps the connections open at once (handshaking or
	// accepted); one over the cap is closed at once. Default 1024.
	MaxConns int
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
	return ListenerConfig{MaxConns: 1024, HandshakeTimeout: 5 * time.Second, IdleTimeout: NoIdleTimeout}
}

// withDefaults fills the zero fields with their defaults: the one place a
// zero field becomes its default.
func (c ListenerConfig) withDefaults() ListenerConfig {
	d := DefaultListenerConfig()
	if c.MaxConns == 0 {
		c.MaxConns = d.MaxConns
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
// MaxConns or HandshakeTimeout.
func (c ListenerConfig) Validate() error {
	c = c.withDefaults()
	if c.MaxConns < 0 || c.HandshakeTimeout < 0 {
		return fmt.Errorf("peerauth: listener MaxConns %d, HandshakeTimeout %v: neither may be negative", c.MaxConns, c.HandshakeTimeout)
	}
	return nil
}

// ListenerStats counts a guarded listener's connections.
type ListenerStats struct {
	Active       int64 // connections open now (handshaking or accepted)
	Accepted     int64 // connections handed to the server (authenticated)
	OverLimit    int64 // connections closed because MaxConns were open
	AuthFailures int64 // connections closed for a failed handshake
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
	pending map[net.Conn]struct{} // handshaking

	active, accepted, overLimit, authFails, acceptErrs atomic.Int64
	lastRefusalLog                                     atomic.Int64 // unix nanos: refusals are logged at most once a second
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
		pending: make(map[net.Conn]struct{})}
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
		for c := range l.pending {
			_ = c.Close()
		}
		l.mu.Unlock()
		l.wg.Wait()
	})
	return l.closeErr
}

// Stats returns a snapshot of the counters.
func (l *Listener) Stats() ListenerStats {
	return ListenerStats{Active: l.active.Load(), Accepted: l.accepted.Load(), OverLimit: l.overLimit.Load(),
		AuthFailures: l.authFails.Load(), AcceptErrors: l.acceptErrs.Load()}
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
		if l.active.Add(1) > int64(l.cfg.MaxConns) {
			l.active.Add(-1)
			l.overLimit.Add(1)
			_ = nc.Close()
			continue
		}
		l.mu.Lock()
		if l.closed() {
			l.mu.Unlock()
			l.active.Add(-1)
			_ = nc.Close()
			return
		}
		l.pending[nc] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.handshake(nc)
	}
}

func (l *Listener) handshake(nc net.Conn) {
	defer l.wg.Done()
	var err error
	ac := nc
	if l.cfg.Key != nil {
		ac, err = l.cfg.Key.Server(nc, l.cfg.Purpose, time.Now().Add(l.cfg.HandshakeTimeout))
	}
	l.mu.Lock()
	delete(l.pending, nc)
	l.mu.Unlock()
	if err != nil {
		l.authFails.Add(1)
		l.active.Add(-1)
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
