package engineapi

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/internal/fdlimit"
)

// sockConns is what the put socket and the buffer socket share: a
// listener whose connections are each served by a goroutine of their own
// (not Kitex), one call at a time, and how they end. A connection waits
// for its next request without a deadline set by the socket, busy from a
// request's first byte to its answer; close wakes the idle ones at once,
// lets the busy ones finish within the drain timeout, then closes the
// rest.
type sockConns struct {
	ln     net.Listener
	lg     *zap.Logger
	what   string // "put socket", for the log
	drain  time.Duration
	closed chan struct{}
	guard  *fdlimit.Guard // nil admits every connection

	accepted, acceptErrors atomic.Uint64

	mu      sync.Mutex
	active  map[*sockConn]struct{}
	closing bool
	wg      sync.WaitGroup
}

// sockConn is one connection; busy while a call is being served.
type sockConn struct {
	conn net.Conn
	busy bool // under sockConns.mu
}

func newSockConns(ln net.Listener, lg *zap.Logger, what string, drain time.Duration, guard *fdlimit.Guard) sockConns {
	return sockConns{ln: ln, lg: lg, what: what, drain: drain, guard: guard, closed: make(chan struct{}), active: make(map[*sockConn]struct{})}
}

// start accepts connections in the background, handing each to admit.
func (sc *sockConns) start(admit func(net.Conn)) {
	sc.wg.Add(1)
	go func() {
		defer sc.wg.Done()
		acceptLoop(sc.ln, sc.closed, sc.lg, sc.what, &sc.accepted, &sc.acceptErrors, func(conn net.Conn) {
			// Within the reserve of the descriptor limit the client sees
			// its connection end (internal/fdlimit).
			if !sc.guard.AdmitConn(conn) {
				conn.Close()
				return
			}
			admit(conn)
		})
	}()
}

// add takes c on, counting the goroutine that will serve it, which must
// end with done; false (c not added) when the socket is closing.
func (sc *sockConns) add(c *sockConn) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.closing {
		return false
	}
	sc.active[c] = struct{}{}
	sc.wg.Add(1)
	return true
}

// done forgets c when its goroutine ends.
func (sc *sockConns) done(c *sockConn) {
	sc.mu.Lock()
	delete(sc.active, c)
	sc.mu.Unlock()
	sc.wg.Done()
}

// idle clears c's deadlines before it waits for its next request's first
// byte; false when the socket is closing. Under the lock, so that close
// cannot miss a connection going idle.
func (sc *sockConns) idle(c *sockConn) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.closing {
		return false
	}
	_ = c.conn.SetDeadline(time.Time{})
	return true
}

// begin marks c busy once a request's first byte arrived; false when the
// socket is closing.
func (sc *sockConns) begin(c *sockConn) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.closing {
		return false
	}
	c.busy = true
	return true
}

// end marks c idle after its answer and reports whether the socket is
// closing.
func (sc *sockConns) end(c *sockConn) (closing bool) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	c.busy = false
	return sc.closing
}

// open is the number of connections being served.
func (sc *sockConns) open() int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return len(sc.active)
}

// close stops accepting, lets calls in flight finish (up to the drain
// timeout), then closes every connection and waits for their goroutines.
func (sc *sockConns) close() {
	sc.mu.Lock()
	sc.closing = true
	close(sc.closed)
	for c := range sc.active {
		if !c.busy {
			_ = c.conn.SetReadDeadline(time.Now()) // wakes the idle read
		}
	}
	sc.mu.Unlock()
	sc.ln.Close()
	done := make(chan struct{})
	go func() { sc.wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(sc.drain):
	}
	sc.mu.Lock()
	for c := range sc.active {
		c.conn.Close()
	}
	sc.mu.Unlock()
	<-done
}

// acceptLoop accepts connections on ln until closed is closed, handing
// each to admit. accept(2) failures (EMFILE and the like) are counted and
// logged, and accepting backs off and goes on, as the engine socket does.
func acceptLoop(ln net.Listener, closed <-chan struct{}, lg *zap.Logger, what string, accepted, failed *atomic.Uint64, admit func(net.Conn)) {
	backoff := 5 * time.Millisecond
	for {
		conn, err := ln.Accept()
		if err != nil {
			select {
			case <-closed:
				return
			default:
			}
			failed.Add(1)
			lg.Warn(what+": accept failed", zap.Error(err), zap.Duration("retry_in", backoff))
			select {
			case <-time.After(backoff):
			case <-closed:
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		accepted.Add(1)
		admit(conn)
	}
}
