package proxy

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
)

// PeerStats counts the calls this node made on one other node.
type PeerStats struct {
	Node          string
	Fetches       int64         // fetch calls (one Acquire each, or named reads)
	NamedReads    int64         // keys fetched by named reads (one exchange each: fetch.go)
	FetchedBlocks int64         // blocks brought in (or found local meanwhile)
	FetchedBytes  int64         // bytes pulled
	HotFetched    int64         // keys fetched to keep at full priority (owned here, or hot replicas)
	Misses        int64         // keys the peer did not hold
	Failures      int64         // keys or calls that failed (transfer, checksum, RPC)
	ChecksumFails int64         // fetched blocks whose bytes failed their CRC
	Lookups       int64         // Lookup calls
	Pushes        int64         // blocks pushed
	PushFailures  int64         // pushed blocks the peer did not store
	FetchLatency  time.Duration // summed over fetch calls the peer answered
}

// MeanFetchLatency is FetchLatency per fetch call.
func (s PeerStats) MeanFetchLatency() time.Duration {
	if s.Fetches > 0 {
		return s.FetchLatency / time.Duration(s.Fetches)
	}
	return 0
}

// PeerStats returns the counters of the calls made on each other node,
// sorted by node (none on a single node).
func (p *Proxy) PeerStats() []PeerStats {
	r := p.router()
	if r == nil {
		return nil
	}
	return r.stats.snapshot()
}

type peerCounters struct {
	fetches, named, blocks, bytes, hot, misses, failures, csum, lookups, pushes, pushFails, latency atomic.Int64
}

// landed counts the outcome of one block fetched from the node: n bytes
// landed, or why not.
func (pc *peerCounters) landed(n int64, err error) {
	switch {
	case err == nil:
		pc.blocks.Add(1)
		pc.bytes.Add(n)
	case errors.Is(err, cache.ErrNotFound):
		pc.misses.Add(1)
	case errors.Is(err, cache.ErrChecksum):
		pc.csum.Add(1)
		pc.failures.Add(1)
	default:
		pc.failures.Add(1)
	}
}

// peerStats holds the counters of each node called.
type peerStats struct {
	mu    sync.Mutex
	nodes map[string]*peerCounters
}

func (s *peerStats) of(node string) *peerCounters {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodes == nil {
		s.nodes = map[string]*peerCounters{}
	}
	pc, ok := s.nodes[node]
	if !ok {
		pc = &peerCounters{}
		s.nodes[node] = pc
	}
	return pc
}

func (s *peerStats) snapshot() []PeerStats {
	s.mu.Lock()
	out := make([]PeerStats, 0, len(s.nodes))
	for node, pc := range s.nodes {
		out = append(out, PeerStats{
			Node: node, Fetches: pc.fetches.Load(), NamedReads: pc.named.Load(), FetchedBlocks: pc.blocks.Load(), FetchedBytes: pc.bytes.Load(), HotFetched: pc.hot.Load(),
			Misses: pc.misses.Load(), Failures: pc.failures.Load(), ChecksumFails: pc.csum.Load(),
			Lookups: pc.lookups.Load(), Pushes: pc.pushes.Load(), PushFailures: pc.pushFails.Load(),
			FetchLatency: time.Duration(pc.latency.Load()),
		})
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// counted is what the router calls other nodes through (each of its
// Remote interfaces): every call goes through it and is counted per node. The fetch calls (Acquire, Pull, Release) are
// counted by fetchBlocks, which knows what became of each block.
type counted struct {
	Peers
	s *peerStats
}

func (c counted) Lookup(ctx context.Context, node, ns string, keys [][]byte) ([]bool, error) {
	pc := c.s.of(node)
	pc.lookups.Add(1)
	res, err := c.Peers.Lookup(ctx, node, ns, keys)
	if err != nil {
		pc.failures.Add(1)
	}
	return res, err
}

func (c counted) Push(ctx context.Context, node, ns string, items []PutItem) ([]error, error) {
	pc := c.s.of(node)
	res, err := c.Peers.Push(ctx, node, ns, items)
	failed := pushFailed(res, err, len(items))
	pc.pushFails.Add(int64(failed))
	pc.pushes.Add(int64(len(items) - failed))
	return res, err
}

// pushFailed counts the items of a Peers.Push answer that the node did not
// store: every item when there is no per-item answer.
func pushFailed(res []error, err error, items int) int {
	if res == nil {
		if err != nil {
			return items
		}
		return 0
	}
	n := 0
	for _, e := range res {
		if e != nil && !errors.Is(e, cache.ErrExists) {
			n++
		}
	}
	return n
}

func (c counted) Delete(ctx context.Context, node, ns string, keys [][]byte) ([]bool, error) {
	res, err := c.Peers.Delete(ctx, node, ns, keys)
	if err != nil {
		c.s.of(node).failures.Add(1)
	}
	return res, err
}

func (c counted) Clear(ctx context.Context, node, ns string) (int64, error) {
	n, err := c.Peers.Clear(ctx, node, ns)
	if err != nil {
		c.s.of(node).failures.Add(1)
	}
	return n, err
}
