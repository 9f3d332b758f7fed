package evict

import (
	"container/heap"
	"math"
)

// NewPrefix returns the prefix-cache policy: GreedyDual over access counts
// with an aging clock (LFU with dynamic aging), plus a clock drift paced by
// the observed reuse interval, a history of recently removed blocks, an
// adaptive credit for first-time blocks, and depth-aware ties. It beats
// plain LRU on prefix-reuse traffic at small and medium capacities and ties
// it at large ones; docs/policy.md has the measurements.
//
// Each tracked block has a priority, fixed when it is admitted or read,
//
//	H = L + (f - 1) + b - depthWeight·min(depth, maxDepthTerm)
//
// where f is the number of times the block was admitted or read (counting
// earlier residencies remembered by the history; capped at maxFreq), L is
// the clock at that moment, and b is the credit of a block seen once.
// Victim returns the block with the lowest H.
//
//   - Blocks seen once enter with a small credit and leave soon unless read
//     again: one-off long prompt tails flow through without pushing out
//     reused prefixes (scan resistance).
//   - Each read adds one to H, so shared system prompts and the prefix of a
//     live conversation stay.
//   - The clock L ages what is not read. It jumps to the priority of each
//     evicted block (GreedyDual), and it also drifts by 1/(driftFactor·T)
//     per access, where T is the typical reuse interval in accesses (a
//     moving geometric mean of the ages at which blocks are read again or
//     come back from the history). So one unread reuse interval costs a
//     block about 1/driftFactor of a read. Without the drift a large cache
//     evicts rarely, L barely moves, and blocks that were popular long ago
//     crowd out recent ones (pure LFU); with it a large cache behaves like
//     LRU, and a small one still protects what is read often.
//   - A block removed and admitted again within the history window keeps
//     its count: the second turn of a conversation whose first turn was
//     evicted promotes that prefix at once.
//   - b adapts like ARC's target: when a block that left with f = 1 comes
//     back, first-timers were evicted too early and b grows; when a block
//     that left with f > 1 comes back, b shrinks. Each step is scaled by the
//     ratio of the two kinds of history entries.
//   - Ties, and nearly equal priorities within one request, go to the
//     deeper block first: a chain is useless beyond its first missing block,
//     so its tail should go before its head.
//   - Within a chain that rule is an invariant, whatever the clock does
//     between two blocks' admissions or reads: a block admitted after its
//     parent (named in Entry.Parent; or, when the tier says nothing, the
//     block admitted just before it, if one level shallower and in the
//     same class) is chained to it, and its H never exceeds the parent's
//     (it is capped, and lifted again when the parent's H rises). So Victim
//     never returns a block whose chained child is still tracked, and it
//     passes over the chain above a skipped (pinned) block unless nothing
//     else in that class is left. A link ends when either block leaves.
//     A block whose parent left just before it came (an orphan: no lookup
//     reaches it) gets the lowest priority of its class until it is read,
//     so a chain that pushes itself out of a full tier keeps its head.
//
// LowPriority entries (copies of blocks owned by another node) live in their
// own heap and are all offered as victims before any normal entry; they
// neither enter the history nor move b or T.
//
// Admit, Touch and Remove cost O(log n) amortized (a read may lift the
// chained children capped at the block's old priority); Victim is O(1)
// plus O(k log n) for k skipped blocks (and the chains above them). The
// history holds up to historyFactor × Len() ids (about 60 bytes each with
// the map overhead). Not safe for concurrent use (see Policy).
func NewPrefix() Policy { return newPrefix(defaultPrefixParams) }

const (
	// historyFactor bounds the history of removed blocks to this many
	// times the number of tracked blocks. Measured on the conversation
	// trace: 4 gives about 0.005 less hit rate than 10; 20 no more than 10.
	historyFactor = 10
	// prefixInitialCredit is b at construction.
	prefixInitialCredit = 0.01
	// maxCredit bounds b: a first-timer never outranks a block read twice
	// more than this.
	maxCredit = 2
	// creditStep is the base step of b's adaptation. Measured: 1e-4 is
	// about 0.002 better on the conversation trace, 1e-3 about 0.004
	// worse.
	creditStep = 3e-4
	// depthWeight orders a request's blocks deepest first without letting
	// depth outweigh a read; maxDepthTerm caps the depth that counts.
	depthWeight  = 1e-4
	maxDepthTerm = 1000
	// maxFreq caps f so that a block hot long ago ages out. Measured: 8 is
	// slightly better than 3, 5, 16 or 1024 on both workloads.
	maxFreq = 8
	// driftFactor sets the clock drift: 1/(driftFactor·T) per access.
	// Measured: 2 ties LRU at the largest capacities but gives up 0.005 at
	// 3M tokens; 5 keeps the small-cache gains but loses 0.005 to LRU on
	// the 8-node cluster; no drift loses 0.02 there.
	driftFactor = 3
	// reuseAlpha is the weight of each new sample in T's moving average
	// of log ages; 1e-4 adapts too slowly for a node that sees an eighth
	// of the traffic.
	reuseAlpha = 1e-2
	// initialReuse is T before any sample, in accesses.
	initialReuse = 1 << 14
)

// prefixParams are the tuning knobs of NewPrefix (see the constants); tests
// vary them.
type prefixParams struct {
	historyFactor float64
	initialCredit float64
	maxCredit     float64
	creditStep    float64
	depthWeight   float64
	maxFreq       uint32
	driftFactor   float64 // 0 turns the drift off
	reuseAlpha    float64
}

var defaultPrefixParams = prefixParams{
	historyFactor: historyFactor,
	initialCredit: prefixInitialCredit,
	maxCredit:     maxCredit,
	creditStep:    creditStep,
	depthWeight:   depthWeight,
	maxFreq:       maxFreq,
	driftFactor:   driftFactor,
	reuseAlpha:    reuseAlpha,
}

func newPrefix(pp prefixParams) *prefix {
	return &prefix{
		pp:      pp,
		nodes:   make(map[uint64]*prefixNode),
		hist:    make(map[uint64]prefixHist),
		b:       pp.initialCredit,
		logT:    math.Log(initialReuse),
		driftBy: driftStep(pp, math.Log(initialReuse)),
	}
}

type prefixNode struct {
	id    uint64
	h     float64
	seq   uint64 // admission/read order, for ties
	last  uint64 // access count at the last admission or read
	freq  uint32
	depth int32
	low   bool
	idx   int // position in its heap; -1 once removed
	// parent is the block this one was chained to when it was admitted
	// (see parentCandidate and parentOf).
	parent *prefixNode
	// held is the Victim call (p.victims) that found this block behind a
	// skipped descendant.
	held uint64
	// want is the priority this block would have without its parent's cap,
	// valid while capped; pending lists the chained children capped at
	// this block's priority (inPending: this block is in its parent's).
	want      float64
	capped    bool
	inPending bool
	pending   []*prefixNode
}

// prefixHist is what the history remembers of a removed block: its count,
// when it was last accessed, and the ring slot that holds it (so that a
// stale slot does not erase a newer record of the same id).
type prefixHist struct {
	freq uint32
	slot uint64
	last uint64
}

type prefix struct {
	pp    prefixParams
	nodes map[uint64]*prefixNode
	// heaps[0] holds LowPriority entries, heaps[1] normal ones.
	heaps [2]prefixHeap
	// clock is L, the aging clock.
	clock float64
	// now counts accesses (admissions and reads of normal entries).
	now uint64
	// logT is the moving average of log(reuse age + 1); driftBy is the
	// clock drift per access it implies.
	logT    float64
	driftBy float64
	seq     uint64
	// b is the adaptive credit of a block seen once.
	b float64
	// prev is the block admitted last, the parent candidate of the next
	// admission (see parentCandidate); gone is that block once removed
	// (until the next admission), whose child would be an orphan.
	prev, gone *prefixNode
	// victims counts Victim calls that had to pass over blocks.
	victims uint64

	// hist and ring form the history of removed blocks; ringN counts
	// writes, so slot ringN%len(ring) is the next to overwrite. once counts
	// history entries with freq 1.
	hist  map[uint64]prefixHist
	ring  []uint64
	ringN uint64
	once  int
}

func driftStep(pp prefixParams, logT float64) float64 {
	if pp.driftFactor <= 0 {
		return 0
	}
	return 1 / (pp.driftFactor * math.Exp(logT))
}

func (p *prefix) heapOf(n *prefixNode) *prefixHeap {
	if n.low {
		return &p.heaps[0]
	}
	return &p.heaps[1]
}

// priority computes H for n at the current clock and credit.
func (p *prefix) priority(n *prefixNode) float64 {
	d := float64(min(n.depth, maxDepthTerm))
	return p.clock + float64(n.freq-1) + p.b - p.pp.depthWeight*d
}

// access advances time by one access of a normal entry.
func (p *prefix) access() {
	p.now++
	p.clock += p.driftBy
	if p.clock > rebaseAt {
		p.rebase()
	}
}

// rebaseAt bounds the clock so that the depth term (1e-4 per level) stays
// well above float64 resolution (2^-52 relative: about 1e-7 at 1e9).
const rebaseAt = 1e9

// rebase subtracts the clock from every priority. A uniform shift keeps
// both heaps ordered. O(n), about once per 10^9 units of aging.
func (p *prefix) rebase() {
	c := p.clock
	for i := range p.heaps {
		for _, n := range p.heaps[i] {
			n.h -= c
			n.want -= c
		}
	}
	p.clock = 0
}

// observe feeds one reuse age (accesses since the block's last access).
func (p *prefix) observe(age uint64) {
	p.logT += p.pp.reuseAlpha * (math.Log(float64(age)+1) - p.logT)
	p.driftBy = driftStep(p.pp, p.logT)
}

// Admit records a newly stored block. An id already tracked counts as a
// read and takes the new metadata.
func (p *prefix) Admit(e Entry) {
	depth := max(e.Depth, 0)
	if n, ok := p.nodes[e.ID]; ok {
		h := p.heapOf(n)
		n.depth = depth
		p.prev = n
		if n.low != e.LowPriority {
			heap.Remove(h, n.idx)
			n.low = e.LowPriority
			p.bump(n)
			heap.Push(p.heapOf(n), n)
		} else {
			p.bump(n)
			heap.Fix(h, n.idx)
		}
		p.lift(n)
		return
	}
	n := &prefixNode{id: e.ID, depth: depth, low: e.LowPriority, freq: 1}
	if !n.low {
		if h, ok := p.hist[e.ID]; ok {
			p.observe(p.now - h.last)
			p.forget(e.ID, h)
			p.adapt(h.freq)
			n.freq = min(h.freq+1, p.pp.maxFreq)
		}
		p.access()
	}
	n.last = p.now
	p.seq++
	n.seq = p.seq
	q, orphan := p.parentCandidate(e, n)
	n.h = math.Inf(-1)
	if linkable(q, n) {
		n.parent = q
	}
	if !orphan {
		p.raise(n, p.priority(n))
	}
	p.prev, p.gone = n, nil
	p.nodes[e.ID] = n
	heap.Push(p.heapOf(n), n)
}

// parentCandidate returns the block new entry e (node n) may be chained
// to: the parent the tier names (Entry.ParentKind), none when the tier
// says there is none, or else the block admitted just before it. Tiers
// store a chain's missing blocks in depth order (a BatchPut, or the
// engine's puts of one request), so without a name the previous admission
// is that chain's previous block; Touch, Remove and Victim calls in
// between do not matter. The guess is wrong when another chain's block one
// level up was admitted just before (two clients' puts interleaved, or a
// new request right after an unrelated one): the block then ranks below
// that one, which costs a little hit rate (docs/policy.md) and never
// breaks the rule for the chains it gets right.
//
// orphan reports a block whose parent left just before it came: the named
// parent is not tracked, or the block admitted just before it (one level
// up, same class) was removed since, as when a tier evicts a chain's last
// block to make room for the next. Nothing can reach an orphan through a
// prefix lookup, so it gets the lowest priority (until it is read) and
// goes before every other block of its class; the chain's head stays.
func (p *prefix) parentCandidate(e Entry, n *prefixNode) (q *prefixNode, orphan bool) {
	switch e.ParentKind {
	case ParentKnown:
		q = p.nodes[e.Parent]
		return q, q == nil && n.depth > 0
	case ParentNone:
		return nil, false
	}
	if g := p.gone; p.prev == nil && g != nil {
		return nil, g.low == n.low && g.depth == n.depth-1
	}
	return p.prev, false
}

// linkable reports whether new block n may be chained to q: q is tracked,
// in n's class (LowPriority copies go first whatever their chain), and one
// level shallower.
func linkable(q, n *prefixNode) bool {
	return q != nil && q.idx >= 0 && q.low == n.low && q.depth == n.depth-1
}

// parentOf returns n's chain parent while the link holds: both tracked, in
// one class, one level apart. A removed parent (even one admitted again
// since) ends the link for good; so does a parent that changed class or
// depth, once n is next read.
func parentOf(n *prefixNode) *prefixNode {
	if q := n.parent; q != nil && q.idx >= 0 && q.low == n.low && q.depth == n.depth-1 {
		return q
	}
	return nil
}

// raise sets n's priority to target, or to its chain parent's when that is
// lower, and never lowers it (b may have shrunk since the last read). A
// capped block waits in its parent's pending list and gets the rest when
// the parent goes up (lift): a tier may hand over a chain's reads in any
// order, and a child read just before its parent must not be left at the
// parent's old priority. The caller fixes n's heap position.
func (p *prefix) raise(n *prefixNode, target float64) {
	q := parentOf(n)
	if q == nil {
		n.parent = nil
		n.h = max(n.h, target)
		n.capped = false
		return
	}
	if target <= q.h {
		n.h = max(n.h, target)
		n.capped = false
		return
	}
	n.h = max(n.h, q.h)
	n.want, n.capped = target, true
	if !n.inPending {
		n.inPending = true
		q.pending = append(q.pending, n)
	}
}

// lift raises the chained children capped at n's priority after it went
// up, and theirs in turn. Each child re-enters a pending list only while
// still capped, so a read costs O(log n) amortized.
func (p *prefix) lift(n *prefixNode) {
	if len(n.pending) == 0 {
		return
	}
	kids := n.pending
	n.pending = nil
	for _, k := range kids {
		k.inPending = false
		if k.idx < 0 || !k.capped || parentOf(k) != n {
			continue
		}
		old := k.h
		p.raise(k, k.want)
		if k.h > old {
			heap.Fix(p.heapOf(k), k.idx)
			p.lift(k)
		}
	}
}

// bump counts one more access of n and recomputes its priority.
func (p *prefix) bump(n *prefixNode) {
	if !n.low {
		p.observe(p.now - n.last)
		p.access()
	}
	n.last = p.now
	if n.freq < p.pp.maxFreq {
		n.freq++
	}
	p.seq++
	n.seq = p.seq
	p.raise(n, p.priority(n))
}

// adapt moves b after a block that left with count f came back.
func (p *prefix) adapt(f uint32) {
	once := float64(p.once) + 1
	more := float64(len(p.hist)-p.once) + 1
	if f <= 1 {
		p.b = min(p.b+p.pp.creditStep*max(1, more/once), p.pp.maxCredit)
	} else {
		p.b = max(p.b-p.pp.creditStep*max(1, once/more), 0)
	}
}

// Touch records a read. Unknown ids are ignored.
func (p *prefix) Touch(id uint64) {
	n, ok := p.nodes[id]
	if !ok {
		return
	}
	p.bump(n)
	heap.Fix(p.heapOf(n), n.idx)
	p.lift(n)
}

// Remove forgets a block and remembers its count in the history. Removing
// the current lowest-priority normal block (an eviction) advances the clock
// to its priority. Unknown ids are ignored.
func (p *prefix) Remove(id uint64) {
	n, ok := p.nodes[id]
	if !ok {
		return
	}
	h := p.heapOf(n)
	if n.idx == 0 && !n.low && n.h > p.clock {
		p.clock = n.h
		if p.clock > rebaseAt {
			p.rebase()
		}
	}
	heap.Remove(h, n.idx)
	delete(p.nodes, id)
	n.parent, n.pending = nil, nil
	if p.prev == n {
		p.prev, p.gone = nil, n
	}
	if !n.low {
		p.remember(id, n)
	}
}

// remember adds a removed block to the history, overwriting the oldest
// record once the history holds historyFactor × (Len()+1) ids.
func (p *prefix) remember(id uint64, n *prefixNode) {
	if old, ok := p.hist[id]; ok {
		p.forget(id, old)
	}
	limit := max(int(p.pp.historyFactor*float64(len(p.nodes)+1)), 1)
	var slot uint64
	if len(p.ring) < limit {
		slot = uint64(len(p.ring))
		p.ring = append(p.ring, id)
	} else {
		slot = p.ringN % uint64(len(p.ring))
		old := p.ring[slot]
		if h, ok := p.hist[old]; ok && h.slot == slot {
			p.forget(old, h)
		}
		p.ring[slot] = id
	}
	p.ringN++
	p.hist[id] = prefixHist{freq: n.freq, slot: slot, last: n.last}
	if n.freq <= 1 {
		p.once++
	}
}

func (p *prefix) forget(id uint64, h prefixHist) {
	delete(p.hist, id)
	if h.freq <= 1 {
		p.once--
	}
}

// Victim returns the tracked block with the lowest priority that skip does
// not reject, LowPriority entries first.
func (p *prefix) Victim(skip func(id uint64) bool) (uint64, bool) {
	for i := range p.heaps {
		h := &p.heaps[i]
		if h.Len() == 0 {
			continue
		}
		if skip == nil || !skip((*h)[0].id) {
			return (*h)[0].id, true
		}
		// Pop skipped blocks until one is found, then put them back. A
		// chain's blocks come off the heap tail first, so a skipped
		// block's parent is still to come: it is passed over too (held),
		// and so on up the chain, unless nothing else in this class is
		// left to evict.
		p.victims++
		mark := p.victims
		var held []*prefixNode
		var fallback *prefixNode
		id, found := uint64(0), false
		for h.Len() > 0 {
			n := heap.Pop(h).(*prefixNode)
			held = append(held, n)
			if !skip(n.id) {
				if n.held != mark {
					id, found = n.id, true
					break
				}
				if fallback == nil {
					fallback = n
				}
			}
			if q := parentOf(n); q != nil {
				q.held = mark
			}
		}
		if !found && fallback != nil {
			id, found = fallback.id, true
		}
		for _, n := range held {
			heap.Push(h, n)
		}
		if found {
			return id, true
		}
	}
	return 0, false
}

// Len returns the number of blocks tracked.
func (p *prefix) Len() int { return len(p.nodes) }

// prefixHeap is a min-heap on priority; ties go to the deeper block, then
// to the older access.
type prefixHeap []*prefixNode

func (h prefixHeap) Len() int { return len(h) }
func (h prefixHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.h != b.h {
		return a.h < b.h
	}
	if a.depth != b.depth {
		return a.depth > b.depth
	}
	return a.seq < b.seq
}
func (h prefixHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx = i
	h[j].idx = j
}
func (h *prefixHeap) Push(x any) {
	n := x.(*prefixNode)
	n.idx = len(*h)
	*h = append(*h, n)
}
func (h *prefixHeap) Pop() any {
	old := *h
	n := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	n.idx = -1
	return n
}

var _ Policy = (*prefix)(nil)
