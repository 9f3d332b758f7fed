package evict

// NewLRU returns the default policy: least recently used first, with two
// refinements that tidepool needs.
//
// LowPriority entries (copies of blocks owned by another node) live on their
// own list, and every one of them is offered as a victim before any normal
// entry, whatever their recency.
//
// Deeper blocks go first on ties. An engine admits and reads a prefix chain
// as a batch in depth order 0, 1, 2, …; plain LRU would then make the deepest
// block the youngest and evict the chain head first, which is backwards: a
// missing early block makes every later block of the chain useless. So the
// policy treats a run of consecutive Admit/Touch calls with strictly
// increasing depth as one recency class (one logical tick of the tier) and
// orders that class by depth, deepest toward the LRU end. Concretely each
// list remembers the oldest node of the current run (the run is always the
// segment at the MRU end of the list); a promoted node whose depth is greater
// than the previous promoted node's depth is linked just before (older than)
// that run's oldest node and becomes the run's new oldest node; any other
// promotion (depth not greater, or the other priority list was used in
// between) starts a new run at the MRU end. A chain admitted 0..3 thus reads
// LRU→MRU as [… 3 2 1 0] and evicts depth 3 first, while blocks touched in a
// later batch are still younger than everything of an earlier batch.
//
// Every operation is O(1) (a map access and a few pointer moves); Victim is
// O(1) plus the number of entries it passes over. Not safe for concurrent use
// (see Policy).
func NewLRU() Policy {
	l := &lru{nodes: make(map[uint64]*lruNode)}
	l.lists[0].init()
	l.lists[1].init()
	return l
}

// lru implements NewLRU. lists[0] holds LowPriority entries, lists[1] normal
// ones.
type lru struct {
	nodes map[uint64]*lruNode
	lists [2]lruList
	// free recycles nodes so that a steady state of admits and removes does
	// not allocate.
	free *lruNode
}

type lruNode struct {
	prev, next *lruNode
	id         uint64
	depth      int32
	low        bool
}

// lruList is a circular doubly linked list around a sentinel: root.next is
// the LRU end, root.prev the MRU end.
type lruList struct {
	root lruNode
	// runOldest is the oldest node of the current run of promotions with
	// increasing depth (nil when no run is open); runDepth is the depth of
	// the last node promoted in that run.
	runOldest *lruNode
	runDepth  int32
}

func (ls *lruList) init() {
	ls.root.next = &ls.root
	ls.root.prev = &ls.root
}

// insertBefore links n just before at.
func insertBefore(n, at *lruNode) {
	n.next = at
	n.prev = at.prev
	at.prev.next = n
	at.prev = n
}

func (ls *lruList) unlink(n *lruNode) {
	if ls.runOldest == n {
		// The run is the MRU segment; its next-oldest member is n.next
		// unless n was the only member.
		if n.next == &ls.root {
			ls.runOldest = nil
		} else {
			ls.runOldest = n.next
		}
	}
	n.prev.next = n.next
	n.next.prev = n.prev
	n.prev, n.next = nil, nil
}

// promote links an unlinked node as most recently used, applying the
// deeper-first rule inside a run.
func (ls *lruList) promote(n *lruNode) {
	if ls.runOldest != nil && n.depth > ls.runDepth {
		insertBefore(n, ls.runOldest)
	} else {
		insertBefore(n, &ls.root) // MRU end
	}
	ls.runOldest = n
	ls.runDepth = n.depth
}

func (l *lru) list(n *lruNode) *lruList {
	if n.low {
		return &l.lists[0]
	}
	return &l.lists[1]
}

// closeOtherRun ends the open run on the list not used by n, so that a run
// spans only uninterrupted promotions.
func (l *lru) closeOtherRun(n *lruNode) {
	if n.low {
		l.lists[1].runOldest = nil
	} else {
		l.lists[0].runOldest = nil
	}
}

// Admit records a newly stored block as most recently used. Admitting an id
// that is already tracked re-admits it with the new metadata.
func (l *lru) Admit(e Entry) {
	if n, ok := l.nodes[e.ID]; ok {
		l.list(n).unlink(n)
		n.depth, n.low = e.Depth, e.LowPriority
		l.closeOtherRun(n)
		l.list(n).promote(n)
		return
	}
	n := l.free
	if n != nil {
		l.free = n.next
		n.next = nil
	} else {
		n = new(lruNode)
	}
	n.id, n.depth, n.low = e.ID, e.Depth, e.LowPriority
	l.nodes[e.ID] = n
	l.closeOtherRun(n)
	l.list(n).promote(n)
}

// Touch moves a block to the MRU end (subject to the deeper-first rule).
// Unknown ids are ignored.
func (l *lru) Touch(id uint64) {
	n, ok := l.nodes[id]
	if !ok {
		return
	}
	ls := l.list(n)
	ls.unlink(n)
	l.closeOtherRun(n)
	ls.promote(n)
}

// Remove forgets a block. Unknown ids are ignored.
func (l *lru) Remove(id uint64) {
	n, ok := l.nodes[id]
	if !ok {
		return
	}
	delete(l.nodes, id)
	l.list(n).unlink(n)
	*n = lruNode{next: l.free}
	l.free = n
}

// Victim returns the least recently used block not skipped, LowPriority
// entries first.
func (l *lru) Victim(skip func(id uint64) bool) (uint64, bool) {
	for i := range l.lists {
		root := &l.lists[i].root
		for n := root.next; n != root; n = n.next {
			if skip == nil || !skip(n.id) {
				return n.id, true
			}
		}
	}
	return 0, false
}

// Len returns the number of blocks tracked.
func (l *lru) Len() int { return len(l.nodes) }

var _ Policy = (*lru)(nil)
