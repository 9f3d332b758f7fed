// Package flight makes concurrent work on one key happen once
// (groupcache's singleflight, generic, with a context on the waiting side
// and an optional release of a shared result).
//
// The first caller of a key leads: it does the work and Finishes the call;
// callers that Join while it is in flight wait for that result instead of
// doing the work again. The leader should re-check, inside the flight,
// whether the work is still needed (a flight that ended between the
// caller's miss and its Join may have done it).
//
// Results are shared, not copied. When a result holds something that must
// be given back (a pinned buffer, a read lock), New takes a release
// function: it runs once, after the last participant of a successful call
// has Left, so every participant may read the result until it Leaves.
package flight

import (
	"context"
	"errors"
	"sync"
)

// Group is a set of calls in flight, by key. The zero value is not usable;
// New makes one. Safe for concurrent use.
type Group[K comparable, V any] struct {
	release func(V)

	mu    sync.Mutex
	calls map[K]*Call[K, V]
}

// New returns an empty group. release, when not nil, is called with the
// value of each successful call once its last participant has Left.
func New[K comparable, V any](release func(V)) *Group[K, V] {
	return &Group[K, V]{release: release, calls: make(map[K]*Call[K, V])}
}

// Call is one flight of a key.
type Call[K comparable, V any] struct {
	g    *Group[K, V]
	key  K
	done chan struct{}
	refs int // participants that have not Left; guarded by g.mu

	// Set by Finish before done is closed.
	val V
	err error
}

// Join returns the key's call in flight, or starts one and makes the
// caller its leader (leader true). The leader MUST call Finish once; every
// participant, leader included, MUST call Leave once it is done with the
// result (after Finish, for the leader).
func (g *Group[K, V]) Join(key K) (c *Call[K, V], leader bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c = g.calls[key]; c != nil {
		c.refs++
		return c, false
	}
	c = &Call[K, V]{g: g, key: key, done: make(chan struct{}), refs: 1}
	g.calls[key] = c
	return c, true
}

// Finish records the call's result, takes the call out of the group (a
// later Join starts a new flight) and wakes the participants. Only the
// leader calls it, once.
func (c *Call[K, V]) Finish(v V, err error) {
	c.val, c.err = v, err
	c.g.mu.Lock()
	if c.g.calls[c.key] == c {
		delete(c.g.calls, c.key)
	}
	c.g.mu.Unlock()
	close(c.done)
}

// Wait returns the call's result once it is Finished, or ctx's error if
// ctx ends first (the participant must still Leave).
func (c *Call[K, V]) Wait(ctx context.Context) (V, error) {
	select {
	case <-c.done:
		return c.val, c.err
	case <-ctx.Done():
		var zero V
		return zero, ctx.Err()
	}
}

// Leave ends the caller's use of the result. After the last participant of
// a successful call Leaves, the group's release function gets its value.
func (c *Call[K, V]) Leave() {
	c.g.mu.Lock()
	c.refs--
	last := c.refs == 0
	c.g.mu.Unlock()
	if !last || c.g.release == nil {
		return
	}
	// The leader Leaves only after Finish, so the last Leave comes after
	// it: done is closed and the result is set.
	<-c.done
	if c.err == nil {
		c.g.release(c.val)
	}
}

// Do runs fn once for the concurrent callers of key and returns its result
// to each; shared is false for the caller that ran it. A caller whose ctx
// ends while waiting gets ctx's error; the leader's own ctx is for fn to
// honour or not (a flight serves every waiter, so fn should not give up on
// its leader's cancellation alone). For a group without a release
// function: the value is returned after the caller has Left.
func (g *Group[K, V]) Do(ctx context.Context, key K, fn func() (V, error)) (v V, err error, shared bool) {
	c, leader := g.Join(key)
	defer c.Leave()
	if !leader {
		v, err = c.Wait(ctx)
		return v, err, true
	}
	finished := false
	defer func() {
		if !finished { // fn panicked: do not leave the waiters hanging
			c.Finish(v, ErrPanicked)
		}
	}()
	v, err = fn()
	finished = true
	c.Finish(v, err)
	return v, err, false
}

// ErrPanicked is what Do's waiters get when the leader's fn panicked (the
// panic itself goes on up the leader's stack).
var ErrPanicked = errors.New("flight: the leader's work panicked")

// Joined returns how many participants key's call in flight has (0: no
// call), for tests that wait until concurrent callers have joined.
func (g *Group[K, V]) Joined(key K) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c := g.calls[key]; c != nil {
		return c.refs
	}
	return 0
}

// InFlight returns how many keys have a call in flight (for tests and
// stats).
func (g *Group[K, V]) InFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.calls)
}
