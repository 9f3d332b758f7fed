package safecodec

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cloudwego/kitex/pkg/remote"
	"github.com/cloudwego/kitex/pkg/remote/codec/perrors"
	kitexnetpoll "github.com/cloudwego/kitex/pkg/remote/trans/netpoll"
	"github.com/cloudwego/kitex/transport"
	"github.com/cloudwego/netpoll"
)

// Borrowed request bytes.
//
// The engine API's inline puts are decoded with their values as slices of
// the request buffer (scripts/gen-idl.sh, borrow_values), which saves a
// copy of every value. Kitex releases the buffer it decodes from as soon
// as the decoder returns, before the handler runs, and netpoll then
// recycles its memory for other connections' reads. So:
//
//   - lend: a framed request of minLend bytes or more, read by netpoll, on
//     a call that carries a Loans (put there by the Lender tracer), is
//     decoded from a zero-copy, reference-counted slice of its frame
//     (netpoll's Reader.Slice), recorded in the Loans. Kitex's own release
//     then leaves those bytes alone (the slice holds a reference). If the
//     decoded arguments are a Borrower, the Lender releases the slice when
//     Kitex finishes the call, after the handler has returned and the
//     reply has been written; if not, the codec releases it at once. A
//     slice never released is not reused by netpoll either: the garbage
//     collector frees it.
//   - own: arguments that are a Borrower but were not lent a buffer
//     (small, unframed, another transport, no Lender) have their values
//     copied by OwnValues before the codec returns.
//
// Whoever handles a lent request must not keep its values after the
// handler returns (proxy pushes copies to other owners).

// Borrower is a request whose generated decoder borrows its values from
// the buffer it decodes; OwnValues copies them.
type Borrower interface {
	OwnValues()
}

type loansKey struct{}

// Loans are the request buffers lent to one call.
type Loans struct {
	lender *Lender
	bufs   []remote.ByteBuffer
}

// releaseLast gives back the buffer lent last, whose request turned out
// not to borrow from it.
func (l *Loans) releaseLast() {
	i := len(l.bufs) - 1
	_ = l.bufs[i].Release(nil)
	l.bufs[i] = nil
	l.bufs = l.bufs[:i]
	l.lender.lent.Add(-1)
}

// release releases every buffer lent to the call.
func (l *Loans) release() {
	for i, b := range l.bufs {
		_ = b.Release(nil)
		l.bufs[i] = nil
	}
	l.bufs = l.bufs[:0]
}

// Lender is a Kitex server tracer (server.WithTracer) that gives each call
// a Loans for the codec to record what it lends, and releases them when
// Kitex finishes the call: Kitex calls a server tracer's Finish from the
// deferred end of its read loop, after the handler and the reply's write,
// on success, error and panic alike.
type Lender struct {
	pool sync.Pool // *Loans
	lent atomic.Int64
}

// Lent returns how many requests were decoded from lent buffers.
func (t *Lender) Lent() int64 { return t.lent.Load() }

// Start implements stats.Tracer.
func (t *Lender) Start(ctx context.Context) context.Context {
	l, _ := t.pool.Get().(*Loans)
	if l == nil {
		l = &Loans{lender: t}
	}
	return context.WithValue(ctx, loansKey{}, l)
}

// Finish implements stats.Tracer.
func (t *Lender) Finish(ctx context.Context) {
	l, _ := ctx.Value(loansKey{}).(*Loans)
	if l == nil {
		return
	}
	l.release()
	t.pool.Put(l)
}

// minLend is the smallest frame lent: below it a copy of the values costs
// less than the slice.
const minLend = 16 << 10

// lend returns the buffer to decode msg's payload from: a slice of in's
// frame recorded in the call's Loans (returned), or in itself (nil Loans).
func lend(ctx context.Context, msg remote.Message, in remote.ByteBuffer) (remote.ByteBuffer, *Loans, error) {
	l, _ := ctx.Value(loansKey{}).(*Loans)
	n := msg.PayloadLen()
	if l == nil || n <= 0 || !framed(msg) {
		return in, nil, nil
	}
	nr, ok := in.(interface{ NetpollReader() netpoll.Reader })
	if !ok || nr.NetpollReader() == nil {
		return in, nil, nil
	}
	sl, err := nr.NetpollReader().Slice(n)
	if err != nil {
		return nil, nil, perrors.NewProtocolErrorWithErrMsg(err, fmt.Sprintf("safecodec: reading a frame of %d bytes: %s", n, err))
	}
	buf := kitexnetpoll.NewReaderByteBuffer(sl)
	l.bufs = append(l.bufs, buf)
	l.lender.lent.Add(1)
	return buf, l, nil
}

// framed reports whether msg came in a plain frame, whose payload length
// is exactly the bytes left of it.
func framed(msg remote.Message) bool {
	ri := msg.RPCInfo()
	if ri == nil || ri.Config() == nil {
		return false
	}
	return ri.Config().TransportProtocol() == transport.Framed
}
