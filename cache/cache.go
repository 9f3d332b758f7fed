// Package cache is the shared vocabulary of tidepool's tiered block store:
// the errors every tier returns, block metadata, options and statistics.
// The tiers live in sub-packages (dram, ssd), eviction policies in evict,
// and the composition of tiers in tiered. This package imports nothing of
// ours so that every tier can use it.
package cache

import "errors"

// Errors returned by tiers and stores. Test with errors.Is; they are mapped
// to protocol error codes once, at the Thrift edge.
var (
	ErrNotFound     = errors.New("cache: block not found")
	ErrExists       = errors.New("cache: block exists")
	ErrTooLarge     = errors.New("cache: value too large")
	ErrNoSpace      = errors.New("cache: no space")
	ErrInvalidKey   = errors.New("cache: invalid key")
	ErrChecksum     = errors.New("cache: checksum mismatch")
	ErrLeaseExpired = errors.New("cache: lease expired")
	ErrClosed       = errors.New("cache: closed")
	ErrUnavailable  = errors.New("cache: tier unavailable")
)

// PutOptions qualify one put.
type PutOptions struct {
	// Depth is the block's position in its prefix chain (0 = first block).
	// Eviction prefers deeper blocks on ties.
	Depth int32
	// LowPriority marks a copy of a block owned by another node; such
	// copies are evicted before owned blocks.
	LowPriority bool
	// Durable asks for the block to be written through to persistent
	// storage before the put returns (tiers without persistence ignore it).
	Durable bool
	// SyncReplicas asks the proxy of a clustered node to wait until that
	// many of the block's owners (other than this node) stored it before
	// the put returns; 0 (or negative): it is pushed in the background.
	// The tiers ignore it.
	SyncReplicas int
	// Checksum, when HasChecksum, is the CRC-32C the value is known by:
	// the block's checksum in the tier it is copied from (demotion, spill
	// at stop). The SSD tier, which checksums the value anyway, refuses it
	// with ErrChecksum when they differ, so that bytes damaged in DRAM do
	// not get a fresh checksum there.
	Checksum    uint32
	HasChecksum bool
	// Meta, when set, describes the block for routers (token ids, parent
	// key, block size): the proxy hands it to the KV-event publisher, and
	// the SSD tier keeps it in the block's record so that it survives a
	// restart (docs/ssd.md). The DRAM tier ignores it.
	Meta *BlockMeta
	// Parent, when set, is the key of the block's chain parent in the
	// same namespace (the block at Depth-1), stored just before it by the
	// same caller: a BatchPut's previous item. The DRAM tier's chain rule
	// then refuses the block (ErrNoSpace) when the parent is not held or
	// would be evicted to make room for it, instead of guessing the chain
	// from the order of puts. Nothing else uses it.
	Parent []byte
}

// Info describes one stored block.
type Info struct {
	Size     int64
	Checksum uint32 // CRC-32C (Castagnoli) of the value
	Depth    int32
	Tier     string // "dram", "ssd", ... ("remote": held by another node)
	Node     string // with Tier "remote": the node that holds the block (proxy, cluster scope)
}

// TierStats is a snapshot of one tier's counters.
type TierStats struct {
	Name          string
	CapacityBytes int64
	UsedBytes     int64
	Blocks        int64
	Hits          int64
	Misses        int64
	Evictions     int64
	BytesIn       int64
	BytesOut      int64
	// ChecksumFailures counts reads whose bytes did not match their checksum.
	ChecksumFailures int64
}

// NamespaceStats is a snapshot of one namespace's counters.
type NamespaceStats struct {
	Namespace string
	Blocks    int64
	Bytes     int64
	Hits      int64
	Misses    int64
	Puts      int64
	Evictions int64
}

// Stats is a snapshot of a store.
type Stats struct {
	Tiers      []TierStats
	Namespaces []NamespaceStats
}

// Observer hears of blocks entering and leaving a tier's index, so that a
// publisher can tell routers what this sidecar holds (proxy/kvevents). A
// tier calls it with its own name ("dram", "ssd") as the block becomes
// visible and as it stops being visible, whatever the cause (put, commit,
// promotion, demotion, delete, eviction, the scrubber, a reset index).
// Calls are made with the tier's locks held: they must not block and must
// not call back into the tier. key is valid only during the call. meta is
// the block's description when the tier keeps one (the SSD tier: the one
// its record holds, also for the blocks it finds at start), nil otherwise;
// it must not be modified.
type Observer interface {
	Stored(ns string, key []byte, tier string, meta *BlockMeta)
	Removed(ns string, key []byte, tier string)
	// Cleared reports that every block of ns left the tier at once.
	Cleared(ns string, tier string)
}

// BlockMeta is what a router needs to index a block that the sidecar
// holds: the token ids the block covers, the key of the block before it in
// its chain (empty for the first) and the engine's block size in tokens.
// Engines pass it along with a put (optional); the store never reads it.
type BlockMeta struct {
	Tokens    []uint32
	Parent    []byte
	BlockSize int32
}

// Clone returns a copy of m that shares no memory with it (nil for nil).
func (m *BlockMeta) Clone() *BlockMeta {
	if m == nil {
		return nil
	}
	c := &BlockMeta{BlockSize: m.BlockSize}
	if m.Tokens != nil {
		c.Tokens = append([]uint32(nil), m.Tokens...)
	}
	if m.Parent != nil {
		c.Parent = append([]byte(nil), m.Parent...)
	}
	return c
}

// Descriptions gives the description of a block the store holds or has
// just evicted (nil: none known), so that a copy of the block into another
// tier (a demotion into SSD, the stop spill) keeps it. It must not block.
type Descriptions interface {
	Description(ns string, key []byte) *BlockMeta
}
