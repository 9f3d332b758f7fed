package proxy

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/tidepool-kv/tidepool/cache"
)

// Pins holds the pins taken by one request's GetPinned / BatchGetPinned
// calls, so that the values they returned can be written to a socket
// straight from the DRAM arenas. Release drops them all; it MUST be called
// once the answer has been written (or has failed to be). The zero value is
// ready to use. Safe for concurrent use.
type Pins struct {
	mu sync.Mutex
	ls []cache.Lease
}

func (ps *Pins) add(l cache.Lease) {
	ps.mu.Lock()
	ps.ls = append(ps.ls, l)
	ps.mu.Unlock()
}

// Len reports how many pins are held.
func (ps *Pins) Len() int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return len(ps.ls)
}

// Release unpins every block pinned so far; after it the values returned
// through ps must not be read. Safe to call twice.
func (ps *Pins) Release() error {
	ps.mu.Lock()
	ls := ps.ls
	ps.ls = nil
	ps.mu.Unlock()
	var errs []error
	for _, l := range ls {
		if err := l.Release(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// GetPinned is Get without the copy out of the DRAM tier: when the block is
// there (or lands there from its owner), the value returned is its bytes in
// place (checksum verified), pinned in pins until pins.Release, and must
// not be modified. Otherwise (the SSD tier, a store without arenas, a
// checksum mismatch in DRAM) it is a copy that the caller owns. A nil pins
// is Get.
func (p *Proxy) GetPinned(ctx context.Context, ns string, key []byte, scope Scope, pins *Pins) ([]byte, cache.Info, error) {
	if err := p.checkNamespace(ns); err != nil {
		return nil, cache.Info{}, err
	}
	if err := p.checkKey(key); err != nil {
		return nil, cache.Info{}, err
	}
	v, info, err := p.local(ctx, ns, key, pins)
	if r := p.clusterRouter(scope); r != nil && errors.Is(err, cache.ErrNotFound) {
		ferr := r.fetch(ctx, ns, [][]byte{key})[0]
		if ferr == nil {
			v, info, lerr := p.local(ctx, ns, key, pins) // fetched into the DRAM arenas
			if !errors.Is(lerr, cache.ErrNotFound) {
				return v, info, lerr
			}
		}
		if throughOwner(ferr) {
			if v, info, terr := p.readThrough(ctx, r, ns, key); terr == nil {
				return v, info, nil
			}
		}
	}
	return v, info, err
}

// throughOwner reports whether a read that fetch answered ferr should
// read the block from its owner without keeping it here: the block could
// not be kept (no room for a copy: cache.ErrNoSpace), or was kept
// (ferr nil) but pushed out again before the read reached it (the caller
// saw it missing). The owner holds it; that this node has no room for a
// copy must not turn a hit into a miss.
func throughOwner(ferr error) bool {
	return ferr == nil || errors.Is(ferr, cache.ErrNoSpace)
}

// readThrough reads the block of (ns, key) from its owners into memory of
// its own (at most MaxValueBytes, whatever the owner claims), checked
// against its CRC-32C as it lands, and keeps no copy here: the read of a
// block this node has no room for (throughOwner). An error when no owner
// gave it or none can land it in plain memory (ErrNoFetch).
func (p *Proxy) readThrough(ctx context.Context, r *router, ns string, key []byte) ([]byte, cache.Info, error) {
	var buf []byte
	n, info, err := r.fetchDirect(ctx, ns, key, r.remoteOwners(ns, key), func(b RemoteBlock) ([]byte, error) {
		if b.Length < 0 || b.Length > p.cfg.MaxValueBytes {
			return nil, fmt.Errorf("%w: block of %d bytes, limit %d", cache.ErrTooLarge, b.Length, p.cfg.MaxValueBytes)
		}
		buf = make([]byte, b.Length)
		return buf, nil
	})
	if err != nil {
		return nil, cache.Info{}, err
	}
	r.readThroughs.Add(1)
	return buf[:n], info, nil
}

// local reads (ns, key) from this node's tiers: pinned in place into pins
// when it can (pin), else a copy (Store.Get).
func (p *Proxy) local(ctx context.Context, ns string, key []byte, pins *Pins) ([]byte, cache.Info, error) {
	if v, info, ok := p.pin(ctx, ns, key, pins); ok {
		return v, info, nil
	}
	return p.store.Get(ctx, ns, key, nil)
}

// pin pins (ns, key) in place into pins when pins is not nil, the proxy
// has shared arenas and the block is in them.
func (p *Proxy) pin(ctx context.Context, ns string, key []byte, pins *Pins) ([]byte, cache.Info, bool) {
	if pins == nil || p.zcs == nil {
		return nil, cache.Info{}, false
	}
	l, err := p.zcs.Pin(ctx, ns, key)
	if err != nil {
		// A miss, a checksum mismatch (Get then reads the SSD copy, if
		// any, and reports the mismatch otherwise) or an error that Get
		// reports the same way.
		return nil, cache.Info{}, false
	}
	pins.add(l)
	return l.Bytes(), l.Info(), true
}

// BatchGetPinned is BatchGet with GetPinned's values: blocks in the DRAM
// tier come back in place, pinned in pins. A nil pins is BatchGet.
func (p *Proxy) BatchGetPinned(ctx context.Context, ns string, keys [][]byte, scope Scope, pins *Pins) ([]GetResult, error) {
	if err := p.checkBatch(len(keys)); err != nil {
		return nil, err
	}
	if err := p.checkNamespace(ns); err != nil {
		return nil, err
	}
	out := make([]GetResult, len(keys))
	var missed [][]byte
	var missedIdx []int
	for i, k := range keys {
		if err := p.checkKey(k); err != nil {
			out[i].Err = err
			continue
		}
		out[i].Value, out[i].Info, out[i].Err = p.local(ctx, ns, k, pins)
		if errors.Is(out[i].Err, cache.ErrNotFound) {
			missed = append(missed, k)
			missedIdx = append(missedIdx, i)
		}
	}
	if r := p.clusterRouter(scope); r != nil && len(missed) > 0 {
		var through []int // indexes into keys
		for j, ferr := range r.fetch(ctx, ns, missed) {
			i := missedIdx[j]
			if ferr == nil {
				out[i].Value, out[i].Info, out[i].Err = p.local(ctx, ns, keys[i], pins)
			}
			if throughOwner(ferr) && errors.Is(out[i].Err, cache.ErrNotFound) {
				through = append(through, i)
			}
		}
		r.each(len(through), through, func(i int) {
			if v, info, err := p.readThrough(ctx, r, ns, keys[i]); err == nil {
				out[i] = GetResult{Value: v, Info: info}
			}
		})
	}
	return out, nil
}
