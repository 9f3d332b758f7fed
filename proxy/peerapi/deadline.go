package peerapi

import (
	"context"
	"net"
	"sync"
	"time"

	kconnpool "github.com/cloudwego/kitex/pkg/remote/connpool"

	"github.com/cloudwego/kitex/pkg/remote"
)

// Each call's deadline and cancellation on its connection.
//
// Kitex bounds a call with a context deadline or an RPC timeout by running
// it on a goroutine of its timeout pool while the caller waits
// (client/rpctimeout.go in v0.16.1): two goroutine hand-offs per call, and a
// timer. It calls on the caller's goroutine only when the context has no
// Done channel and the client no RPC timeout. apiConn.call gives it such a
// context (the caller's, uncancellable, carrying the call's deadline as a
// value) and no RPC timeout; deadlinePool, the client's connection pool,
// puts that deadline on the connection a call takes and, when the caller's
// context ends first, a deadline in the past (context.AfterFunc), so that
// a write or read of the call fails then as a timeout; the connection goes
// back to the pool with neither (a cancelled call's is discarded).

// callKey is the context key of a call's bounds.
type callKey struct{}

// callBounds is what deadlinePool.Get puts on the connection.
type callBounds struct {
	ctx      context.Context // the caller's: its end ends the call
	deadline time.Time
}

// deadlinePool is Kitex's long-connection pool with each call's bounds put
// on the connection it takes.
type deadlinePool struct{ *kconnpool.LongPool }

var _ remote.LongConnPool = deadlinePool{}

func (p deadlinePool) Get(ctx context.Context, network, address string, opt remote.ConnOption) (net.Conn, error) {
	b, _ := ctx.Value(callKey{}).(callBounds)
	if !b.deadline.IsZero() {
		// Dialing too ends with the call.
		opt.ConnectTimeout = max(min(opt.ConnectTimeout, time.Until(b.deadline)), time.Millisecond)
	}
	c, err := p.LongPool.Get(ctx, network, address, opt)
	if err != nil {
		return nil, err
	}
	if cc := asClientConn(c); cc != nil && !b.deadline.IsZero() {
		cc.arm(b)
	}
	return c, nil
}

func (p deadlinePool) Put(c net.Conn) error {
	if cc := asClientConn(c); cc != nil && !cc.disarm() {
		return p.LongPool.Discard(c) // cancelled: its deadline may fire yet
	}
	return p.LongPool.Put(c)
}

func (p deadlinePool) Discard(c net.Conn) error {
	if cc := asClientConn(c); cc != nil {
		cc.disarm()
	}
	return p.LongPool.Discard(c)
}

// asClientConn is the *clientConn under a pooled connection.
func asClientConn(c net.Conn) *clientConn {
	if r, ok := c.(remote.RawConn); ok {
		c = r.RawConn()
	}
	cc, _ := c.(*clientConn)
	return cc
}

// callDeadline is a clientConn's state while a call holds it.
type callDeadline struct {
	mu        sync.Mutex
	armed     bool
	gen       uint64 // counts arm and disarm: a late AfterFunc of an earlier call does nothing
	cancelled bool   // the caller's context ended during the call
	stop      func() bool
}

// longAgo is a deadline in the past: the next read or write fails at once.
var longAgo = time.Unix(1, 0)

// arm puts the call's deadline on c, and a deadline in the past when the
// caller's context ends first.
func (c *clientConn) arm(b callBounds) {
	d := &c.dl
	d.mu.Lock()
	d.gen++
	gen := d.gen
	d.armed, d.cancelled = true, false
	_ = c.Conn.SetDeadline(b.deadline)
	d.mu.Unlock()
	d.stop = context.AfterFunc(b.ctx, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.gen == gen {
			d.cancelled = true
			_ = c.Conn.SetDeadline(longAgo)
		}
	})
}

// disarm clears the call's deadline; false when the caller's context had
// ended (the connection may be mid-call: not to be reused).
func (c *clientConn) disarm() bool {
	d := &c.dl
	if d.stop != nil {
		d.stop()
		d.stop = nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.gen++
	ok := !d.cancelled
	d.armed, d.cancelled = false, false
	_ = c.Conn.SetDeadline(time.Time{})
	return ok
}

// SetReadDeadline keeps the call's deadline: Kitex's Go net client clears
// the read deadline before reading each answer when it has no RPC timeout
// of its own.
func (c *clientConn) SetReadDeadline(t time.Time) error {
	d := &c.dl
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.armed {
		return nil
	}
	return c.Conn.SetReadDeadline(t)
}
