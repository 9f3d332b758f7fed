package client

// Zero-copy calls (docs/zerocopy.md). The sidecar's DRAM tier lives in
// arena files in a directory both containers of the pod mount; Hello lists
// them. The client maps each file read-only (MAP_SHARED) on first use and
// reads leased blocks in place; it writes a reserved slot through a
// mapping that only the writing thread can write, for the copy
// (WriteKeyed, where the machine has memory protection keys), or with
// pwrite on the arena file, so no block byte crosses the socket.
//
// Files: zerocopy.go has the calls (Reserve, Commit, Acquire, Release,
// PutFrom, GetInto, the slot reads and writes) and the zeroCopy state of a
// Client; arena.go maps the arena files and remaps them after a sidecar
// restart; writemode.go writes a slot (WriteMode: keyed, pwrite,
// mapped); spares.go keeps unbound reservations for later puts;
// releaser.go releases GetInto's leases in the background; coalesce.go
// batches the control calls of concurrent callers.
//
// Locks. Lock order (a lock may only be taken while holding locks listed
// before it):
//
//	zeroCopy.mu → zeroCopy.rw
//
// zeroCopy.mu serializes mapping and remapping (mapArenas: it calls Hello
// and takes zeroCopy.rw while holding it); zeroCopy.rw guards the arena
// list and closed, and is held for reading for the whole of a slot's copy
// (withArenas), so that no remap or Close unmaps an arena under it.
// Leaves, never held while another lock is taken: zeroCopy.spareMu
// (spares.go), releaser.mu (releaser.go) and each combiner's mu
// (coalesce.go); no lock is held across a call to the sidecar but
// zeroCopy.mu.

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidepool-kv/tidepool/internal/crc32c"

	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
)

// ArenaLayoutVersion is the arena layout this client understands (see
// proxy.ArenaLayoutVersion): a slot holds exactly the value's bytes, and
// checksums are CRC-32C.
const ArenaLayoutVersion = 1

// CodeLeaseExpired is answered for unknown, used or expired tokens and
// lease ids.
const CodeLeaseExpired = tp.ErrorCode_LEASE_EXPIRED

// CodeChecksum is answered when bytes do not match their CRC-32C.
const CodeChecksum = tp.ErrorCode_CHECKSUM_MISMATCH

// Slot is where a block's bytes lie in the shared arenas.
type Slot struct {
	Arena  int32
	Offset int64
	Length int64
}

// ReserveItem asks for one slot. An Unbound one has no Key: it is given
// at Commit (CommitItem.Key), so that a writer can hold a slot ready
// before it knows what it will put there (servers with FeatureCommitNext).
type ReserveItem struct {
	Key     []byte
	Size    int64
	Depth   int32
	Unbound bool
}

// Reservation is one item of Reserve. Code is CodeOK (write Size bytes at
// Slot, then Commit Token before Deadline), CodeExists (the key is present:
// nothing to write) or the item's error.
type Reservation struct {
	Code     ErrorCode
	Message  string
	Slot     Slot
	Token    int64
	Deadline time.Time
}

// CommitItem publishes one reservation; Checksum (CRC-32C of the bytes
// written) is verified by the server when HasChecksum. Key and Depth are
// those of an unbound reservation (empty for one reserved with its key).
// NextSize > 0 asks CommitNext for an unbound reservation of that size in
// the same namespace, for the writer's next put.
type CommitItem struct {
	Token       int64
	Checksum    uint32
	HasChecksum bool
	Key         []byte
	Depth       int32
	NextSize    int64
	Meta        *BlockMeta // for KV events; nil: none
}

// FeatureCommitNext, in HelloResponse.Features: the server takes unbound
// reservations and answers CommitItem.NextSize (see CommitNext).
const FeatureCommitNext = "commit_next"

// Lease is one key of Acquire. Code is CodeOK (the block is pinned at Slot
// until Release or the deadline), CodeNotFound or the item's error.
type Lease struct {
	Code     ErrorCode
	Slot     Slot
	LeaseID  int64
	Checksum uint32
	Tier     string
}

func fromSlot(s *tp.Slot) Slot {
	if s == nil {
		return Slot{}
	}
	return Slot{Arena: s.Arena, Offset: s.Offset, Length: s.Length}
}

func statusErrors(res []*tp.ItemStatus) []error {
	out := make([]error, len(res))
	for i, s := range res {
		if s != nil && s.Code != CodeOK {
			out[i] = &Error{Code: s.Code, Message: s.Message}
		}
	}
	return out
}

func fromMs(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// Reserve allocates slots for blocks of ns; ttl ≤ 0 means the server's
// default. Each OK reservation MUST be committed or aborted before its
// deadline.
func (c *Client) Reserve(ctx context.Context, ns string, items []ReserveItem, ttl time.Duration) ([]Reservation, error) {
	req := &tp.ReserveRequest{Ns: ns, Items: make([]*tp.ReserveItem, len(items)), TtlMs: int32(ttl.Milliseconds())}
	for i, it := range items {
		req.Items[i] = &tp.ReserveItem{Key: it.Key, Size: it.Size, Depth: it.Depth, Unbound: it.Unbound}
	}
	var res tp.TidepoolReserveResult
	if err := c.call(ctx, "Reserve", &tp.TidepoolReserveArgs{Req: req}, &res); err != nil {
		return nil, err
	}
	return fromReservations(res.GetSuccess().Results), nil
}

func fromReservations(rs []*tp.Reservation) []Reservation {
	out := make([]Reservation, len(rs))
	for i, x := range rs {
		if x != nil {
			out[i] = Reservation{Code: x.Code, Message: x.Message, Slot: fromSlot(x.Slot), Token: x.Token, Deadline: fromMs(x.DeadlineUnixMs)}
		}
	}
	return out
}

// Commit publishes reservations; per item nil, CodeExists (stored
// meanwhile; the slot was freed), CodeLeaseExpired or CodeChecksum.
// Reservations that NextSize asked for are aborted (see CommitNext).
func (c *Client) Commit(ctx context.Context, items []CommitItem) ([]error, error) {
	errs, next, err := c.CommitNext(ctx, items)
	var tokens []int64
	for _, r := range next {
		if r.Code == CodeOK && r.Token != 0 {
			tokens = append(tokens, r.Token)
		}
	}
	c.abortQuietly(tokens)
	return errs, err
}

// CommitNext is Commit that also answers, per item, the unbound
// reservation its NextSize asked for (Token 0 where it asked for none, or
// where the server does not list FeatureCommitNext). Each OK one MUST be
// committed (with its key) or aborted before its deadline.
func (c *Client) CommitNext(ctx context.Context, items []CommitItem) ([]error, []Reservation, error) {
	req := &tp.CommitRequest{Items: make([]*tp.CommitItem, len(items))}
	for i, it := range items {
		req.Items[i] = &tp.CommitItem{Token: it.Token, Checksum: int32(it.Checksum), HasChecksum: it.HasChecksum,
			Key: it.Key, Depth: it.Depth, NextSize: it.NextSize}
		req.Items[i].TokenIds, req.Items[i].ParentKey, req.Items[i].BlockSize = it.Meta.fields()
	}
	var res tp.TidepoolCommitResult
	if err := c.call(ctx, "Commit", &tp.TidepoolCommitArgs{Req: req}, &res); err != nil {
		return nil, nil, err
	}
	r := res.GetSuccess()
	next := make([]Reservation, len(items))
	if len(r.Next) == len(items) {
		copy(next, fromReservations(r.Next))
	}
	return statusErrors(r.Results), next, nil
}

// Abort frees reservations; per item nil or CodeLeaseExpired.
func (c *Client) Abort(ctx context.Context, tokens []int64) ([]error, error) {
	var res tp.TidepoolAbortResult
	if err := c.call(ctx, "Abort", &tp.TidepoolAbortArgs{Req: &tp.AbortRequest{Tokens: tokens}}, &res); err != nil {
		return nil, err
	}
	return statusErrors(res.GetSuccess().Results), nil
}

// Acquire pins blocks of ns for lease (≤ 0: the server's default) and
// returns where they are, and the earliest deadline. Every OK lease MUST be
// released (or left to expire; its bytes must not be read after deadline).
func (c *Client) Acquire(ctx context.Context, ns string, keys [][]byte, lease time.Duration) ([]Lease, time.Time, error) {
	var res tp.TidepoolAcquireResult
	req := &tp.AcquireRequest{Ns: ns, Keys: keys, LeaseMs: int32(lease.Milliseconds())}
	if err := c.call(ctx, "Acquire", &tp.TidepoolAcquireArgs{Req: req}, &res); err != nil {
		return nil, time.Time{}, err
	}
	r := res.GetSuccess()
	out := make([]Lease, len(r.Results))
	for i, x := range r.Results {
		if x != nil {
			out[i] = Lease{Code: x.Code, Slot: fromSlot(x.Slot), LeaseID: x.LeaseId, Checksum: uint32(x.Checksum), Tier: x.Tier}
		}
	}
	return out, fromMs(r.DeadlineUnixMs), nil
}

// Release unpins leases; per item nil or CodeLeaseExpired (not held, or
// released after its deadline: bytes read through it may be wrong).
func (c *Client) Release(ctx context.Context, ids []int64) ([]error, error) {
	var res tp.TidepoolReleaseResult
	if err := c.call(ctx, "Release", &tp.TidepoolReleaseArgs{Req: &tp.ReleaseRequest{LeaseIds: ids}}, &res); err != nil {
		return nil, err
	}
	return statusErrors(res.GetSuccess().Results), nil
}

// Renew extends leases to lease from now and returns the earliest new
// deadline; per item nil or CodeLeaseExpired.
func (c *Client) Renew(ctx context.Context, ids []int64, lease time.Duration) ([]error, time.Time, error) {
	var res tp.TidepoolRenewResult
	req := &tp.RenewRequest{LeaseIds: ids, LeaseMs: int32(lease.Milliseconds())}
	if err := c.call(ctx, "Renew", &tp.TidepoolRenewArgs{Req: req}, &res); err != nil {
		return nil, time.Time{}, err
	}
	r := res.GetSuccess()
	return statusErrors(r.Results), fromMs(r.DeadlineUnixMs), nil
}

// zeroCopy is a client's view of the arenas, made on first use.
//
// Locks: mu serializes (re)mapping; rw guards the lifetime
// of the mappings: a copy holds it shared, a remap or Close exclusively
// (mu → rw).
type zeroCopy struct {
	mu       sync.Mutex
	mode     atomic.Int32 // WriteMode
	verify   atomic.Bool  // GetInto checks the CRC-32C (SetVerifyReads)
	maxBatch atomic.Int32 // the server's max batch (Hello); 0: not known yet
	rel      releaser
	rw       sync.RWMutex
	arenas   []*arenaMap // guarded by rw
	closed   bool        // guarded by rw

	// The control calls of GetInto and PutFrom, coalesced (coalesce.go).
	acquires combiner[[]byte, acquired]
	reserves combiner[ReserveItem, Reservation]
	commits  combiner[CommitItem, committed]

	// Unbound reservations kept for PutFrom's next puts (FeatureCommitNext).
	commitNext atomic.Bool // the server lists FeatureCommitNext (Hello)
	spareMu    sync.Mutex
	spares     map[spareKey][]Reservation // guarded by spareMu
	nspares    int                        // guarded by spareMu
	maxSpares  int                        // Config.ReserveAhead; 0: none
}

// committed is one item's answer of a coalesced Commit.
type committed struct {
	err  error
	next Reservation // Token 0: none
}

// acquired is one key's answer of a coalesced Acquire.
type acquired struct {
	Lease
	deadline time.Time // the earliest deadline of the call's leases
}

// defaultBatch is the most items in one coalesced call while the server's
// max batch is not known (it is from the first GetInto or PutFrom on).
const defaultBatch = 256

// initZeroCopy sets up the coalesced calls of c, with at most inFlight
// Acquire or Reserve calls in flight per namespace (Config.ZeroCopyInFlight).
func (c *Client) initZeroCopy(inFlight int) {
	z := &c.zc
	// The key is allocated at the first put, not here: a client that
	// never puts takes none of the process's 15.
	z.mode.Store(int32(WriteKeyed))
	maxBatch := func() int {
		if n := int(z.maxBatch.Load()); n > 0 {
			return n
		}
		return defaultBatch
	}
	z.acquires = combiner[[]byte, acquired]{
		name:  "Acquire",
		width: inFlight,
		call: func(ctx context.Context, k flightKey, keys [][]byte) ([]acquired, error) {
			ls, deadline, err := c.Acquire(ctx, k.ns, keys, k.d)
			if err != nil {
				return nil, err
			}
			out := make([]acquired, len(ls))
			for i, l := range ls {
				out[i] = acquired{Lease: l, deadline: deadline}
			}
			return out, nil
		},
		clone: bytes.Clone,
		undo: func(res []acquired) {
			for _, a := range res {
				if a.Code == CodeOK {
					z.rel.add(c, a.LeaseID)
				}
			}
		},
		max: maxBatch,
	}
	z.reserves = combiner[ReserveItem, Reservation]{
		name:  "Reserve",
		width: inFlight,
		call: func(ctx context.Context, k flightKey, items []ReserveItem) ([]Reservation, error) {
			return c.Reserve(ctx, k.ns, items, k.d)
		},
		clone: func(it ReserveItem) ReserveItem {
			it.Key = bytes.Clone(it.Key)
			return it
		},
		undo: func(res []Reservation) {
			var tokens []int64
			for _, r := range res {
				if r.Code == CodeOK {
					tokens = append(tokens, r.Token)
				}
			}
			c.abortQuietly(tokens)
		},
		max: maxBatch,
	}
	z.commits = combiner[CommitItem, committed]{
		name: "Commit",
		// The server checksums every committed byte, one block after the
		// other within a call: one Commit in flight would put every
		// PutFrom's server-side CRC pass on one core. Two per core keep
		// a call queued behind each one being checked, so that no core
		// of the sidecar waits for a round trip (with one per core, 1 MiB
		// puts of 16 callers ran 8-9 % slower on 2 cores, the CPUs idle a
		// fifth of the time).
		width: max(inFlight, 2*runtime.GOMAXPROCS(0)),
		call: func(ctx context.Context, _ flightKey, items []CommitItem) ([]committed, error) {
			errs, next, err := c.CommitNext(ctx, items)
			if err != nil {
				return nil, err
			}
			out := make([]committed, len(items))
			for i := range out {
				out[i] = committed{err: errs[i], next: next[i]}
			}
			return out, nil
		},
		clone: func(it CommitItem) CommitItem {
			it.Key = bytes.Clone(it.Key)
			return it
		},
		drop: func(items []CommitItem) {
			tokens := make([]int64, len(items))
			for i, it := range items {
				tokens[i] = it.Token
			}
			c.abortQuietly(tokens)
		},
		undo: func(res []committed) {
			var tokens []int64
			for _, r := range res {
				if r.next.Code == CodeOK && r.next.Token != 0 {
					tokens = append(tokens, r.next.Token)
				}
			}
			c.abortQuietly(tokens)
		},
		max: maxBatch,
	}
}

// abortQuietly aborts reservations nobody waits for any more. Failures need
// no handling: a reservation that could not be aborted expires at its
// deadline.
func (c *Client) abortQuietly(tokens []int64) {
	if len(tokens) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c.Abort(ctx, tokens)
}

// SetVerifyReads says whether GetInto checks each copy against the block's
// CRC-32C (default false). The bytes were checked where they entered the
// sidecar (Put, Commit, a transfer from a peer, an SSD read), the arenas
// are mapped read-only by readers, and the sidecar's scrubber re-checks
// resident blocks in the background; the check here also guards against
// bytes changed in the shared arena by a misbehaving writer between two
// scrubs, at the cost of one CRC-32C pass, which bounds GetInto's speed
// (docs/zerocopy.md, docs/security.md "Integrity"). A sidecar with
// verify_reads (or the namespace in verify_reads_namespaces) checks in
// Acquire instead, for every client. Lease expiry during the copy is
// detected by Release either way.
func (c *Client) SetVerifyReads(v bool) { c.zc.verify.Store(v) }

// leaseMargin is how long before its deadline a lease must still be when
// GetInto's copy ends for the release to be left to the background.
const leaseMargin = 100 * time.Millisecond

// close unmaps the arenas; called by Client.Close.
func (z *zeroCopy) close() {
	z.rel.stop()
	z.rw.Lock()
	defer z.rw.Unlock()
	z.closed = true
	for _, a := range z.arenas {
		a.close()
	}
	z.arenas = nil
}

// ReadSlot copies the bytes of a slot (of a lease the caller holds) into
// dst, which must be at least s.Length long, and returns their CRC-32C,
// mapping the arenas on first use.
func (c *Client) ReadSlot(ctx context.Context, s Slot, dst []byte) (crc uint32, err error) {
	if int64(len(dst)) < s.Length {
		return 0, &Error{Code: CodeTooLarge, Message: fmt.Sprintf("zero-copy: slot of %d bytes, buffer of %d", s.Length, len(dst))}
	}
	err = c.withArenas(ctx, func(arenas []*arenaMap) error {
		src, err := view(arenas, s)
		if err != nil {
			return err
		}
		crc = crc32c.Copy(dst, src)
		return nil
	})
	return crc, err
}

// ViewSlot calls fn with the bytes of a slot (of a lease the caller holds)
// in the read-only mapping, without a copy: for example to hand them to a
// GPU copy. b is valid only during fn and must not be modified or kept.
func (c *Client) ViewSlot(ctx context.Context, s Slot, fn func(b []byte)) error {
	return c.withArenas(ctx, func(arenas []*arenaMap) error {
		b, err := view(arenas, s)
		if err != nil {
			return err
		}
		fn(b)
		return nil
	})
}

// copySlot copies a slot into dst without checksumming.
func (c *Client) copySlot(ctx context.Context, s Slot, dst []byte) error {
	if int64(len(dst)) < s.Length {
		return &Error{Code: CodeTooLarge, Message: fmt.Sprintf("zero-copy: slot of %d bytes, buffer of %d", s.Length, len(dst))}
	}
	return c.withArenas(ctx, func(arenas []*arenaMap) error {
		src, err := view(arenas, s)
		if err == nil {
			copy(dst, src)
		}
		return err
	})
}

// WriteSlot writes src (exactly s.Length bytes) into a slot the caller
// reserved and returns its CRC-32C, for Commit.
func (c *Client) WriteSlot(ctx context.Context, s Slot, src []byte) (crc uint32, err error) {
	if int64(len(src)) != s.Length {
		return 0, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("zero-copy: slot of %d bytes, %d to write", s.Length, len(src))}
	}
	err = c.withArenas(ctx, func(arenas []*arenaMap) error {
		var err error
		crc, err = c.writeSlot(arenas, s, src)
		return err
	})
	return crc, err
}

// PutFrom stores buf under key without sending it over the socket: Reserve,
// copy into the slot in the shared arena, Commit with the CRC-32C computed
// here (the server verifies it). Semantics as Put: existed is true when the
// key was already present (nothing was written). Concurrent PutFroms share
// their round trips (coalesce.go): a Reserve that finds
// Config.ZeroCopyInFlight Reserves of its namespace in flight (a Commit:
// that or twice GOMAXPROCS Commits) queues, and goes out batched with the others
// queued meanwhile when one returns; one that finds fewer goes out at
// once. A caller whose ctx ends while queued returns its error at once; a
// reservation it would have got is aborted.
func (c *Client) PutFrom(ctx context.Context, ns string, key, buf []byte, depth int32) (existed bool, err error) {
	if err := c.mapArenas(ctx, false); err != nil {
		return false, err
	}
	for attempt := 0; ; attempt++ {
		existed, err = c.putFrom(ctx, ns, key, buf, depth)
		// A checksum mismatch after a sidecar restart: the bytes went into
		// the old arena file. Remap and write again, once.
		if CodeOf(err) != CodeChecksum || attempt > 0 || !c.remapIfStale(ctx) {
			return existed, err
		}
	}
}

// putFrom is one zero-copy put: into an unbound reservation kept from an
// earlier put's Commit when the client holds one of this namespace and
// size (one round trip: the Commit binds the key and asks for the next),
// else into a slot Reserved for key (two). A spare that turns out lost
// (the sidecar restarted, or the slot outlived its deadline) makes it put
// again through a Reserve, once.
func (c *Client) putFrom(ctx context.Context, ns string, key, buf []byte, depth int32) (existed bool, err error) {
	existed, lost, err := c.putFromOnce(ctx, ns, key, buf, depth, true)
	if lost {
		c.abortQuietly(c.zc.dropSpares())
		existed, _, err = c.putFromOnce(ctx, ns, key, buf, depth, false)
	}
	return existed, err
}

// putFromOnce is putFrom, using a spare when useSpare; lost reports that
// the spare it used was gone.
func (c *Client) putFromOnce(ctx context.Context, ns string, key, buf []byte, depth int32, useSpare bool) (existed, lost bool, err error) {
	z := &c.zc
	size := int64(len(buf))
	var r Reservation
	spare := false
	if useSpare {
		r, spare = z.takeSpare(ns, size)
	}
	if !spare {
		r, err = z.reserves.do(ctx, flightKey{ns: ns}, ReserveItem{Key: key, Size: size, Depth: depth})
		if err != nil {
			return false, false, err
		}
		switch r.Code {
		case CodeOK:
		case CodeExists:
			return true, false, nil
		default:
			return false, false, &Error{Code: r.Code, Message: r.Message}
		}
	}
	crc, err := c.WriteSlot(ctx, r.Slot, buf)
	if err != nil {
		c.Abort(ctx, []int64{r.Token})
		c.remapIfStale(ctx)
		return false, false, err
	}
	item := CommitItem{Token: r.Token, Checksum: crc, HasChecksum: true}
	if spare {
		item.Key, item.Depth = key, depth
	}
	if z.commitNext.Load() && z.maxSpares > 0 {
		item.NextSize = size
	}
	res, err := z.commits.do(ctx, flightKey{}, item)
	if err != nil {
		return false, false, err
	}
	if n := res.next; n.Code == CodeOK && n.Token != 0 && !z.keepSpare(ns, size, n) {
		c.abortQuietly([]int64{n.Token})
	}
	switch CodeOf(res.err) {
	case CodeOK:
		return false, false, nil
	case CodeExists:
		return true, false, nil
	}
	return false, spare && CodeOf(res.err) == CodeLeaseExpired, res.err
}

// GetInto copies the block of key into buf without it crossing the socket:
// Acquire, copy from the shared arena, verify the CRC-32C (with
// SetVerifyReads(true)), Release. The release goes in the background,
// batched with other GetIntos' (one round trip per call), when the copy
// ended well before the lease deadline; else it is synchronous and a lease
// that expired during the copy fails the call with CodeLeaseExpired.
// Semantics as Get: found is false on a miss. n is the block's size; when
// buf is shorter, GetInto copies nothing and returns CodeTooLarge with n
// set, so the caller can retry with a larger buffer. Concurrent GetIntos
// share their Acquires (coalesce.go): one that finds
// Config.ZeroCopyInFlight Acquires of its namespace in flight queues, and
// goes out batched with the others queued meanwhile when one returns; one
// that finds fewer goes out at once. A caller whose ctx ends while queued
// returns its error at once; a lease it would have got is released.
func (c *Client) GetInto(ctx context.Context, ns string, key, buf []byte) (n int, found bool, err error) {
	if err := c.mapArenas(ctx, false); err != nil {
		return 0, false, err
	}
	for attempt := 0; ; attempt++ {
		l, err := c.zc.acquires.do(ctx, flightKey{ns: ns}, key)
		if err != nil {
			return 0, false, err
		}
		deadline := l.deadline
		switch l.Code {
		case CodeOK:
		case CodeNotFound:
			return 0, false, nil
		default:
			return 0, false, &Error{Code: l.Code, Message: "zero-copy: acquire failed"}
		}
		n = int(l.Slot.Length)
		var crc uint32
		var rerr error
		verify := c.zc.verify.Load()
		if verify {
			crc, rerr = c.ReadSlot(ctx, l.Slot, buf)
		} else {
			rerr = c.copySlot(ctx, l.Slot, buf)
		}
		// The lease protected the bytes if the copy ended before its
		// deadline (same host, same clock; the deadline is rounded down to
		// the millisecond): then the release can go in the background,
		// batched with others. Else release now and trust the server.
		var rel []error
		if time.Until(deadline) > leaseMargin {
			c.zc.rel.add(c, l.LeaseID)
		} else if rel, err = c.Release(ctx, []int64{l.LeaseID}); err != nil {
			return 0, false, err
		}
		switch {
		case rerr != nil:
			return n, false, rerr
		case len(rel) == 1 && rel[0] != nil:
			// Released after the deadline: the copy may be of reused bytes.
			return 0, false, rel[0]
		case !verify || crc == l.Checksum:
			return n, true, nil
		case attempt == 0 && c.remapIfStale(ctx):
			continue
		}
		return 0, false, &Error{Code: CodeChecksum, Message: fmt.Sprintf("zero-copy: block of %d bytes has CRC-32C %08x in the arena, %08x expected", n, crc, l.Checksum)}
	}
}
