package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
)

// ErrNoStream reports that ReservePut cannot take the value in place: the
// caller must put it the ordinary way, with Put, which decides what
// becomes of it. The reasons: a durable put (written through
// to persistent storage first, as Put does), a store without shared
// arenas, or a slot that could not be reserved (DRAM pinned full: Put
// then caches the block in a slower tier).
var ErrNoStream = errors.New("proxy: the value cannot be written in place; put it whole")

// PendingPut is a block being written straight into its reserved arena
// slot (ReservePut): a socket read lands there, checksummed as it lands,
// and the value is never held anywhere else. Exactly one of Commit and
// Abort ends it.
type PendingPut struct {
	p    *Proxy
	r    cache.Reservation
	rt   *router
	ns   string
	key  []byte
	opts cache.PutOptions
}

// ReservePut starts a Put of a value of size bytes that the caller writes
// into Bytes and then commits. The outcomes are Put's (existed for a
// present key, with no PendingPut; the same errors) plus ErrNoStream,
// after which the caller puts the value whole with Put.
func (p *Proxy) ReservePut(ctx context.Context, ns string, key []byte, size int64, opts cache.PutOptions) (pp *PendingPut, existed bool, err error) {
	if err := p.checkKey(key); err != nil {
		return nil, false, err
	}
	if err := p.checkSize(size); err != nil {
		return nil, false, err
	}
	if err := p.checkMeta(opts.Meta); err != nil {
		return nil, false, err
	}
	if opts.Durable {
		return nil, false, fmt.Errorf("%w: a durable put", ErrNoStream)
	}
	if err := p.admitNamespace(ns); err != nil {
		return nil, false, err
	}
	zs, _, err := p.zeroCopyStore()
	if err != nil {
		return nil, false, fmt.Errorf("%w: %w", ErrNoStream, err)
	}
	rt := p.router()
	opts = rt.localOpts(ns, key, opts) // as in Put
	r, err := zs.Reserve(ctx, ns, key, size, opts, 0)
	switch {
	case errors.Is(err, cache.ErrExists):
		return nil, true, nil
	case err != nil:
		return nil, false, fmt.Errorf("%w: %w", ErrNoStream, err)
	}
	return &PendingPut{p: p, r: r, rt: rt, ns: ns, key: bytes.Clone(key), opts: opts}, false, nil
}

// Bytes is the slot to write the value into, valid until Commit or Abort
// and at most until Deadline: past it the tier may give the memory to
// another block, so a writer must have stopped writing by then.
func (pp *PendingPut) Bytes() []byte { return pp.r.Bytes() }

// Deadline is when the slot may be reclaimed.
func (pp *PendingPut) Deadline() time.Time { return pp.r.Deadline() }

// Commit publishes the block, whose bytes have the CRC-32C crc (computed
// as they were written: the slot is not checksummed again, but reads
// verify the block as any other, cache.Reservation.CommitSummed), and
// pushes it to its other owners as Put does.
// A slot whose deadline passed before the value was all written is an
// ErrUnavailable (the writer was too slow; nothing is stored).
func (pp *PendingPut) Commit(ctx context.Context, crc uint32) (existed bool, err error) {
	done := pp.p.describe(pp.ns, pp.key, pp.opts.Meta)
	defer func() { done(err) }()
	var value []byte
	push := pp.rt != nil && pp.rt.pushesElsewhere(pp.ns, pp.key)
	if push && !pp.r.Expired() {
		// Copied for the other owners while the slot is still reserved:
		// once published the block may be evicted. (A block only this node
		// owns is not copied.)
		value = bytes.Clone(pp.r.Bytes())
	}
	existed, err = pp.r.CommitSummed(ctx, crc)
	if errors.Is(err, cache.ErrLeaseExpired) {
		return false, fmt.Errorf("%w: the value was still arriving when its slot's deadline passed (%v)", cache.ErrUnavailable, err)
	}
	if err == nil && !existed && !push && pp.opts.LowPriority && pp.rt != nil {
		// Reserved as a copy of a block owned elsewhere, whose owner has
		// left the ring since: owed to it (owed.go).
		pp.rt.owe(pp.ns, []PutItem{{Key: pp.key}})
	}
	if err != nil || existed || value == nil {
		return existed, err
	}
	return false, pp.rt.push(ctx, pp.ns, []PutItem{{Key: pp.key, Value: value, Opts: pp.opts}}, pp.opts.SyncReplicas, true)
}

// Describe sets the block's description (token ids, parent key, block
// size) for KV events, when it arrives after the value (the put socket);
// a bad one is ErrInvalidArgument and changes nothing.
func (pp *PendingPut) Describe(m *cache.BlockMeta) error {
	if err := pp.p.checkMeta(m); err != nil {
		return err
	}
	pp.opts.Meta = m
	return nil
}

// Abort frees the slot: nothing is stored.
func (pp *PendingPut) Abort() { _ = pp.r.Abort() }
