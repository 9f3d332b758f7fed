package tiered

import (
	"context"
	"errors"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
)

// Arenas forwards to the DRAM tier (zero-copy clients map these files).
func (s *Store) Arenas() []cache.ArenaInfo { return s.dram.Arenas() }

// SlotIndexPath forwards to the DRAM tier: its table of where each block
// lies, for readers on this node ("" when none).
func (s *Store) SlotIndexPath() string { return s.dram.SlotIndexPath() }

// Reserve forwards to the DRAM tier (see dram.Tier.Reserve). A key the
// SSD tier holds is reported as cache.ErrExists, as a Put would. The
// committed block is an ordinary DRAM block: it is demoted when evicted
// and spilled at Close. opts.Durable is not honoured by the zero-copy
// path (the commit happens in the DRAM tier, below this store).
func (s *Store) Reserve(ctx context.Context, ns string, key []byte, size int64, opts cache.PutOptions, ttl time.Duration) (cache.Reservation, error) {
	if s.closed.Load() {
		return nil, cache.ErrClosed
	}
	if s.ssd != nil {
		if _, ok := s.ssd.Stat(ctx, ns, key); ok {
			return nil, cache.ErrExists
		}
	}
	return s.dram.Reserve(ctx, ns, key, size, opts, ttl)
}

// ReserveUnbound forwards to the DRAM tier (see
// dram.Tier.ReserveUnbound); Bind then reports a key the SSD tier holds
// as cache.ErrExists, as Reserve does.
func (s *Store) ReserveUnbound(ctx context.Context, ns string, size int64, opts cache.PutOptions, ttl time.Duration) (cache.Reservation, error) {
	if s.closed.Load() {
		return nil, cache.ErrClosed
	}
	r, err := s.dram.ReserveUnbound(ctx, ns, size, opts, ttl)
	if err != nil || s.ssd == nil {
		return r, err
	}
	return &unbound{Reservation: r, s: s, ns: ns}, nil
}

// unbound is a DRAM reservation made without its key, whose Bind also
// looks in the SSD tier.
type unbound struct {
	cache.Reservation
	s  *Store
	ns string
}

func (u *unbound) Bind(key []byte, opts cache.PutOptions) error {
	if _, ok := u.s.ssd.Stat(context.Background(), u.ns, key); ok {
		return cache.ErrExists
	}
	return u.Reservation.Bind(key, opts)
}

// Acquire pins (ns, key) in the DRAM tier (see dram.Tier.Acquire),
// promoting it from SSD or the demotion queue first when DRAM misses, or
// when its DRAM copy failed a verified read (and was removed).
func (s *Store) Acquire(ctx context.Context, ns string, key []byte, lease time.Duration) (cache.Lease, error) {
	l, err := s.dram.Acquire(ctx, ns, key, lease)
	if s.ssd == nil || !(errors.Is(err, cache.ErrNotFound) || errors.Is(err, cache.ErrChecksum)) || s.closed.Load() {
		return l, err
	}
	v, info, ferr := s.fetch(ctx, ns, key)
	if ferr != nil {
		return nil, err
	}
	// The read was counted: a DRAM miss, then a hit below.
	l, err = s.dram.AcquireUncounted(ctx, ns, key, lease)
	if errors.Is(err, cache.ErrNotFound) && !s.closed.Load() {
		// Not promoted: the read's flight skipped it because the
		// demotion queue was full (promote), or DRAM lost it since. A
		// pinned read needs the block in DRAM, so promote it here, even
		// if making room waits for the queue (DemotionWait).
		s.promoteNow(ctx, ns, key, v, info)
		l, err = s.dram.AcquireUncounted(ctx, ns, key, lease)
	}
	return l, err
}

// Reap forwards to the DRAM tier.
func (s *Store) Reap() int { return s.dram.Reap() }

// Pin forwards to the DRAM tier (see dram.Tier.Pin: the value in place,
// checksum verified, pinned until Release). It does not look in the SSD
// tier: on a miss the caller falls back to Get, which promotes.
func (s *Store) Pin(ctx context.Context, ns string, key []byte) (cache.Lease, error) {
	if s.closed.Load() {
		return nil, cache.ErrClosed
	}
	return s.dram.Pin(ctx, ns, key)
}

// Scan forwards to the DRAM tier (see dram.Tier.Scan): the blocks held in
// DRAM, not those only on SSD.
func (s *Store) Scan(fn func(cache.BlockRef) bool) { s.dram.Scan(fn) }
