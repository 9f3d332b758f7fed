package engineapi

import (
	"context"
	"sync"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/proxy"
)

// pinTracer lets Get and BatchGet answer with block bytes written to the
// socket straight from the DRAM arenas, without a copy into the heap:
// Start puts an empty proxy.Pins in the call's context, the handler pins
// the blocks it answers with into it (proxy.GetPinned), and Finish
// releases them. Kitex calls a server tracer's Finish after the reply has
// been encoded and flushed to the connection, or has failed to be (its
// OnRead defers it), so the pinned bytes stay in place for exactly as long
// as the write reads them. (Values of 4 KiB and more are written by
// reference: Kitex's codec hands them to netpoll's WriteDirect.)
type pinTracer struct {
	lg   *zap.Logger
	pool sync.Pool // *proxy.Pins
}

type pinsKey struct{}

func newPinTracer(lg *zap.Logger) *pinTracer {
	return &pinTracer{lg: lg, pool: sync.Pool{New: func() any { return new(proxy.Pins) }}}
}

// Start implements stats.Tracer.
func (t *pinTracer) Start(ctx context.Context) context.Context {
	return context.WithValue(ctx, pinsKey{}, t.pool.Get().(*proxy.Pins))
}

// Finish implements stats.Tracer: the reply is written (or failed), so the
// pinned bytes can go.
func (t *pinTracer) Finish(ctx context.Context) {
	ps := pinsFrom(ctx)
	if ps == nil {
		return
	}
	if err := ps.Release(); err != nil {
		// Pins do not expire, so this is a bug, not a slow client.
		t.lg.Error("releasing the pins of a reply", zap.Error(err))
	}
	t.pool.Put(ps)
}

// pinsFrom returns the call's Pins, or nil when the server runs without
// the tracer (then Get copies, as proxy.GetPinned does with nil pins).
func pinsFrom(ctx context.Context) *proxy.Pins {
	ps, _ := ctx.Value(pinsKey{}).(*proxy.Pins)
	return ps
}
