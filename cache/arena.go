package cache

import (
	"context"
	"time"
)

// The vocabulary of the shared arenas: the DRAM tier keeps block bytes in
// memory-mapped arena files that the engine maps too (zero-copy puts and
// reads) and that the transfer layer registers (remote fetches land in
// place). A block's bytes lie at (arena index, byte offset, length) of
// those files. A store hands out two kinds of handle on arena memory, both
// of which MUST be given back: a Lease on a stored block (Release) and a
// Reservation of a slot not yet published (Commit or Abort).

// ArenaInfo describes one arena file, for a client that maps the same file
// (zero-copy) or registers it with RDMA/CUDA. A block lives at (arena
// index, offset, length); see Lease.Location.
type ArenaInfo struct {
	Path string
	Size int64
}

// BlockRef describes one block present in a tier, for a scan of its
// blocks (the rebalancer's).
type BlockRef struct {
	Namespace string
	Key       []byte // a copy; the caller may keep it
	Size      int64  // value bytes
	Depth     int32
	// LowPriority marks a copy of a block owned by another node.
	LowPriority bool
}

// Lease pins one stored block so that its bytes stay in place in the
// arenas: the block is not evicted or freed while the lease is held and
// has not expired. A Lease MUST be released (Release), and before its
// deadline: after it the store may reclaim the block and reuse its bytes.
type Lease interface {
	// Bytes returns the value in the arena, without a copy. The slice is
	// valid until Release (and at most until the deadline); it must not be
	// modified.
	Bytes() []byte
	// Info returns the block's metadata.
	Info() Info
	// Location returns where the value lies: arena index (see the store's
	// Arenas), byte offset in that arena file, and length.
	Location() (arena int, offset, length int64)
	// Deadline returns the time after which the lease no longer protects
	// the bytes.
	Deadline() time.Time
	// Expired reports whether the deadline has passed (by the store's
	// clock).
	Expired() bool
	// Renew extends the lease to lease from now (≤ 0: the store's default)
	// and returns the new deadline; ErrLeaseExpired when it was released
	// or its deadline passed.
	Renew(lease time.Duration) (time.Time, error)
	// Release unpins the block. Safe to call twice. It returns
	// ErrLeaseExpired when the block was reclaimed after the deadline:
	// bytes read through the lease since may be wrong.
	Release() error
}

// Reservation is a slot of arena memory allocated for a value that the
// caller writes in place (a zero-copy put, a remote fetch landing): the
// caller writes the bytes through Bytes or a mapping of the arena file at
// Location, then Commit publishes the block or Abort frees the slot. Until
// Commit the block is invisible to reads. A Reservation MUST be committed
// or aborted before its deadline; after it the slot may be reclaimed and
// Commit fails with ErrLeaseExpired.
type Reservation interface {
	// Bytes returns the slot's arena memory, for writing the value in
	// place. Valid until Commit or Abort, and at most until the deadline.
	Bytes() []byte
	// Location returns where the slot lies: arena index, byte offset in
	// that arena file, and length.
	Location() (arena int, offset, length int64)
	// Deadline returns the time after which the slot may be reclaimed.
	Deadline() time.Time
	// Expired reports whether the deadline has passed.
	Expired() bool
	// Commit checksums the slot's bytes, checks them against crc when
	// hasCRC, and publishes the block; existed reports that the key was
	// stored meanwhile (the slot is then freed). Errors: ErrLeaseExpired,
	// ErrChecksum, ErrClosed; on any error the slot is freed.
	Commit(ctx context.Context, crc uint32, hasCRC bool) (existed bool, err error)
	// CommitChecked is Commit for bytes already checked against crc as
	// they landed (a transfer verified end to end): it does not checksum
	// them again.
	CommitChecked(ctx context.Context, crc uint32) (existed bool, err error)
	// CommitSummed is Commit for bytes whose checksum crc the sidecar
	// computed itself as it wrote them (the put socket): it does not
	// checksum them again, and reads verify the block as any other.
	CommitSummed(ctx context.Context, crc uint32) (existed bool, err error)
	// Abort frees the slot; ErrLeaseExpired when it was already committed,
	// aborted or reclaimed.
	Abort() error
	// Bind gives a reservation made without a key (ReserveUnbound) its
	// key, depth and priority before Commit. Errors: ErrInvalidKey,
	// ErrExists (the key is present), or an error when the reservation
	// has its key already; the reservation stays open on any error.
	Bind(key []byte, opts PutOptions) error
}
