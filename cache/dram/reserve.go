package dram

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
)

// Reservation is a slot of arena memory allocated for a value that the
// caller writes in place (the zero-copy put): Reserve allocates and counts
// the value's footprint, the caller writes the bytes through Bytes or a
// mapping of the arena file at Location, then Commit publishes the block or
// Abort frees it. Until Commit the block is invisible to Get, Stat, Acquire
// and Lookup, and it is never evicted.
//
// A Reservation MUST be committed or aborted before its deadline: after it,
// the tier may reclaim the slot (at the next Reap, or when a put needs
// room) and reuse its bytes, and Commit fails with cache.ErrLeaseExpired.
// Reservation implements cache.Reservation.
type Reservation struct {
	t        *Tier
	nss      *nsState
	key      string
	b        *block // not linked in the index or the policy
	deadline int64  // unix nanoseconds
	done     bool   // guarded by Tier.rmu: committed, aborted or reclaimed
	unbound  bool   // made by ReserveUnbound and not bound yet (Bind)
}

var _ cache.Reservation = (*Reservation)(nil)

// Reserve allocates a slot of size bytes for (ns, key) that stays reserved
// for ttl (≤ 0 means ReserveTimeout; capped at max(MaxLease,
// ReserveTimeout)). It may evict unpinned blocks to make room, as Put does.
// Errors: cache.ErrExists (the key is present: nothing to write),
// cache.ErrInvalidKey, cache.ErrTooLarge (size over MaxValueSize or
// negative), cache.ErrNoSpace, cache.ErrClosed. Two reservations of one key
// may coexist; the first to commit wins and the other's Commit reports
// existed.
func (t *Tier) Reserve(ctx context.Context, ns string, key []byte, size int64, opts cache.PutOptions, ttl time.Duration) (cache.Reservation, error) {
	if err := t.checkKey(key); err != nil {
		return nil, err
	}
	if size < 0 || size > t.cfg.MaxValueSize {
		return nil, fmt.Errorf("%w: reservation of %d bytes (limit %d)", cache.ErrTooLarge, size, t.cfg.MaxValueSize)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	nss := t.namespace(ns)
	sh := t.shardFor(nss.id, key)
	sh.mu.Lock()
	if sh.closed {
		sh.mu.Unlock()
		return nil, cache.ErrClosed
	}
	if _, ok := sh.m[nss.id][string(key)]; ok {
		sh.mu.Unlock()
		return nil, cache.ErrExists
	}
	sh.mu.Unlock()
	r, err := t.newReservation(nss, string(key), sh, size, opts, ttl)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// ReserveUnbound is Reserve for a value whose key is not known yet: the
// slot is reserved ahead of the put that will fill it, and the key is
// given by Bind before Commit (a writer keeps one ready, so that a put
// needs one round trip: write, then bind and commit). opts.Depth and
// opts.LowPriority may be set again by Bind. Slots reserved ahead are
// speculative, and nothing can evict them: together they take at most
// MaxUnboundShare of Capacity, beyond which ReserveUnbound fails with
// cache.ErrNoSpace without evicting anything (the writer then reserves
// with the key). Errors as Reserve's, but for cache.ErrExists and
// cache.ErrInvalidKey, which Bind reports.
func (t *Tier) ReserveUnbound(ctx context.Context, ns string, size int64, opts cache.PutOptions, ttl time.Duration) (cache.Reservation, error) {
	if size < 0 || size > t.cfg.MaxValueSize {
		return nil, fmt.Errorf("%w: reservation of %d bytes (limit %d)", cache.ErrTooLarge, size, t.cfg.MaxValueSize)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if t.closed.Load() {
		return nil, cache.ErrClosed
	}
	foot, limit := footprint(size), t.cfg.Capacity/MaxUnboundShare
	if t.unboundBytes.Add(foot) > limit {
		t.unboundBytes.Add(-foot)
		return nil, fmt.Errorf("%w: slots reserved ahead take %d of their %d bytes", cache.ErrNoSpace, t.unboundBytes.Load(), limit)
	}
	r, err := t.newReservation(t.namespace(ns), "", nil, size, opts, ttl)
	if err != nil {
		t.unboundBytes.Add(-foot)
		return nil, err
	}
	return r, nil
}

// MaxUnboundShare: the slots reserved ahead (ReserveUnbound, not bound
// yet) take at most 1/MaxUnboundShare of the tier's Capacity.
const MaxUnboundShare = 8

// newReservation makes room for a slot of size bytes and records the reservation;
// sh is nil for an unbound one.
func (t *Tier) newReservation(nss *nsState, key string, sh *shard, size int64, opts cache.PutOptions, ttl time.Duration) (*Reservation, error) {
	if ttl <= 0 {
		ttl = t.cfg.ReserveTimeout
	}
	ttl = min(ttl, max(t.cfg.MaxLease, t.cfg.ReserveTimeout))
	foot := footprint(size)
	var nb *chainBlock
	if sh != nil {
		nb = blockAt(nss, []byte(key), foot, opts)
	}
	off, err := t.makeRoom(size, foot, nb)
	if err != nil {
		return nil, err
	}
	r := &Reservation{
		t: t, nss: nss, key: key, unbound: sh == nil,
		b: &block{
			ns: nss, off: off, size: size, foot: foot,
			depth: opts.Depth, low: opts.LowPriority, shard: sh,
		},
		deadline: t.clk.Now().Add(ttl).UnixNano(),
	}
	t.rmu.Lock()
	t.reservations[r] = struct{}{}
	t.rmu.Unlock()
	t.reservedBytes.Add(foot)
	return r, nil
}

// Bind gives a reservation made by ReserveUnbound its key, depth and
// priority (opts.Depth, opts.LowPriority), before Commit. Errors:
// cache.ErrInvalidKey, cache.ErrExists (the key is present: Abort the
// slot, or keep it for another key), and an error for a reservation that
// has its key already. The reservation stays open on any error.
func (r *Reservation) Bind(key []byte, opts cache.PutOptions) error {
	t := r.t
	t.rmu.Lock()
	unbound, done := r.unbound, r.done
	t.rmu.Unlock()
	switch {
	case done:
		return fmt.Errorf("%w: reservation already committed, aborted or reclaimed", cache.ErrLeaseExpired)
	case !unbound:
		return errors.New("dram: the reservation has its key already")
	}
	if err := t.checkKey(key); err != nil {
		return err
	}
	sh := t.shardFor(r.nss.id, key)
	sh.mu.Lock()
	_, ok := sh.m[r.nss.id][string(key)]
	sh.mu.Unlock()
	if ok {
		return cache.ErrExists
	}
	r.key = string(key)
	r.b.shard, r.b.depth, r.b.low = sh, opts.Depth, opts.LowPriority
	t.rmu.Lock()
	defer t.rmu.Unlock()
	if r.done {
		return fmt.Errorf("%w: reservation reclaimed", cache.ErrLeaseExpired)
	}
	r.unbound = false
	t.unboundBytes.Add(-r.b.foot)
	return nil
}

// Bytes returns the slot's arena memory, for writing the value in place.
// Valid until Commit or Abort, and at most until the deadline.
func (r *Reservation) Bytes() []byte { return r.t.bytes(r.b.off, r.b.size) }

// Location returns where the slot lies: arena index (see Tier.Arenas), byte
// offset in that arena file, and length.
func (r *Reservation) Location() (arena int, offset, length int64) {
	return int(r.b.off / r.t.arenaSize), r.b.off % r.t.arenaSize, r.b.size
}

// Deadline returns the time after which the slot may be reclaimed.
func (r *Reservation) Deadline() time.Time { return time.Unix(0, r.deadline) }

// Expired reports whether the deadline has passed (by the tier's clock).
func (r *Reservation) Expired() bool { return r.t.now() >= r.deadline }

// claim marks r done; it fails when r was already committed, aborted or
// reclaimed.
func (r *Reservation) claim() bool {
	t := r.t
	t.rmu.Lock()
	defer t.rmu.Unlock()
	if r.done {
		return false
	}
	r.done = true
	delete(t.reservations, r)
	return true
}

// free returns a claimed reservation's memory.
func (r *Reservation) free() {
	if r.unbound {
		r.t.unboundBytes.Add(-r.b.foot)
	}
	r.t.reservedBytes.Add(-r.b.foot)
	r.t.freeBlockMem(r.b)
}

// Commit checksums the bytes written into the slot, checks them against crc
// when hasCRC, and publishes the block: from now on it is read, evicted
// (and handed to OnEvict) like any other. If the key was stored meanwhile
// (by a Put or another reservation), the slot is freed and existed is true.
// On any error the slot is freed too. Errors: cache.ErrLeaseExpired (the
// deadline passed, or the reservation was already committed, aborted or
// reclaimed), cache.ErrChecksum (the bytes do not match crc),
// cache.ErrClosed.
func (r *Reservation) Commit(ctx context.Context, crc uint32, hasCRC bool) (existed bool, err error) {
	return r.commit(ctx, crc, hasCRC, false, false)
}

// CommitChecked publishes the block with crc as its checksum without
// checksumming the slot again: for bytes that were already checked against
// crc as they landed (a transfer verified end to end, rdma.Op.SumKnown).
// Otherwise as Commit.
func (r *Reservation) CommitChecked(ctx context.Context, crc uint32) (existed bool, err error) {
	return r.commit(ctx, crc, true, true, true)
}

// CommitSummed publishes the block with crc as its checksum without
// checksumming the slot again: for bytes whose checksum the sidecar
// computed as it wrote them. Unlike CommitChecked, a verified read checks
// the block even in its first second. Otherwise as Commit.
func (r *Reservation) CommitSummed(ctx context.Context, crc uint32) (existed bool, err error) {
	return r.commit(ctx, crc, true, true, false)
}

// commit publishes the block: checksummed here unless checked (its crc
// known already), against crc when hasCRC; landed marks bytes checked in
// place as they landed (landedFresh).
func (r *Reservation) commit(ctx context.Context, crc uint32, hasCRC, checked, landed bool) (existed bool, err error) {
	t := r.t
	if !r.claim() {
		return false, fmt.Errorf("%w: reservation already committed, aborted or reclaimed", cache.ErrLeaseExpired)
	}
	if r.unbound {
		r.free()
		return false, fmt.Errorf("%w: commit of a reservation that has no key (Bind)", cache.ErrInvalidKey)
	}
	if t.now() >= r.deadline {
		r.free()
		t.reclaimed.Add(1)
		return false, fmt.Errorf("%w: reservation deadline passed before commit", cache.ErrLeaseExpired)
	}
	if err := ctx.Err(); err != nil {
		r.free()
		return false, err
	}
	b, sh := r.b, r.b.shard
	sh.mu.Lock()
	if sh.closed {
		sh.mu.Unlock()
		return false, cache.ErrClosed // the arenas are going away with the slot
	}
	sum := crc
	if !checked {
		sh.ops++
		sh.mu.Unlock()
		sum = cache.Checksum(t.bytes(b.off, b.size))
		t.opDone(sh)
	} else {
		sh.mu.Unlock()
	}
	if hasCRC && sum != crc {
		r.free()
		return false, fmt.Errorf("%w: committed %d bytes have CRC-32C %08x, the client sent %08x", cache.ErrChecksum, b.size, sum, crc)
	}
	b.crc = sum
	if landed {
		b.landed.Store(t.now())
	}
	b.id = t.nextID.Add(1)
	existed, err = t.publish(b, r.key)
	t.reservedBytes.Add(-b.foot)
	if existed || err != nil {
		t.freeBlockMem(b)
	}
	return existed, err
}

// Abort frees the slot. It fails with cache.ErrLeaseExpired when the
// reservation was already committed, aborted or reclaimed.
func (r *Reservation) Abort() error {
	if !r.claim() {
		return fmt.Errorf("%w: reservation already committed, aborted or reclaimed", cache.ErrLeaseExpired)
	}
	r.free()
	return nil
}

// publish links a new block under key in its shard, the policy and the
// counters. It reports existed (and links nothing) when the key is present;
// the caller then frees the block's memory.
func (t *Tier) publish(b *block, key string) (existed bool, err error) {
	sh, nss := b.shard, b.ns
	sh.mu.Lock()
	m := sh.m[nss.id]
	if _, ok := m[key]; ok {
		sh.mu.Unlock()
		return true, nil
	}
	if sh.closed {
		sh.mu.Unlock()
		return false, cache.ErrClosed
	}
	if m == nil {
		m = make(map[string]*block)
		sh.m[nss.id] = m
	}
	b.key = key
	b.linked = true
	m[key] = b
	t.pmu.Lock()
	b.id = t.policyID(nss.id, key)
	t.admitLocked(b)
	t.pmu.Unlock()
	t.observeStored(b)
	sh.mu.Unlock()

	t.blocks.Add(1)
	t.bytesIn.Add(b.size)
	nss.blocks.Add(1)
	nss.bytes.Add(b.size)
	nss.puts.Add(1)
	return false, nil
}

// reapReservations frees the reservations whose deadline has passed and
// returns how many.
func (t *Tier) reapReservations(now int64) int {
	t.rmu.Lock()
	var expired []*Reservation
	for r := range t.reservations {
		if r.deadline <= now {
			r.done = true
			delete(t.reservations, r)
			expired = append(expired, r)
		}
	}
	t.rmu.Unlock()
	for _, r := range expired {
		r.free()
	}
	t.reclaimed.Add(int64(len(expired)))
	return len(expired)
}

// Reap frees, now, the memory of reservations past their deadline and of
// deleted blocks whose leases have all expired; puts do the same on their
// slow path. It returns how many reservations it reclaimed.
func (t *Tier) Reap() int {
	if t.closed.Load() {
		return 0
	}
	now := t.now()
	n := t.reapReservations(now)
	t.reapZombies(now)
	return n
}

// ReserveStats is a snapshot of the reservation counters.
type ReserveStats struct {
	Open      int64 // reservations neither committed, aborted nor reclaimed
	OpenBytes int64 // their footprint
	Reclaimed int64 // reservations reclaimed after their deadline, ever
}

// ReserveStats returns the reservation counters.
func (t *Tier) ReserveStats() ReserveStats {
	t.rmu.Lock()
	n := len(t.reservations)
	t.rmu.Unlock()
	return ReserveStats{Open: int64(n), OpenBytes: t.reservedBytes.Load(), Reclaimed: t.reclaimed.Load()}
}
