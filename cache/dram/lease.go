package dram

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
)

// Lease pins one block so that its bytes stay in place: the block is not
// evicted or freed while the lease is held and has not expired. A Lease MUST
// be released (Release), and must be released before its deadline: after
// the deadline the tier may reclaim the block and reuse its bytes. Lease
// implements cache.Lease.
type Lease struct {
	t        *Tier
	b        *block
	gen      uint32
	deadline atomic.Int64 // unix nanoseconds; moved by Renew
	internal bool         // counted in shard.ops (Get)
	done     atomic.Bool
}

var _ cache.Lease = (*Lease)(nil)

// Acquire pins (ns, key) for lease (≤ 0 means LeaseTimeout; capped at
// MaxLease) and returns the handle, for zero-copy reads. It counts as a read
// (hit or miss). When reads of ns are verified (Config.VerifyReads,
// VerifyReadsNamespaces) it checks the block's bytes in place first; a block
// that fails is removed (as by Get) and Acquire returns cache.ErrChecksum,
// counting a miss. The caller MUST call Release. Errors:
// cache.ErrNotFound, cache.ErrInvalidKey, cache.ErrChecksum,
// cache.ErrClosed.
func (t *Tier) Acquire(ctx context.Context, ns string, key []byte, lease time.Duration) (cache.Lease, error) {
	if err := t.checkKey(key); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return asLease(t.acquireLease(ctx, ns, key, lease, countRead))
}

// AcquireUncounted is Acquire without counting the read (no hit, no miss),
// for a caller that has counted it already: the store acquiring a block it
// has just promoted after a counted miss.
func (t *Tier) AcquireUncounted(ctx context.Context, ns string, key []byte, lease time.Duration) (cache.Lease, error) {
	if err := t.checkKey(key); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return asLease(t.acquireLease(ctx, ns, key, lease, countNone))
}

// asLease returns l as a cache.Lease: a nil interface (never one holding a
// nil *Lease) with err.
func asLease(l *Lease, err error) (cache.Lease, error) {
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (t *Tier) acquireLease(ctx context.Context, ns string, key []byte, lease time.Duration, count countMode) (*Lease, error) {
	if lease <= 0 {
		lease = t.cfg.LeaseTimeout
	}
	lease = min(lease, t.cfg.MaxLease)
	l := new(Lease)
	nss := t.namespace(ns)
	if err := t.acquire(l, nss, key, lease, false, count); err != nil {
		return nil, err
	}
	if !nss.verify {
		return l, nil
	}
	b, sh := l.b, l.b.shard
	// Counted in ops for the checksum, so that Close does not unmap the
	// arenas under it.
	sh.mu.Lock()
	if sh.closed {
		sh.mu.Unlock()
		_ = t.release(l)
		return nil, cache.ErrClosed
	}
	sh.ops++
	sh.mu.Unlock()
	sum := cache.Checksum(l.Bytes())
	t.opDone(sh)
	if sum != b.crc {
		_ = t.release(l)
		if count == countRead {
			t.misses.Add(1)
			nss.misses.Add(1)
		}
		return nil, t.checksumMismatch(b, sum, count != countNone)
	}
	return l, nil
}

// countMode says what acquire counts.
type countMode uint8

const (
	countRead countMode = iota // a hit or a miss
	countHit                   // a hit; a miss is counted by the caller's next read (Pin, then Get)
	countNone                  // nothing: the caller counted this read already
)

// acquire pins (nss, key) into l and counts the read as count says.
// internal marks a pin held by the tier itself for a copy (Get, Pin):
// Close waits for those.
func (t *Tier) acquire(l *Lease, nss *nsState, key []byte, lease time.Duration, internal bool, count countMode) error {
	sh := t.shardFor(nss.id, key)
	deadline := t.clk.Now().Add(lease).UnixNano()
	sh.mu.Lock()
	if sh.closed {
		sh.mu.Unlock()
		return cache.ErrClosed
	}
	b, ok := sh.m[nss.id][string(key)]
	if !ok {
		sh.mu.Unlock()
		if count == countRead {
			t.misses.Add(1)
			nss.misses.Add(1)
		}
		return fmt.Errorf("%w: dram", cache.ErrNotFound)
	}
	sh.pinLocked(b, deadline, internal)
	if internal {
		sh.ops++
	}
	*l = Lease{t: t, b: b, gen: b.gen, internal: internal}
	l.deadline.Store(deadline)
	// Record the read for the policy; hand a full batch over outside the
	// shard lock.
	var batch [touchBatch]uint64
	full := false
	nt := sh.nt.Load()
	sh.touches[nt] = b.id
	sh.nt.Store(nt + 1)
	if nt+1 == touchBatch {
		batch = sh.touches
		sh.nt.Store(0)
		full = true
	}
	sh.mu.Unlock()
	if full {
		t.pmu.Lock()
		for _, id := range batch {
			t.policy.Touch(id)
		}
		t.pmu.Unlock()
	}
	if count != countNone {
		t.hits.Add(1)
		nss.hits.Add(1)
		t.bytesOut.Add(b.size)
	}
	return nil
}

// flushTouches hands every recorded read to the policy. A shard with none
// recorded is passed over without its lock (a put that must evict calls
// this each time: under a stream of puts and no reads, 64 lock round trips
// for nothing); a read recorded meanwhile goes with the next flush, as one
// recorded just after its shard's turn always did.
func (t *Tier) flushTouches() {
	var batch [touchBatch]uint64
	for i := range t.shards {
		sh := &t.shards[i]
		if sh.nt.Load() == 0 {
			continue
		}
		sh.mu.Lock()
		n := copy(batch[:], sh.touches[:sh.nt.Load()])
		sh.nt.Store(0)
		sh.mu.Unlock()
		if n == 0 {
			continue
		}
		t.pmu.Lock()
		for _, id := range batch[:n] {
			t.policy.Touch(id)
		}
		t.pmu.Unlock()
	}
}

// release unpins l. It returns cache.ErrLeaseExpired when the lease had
// expired and the block was reclaimed meanwhile (its bytes may have been
// reused).
func (t *Tier) release(l *Lease) error {
	if l.done.Swap(true) {
		return nil
	}
	b := l.b
	sh := b.shard
	sh.mu.Lock()
	if l.internal {
		sh.ops--
		b.ipins.Add(-1) // never revoked: held() protects b meanwhile
	}
	if b.gen != l.gen {
		sh.mu.Unlock()
		return fmt.Errorf("%w: dram block reclaimed after the lease deadline", cache.ErrLeaseExpired)
	}
	if b.pins.Add(-1) == 0 {
		sh.pinned.Add(-b.foot)
		if !b.linked {
			// Deleted while pinned: the last pin frees it.
			t.zmu.Lock()
			delete(t.zombies, b)
			t.zmu.Unlock()
			t.freeBlockMem(b)
		}
	}
	sh.mu.Unlock()
	return nil
}

// Bytes returns the value in the arena, without a copy. The slice is valid
// until Release (and at most until the lease deadline); it must not be
// modified.
func (l *Lease) Bytes() []byte { return l.t.bytes(l.b.off, l.b.size) }

// Info returns the block's metadata.
func (l *Lease) Info() cache.Info { return l.b.info() }

// Location returns where the value lies: arena index (see Tier.Arenas),
// byte offset in that arena file, and length.
func (l *Lease) Location() (arena int, offset, length int64) {
	return int(l.b.off / l.t.arenaSize), l.b.off % l.t.arenaSize, l.b.size
}

// Deadline returns the time after which the lease no longer protects the
// bytes.
func (l *Lease) Deadline() time.Time { return time.Unix(0, l.deadline.Load()) }

// Expired reports whether the lease's deadline has passed (by the tier's
// clock). The bytes of an expired lease may be reclaimed at any moment.
func (l *Lease) Expired() bool { return l.t.now() >= l.deadline.Load() }

// Renew extends the lease to lease from now (≤ 0 means LeaseTimeout; capped
// at MaxLease) and returns the new deadline. A lease that was released or
// whose deadline has passed cannot be renewed: cache.ErrLeaseExpired (even
// when its block happens to be still in place, so that the outcome does not
// depend on the timing of reclamation).
func (l *Lease) Renew(lease time.Duration) (time.Time, error) {
	t := l.t
	if lease <= 0 {
		lease = t.cfg.LeaseTimeout
	}
	lease = min(lease, t.cfg.MaxLease)
	b := l.b
	sh := b.shard
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := t.clk.Now()
	switch {
	case l.done.Load():
		return time.Time{}, fmt.Errorf("%w: lease already released", cache.ErrLeaseExpired)
	case b.gen != l.gen || now.UnixNano() >= l.deadline.Load():
		return time.Time{}, fmt.Errorf("%w: lease deadline passed before renewal", cache.ErrLeaseExpired)
	}
	d := now.Add(lease).UnixNano()
	if d > l.deadline.Load() {
		l.deadline.Store(d)
	}
	if d > b.leaseExp.Load() {
		b.leaseExp.Store(d)
	}
	return time.Unix(0, l.deadline.Load()), nil
}

// Release unpins the block. Safe to call twice (the second call does
// nothing). It returns cache.ErrLeaseExpired when the lease expired and the
// block was reclaimed before the release: bytes read through it since the
// deadline may be wrong.
func (l *Lease) Release() error { return l.t.release(l) }
