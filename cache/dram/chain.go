package dram

import (
	"fmt"

	"github.com/tidepool-kv/tidepool/cache"
)

// The chain rule: a put never pushes out its own chain.
//
// Tiers store a chain's missing blocks in depth order (a BatchPut's items,
// an engine's puts of one request, a chain promoted from SSD), and both
// policies evict a chain tail first. So when a chain is larger than the
// room the tier may take for it, the block that needs room finds as the
// next victim the block stored just before it, its own parent; evicting
// it would leave the new block an orphan that no prefix lookup reaches,
// and the next block of the chain would push that one out in turn: the
// chain would eat its own middle and keep its head plus one useless tail
// block. Instead the tier refuses the block (cache.ErrNoSpace), and then
// every deeper block of that chain, so that the chain keeps a contiguous
// head and nothing else the policy ranks above it is evicted for it.
//
// The tier is not told a block's parent (keys are opaque hashes), so it
// recognizes a chain as the policies do: a block continues the chain of
// the block admitted just before it when it is in the same namespace and
// class (LowPriority or not) and exactly one level deeper.

// chainPos is where a block being stored sits: namespace, depth and
// class. A nil *chainPos (a slot reserved ahead, whose key and depth come
// later; EvictTo) takes no part in the rule.
type chainPos struct {
	ns    uint32
	depth int32
	low   bool
}

func posOf(nss *nsState, depth int32, low bool) *chainPos {
	return &chainPos{ns: nss.id, depth: depth, low: low}
}

// chainMark is a block the rule remembers: the last one admitted (tail)
// or the last one refused (refused). ok is false when there is none.
type chainMark struct {
	id  uint64
	pos chainPos
	ok  bool
	err error // refused: why, answered again to a retry
}

// continues reports whether a block at p is the next block of the chain
// whose last block is m.
func (m chainMark) continues(p *chainPos) bool {
	return m.ok && p != nil && m.pos.ns == p.ns && m.pos.low == p.low && m.pos.depth == p.depth-1
}

// errChainTail and errChainRefused are the rule's refusals.
func errChainTail(p *chainPos) error {
	return fmt.Errorf("%w: storing the block of depth %d would evict the block stored just before it, its chain's last block (depth %d): the chain is larger than the room, its head is kept", cache.ErrNoSpace, p.depth, p.depth-1)
}

func errChainRefused(p *chainPos) error {
	return fmt.Errorf("%w: the block of depth %d follows a block of its chain (depth %d) refused for room: the chain keeps its head", cache.ErrNoSpace, p.depth, p.depth-1)
}

// admitLocked hands b, just linked, to the policy and makes it the chain
// tail the next put may continue. Called under pmu.
func (t *Tier) admitLocked(b *block) {
	t.policy.Admit(b.entry())
	t.byID[b.id] = b
	t.tail = chainMark{id: b.id, pos: chainPos{ns: b.ns.id, depth: b.depth, low: b.low}, ok: true}
	t.refused = chainMark{}
}

// at reports whether a block at p is at m's place: a retry of the block
// m marks (the put socket tries a reservation, then a whole put).
func (m chainMark) at(p *chainPos) bool {
	return m.ok && p != nil && m.pos == *p
}

// refusedChain reports whether a block at p continues a chain whose last
// block the rule refused, or is that block again; it is then refused too
// (and becomes the mark).
func (t *Tier) refusedChain(p *chainPos) error {
	if p == nil {
		return nil
	}
	t.pmu.Lock()
	defer t.pmu.Unlock()
	switch {
	case t.refused.at(p):
		return t.refused.err
	case t.refused.continues(p):
		t.refused = chainMark{pos: *p, ok: true, err: errChainRefused(p)}
		return t.refused.err
	}
	return nil
}

// refuseTailLocked reports whether making room for a block at p would
// evict victim, the block admitted just before it one level up: then p is
// refused and remembered, so that the rest of its chain is refused too.
// Called under pmu.
func (t *Tier) refuseTailLocked(p *chainPos, victim uint64) error {
	if p == nil || t.tail.id != victim || !t.tail.continues(p) {
		return nil
	}
	t.refused = chainMark{pos: *p, ok: true, err: errChainTail(p)}
	return t.refused.err
}
