package dram

import (
	"errors"
	"fmt"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/evict"
)

// The chain rule: a put never pushes out its own chain, while evictions
// lose blocks (no tier below takes them: Config.KeepsEvicted).
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
// A put that names its parent (PutOptions.Parent: a BatchPut's previous
// item) is refused when the parent is not in the tier (refused, evicted,
// or never stored: the block would be an orphan) or is the victim that
// would make room for it. Other puts (the put socket's, zero-copy
// reservations, promotions) do not name one, so the tier recognizes a
// chain as the policies do: a block continues the chain of the block
// admitted just before it when it is in the same namespace and class
// (LowPriority or not) and exactly one level deeper; once a block is
// refused, the blocks that continue it are refused too until the tier
// admits another block. That guess fails when another client's block is
// admitted between two blocks of a chain: then the chain may still push
// out its tail (the policy ranks the orphan lowest, as before).
//
// A refused block is still shown to the policy, as if admitted and
// evicted at once: its count enters the history, so when the chain comes
// again it comes with a count that can win it the room. Without that a
// chain's tail, refused as a first-timer, would be refused as a
// first-timer every time.

// chainPos is where a block sits in the rule's eyes: namespace, depth
// and class.
type chainPos struct {
	ns    uint32
	depth int32
	low   bool
}

// chainBlock is a block being stored, as the rule sees it. A nil
// *chainBlock (a slot reserved ahead, whose key and depth come later;
// EvictTo) takes no part in the rule.
type chainBlock struct {
	pos    chainPos
	key    []byte
	parent []byte // PutOptions.Parent; nil: unknown
	foot   int64
}

func blockAt(nss *nsState, key []byte, foot int64, opts cache.PutOptions) *chainBlock {
	b := &chainBlock{pos: chainPos{ns: nss.id, depth: opts.Depth, low: opts.LowPriority}, key: key, foot: foot}
	if opts.Depth > 0 && len(opts.Parent) > 0 {
		b.parent = opts.Parent
	}
	return b
}

// chainMark is a block the rule remembers: the last one admitted (tail)
// or the last one refused (refused). ok is false when there is none.
type chainMark struct {
	id  uint64
	pos chainPos
	ok  bool
	// key and err (refused only): the block, and why, answered again to
	// a retry of it.
	key string
	err error
}

// continues reports whether a block at p is the next block of the chain
// whose last block is m.
func (m chainMark) continues(p *chainPos) bool {
	return m.ok && p != nil && m.pos.ns == p.ns && m.pos.low == p.low && m.pos.depth == p.depth-1
}

// ErrChainRule is wrapped, with cache.ErrNoSpace, by the chain rule's
// refusals.
var ErrChainRule = errors.New("dram: a put never evicts its own chain")

// errChainTail, errParentMissing and errChainRefused are the rule's
// refusals.
func errChainTail(p *chainPos) error {
	return fmt.Errorf("%w: %w: storing the block of depth %d would evict its chain parent, the chain's last block (depth %d): the chain is larger than the room, its head is kept", cache.ErrNoSpace, ErrChainRule, p.depth, p.depth-1)
}

func errParentMissing(p *chainPos) error {
	return fmt.Errorf("%w: %w: the block of depth %d follows a block (depth %d) that the dram tier does not hold: refused for room or evicted, it would be unreachable", cache.ErrNoSpace, ErrChainRule, p.depth, p.depth-1)
}

func errChainRefused(p *chainPos) error {
	return fmt.Errorf("%w: %w: the block of depth %d follows a block of its chain (depth %d) refused for room: the chain keeps its head", cache.ErrNoSpace, ErrChainRule, p.depth, p.depth-1)
}

// admitLocked hands b, just linked, to the policy and makes it the chain
// tail the next put may continue. Called under pmu.
func (t *Tier) admitLocked(b *block) {
	t.policy.Admit(b.entry())
	t.byID[b.id] = b
	t.tail = chainMark{id: b.id, pos: chainPos{ns: b.ns.id, depth: b.depth, low: b.low}, ok: true}
	if t.refused.ok {
		t.refused = chainMark{}
		t.refusing.Store(false)
	}
}

// again reports whether b is the block m marks, put again: the put and
// buffer sockets try a reservation, then a whole put.
func (m chainMark) again(b *chainBlock) bool {
	return m.ok && m.pos == b.pos && m.key == string(b.key)
}

// refusedChain reports whether block b continues a chain whose last block
// the rule refused, or is that block again; it is then refused too (and
// becomes the mark).
func (t *Tier) refusedChain(b *chainBlock) error {
	if b == nil {
		return nil
	}
	missing := b.parent != nil && !t.holds(b.pos.ns, b.parent)
	if !missing && !t.refusing.Load() {
		return nil // the common case, without pmu
	}
	t.pmu.Lock()
	defer t.pmu.Unlock()
	switch {
	case t.refused.again(b):
		return t.refused.err
	case b.parent != nil:
		if missing {
			return t.refuseLocked(b, errParentMissing(&b.pos))
		}
	case t.refused.continues(&b.pos):
		return t.refuseLocked(b, errChainRefused(&b.pos))
	}
	return nil
}

// refuseTailLocked reports whether making room for block b would evict
// victim, b's parent (named, or else guessed: the block admitted just
// before it, one level up): then b is refused and remembered, so that the
// rest of its chain is refused too. Called under pmu.
func (t *Tier) refuseTailLocked(b *chainBlock, victim uint64) error {
	switch {
	case b == nil:
		return nil
	case b.parent != nil:
		if v := t.byID[victim]; v == nil || v.ns.id != b.pos.ns || v.key != string(b.parent) {
			return nil
		}
	case t.tail.id != victim || !t.tail.continues(&b.pos):
		return nil
	}
	return t.refuseLocked(b, errChainTail(&b.pos))
}

// refuseLocked marks b refused for err, which it returns, and tells the
// policy it was seen, as a block admitted and evicted at once (the
// history keeps its count, and the clock moves as for the eviction it
// replaces): refused blocks that come back come back with their count, as
// evicted ones do, instead of being refused as first-timers forever. A
// retry of the marked block is not shown again. Called under pmu.
func (t *Tier) refuseLocked(b *chainBlock, err error) error {
	if t.refused.again(b) {
		return t.refused.err
	}
	t.refused = chainMark{pos: b.pos, ok: true, key: string(b.key), err: err}
	t.refusing.Store(true)
	id := t.policyID(b.pos.ns, t.refused.key)
	t.policy.Admit(evict.Entry{ID: id, Size: b.foot, Depth: b.pos.depth, LowPriority: b.pos.low})
	t.policy.Remove(id)
	return err
}

// holds reports whether the tier's index has key in namespace nsID.
func (t *Tier) holds(nsID uint32, key []byte) bool {
	sh := t.shardFor(nsID, key)
	sh.mu.Lock()
	_, ok := sh.m[nsID][string(key)]
	sh.mu.Unlock()
	return ok
}
