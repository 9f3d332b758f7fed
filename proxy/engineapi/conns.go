package engineapi

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudwego/kitex/pkg/remote"
	"go.uber.org/zap"
)

// ErrTooManyConnections refuses a connection beyond Config.MaxConnections.
var ErrTooManyConnections = errors.New("engineapi: too many connections")

// connTracker caps the connections open at once and closes idle ones.
// Kitex calls OnActive for every accepted connection and OnInactive when
// any connection closes, also one OnActive refused (netpoll's close
// callback is set before OnActive runs), so active counts every open
// connection. netpoll's own idle timeout is TCP keepalive, which a Unix
// socket does not have: the reaper here does the job.
type connTracker struct {
	max  int64
	idle time.Duration
	lg   *zap.Logger

	active     atomic.Int64
	refused    atomic.Uint64
	idleClosed atomic.Uint64

	mu    sync.Mutex
	conns map[net.Conn]*connState // tracked (not refused) connections

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// connState is one connection's activity; the hot path touches only its
// atomics (through the context), never the map.
type connState struct {
	last     atomic.Int64 // unix nanoseconds of the last read or write
	inflight atomic.Int32 // requests read and not yet answered
	gpu      connGPU      // GPU registrations (handler_gpu.go)
}

type connStateKey struct{}

var _ remote.DuplexBoundHandler = (*connTracker)(nil)

func newConnTracker(max int, idle time.Duration, lg *zap.Logger) *connTracker {
	return &connTracker{max: int64(max), idle: idle, lg: lg, conns: make(map[net.Conn]*connState), stop: make(chan struct{})}
}

func (c *connTracker) OnActive(ctx context.Context, conn net.Conn) (context.Context, error) {
	if n := c.active.Add(1); n > c.max {
		if c.refused.Add(1) == 1 {
			c.lg.Warn("refusing engine connections over the limit", zap.Int64("max_connections", c.max))
		}
		return ctx, ErrTooManyConnections
	}
	st := &connState{}
	st.last.Store(time.Now().UnixNano())
	c.mu.Lock()
	c.conns[conn] = st
	c.mu.Unlock()
	return context.WithValue(ctx, connStateKey{}, st), nil
}

func (c *connTracker) OnInactive(ctx context.Context, conn net.Conn) context.Context {
	c.active.Add(-1)
	c.mu.Lock()
	st := c.conns[conn]
	delete(c.conns, conn)
	c.mu.Unlock()
	if st != nil {
		st.gpu.close() // the engine is gone: its GPU buffers go with it
	}
	return ctx
}

func (c *connTracker) OnRead(ctx context.Context, conn net.Conn) (context.Context, error) {
	if st, ok := ctx.Value(connStateKey{}).(*connState); ok {
		st.inflight.Add(1)
		st.last.Store(time.Now().UnixNano())
	}
	return ctx, nil
}

func (c *connTracker) OnMessage(ctx context.Context, args, result remote.Message) (context.Context, error) {
	return ctx, nil
}

// Write sees every reply (error replies too) on its way out.
func (c *connTracker) Write(ctx context.Context, conn net.Conn, send remote.Message) (context.Context, error) {
	if st, ok := ctx.Value(connStateKey{}).(*connState); ok {
		st.last.Store(time.Now().UnixNano())
		if st.inflight.Add(-1) < 0 {
			st.inflight.Store(0)
		}
	}
	return ctx, nil
}

// start runs the reaper: every quarter of the idle timeout it closes the
// connections with no request in flight that were quiet for longer.
func (c *connTracker) start() {
	tick := c.idle / 4
	if tick < 10*time.Millisecond {
		tick = 10 * time.Millisecond
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-c.stop:
				return
			case now := <-t.C:
				c.reap(now)
			}
		}
	}()
}

func (c *connTracker) reap(now time.Time) {
	cutoff := now.Add(-c.idle).UnixNano()
	var idle []net.Conn
	c.mu.Lock()
	for conn, st := range c.conns {
		// A connection holding GPU registrations is the engine's session:
		// closing it would end them, so it is not reaped for quiet.
		if st.inflight.Load() == 0 && st.last.Load() < cutoff && !st.gpu.held() {
			idle = append(idle, conn)
		}
	}
	c.mu.Unlock()
	// Closed outside the lock: the close runs OnInactive, which takes it.
	for _, conn := range idle {
		c.idleClosed.Add(1)
		conn.Close()
	}
}

func (c *connTracker) close() {
	c.stopOnce.Do(func() { close(c.stop) })
	c.wg.Wait()
	// Registrations of connections still open at the stop end here.
	c.mu.Lock()
	var sts []*connState
	for _, st := range c.conns {
		sts = append(sts, st)
	}
	c.mu.Unlock()
	for _, st := range sts {
		st.gpu.close()
	}
}
