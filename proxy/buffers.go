package proxy

// GetInto and PutFrom: reads into and puts from memory the caller gives,
// for the engine API's buffer socket (engine buffers shared with this
// process).
//
// PutFrom copies the value into its reserved arena slot and checksums it
// in the same pass (crc32c.Copy): one pass over the value, where a
// zero-copy put through Reserve and Commit makes three (the client's copy
// into the slot, its checksum, the check at Commit).
//
// GetInto: a block in
// this node's tiers is copied there; a block only another node holds is
// read from the network straight into it (Peers.FetchTo), checked against
// its CRC-32C as it lands, without a copy into this node's arenas: one
// copy fewer than fetching into the store and copying out.
//
// Such a block is not kept here. When this node should keep it — it owns
// the key (a new owner filling from the previous one), or the key is read
// often enough to be a hot replica (hot.go) — or when the owner cannot
// land it in plain memory (an RDMA connection, an older node), the read
// goes through the store as GetPinned does, and is copied out; and when
// this node has no room to keep it after all (the fetch refused for room,
// or the copy pushed out before the read reached it), the block is read
// straight into the caller's memory as above.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/crc32c"
)

// PutFrom stores the value in src as Put does, copied into its arena slot
// and checksummed in one pass. When sum is not nil the value must have
// that CRC-32C (cache.ErrChecksum otherwise, nothing stored). A put that
// cannot be written in place (ErrNoStream: durable, no shared arenas,
// DRAM pinned full) is a Put of src. src must stay unchanged until
// PutFrom returns; it is not kept.
func (p *Proxy) PutFrom(ctx context.Context, ns string, key, src []byte, opts cache.PutOptions, sum *uint32) (existed bool, err error) {
	pp, existed, err := p.ReservePut(ctx, ns, key, int64(len(src)), opts)
	if errors.Is(err, ErrNoStream) {
		if sum != nil && cache.Checksum(src) != *sum {
			return false, fmt.Errorf("%w: the value does not match the checksum sent", cache.ErrChecksum)
		}
		return p.Put(ctx, ns, key, src, opts)
	}
	if err != nil || existed {
		return existed, err
	}
	ok := false
	defer func() {
		if !ok {
			pp.Abort() // a fault in the copy (engineapi recovers it) stores nothing
		}
	}()
	crc := crc32c.Copy(pp.Bytes(), src)
	if sum != nil && crc != *sum {
		return false, fmt.Errorf("%w: the value does not match the checksum sent", cache.ErrChecksum)
	}
	ok = true
	return pp.Commit(ctx, crc)
}

// GetInto copies the block of (ns, key) into dst and returns its size and
// metadata. A miss is cache.ErrNotFound; a block longer than dst is
// cache.ErrTooLarge with nothing written. On any other error dst may hold
// part of the block.
func (p *Proxy) GetInto(ctx context.Context, ns string, key, dst []byte, scope Scope) (int64, cache.Info, error) {
	if err := p.checkNamespace(ns); err != nil {
		return 0, cache.Info{}, err
	}
	if err := p.checkKey(key); err != nil {
		return 0, cache.Info{}, err
	}
	n, info, err := p.copyLocal(ctx, ns, key, dst)
	r := p.clusterRouter(scope)
	if r == nil || !errors.Is(err, cache.ErrNotFound) {
		return n, info, err
	}
	n, info, err = r.fetchTo(ctx, ns, key, dst)
	if !errors.Is(err, errThroughStore) {
		return n, info, err
	}
	ferr := r.fetch(ctx, ns, [][]byte{key})[0]
	if ferr == nil {
		n, info, err = p.copyLocal(ctx, ns, key, dst) // fetched into the DRAM arenas
		if !errors.Is(err, cache.ErrNotFound) {
			return n, info, err
		}
	}
	if !throughOwner(ferr) {
		return 0, cache.Info{}, ferr
	}
	// Kept nowhere here (no room): straight into dst after all.
	n, info, err = r.fetchDirect(ctx, ns, key, r.remoteOwners(ns, key), landIn(dst))
	if err == nil {
		r.readThroughs.Add(1)
	} else if errors.Is(err, ErrNoFetch) {
		err = ferr
		if err == nil {
			err = cache.ErrNotFound
		}
	}
	return n, info, err
}

// landIn lands a block fetched directly in dst; a block longer than dst
// is cache.ErrTooLarge.
func landIn(dst []byte) func(RemoteBlock) ([]byte, error) {
	return func(got RemoteBlock) ([]byte, error) {
		if got.Length < 0 || got.Length > int64(len(dst)) {
			return nil, fmt.Errorf("%w: block of %d bytes, buffer of %d", cache.ErrTooLarge, got.Length, len(dst))
		}
		return dst[:got.Length], nil
	}
}

// copyLocal copies the block of (ns, key) from this node's tiers into dst
// (Store.Get: from the DRAM arenas, checked as it is copied, in one pass;
// else read by the store straight into dst).
func (p *Proxy) copyLocal(ctx context.Context, ns string, key, dst []byte) (int64, cache.Info, error) {
	// Store.Get writes into dst only when the block fits in its capacity
	// (cut to its length here: nothing past it is the caller's to write);
	// a longer one comes back in a slice of its own, dst untouched.
	v, info, err := p.store.Get(ctx, ns, key, dst[:0:len(dst)])
	if err != nil {
		return 0, cache.Info{}, err
	}
	if len(v) > len(dst) {
		return 0, cache.Info{}, fmt.Errorf("%w: block of %d bytes, buffer of %d", cache.ErrTooLarge, len(v), len(dst))
	}
	if len(v) > 0 && &v[0] != &dst[0] {
		copy(dst, v)
	}
	return int64(len(v)), info, nil
}

// errThroughStore: fetchTo does not land this block in the caller's
// memory; fetch it into the store instead.
var errThroughStore = errors.New("proxy: fetch through the store")

// fetchTo reads the block of (ns, key) from its remote owners, in order,
// straight into dst. errThroughStore when this node should keep the block
// or an owner cannot land it in plain memory (nothing was landed then).
func (r *router) fetchTo(ctx context.Context, ns string, key, dst []byte) (int64, cache.Info, error) {
	owners := r.remoteOwners(ns, key)
	if len(owners) == 0 {
		return 0, cache.Info{}, cache.ErrNotFound
	}
	if r.owns(ns, key) || r.hot.noteDirect(ns+"\x00"+string(key)) {
		return 0, cache.Info{}, errThroughStore
	}
	n, info, err := r.fetchDirect(ctx, ns, key, owners, landIn(dst))
	if errors.Is(err, ErrNoFetch) {
		return 0, cache.Info{}, errThroughStore
	}
	return n, info, err
}

// fetchDirect reads the block of (ns, key) from owners, in order, into
// the memory land returns for it (Peers.FetchTo), checked against its
// CRC-32C as it lands; nothing is kept here. ErrNoFetch when an owner
// cannot land it in plain memory (nothing was landed then); a land error
// wrapping cache.ErrTooLarge ends the read.
func (r *router) fetchDirect(ctx context.Context, ns string, key []byte, owners []string, land func(RemoteBlock) ([]byte, error)) (int64, cache.Info, error) {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, r.cfg.FetchTimeout)
	defer cancel()
	err := error(cache.ErrNotFound)
	for _, node := range owners {
		ok, probe := r.brk.allow(node)
		if !ok {
			err = fmt.Errorf("%w: %s", ErrPeerDown, node)
			continue
		}
		var b RemoteBlock
		start := time.Now()
		err = r.fetcher.FetchTo(ctx, node, ns, key, FetchOptions{AnswerTimeout: r.fopts.AnswerTimeout}, func(got RemoteBlock) ([]byte, error) {
			dst, err := land(got)
			if err == nil {
				b = got
			}
			return dst, err
		})
		if errors.Is(err, ErrNoFetch) {
			r.brk.done(node, probe, callGaveUp) // nothing was sent
			return 0, cache.Info{}, err
		}
		o := outcomeOf(parent, err)
		if errors.Is(err, cache.ErrTooLarge) {
			o = callOK // node answered; the room here was short
		}
		r.brk.done(node, probe, o)
		r.remoteFetches.Add(1)
		pc := r.stats.of(node)
		pc.fetches.Add(1)
		pc.named.Add(1)
		if o == callOK {
			pc.latency.Add(int64(time.Since(start))) // calls the node answered
		}
		if !errors.Is(err, cache.ErrTooLarge) {
			pc.landed(b.Length, err)
		}
		if err == nil {
			r.remoteHits.Add(1)
			return b.Length, cache.Info{Size: b.Length, Checksum: b.Checksum, Depth: b.Depth}, nil
		}
		if errors.Is(err, cache.ErrTooLarge) {
			return 0, cache.Info{}, err
		}
		if !errors.Is(err, cache.ErrNotFound) && !errors.Is(err, ErrPeerDown) {
			r.fetchFailures.Add(1)
			r.lg.Debug("remote fetch into a buffer failed", zap.String("node", node), zap.Error(err))
		}
	}
	return 0, cache.Info{}, err
}
