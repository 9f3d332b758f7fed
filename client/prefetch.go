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
}

// PutWith is Put with options. existed is true when the key was already
// present (the put was a no-op).
func (c *Client) PutWith(ctx context.Context, ns string, key, value []byte, opts PutOptions) (existed bool, err error) {
	var res tp.TidepoolPutResult
	err = c.call(ctx, "Put", &tp.TidepoolPutArgs{Req: &tp.PutRequest{Ns: ns, Key: key, Value: value, Depth: opts.Depth, Durable: opts.Durable}}, &res)
	r := res.GetSuccess()
	if err != nil {
		return false, err
	}
	return r.Existed, nil
}
