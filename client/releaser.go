package client

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// releaseBatch is the most lease ids in one background Release (under the
// server's default max_batch).
const releaseBatch = 256

// releaser releases the leases of GetInto in the background, batching the
// ids queued while a Release is in flight into the next one: one round trip
// per GetInto instead of two. Close releases what is queued.
type releaser struct {
	mu      sync.Mutex
	ids     []int64
	kick    chan struct{} // buffered 1: ids are queued
	done    chan struct{} // closed by stop
	exited  chan struct{} // closed when the goroutine ends
	started bool
	stopped bool

	calls, items atomic.Int64 // Releases made, ids sent in them
}

// add queues id, starting the goroutine on first use. After stop the
// release is synchronous.
func (r *releaser) add(c *Client, id int64) {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		c.Release(context.Background(), []int64{id})
		return
	}
	if !r.started {
		r.started = true
		r.kick = make(chan struct{}, 1)
		r.done = make(chan struct{})
		r.exited = make(chan struct{})
		go r.loop(c)
	}
	r.ids = append(r.ids, id)
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *releaser) loop(c *Client) {
	defer close(r.exited)
	for {
		select {
		case <-r.kick:
		case <-r.done:
			r.flush(c)
			return
		}
		r.flush(c)
	}
}

// flush releases every queued id. Failures need no handling: an id that
// could not be released expires at its deadline.
func (r *releaser) flush(c *Client) {
	for {
		r.mu.Lock()
		n := min(len(r.ids), releaseBatch)
		batch := append([]int64(nil), r.ids[:n]...)
		r.ids = r.ids[n:]
		r.mu.Unlock()
		if n == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r.calls.Add(1)
		r.items.Add(int64(len(batch)))
		c.Release(ctx, batch)
		cancel()
	}
}

// stop releases what is queued and ends the goroutine. Safe to call twice.
func (r *releaser) stop() {
	r.mu.Lock()
	started, stopped := r.started, r.stopped
	r.stopped = true
	r.mu.Unlock()
	if started && !stopped {
		close(r.done)
		<-r.exited
	}
}
