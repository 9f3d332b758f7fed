package dram

import (
	"context"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
)

// landedFresh: the first Pin of a block whose bytes were checked in place as
// they landed (CommitChecked: a transfer verified end to end against the
// block's CRC-32C) less than this long ago does not checksum them again.
// That is the fetch-then-answer path of a remote Get, whose bytes were
// verified where they lie moments earlier (milliseconds; the window only
// bounds a fetch that nobody read at once, e.g. under heavy load). Every
// later Pin, and any Pin after the window, checks.
const landedFresh = time.Second

// pinLease is the deadline of a Pin: far enough never to pass, so that a pin
// is never revoked and its bytes are never reused while it is held.
const pinLease = 100 * 365 * 24 * time.Hour

// Pin is Get without the copy, for a caller that copies the bytes out itself
// (a socket write straight from the arena): it pins (ns, key), verifies the
// block's checksum over its bytes in place (always: the caller copies them
// into an answer, unlike Acquire's reader in place) and returns the lease,
// whose Bytes are the value. A hit counts as a read; a miss is not counted, as
// the caller goes on to Get (or a slower tier), which counts it.
//
// The first Pin of a block committed with CommitChecked
// less than landedFresh (1 s) ago does not checksum it again: it was
// checked in place as it landed.
//
// Unlike Acquire's lease, a pin does not expire: the block is neither
// evicted nor reclaimed until Release, and Close waits for every pin to be
// released before it unmaps the arenas. The caller MUST Release it as soon
// as the copy is done (for a socket write: once the write has completed or
// failed). Errors: as Get; a block whose checksum fails is removed, as by
// Get, and the Pin counts no read (the caller's Get that follows counts the
// miss).
func (t *Tier) Pin(ctx context.Context, ns string, key []byte) (cache.Lease, error) {
	if err := t.checkKey(key); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l := new(Lease)
	if err := t.acquire(l, t.namespace(ns), key, pinLease, true, countHit); err != nil {
		return nil, err
	}
	b := l.b
	if at := b.landed.Swap(0); at != 0 && t.now()-at < int64(landedFresh) {
		return l, nil // checked in place as it landed, a moment ago
	}
	if sum := cache.Checksum(l.Bytes()); sum != b.crc {
		_ = t.release(l)
		return nil, t.checksumMismatch(b, sum, true)
	}
	return l, nil
}
