package client

// Coalescing of the zero-copy control calls (docs/zerocopy.md, "Go
// client"). A GetInto costs one Acquire round trip, a PutFrom a Reserve and
// a Commit; with many callers these small calls cost about as much CPU as
// the copies of the blocks themselves. A combiner lets at most width calls
// of one kind be in flight per group (a namespace and a duration for
// Acquire and Reserve; one group for Commit, which names no namespace):
//
//   - a caller that finds fewer than width calls in flight makes the call
//     itself, with its own context and only its own item, exactly as it
//     would without coalescing: nothing waits, no timer;
//   - a caller that finds width calls in flight queues its item;
//   - when a call returns and items are queued, up to the server's max
//     batch of them go out as one batched call, made by a goroutine with a
//     context of its own (no waiter's cancellation can end it), and each
//     waiter gets its own item's answer, or the call's error.
//
// A waiter whose context ends stops waiting. If its item had not been
// sent, it is dropped (a Commit's token is aborted); if it had, the answer
// it would have got is undone (a lease released, a reservation aborted):
// nothing stays pinned or reserved until its deadline.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// flightKey is the group of a call: items with the same key can share one
// batched call.
type flightKey struct {
	ns string
	d  time.Duration // lease or reservation ttl (≤ 0: the server's default)
}

// States of a waiter: the deliverer and the waiter race for it with a CAS.
const (
	waiting int32 = iota
	delivered
	abandoned
)

// waiter is a queued item and, once delivered, its answer.
type waiter[Req, Res any] struct {
	req   Req
	res   Res
	err   error
	state atomic.Int32  // waiting, delivered or abandoned
	done  chan struct{} // closed once res and err are set (delivered)
}

// flightGroup is the state of one group. Guarded by combiner.mu.
type flightGroup[Req, Res any] struct {
	inflight int
	queue    []*waiter[Req, Res]
}

// combiner coalesces concurrent calls of one kind (see the top of the file).
type combiner[Req, Res any] struct {
	name  string // the method, for errors
	width int    // most calls in flight per group
	// call makes one batched call; it answers one Res per req, in order.
	call func(ctx context.Context, k flightKey, reqs []Req) ([]Res, error)
	// clone makes a queued request independent of the caller's memory (a
	// waiter may leave, and its caller reuse its key, while the item is
	// sent); nil: Req holds no shared memory.
	clone func(Req) Req
	// drop cleans up after items whose waiter left before they were sent;
	// nil: nothing to do.
	drop func(reqs []Req)
	// undo cleans up after answers whose waiter left; nil: nothing to do.
	undo func(res []Res)
	// max is the most items in one call (the server's max batch).
	max func() int

	mu      sync.Mutex
	groups  map[flightKey]*flightGroup[Req, Res]
	calls   atomic.Int64 // calls made
	items   atomic.Int64 // items sent in them
	waited  atomic.Int64 // items that queued behind a call in flight
	dropped atomic.Int64 // waiters that left: items dropped or undone
}

// do returns the answer of req, a member of group k.
func (cb *combiner[Req, Res]) do(ctx context.Context, k flightKey, req Req) (Res, error) {
	cb.mu.Lock()
	if cb.groups == nil {
		cb.groups = make(map[flightKey]*flightGroup[Req, Res])
	}
	g := cb.groups[k]
	if g == nil {
		g = &flightGroup[Req, Res]{}
		cb.groups[k] = g
	}
	if g.inflight < cb.width {
		g.inflight++
		cb.mu.Unlock()
		res, err := cb.one(ctx, k, req)
		cb.next(k, g)
		return res, err
	}
	if cb.clone != nil {
		req = cb.clone(req)
	}
	w := &waiter[Req, Res]{req: req, done: make(chan struct{})}
	g.queue = append(g.queue, w)
	cb.mu.Unlock()
	cb.waited.Add(1)
	select {
	case <-w.done:
	case <-ctx.Done():
		if w.state.CompareAndSwap(waiting, abandoned) {
			var zero Res
			return zero, fmt.Errorf("tidepool: %s: %w", cb.name, ctx.Err())
		}
		<-w.done // delivered meanwhile: the answer is the caller's
	}
	return w.res, w.err
}

// one makes the call of a single item, with the caller's context.
func (cb *combiner[Req, Res]) one(ctx context.Context, k flightKey, req Req) (Res, error) {
	var zero Res
	cb.calls.Add(1)
	cb.items.Add(1)
	res, err := cb.call(ctx, k, []Req{req})
	if err != nil {
		return zero, err
	}
	if len(res) != 1 {
		return zero, cb.malformed()
	}
	return res[0], nil
}

func (cb *combiner[Req, Res]) malformed() error {
	return &Error{Code: CodeInternal, Message: "zero-copy: malformed " + cb.name + " answer"}
}

// next ends a call of g: the items queued meanwhile go out in a goroutine,
// else the call's place is freed.
func (cb *combiner[Req, Res]) next(k flightKey, g *flightGroup[Req, Res]) {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	if len(g.queue) > 0 {
		go cb.run(k, g)
		return
	}
	cb.idle(k, g)
}

// idle frees a call's place in g, and forgets g once nothing is in
// flight. Called with mu held.
func (cb *combiner[Req, Res]) idle(k flightKey, g *flightGroup[Req, Res]) {
	g.inflight--
	if g.inflight == 0 {
		delete(cb.groups, k)
	}
}

// run sends the queued items of g in batches until the queue is empty. It
// holds one of g's places in flight.
func (cb *combiner[Req, Res]) run(k flightKey, g *flightGroup[Req, Res]) {
	limit := max(cb.max(), 1)
	for {
		var batch []*waiter[Req, Res]
		var gone []Req
		cb.mu.Lock()
		i := 0
		for ; i < len(g.queue) && len(batch) < limit; i++ {
			if w := g.queue[i]; w.state.Load() == abandoned {
				gone = append(gone, w.req)
			} else {
				batch = append(batch, w)
			}
		}
		if i == len(g.queue) {
			g.queue = nil
		} else {
			g.queue = append([]*waiter[Req, Res](nil), g.queue[i:]...)
		}
		if len(batch) == 0 {
			// The whole queue was scanned: nothing is left to send.
			cb.idle(k, g)
		}
		cb.mu.Unlock()
		cb.cleanUp(gone, nil)
		if len(batch) == 0 {
			return
		}
		cb.send(k, batch)
	}
}

// send makes one batched call and hands each waiter its answer.
func (cb *combiner[Req, Res]) send(k flightKey, batch []*waiter[Req, Res]) {
	reqs := make([]Req, len(batch))
	for i, w := range batch {
		reqs[i] = w.req
	}
	cb.calls.Add(1)
	cb.items.Add(int64(len(reqs)))
	// Not a waiter's context: one leaving must not end the call for the
	// others. The client's per-call timeout bounds it.
	res, err := cb.call(context.Background(), k, reqs)
	if err == nil && len(res) != len(reqs) {
		err = cb.malformed()
	}
	var undo []Res
	for i, w := range batch {
		if err != nil {
			w.err = err
		} else {
			w.res = res[i]
		}
		if w.state.CompareAndSwap(waiting, delivered) {
			close(w.done)
		} else if err == nil {
			undo = append(undo, res[i])
		}
	}
	cb.cleanUp(nil, undo)
}

// cleanUp drops unsent items and undoes answers whose waiters left.
func (cb *combiner[Req, Res]) cleanUp(gone []Req, undo []Res) {
	if n := len(gone) + len(undo); n > 0 {
		cb.dropped.Add(int64(n))
	}
	if len(gone) > 0 && cb.drop != nil {
		cb.drop(gone)
	}
	if len(undo) > 0 && cb.undo != nil {
		cb.undo(undo)
	}
}

// queued returns how many items wait (for tests).
func (cb *combiner[Req, Res]) queued() int {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	n := 0
	for _, g := range cb.groups {
		for _, w := range g.queue {
			if w.state.Load() == waiting {
				n++
			}
		}
	}
	return n
}

// CallStats counts the calls of one kind that GetInto or PutFrom made.
type CallStats struct {
	Calls   int64 // round trips
	Items   int64 // items sent in them (Items/Calls: the mean batch)
	Waited  int64 // items that queued behind a call in flight
	Dropped int64 // items whose caller left while queued: dropped unsent, or answer undone
}

func (cb *combiner[Req, Res]) stats() CallStats {
	return CallStats{Calls: cb.calls.Load(), Items: cb.items.Load(), Waited: cb.waited.Load(), Dropped: cb.dropped.Load()}
}

// CoalesceStats counts the control calls of GetInto and PutFrom since the
// client was made.
type CoalesceStats struct {
	Acquire CallStats
	Reserve CallStats
	Commit  CallStats
	// Release counts the background Releases of GetInto (Calls and
	// Items only).
	Release CallStats
}

// CoalesceStats returns a snapshot of the counters of the coalesced calls.
func (c *Client) CoalesceStats() CoalesceStats {
	z := &c.zc
	return CoalesceStats{Acquire: z.acquires.stats(), Reserve: z.reserves.stats(), Commit: z.commits.stats(),
		Release: CallStats{Calls: z.rel.calls.Load(), Items: z.rel.items.Load()}}
}
