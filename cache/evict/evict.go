// Package evict holds the eviction policies shared by every tier. A tier
// tells its policy about each block it admits, reads and removes, and asks it
// for victims when it needs room. Policies know nothing of bytes, arenas or
// files: they see block ids and a little metadata.
package evict

// Entry is what a policy knows of one block.
type Entry struct {
	// ID is the tier's handle for the block, unique within the tier while
	// the block is present.
	ID uint64
	// Size is the block's footprint in the tier, in bytes.
	Size int64
	// Depth is the block's position in its prefix chain (0 = first block).
	Depth int32
	// LowPriority marks a copy of a block owned by another node.
	LowPriority bool
	// ParentKind says what the tier knows of the block's parent in its
	// chain (the block at Depth-1): nothing (ParentUnknown, the zero value:
	// a policy may guess from the order of admissions), that this tier
	// holds no parent for it (ParentNone: the chain starts here, as far as
	// this tier is concerned), or its ID (ParentKnown: Parent, a block this
	// tier stored or read for the same request just before; if it is gone
	// by now, the new block is unreachable and NewPrefix evicts it first).
	ParentKind ParentKind
	Parent     uint64
}

// ParentKind is what Entry.Parent means.
type ParentKind uint8

// The kinds of parent knowledge.
const (
	ParentUnknown ParentKind = iota
	ParentNone
	ParentKnown
)

// Policy chooses which block a tier evicts next. Implementations are not
// safe for concurrent use: the tier serializes every call under its own lock,
// so each method must be cheap (O(1) or O(log n)) and must never block.
type Policy interface {
	// Admit records a newly stored block.
	Admit(e Entry)
	// Touch records a read of a present block.
	Touch(id uint64)
	// Remove forgets a block (deleted, evicted or moved to another tier).
	// Unknown ids are ignored.
	Remove(id uint64)
	// Victim returns the block to evict next without removing it. skip
	// reports blocks that cannot be evicted now (pinned); Victim passes over
	// them. ok is false when no evictable block is left.
	Victim(skip func(id uint64) bool) (id uint64, ok bool)
	// Len returns the number of blocks tracked.
	Len() int
}

// Factory makes a new, empty policy; tiers take a Factory so that each tier
// (or each shard) gets its own instance.
type Factory func() Policy
