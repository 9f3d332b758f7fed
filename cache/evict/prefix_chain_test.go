package evict

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// chainModel is the test's own account of what NewPrefix may know about
// chains: which blocks are tracked, the true parent of every block (the
// test builds the chains), and the chain links the policy's rule yields: a
// new block is chained to the parent the tier names or, when it names none,
// to the block admitted just before it, if that one is still tracked, in
// the same class and one level shallower.
type chainModel struct {
	p        *prefix
	parent   map[uint64]uint64 // true parent; 0 for a chain's first block
	depth    map[uint64]int32
	resident map[uint64]bool            // tracked id -> LowPriority
	link     map[uint64]uint64          // child -> parent, as the policy should see it
	kids     map[uint64]map[uint64]bool // parent -> linked children
	last     uint64                     // last id admitted (0: none, or removed since)
	pinned   map[uint64]bool            // what Victim's skip rejects
	pending  []uint64                   // reads not yet handed to the policy (a tier batches them)
	trueLink int                        // links the policy made along true parents
	named    bool                       // the tier names parents (Entry.ParentKind)
}

func (m *chainModel) skip(id uint64) bool { return m.pinned[id] }

// tracked returns the tracked ids in order, so that a seed replays exactly.
func (m *chainModel) tracked() []uint64 {
	ids := make([]uint64, 0, len(m.resident))
	for id := range m.resident {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// active reports whether c's link to its parent holds.
func (m *chainModel) active(c uint64) (uint64, bool) {
	q, ok := m.link[c]
	if !ok {
		return 0, false
	}
	low, tracked := m.resident[q]
	if !tracked || low != m.resident[c] {
		return 0, false
	}
	return q, true
}

func (m *chainModel) unlink(c uint64) {
	if q, ok := m.link[c]; ok {
		delete(m.kids[q], c)
		delete(m.link, c)
	}
}

func (m *chainModel) admit(id uint64, low bool) {
	if _, ok := m.resident[id]; ok {
		m.readLink(id, low)
		m.resident[id] = low
		m.p.Admit(Entry{ID: id, Size: 1, Depth: m.depth[id], LowPriority: low})
		m.last = id
		return
	}
	e := Entry{ID: id, Size: 1, Depth: m.depth[id], LowPriority: low}
	cand := m.last
	if m.named {
		e.ParentKind, cand = ParentNone, 0
		if m.depth[id] > 0 {
			e.Parent, e.ParentKind = m.parent[id], ParentKnown
			cand = m.parent[id]
		}
	}
	m.p.Admit(e)
	if lowQ, ok := m.resident[cand]; ok && cand != 0 && lowQ == low && m.depth[cand] == m.depth[id]-1 {
		m.link[id] = cand
		if m.kids[cand] == nil {
			m.kids[cand] = map[uint64]bool{}
		}
		m.kids[cand][id] = true
		if m.parent[id] == cand {
			m.trueLink++
		}
	}
	m.resident[id] = low
	m.last = id
}

// readLink drops id's link when it is read (or admitted again) while the
// link does not hold: the policy forgets it then.
func (m *chainModel) readLink(id uint64, low bool) {
	q, ok := m.link[id]
	if !ok {
		return
	}
	lowQ, tracked := m.resident[q]
	if !tracked || lowQ != low {
		m.unlink(id)
	}
}

func (m *chainModel) touch(id uint64) {
	if low, ok := m.resident[id]; ok {
		m.readLink(id, low)
	}
	m.p.Touch(id)
}

func (m *chainModel) remove(id uint64) {
	m.p.Remove(id)
	if _, ok := m.resident[id]; !ok {
		return
	}
	delete(m.resident, id)
	delete(m.pinned, id)
	m.unlink(id)
	for c := range m.kids[id] {
		delete(m.link, c) // a removed parent ends the link for good
	}
	delete(m.kids, id)
	if m.last == id {
		m.last = 0
	}
}

// blocked reports whether id has a linked descendant, through tracked
// blocks, that is pinned: evicting id would strand it.
func (m *chainModel) blocked(id uint64) bool {
	for c := range m.kids[id] {
		if _, ok := m.active(c); !ok {
			continue
		}
		if m.skip(c) || m.blocked(c) {
			return true
		}
	}
	return false
}

// checkVictim asks for a victim and checks it against the model: tracked,
// not pinned, low priority first, and never a block with a linked child
// still tracked, unless every candidate of its class is in that case
// because of pins.
func (m *chainModel) checkVictim() (uint64, bool, error) {
	v, ok := m.p.Victim(m.skip)
	anyLow, any := false, false
	for id, low := range m.resident {
		if !m.skip(id) {
			any = true
			anyLow = anyLow || low
		}
	}
	if ok != any {
		return 0, false, fmt.Errorf("Victim ok=%v, model has evictable=%v", ok, any)
	}
	if !ok {
		return 0, false, nil
	}
	low, tracked := m.resident[v]
	if !tracked || m.skip(v) {
		return 0, false, fmt.Errorf("Victim = %d (tracked %v, pinned %v)", v, tracked, m.skip(v))
	}
	if anyLow && !low {
		return 0, false, fmt.Errorf("Victim = %d, owned, while a low-priority block is evictable", v)
	}
	for c := range m.kids[v] {
		if _, ok := m.active(c); ok && !m.skip(c) && !m.blocked(c) {
			return 0, false, fmt.Errorf("Victim = %d (depth %d) while its chained child %d (depth %d) is tracked and evictable", v, m.depth[v], c, m.depth[c])
		}
	}
	if m.blocked(v) {
		for id, l := range m.resident {
			if l == low && !m.skip(id) && !m.blocked(id) {
				return 0, false, fmt.Errorf("Victim = %d, parent of a pinned chain, while %d is free to go", v, id)
			}
		}
	}
	return v, true, nil
}

// checkOrder checks that every chained child ranks below its parent.
func (m *chainModel) checkOrder() error {
	for c := range m.link {
		q, ok := m.active(c)
		if !ok {
			continue
		}
		a, b := m.p.nodes[c], m.p.nodes[q]
		if a == nil || b == nil {
			return fmt.Errorf("link %d -> %d: not tracked by the policy", c, q)
		}
		h := prefixHeap{a, b}
		if !h.Less(0, 1) {
			return fmt.Errorf("chained child %d (depth %d, H %.6f) does not rank below its parent %d (depth %d, H %.6f)", c, a.depth, a.h, q, b.depth, b.h)
		}
	}
	if len(m.resident) != m.p.Len() {
		return fmt.Errorf("Len = %d, model %d", m.p.Len(), len(m.resident))
	}
	return nil
}

// TestPrefixChainInvariant is the property behind "the tail goes before the
// head": with random requests (shared prefixes, touches handed over late as
// a tier batches them, capacity enforced before or after each admission),
// deletes, re-admissions that change class, pins and victim probes, after
// every step a chained block ranks below its parent, and Victim never
// returns a block whose chained child is still tracked (unless pins leave
// nothing else in its class). Chains are what the policy can see: a block
// admitted right after its parent.
func TestPrefixChainInvariant(t *testing.T) {
	seeds, steps := 200, 1000
	if testing.Short() {
		seeds = 40
	}
	trueLinks := 0
	for seed := range uint64(seeds) {
		rng := rand.New(rand.NewPCG(seed, 12))
		m := &chainModel{
			p: newPrefix(defaultPrefixParams), parent: map[uint64]uint64{}, depth: map[uint64]int32{},
			resident: map[uint64]bool{}, link: map[uint64]uint64{}, kids: map[uint64]map[uint64]bool{},
			pinned: map[uint64]bool{}, named: seed%3 == 0,
		}
		capacity := 4 + rng.IntN(60)
		reserveFirst := seed%2 == 0 // like the DRAM tier: room first, then Admit
		var paths [][]uint64
		next := uint64(1)
		fail := func(step int, err error) {
			t.Helper()
			t.Fatalf("seed %d (capacity %d, reserve first %v, parents named %v), step %d: %v", seed, capacity, reserveFirst, m.named, step, err)
		}
		makeRoom := func(step, limit int) {
			for m.p.Len() > limit {
				v, ok, err := m.checkVictim()
				if err != nil {
					fail(step, err)
				}
				if !ok {
					return
				}
				m.remove(v)
			}
		}
		for step := range steps {
			switch r := rng.IntN(100); {
			case r < 45: // a request: touch what is present, admit what is missing, in order
				var path []uint64
				if len(paths) > 0 && rng.IntN(4) != 0 {
					old := paths[rng.IntN(len(paths))]
					path = append(path, old[:1+rng.IntN(len(old))]...)
				}
				for range 1 + rng.IntN(8) {
					id := next
					next++
					if len(path) > 0 {
						m.parent[id] = path[len(path)-1]
					}
					m.depth[id] = int32(len(path))
					path = append(path, id)
				}
				paths = append(paths, path)
				low := rng.IntN(4) == 0
				for _, id := range path {
					if _, ok := m.resident[id]; ok {
						if rng.IntN(3) == 0 {
							m.pending = append(m.pending, id)
						} else {
							m.touch(id)
						}
						continue
					}
					l := low
					if rng.IntN(10) == 0 {
						l = !l
					}
					if reserveFirst {
						makeRoom(step, capacity-1)
					}
					m.admit(id, l)
					if !reserveFirst {
						makeRoom(step, capacity)
					}
				}
			case r < 55: // the tier hands over batched reads
				for _, id := range m.pending {
					m.touch(id)
				}
				m.pending = m.pending[:0]
			case r < 62: // a delete
				if ids := m.tracked(); len(ids) > 0 {
					m.remove(ids[rng.IntN(len(ids))])
				}
			case r < 70: // a put of a present block, sometimes changing class
				if ids := m.tracked(); len(ids) > 0 {
					id := ids[rng.IntN(len(ids))]
					m.admit(id, m.resident[id] != (rng.IntN(3) == 0))
				}
			case r < 82: // pins change
				clear(m.pinned)
				if ids := m.tracked(); len(ids) > 0 {
					for range rng.IntN(4) {
						m.pinned[ids[rng.IntN(len(ids))]] = true
					}
				}
			default:
				if _, _, err := m.checkVictim(); err != nil {
					fail(step, err)
				}
			}
			if err := m.checkOrder(); err != nil {
				fail(step, err)
			}
		}
		trueLinks += m.trueLink
	}
	if trueLinks < seeds*100 {
		t.Fatalf("only %d links along true chains over %d seeds: the test does not exercise chains", trueLinks, seeds)
	}
	t.Logf("%d seeds, %d links along true chains", seeds, trueLinks)
}

// TestPrefixFreshChainKeepsHead is the reported case: once reads have
// taught the policy a short reuse interval (so that its clock drifts by
// more than the depth term per access), a chain stored in depth order and
// then pushed half out by the next one used to lose its head and keep its
// tail (Lookup 0, half the chain's space wasted). Now the tail goes.
func TestPrefixFreshChainKeepsHead(t *testing.T) {
	for _, reserveFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("reserve first %v", reserveFirst), func(t *testing.T) {
			const capacity, chain = 60, 40
			p := newPrefix(defaultPrefixParams)
			fit := func() {
				limit := capacity
				if reserveFirst {
					limit--
				}
				for p.Len() > limit {
					v, _ := p.Victim(nil)
					p.Remove(v)
				}
			}
			for id := range uint64(4) { // a hot system prompt, read back often
				p.Admit(Entry{ID: id + 1, Depth: int32(id)})
			}
			for range 100 {
				for id := range uint64(4) {
					p.Touch(id + 1)
				}
			}
			if step, depth := p.driftBy, p.pp.depthWeight; step <= depth {
				t.Fatalf("clock drift %g per access is not above the depth term %g: the case is not set up", step, depth)
			}
			for c := uint64(1); c <= 2; c++ {
				for d := range uint64(chain) {
					if reserveFirst {
						fit()
					}
					p.Admit(Entry{ID: c*1000 + d, Depth: int32(d)})
					if !reserveFirst {
						fit()
					}
				}
			}
			for id := range uint64(4) {
				if _, ok := p.nodes[id+1]; !ok {
					t.Errorf("system prompt block %d, read 100 times, was evicted for blocks seen once", id)
				}
			}
			for c := uint64(1); c <= 2; c++ {
				res := make([]byte, chain)
				for d := range uint64(chain) {
					res[d] = '.'
					if _, ok := p.nodes[c*1000+d]; ok {
						res[d] = '#'
					}
				}
				head := len(res) - len(strings.TrimLeft(string(res), "#"))
				if strings.Contains(string(res[head:]), "#") || (c == 1 && head == 0) {
					t.Errorf("chain %d: resident blocks by depth %s: want a non-empty prefix", c, res)
				}
			}
		})
	}
}

// TestPrefixChainReadOutOfOrder: a tier may hand a chain's reads to the
// policy in any order (the DRAM tier batches them by index shard). A child
// read before its parent is capped at the parent's old priority, and must
// get what its read earned once the parent's read arrives; otherwise a
// chain read back deepest first would rank as if never read and leave
// before blocks seen once.
func TestPrefixChainReadOutOfOrder(t *testing.T) {
	for _, order := range []string{"head first", "deepest first"} {
		t.Run(order, func(t *testing.T) {
			p := newPrefix(defaultPrefixParams)
			for id := range uint64(4) {
				p.Admit(Entry{ID: id + 1, Depth: int32(id)})
			}
			for i := range uint64(4) {
				id := i + 1
				if order == "deepest first" {
					id = 4 - i
				}
				p.Touch(id)
			}
			var evicted []uint64
			for id := uint64(100); id < 110; id++ { // blocks seen once
				p.Admit(Entry{ID: id})
				for p.Len() > 10 {
					v, _ := p.Victim(nil)
					p.Remove(v)
					evicted = append(evicted, v)
				}
			}
			for _, v := range evicted {
				if v < 100 {
					t.Fatalf("evicted %v: the chain read once went before blocks seen once", evicted)
				}
			}
		})
	}
}

// TestPrefixChainSelfEviction: a chain stored into a tier whose other
// blocks all outrank it pushes itself out. A tier that makes room before
// each admission must then evict the chain's own last block for the next
// one; that next block is an orphan (nothing reaches it through a lookup)
// and goes first, so the chain keeps its head run, plus at most the last
// block stored, instead of a growing run of orphans behind a shrinking
// head.
func TestPrefixChainSelfEviction(t *testing.T) {
	for _, named := range []bool{false, true} {
		t.Run(fmt.Sprintf("parents named %v", named), func(t *testing.T) {
			const capacity, hot, chain = 60, 50, 30
			p := newPrefix(defaultPrefixParams)
			for id := range uint64(hot) { // read twice each: they outrank blocks seen once
				p.Admit(Entry{ID: id + 1})
				p.Touch(id + 1)
				p.Touch(id + 1)
			}
			for d := range uint64(chain) {
				for p.Len() >= capacity {
					v, _ := p.Victim(nil)
					if v <= hot {
						t.Fatalf("block %d of the chain evicted hot block %d", d, v)
					}
					p.Remove(v)
				}
				e := Entry{ID: 1000 + d, Depth: int32(d)}
				if named && d > 0 {
					e.Parent, e.ParentKind = 1000+d-1, ParentKnown
				}
				p.Admit(e)
			}
			res := make([]byte, chain)
			for d := range uint64(chain) {
				res[d] = '.'
				if _, ok := p.nodes[1000+d]; ok {
					res[d] = '#'
				}
			}
			head := len(res) - len(strings.TrimLeft(string(res), "#"))
			if head == 0 || strings.Count(string(res[head:]), "#") > 1 {
				t.Errorf("chain residency by depth %s: want its head run and at most the last block stored", res)
			}
			t.Logf("chain residency by depth %s", res)
		})
	}
}
