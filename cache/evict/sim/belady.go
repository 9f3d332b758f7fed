package sim

import (
	"container/heap"
	"math"

	"github.com/tidepool-kv/tidepool/cache/evict"
	"github.com/tidepool-kv/tidepool/internal/trace"
)

// Belady returns the result of the offline optimum under cfg: on every
// eviction each node drops the block whose next access at that node is
// farthest in the future (never = infinitely far; ties go to the block
// accessed deeper in its next request, since the event order within a
// request follows depth). It is optimal for hit counts of single blocks and
// a reference, not a strict bound, for prefix hits.
func Belady(reqs []trace.Request, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	next := nextUses(reqs, cfg)
	nodes := make([]*node, cfg.Nodes)
	for i := range nodes {
		b := newBelady()
		nodes[i] = &node{pol: b, present: make(map[uint64]struct{}), oracle: b}
	}
	return run(reqs, cfg, nodes, next)
}

// nextUses returns, for every access event of run (one per request block
// and target cache, in replay order), the event index of the next access to
// the same block at the same cache, or math.MaxInt64 when there is none.
// The set of events does not depend on the policy: every block of every
// request is touched or admitted at each of its targets.
func nextUses(reqs []trace.Request, cfg Config) []int64 {
	type key struct {
		node int
		id   uint64
	}
	var evs []key
	var tg []target
	for i, r := range reqs {
		at := i % cfg.Nodes
		for _, id := range r.HashIDs {
			tg = targets(cfg, at, id, tg)
			for _, t := range tg {
				evs = append(evs, key{node: t.node, id: id})
			}
		}
	}
	next := make([]int64, len(evs))
	last := make(map[key]int64, len(evs)/2)
	for e := len(evs) - 1; e >= 0; e-- {
		if n, ok := last[evs[e]]; ok {
			next[e] = n
		} else {
			next[e] = math.MaxInt64
		}
		last[evs[e]] = int64(e)
	}
	return next
}

// belady is the offline policy: a max-heap on next use. The simulator calls
// setNext before each Touch or Admit with that access's next use.
type belady struct {
	pending int64
	h       bheap
	idx     map[uint64]int // id -> position in h
}

func newBelady() *belady { return &belady{idx: make(map[uint64]int)} }

func (b *belady) setNext(n int64) { b.pending = n }

type bitem struct {
	id   uint64
	next int64
}

// bheap is a max-heap on next that keeps belady.idx current.
type bheap struct {
	items []bitem
	idx   map[uint64]int
}

func (h *bheap) Len() int           { return len(h.items) }
func (h *bheap) Less(i, j int) bool { return h.items[i].next > h.items[j].next }
func (h *bheap) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.idx[h.items[i].id] = i
	h.idx[h.items[j].id] = j
}
func (h *bheap) Push(x any) {
	it := x.(bitem)
	h.idx[it.id] = len(h.items)
	h.items = append(h.items, it)
}
func (h *bheap) Pop() any {
	it := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	delete(h.idx, it.id)
	return it
}

func (b *belady) Admit(e evict.Entry) {
	b.h.idx = b.idx
	if i, ok := b.idx[e.ID]; ok {
		b.h.items[i].next = b.pending
		heap.Fix(&b.h, i)
		return
	}
	heap.Push(&b.h, bitem{id: e.ID, next: b.pending})
}

func (b *belady) Touch(id uint64) {
	b.h.idx = b.idx
	if i, ok := b.idx[id]; ok {
		b.h.items[i].next = b.pending
		heap.Fix(&b.h, i)
	}
}

func (b *belady) Remove(id uint64) {
	b.h.idx = b.idx
	if i, ok := b.idx[id]; ok {
		heap.Remove(&b.h, i)
	}
}

// Victim returns the block used farthest in the future. The simulator never
// skips; a skipped top falls back to a linear scan.
func (b *belady) Victim(skip func(uint64) bool) (uint64, bool) {
	if len(b.h.items) == 0 {
		return 0, false
	}
	if !skip(b.h.items[0].id) {
		return b.h.items[0].id, true
	}
	best, found := bitem{next: -1}, false
	for _, it := range b.h.items {
		if !skip(it.id) && it.next > best.next {
			best, found = it, true
		}
	}
	return best.id, found
}

func (b *belady) Len() int { return len(b.h.items) }

var _ evict.Policy = (*belady)(nil)
