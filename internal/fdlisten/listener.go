// Package fdlisten gives an event-loop server (CloudWeGo netpoll, under
// Kitex) a listening socket without giving it the socket's descriptor to
// close.
//
// netpoll converts a plain net.Listener by duplicating its descriptor and,
// on Close, closes the duplicate by number and then again through the
// *os.File holding it (and Kitex closes the listener more than once while
// it stops). Between two of those closes the number can be handed to
// another file (RocksDB's, during a shutdown), and the second close shuts
// that file under its owner. A Listener already is what netpoll wants (a
// net.Listener with an Fd), so netpoll uses it as it is: its Close only
// stops accepting and may be called any number of times, from any thread;
// the descriptor stays open until the owner calls Release, once the server
// has stopped, and is closed there exactly once (by the Go listener that
// has owned it from the start).
package fdlisten

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tidepool-kv/tidepool/internal/fdlimit"
)

// ErrReleased reports an Accept after Release.
var ErrReleased = errors.New("fdlisten: listener released")

// Listener is a listening socket for netpoll. Accept follows netpoll's
// contract, not net.Listener's: it does not block, and returns nil, nil
// when no connection is waiting.
type Listener struct {
	ln    net.Listener // owns the descriptor; closed once, in Release
	fd    int
	addr  net.Addr
	guard *fdlimit.Guard // set before the first Accept; nil admits all

	// mu orders Accept (read side) before Release (write side), so that
	// no accept(2) ever runs on a descriptor number already closed.
	mu       sync.RWMutex
	released bool
	closing  atomic.Bool

	accepted atomic.Uint64
	drained  atomic.Uint64
	failed   atomic.Uint64

	polled     chan struct{} // closed at the first Fd: the poller has it
	polledOnce sync.Once
}

// Stats counts what Accept did.
type Stats struct {
	// Accepted is connections handed to the server.
	Accepted uint64
	// Drained is connections accepted after Close and closed at once.
	Drained uint64
	// Failed is accept(2) errors other than "none waiting" (EMFILE and
	// the like; the server backs off and retries).
	Failed uint64
}

// New takes over ln, a *net.UnixListener or *net.TCPListener. From now on
// the Listener owns it: call Release (not ln.Close) when the server using
// it has stopped.
func New(ln net.Listener) (*Listener, error) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("fdlisten: %T has no descriptor", ln)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("fdlisten: %w", err)
	}
	fd := -1
	if err := rc.Control(func(f uintptr) { fd = int(f) }); err != nil {
		return nil, fmt.Errorf("fdlisten: %w", err)
	}
	// The Go runtime made it non-blocking already; say so for readers.
	if err := syscall.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("fdlisten: %w", err)
	}
	return &Listener{ln: ln, fd: fd, addr: ln.Addr(), polled: make(chan struct{})}, nil
}

// SetGuard makes Accept close at once the connections whose descriptors
// g refuses (internal/fdlimit). Call it before the server starts.
func (l *Listener) SetGuard(g *fdlimit.Guard) { l.guard = g }

// Fd returns the listening descriptor, for the server's poller. It stays
// valid until Release.
func (l *Listener) Fd() int {
	l.polledOnce.Do(func() { close(l.polled) })
	return l.fd
}

// Polled is closed once a poller has asked for the descriptor (netpoll
// does so as its event loop starts serving): from then on the server's
// own setup is done and stopping it stops the loop. Stopping a Kitex
// server before that races its start and can leave the loop running.
func (l *Listener) Polled() <-chan struct{} { return l.polled }

// Addr implements net.Listener.
func (l *Listener) Addr() net.Addr { return l.addr }

// String names the listener by its address, so that a server logging its
// options with %+v (Kitex does) reads none of the counters.
func (l *Listener) String() string { return "fdlisten.Listener(" + l.addr.String() + ")" }

// Accept takes one waiting connection: nil, nil when none waits. After
// Close, a waiting connection is closed at once (the client sees the
// connection end) and Accept returns nil, nil, so that a level-triggered
// poller does not spin on it.
func (l *Listener) Accept() (net.Conn, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.released {
		return nil, ErrReleased
	}
	for {
		nfd, sa, err := syscall.Accept4(l.fd, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		switch {
		case err == nil:
		case errors.Is(err, syscall.EAGAIN):
			return nil, nil
		case errors.Is(err, syscall.EINTR), errors.Is(err, syscall.ECONNABORTED):
			continue
		default:
			l.failed.Add(1)
			return nil, err
		}
		if l.closing.Load() {
			syscall.Close(nfd)
			l.drained.Add(1)
			continue
		}
		if !l.guard.Admit(nfd) {
			// Within the reserve of the descriptor limit: the client
			// sees its connection end, the process keeps the number.
			syscall.Close(nfd)
			continue
		}
		l.accepted.Add(1)
		return &Conn{fd: nfd, local: l.addr, remote: remoteAddr(sa, l.addr)}, nil
	}
}

// Close stops accepting. It leaves the descriptor open (Release closes
// it) and may be called any number of times.
func (l *Listener) Close() error {
	l.closing.Store(true)
	return nil
}

// Release closes the listening socket (and, for a Unix socket created
// with unlink-on-close, removes its path). Call it once the server that
// accepts on it has stopped; later calls return the first call's result.
func (l *Listener) Release() error {
	l.closing.Store(true)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return nil
	}
	l.released = true
	return l.ln.Close()
}

// Stats returns the counters.
func (l *Listener) Stats() Stats {
	return Stats{Accepted: l.accepted.Load(), Drained: l.drained.Load(), Failed: l.failed.Load()}
}

func remoteAddr(sa syscall.Sockaddr, local net.Addr) net.Addr {
	switch a := sa.(type) {
	case *syscall.SockaddrInet4:
		return &net.TCPAddr{IP: net.IP(a.Addr[:]).To16(), Port: a.Port}
	case *syscall.SockaddrInet6:
		return &net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port}
	case *syscall.SockaddrUnix:
		return &net.UnixAddr{Name: a.Name, Net: "unix"}
	}
	return local
}

// Conn is an accepted connection handed to the server, which takes over
// its descriptor (netpoll reads Fd and closes the descriptor itself).
type Conn struct {
	fd            int
	local, remote net.Addr
	closed        atomic.Bool
}

var _ net.Conn = (*Conn)(nil)

// Fd returns the connection's descriptor.
func (c *Conn) Fd() int { return c.fd }

// Read implements net.Conn on the raw, non-blocking descriptor.
func (c *Conn) Read(b []byte) (int, error) { return syscall.Read(c.fd, b) }

// Write implements net.Conn on the raw, non-blocking descriptor.
func (c *Conn) Write(b []byte) (int, error) { return syscall.Write(c.fd, b) }

// Close closes the descriptor, for a caller that did not hand it on.
func (c *Conn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	return syscall.Close(c.fd)
}

// LocalAddr implements net.Conn.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr implements net.Conn.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline is not supported on the raw descriptor.
func (c *Conn) SetDeadline(time.Time) error { return errors.ErrUnsupported }

// SetReadDeadline is not supported on the raw descriptor.
func (c *Conn) SetReadDeadline(time.Time) error { return errors.ErrUnsupported }

// SetWriteDeadline is not supported on the raw descriptor.
func (c *Conn) SetWriteDeadline(time.Time) error { return errors.ErrUnsupported }
