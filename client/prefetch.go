package client

import (
	"context"

	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
)

// Prefetch asks the sidecar to bring keys of ns into its DRAM tier in the
// background (from its SSD tier) and returns how many it queued: keys
// already in DRAM, absent keys and keys beyond its prefetch queue are not.
// It does not wait for the blocks to arrive.
func (c *Client) Prefetch(ctx context.Context, ns string, keys [][]byte) (queued int, err error) {
	var res tp.TidepoolPrefetchResult
	err = c.call(ctx, "Prefetch", &tp.TidepoolPrefetchArgs{Req: &tp.PrefetchRequest{Ns: ns, Keys: keys}}, &res)
	r := res.GetSuccess()
	if err != nil {
		return 0, err
	}
	return int(r.Queued), nil
}

// PutOptions qualify one PutWith.
type PutOptions struct {
	// Depth is the block's position in its prefix chain (0 = first).
	Depth int32
	// Durable asks the sidecar to write the block through to its SSD tier,
	// with the write-ahead log synced, before answering: the block then
	// survives kill -9 of the sidecar (and power loss). It is not pinned:
	// like any block it is evicted when the cache needs room
	// (tidepool_ssd_durable_evictions_total counts those). A sidecar that
	// cannot make it durable (no SSD tier, or one that is degraded)
	// refuses it with CodeUnavailable.
	Durable bool
	// Meta describes the block for KV events (token ids, parent key, block
	// size); nil: none (docs/events.md).
	Meta *BlockMeta
}

// BlockMeta is what a router needs to index a block (docs/events.md): its
// token ids (exactly BlockSize of them, or none), the key of the block
// before it in its chain (nil for the first) and the engine's block size
// in tokens. A sidecar publishing KV events sends it with the block's
// BlockStored events; one that does not checks and drops it.
type BlockMeta struct {
	Tokens    []uint32
	Parent    []byte
	BlockSize int32
}

// fields are m as the request's optional fields.
func (m *BlockMeta) fields() (tokens []int32, parent []byte, size *int32) {
	if m == nil {
		return nil, nil, nil
	}
	if len(m.Tokens) > 0 {
		tokens = make([]int32, len(m.Tokens))
		for i, t := range m.Tokens {
			tokens[i] = int32(t)
		}
	}
	if len(m.Parent) > 0 {
		parent = m.Parent
	}
	if m.BlockSize != 0 {
		s := m.BlockSize
		size = &s
	}
	return tokens, parent, size
}

// PutWith is Put with options. existed is true when the key was already
// present (the put was a no-op).
func (c *Client) PutWith(ctx context.Context, ns string, key, value []byte, opts PutOptions) (existed bool, err error) {
	var res tp.TidepoolPutResult
	req := &tp.PutRequest{Ns: ns, Key: key, Value: value, Depth: opts.Depth, Durable: opts.Durable}
	req.TokenIds, req.ParentKey, req.BlockSize = opts.Meta.fields()
	err = c.call(ctx, "Put", &tp.TidepoolPutArgs{Req: req}, &res)
	r := res.GetSuccess()
	if err != nil {
		return false, err
	}
	return r.Existed, nil
}
