package proxy

// Blocks owed to their owners (docs/cluster.md §5, "Failed pushes"). A
// put stores its block here and pushes it to the block's owners; when
// that push fails (the owner hangs, is unreachable or marked down, or the
// push queue is full), this node may hold the only copy, and a copy of a
// block owned elsewhere is low-priority, which the rebalancer never moved:
// the owner, back a moment later, never got it and reads through it
// missed. So a block whose push failed, a rebalancer move that failed,
// and a block stored as a copy whose owner left the ring before its push
// (a zero-copy Commit after the Reserve, a put racing the ring's rebuild)
// is owed: the rebalancer pushes it again to the block's current owners,
// in its passes after a membership change (the owner coming back is one)
// and in retry passes while an owed block has a current owner other than
// this node, until the owners hold it or it is no longer held here
// (evicted, deleted), for at most owedFor.

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// maxOwed bounds the blocks owed at once: a namespace and a key each
	// (≤ about 200 bytes with the map's own), so at most ~6 MiB. A failed
	// push past it is given up and counted.
	maxOwed = 1 << 15
	// owedFor is how long an owed block is retried from its first failed
	// push: long enough for an owner that was declared failed to come back
	// (a flap, a restarted pod); then it is given up and counted.
	owedFor = 5 * time.Minute
	// maxRetryEvery bounds the back-off of retry passes that moved nothing
	// (an owner that keeps refusing), from max(RebalanceDelay,
	// PeerDownFor).
	maxRetryEvery = time.Minute
)

// owedSet is the blocks owed to their owners, by ns + "\x00" + key. Safe
// for concurrent use.
type owedSet struct {
	mu      sync.Mutex
	m       map[string]owedBlock
	dropped atomic.Int64 // given up: past owedFor, or past maxOwed
}

type owedBlock struct {
	ns    string
	key   []byte
	since time.Time // the first failed push
}

func owedKey(ns string, key []byte) string { return ns + "\x00" + string(key) }

// add owes the blocks of ns with keys; a block owed already keeps its
// first failure time. It reports whether a block was added.
func (o *owedSet) add(now time.Time, ns string, keys [][]byte) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[string]owedBlock{}
	}
	added := false
	for _, k := range keys {
		id := owedKey(ns, k)
		if _, ok := o.m[id]; ok {
			continue
		}
		if len(o.m) >= maxOwed {
			o.dropped.Add(1)
			continue
		}
		o.m[id] = owedBlock{ns: ns, key: slices.Clone(k), since: now}
		added = true
	}
	return added
}

// settle removes the blocks of keys: pushed, held by their owners, or gone.
func (o *owedSet) settle(keys []string) {
	o.mu.Lock()
	for _, k := range keys {
		delete(o.m, k)
	}
	o.mu.Unlock()
}

// keys returns the owed blocks' keys, after giving up those owed since
// before now - owedFor.
func (o *owedSet) keys(now time.Time) map[string]bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.expire(now)
	out := make(map[string]bool, len(o.m))
	for k := range o.m {
		out[k] = true
	}
	return out
}

// due reports whether an owed block has a current owner other than self
// (owners lists a block's owners, its first rep the current ones), after
// giving up the expired ones: a retry pass has somewhere to push.
func (o *owedSet) due(now time.Time, self string, rep int, owners func(ns string, key []byte) []string) bool {
	o.mu.Lock()
	o.expire(now)
	blocks := make([]owedBlock, 0, len(o.m))
	for _, b := range o.m {
		blocks = append(blocks, b)
	}
	o.mu.Unlock() // owners places keys: not under the lock a failed put takes
	for _, b := range blocks {
		cur := owners(b.ns, b.key)
		for _, n := range cur[:min(rep, len(cur))] {
			if n != self {
				return true
			}
		}
	}
	return false
}

func (o *owedSet) expire(now time.Time) {
	for k, b := range o.m {
		if now.Sub(b.since) > owedFor {
			delete(o.m, k)
			o.dropped.Add(1)
		}
	}
}

func (o *owedSet) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.m)
}
