package proxy

// Per-peer circuit breaker: a node whose last call failed (timed out,
// refused, unreachable) is not called again for a while, so a partitioned
// or hung owner costs one short remote deadline, not one per request.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/clock"
)

// ErrPeerDown is a remote call not made because the node failed a call
// within the last RouteConfig.PeerDownFor (a read then misses).
var ErrPeerDown = errors.New("proxy: peer failed recently; not asked")

// breaker remembers recent failures per node. A failure opens the node's
// breaker for openFor: calls fail fast with ErrPeerDown. After that one
// call at a time is let through (half-open); its success closes the
// breaker, its failure opens it again. Nodes come from the placement view
// (never from a request), so the map is bounded by the cluster size; a
// node's entry is dropped when a call succeeds.
type breaker struct {
	openFor time.Duration // 0: off (every call is let through)
	clock   clock.Clock

	mu    sync.Mutex
	nodes map[string]*peerHealth

	opens, fastFails atomic.Int64
}

type peerHealth struct {
	openUntil time.Time
	probing   bool // a half-open probe is in flight
}

func newBreaker(openFor time.Duration, c clock.Clock) *breaker {
	return &breaker{openFor: openFor, clock: c, nodes: map[string]*peerHealth{}}
}

// allow reports whether a call to node may be made now, and whether it is
// the half-open probe (pass it to done). A refused call is counted.
func (b *breaker) allow(node string) (ok, probe bool) {
	if b.openFor <= 0 {
		return true, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	h := b.nodes[node]
	switch {
	case h == nil:
		return true, false
	case b.clock.Now().Before(h.openUntil) || h.probing:
		b.fastFails.Add(1)
		return false, false
	default:
		h.probing = true
		return true, true
	}
}

// done records the outcome of a call allowed by allow: failed opens the
// breaker, a success closes it; neither (the caller gave up) only ends a
// probe.
func (b *breaker) done(node string, probe bool, outcome callOutcome) {
	if b.openFor <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	h := b.nodes[node]
	switch outcome {
	case callOK:
		delete(b.nodes, node)
	case callFailed:
		if h == nil {
			h = &peerHealth{}
			b.nodes[node] = h
		}
		if !b.clock.Now().Before(h.openUntil) {
			b.opens.Add(1)
		}
		h.openUntil = b.clock.Now().Add(b.openFor)
		if probe {
			h.probing = false
		}
	default:
		if probe && h != nil {
			h.probing = false
		}
	}
}

// down lists the nodes whose breaker is open now.
func (b *breaker) down() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	now := b.clock.Now()
	for n, h := range b.nodes {
		if now.Before(h.openUntil) {
			out = append(out, n)
		}
	}
	return out
}

type callOutcome uint8

const (
	callOK     callOutcome = iota // the node answered
	callFailed                    // the node did not answer in time, or refused
	callGaveUp                    // the caller's own context ended: says nothing of the node
)

// outcomeOf classifies a call's error. parent is the caller's context
// before the router added its deadline: when it ended, the caller gave up.
// Answers about blocks (not found, checksum, exists) are answers.
func outcomeOf(parent context.Context, err error) callOutcome {
	switch {
	case err == nil:
		return callOK
	case parent.Err() != nil:
		return callGaveUp
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.Is(err, cache.ErrUnavailable):
		return callFailed
	case errors.Is(err, cache.ErrNotFound), errors.Is(err, cache.ErrChecksum), errors.Is(err, cache.ErrExists):
		return callOK
	}
	return callFailed
}

// perKeyOutcome folds a call's per-key errors: a key that timed out or was
// unavailable (the transfer from the node failed) counts against the node.
func perKeyOutcome(parent context.Context, errs []error) callOutcome {
	for _, e := range errs {
		if e == nil {
			continue
		}
		if o := outcomeOf(parent, e); o != callOK && (errors.Is(e, context.DeadlineExceeded) || errors.Is(e, cache.ErrUnavailable)) {
			return o
		}
	}
	return callOK
}
