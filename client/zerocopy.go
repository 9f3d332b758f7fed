package client

// Zero-copy calls (docs/zerocopy.md). The sidecar's DRAM tier lives in
// arena files in a directory both containers of the pod mount; Hello lists
// them. The client maps each file read-only (MAP_SHARED) on first use and
// reads leased blocks in place; it writes a reserved slot through a
// mapping that only the writing thread can write, for the copy
// (WriteKeyed, where the machine has memory protection keys), or with
// pwrite on the arena file, so no block byte crosses the socket.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tidepool-kv/tidepool/internal/crc32c"
	"github.com/tidepool-kv/tidepool/internal/pkey"

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

// WriteMode says how PutFrom writes a reserved slot.
type WriteMode int

const (
	// WritePwrite copies with pwrite(2) on the arena file, after
	// checksumming the source (what WriteKeyed falls back to without
	// protection keys: it writes nothing outside the slot and needs no
	// writable mapping).
	WritePwrite WriteMode = iota
	// WriteMmap makes the slot's pages writable for a copy with the
	// checksum fused in, and read-only again after: the client keeps one
	// MAP_SHARED mapping of each arena, read-only except for the pages of
	// the slots being written (mprotect windows), so a stray write of the
	// process outside them faults instead of changing a block. (Until
	// issue 17 it mapped and unmapped the slot's pages per put, which was
	// slow.)
	WriteMmap
	// WriteMapped keeps a read-write MAP_SHARED mapping of each whole arena
	// and copies into the slot with the checksum fused in (the fastest).
	// The process then has every arena mapped writable, so a stray write
	// of its own can damage other blocks: the trust is that of the
	// read-write descriptor the other modes hold, with less margin.
	WriteMapped
	// WriteKeyed keeps a read-write MAP_SHARED mapping of each arena
	// whose pages carry a memory protection key (x86 PKU) that denies
	// every thread access to them, and copies into a slot with the
	// checksum fused in on a thread that allows itself access for the
	// copy alone (internal/pkey): as fast as WriteMapped, and a stray
	// write of the process to an arena faults, as with the read-only
	// mappings. The default. Where the CPU or kernel has no protection
	// keys, or none is free, PutFrom writes with pwrite instead.
	WriteKeyed
)

// writeKey is the process's protection key for WriteKeyed, allocated on
// first use; every client shares it (a process has 15).
var writeKey struct {
	once sync.Once
	k    pkey.Key
	err  error
}

// keyForWrites returns the process's key (a variable: tests take the
// keys away).
var keyForWrites = func() (pkey.Key, error) {
	writeKey.once.Do(func() { writeKey.k, writeKey.err = pkey.Alloc() })
	return writeKey.k, writeKey.err
}

// arenaMap is one arena file mapped read-only, plus a descriptor opened
// read-write for writing reserved slots.
type arenaMap struct {
	path string
	size int64
	ino  uint64
	mem  []byte // PROT_READ, MAP_SHARED
	rw   *os.File

	wonce sync.Once
	wmem  []byte // PROT_READ|PROT_WRITE, MAP_SHARED (WriteMapped), made on first use
	werr  error

	konce   sync.Once
	kmem    []byte // PROT_READ|PROT_WRITE, MAP_SHARED, tagged with writeKey (WriteKeyed), made on first use
	kerr    error
	kfilled []atomic.Bool // per fillChunk of kmem: its page table filled (fill)
	knofill atomic.Bool   // the kernel cannot (before Linux 5.14): writes fault page by page

	// WriteMmap: a MAP_SHARED mapping of the whole arena, PROT_READ but for
	// the pages of slots being written, made on first use.
	vonce sync.Once
	vmem  []byte
	verr  error
	vmu   sync.Mutex      // orders the mprotect calls of concurrent writers
	vrefs map[int64]int32 // guarded by vmu: writers of each page a slot shares with a neighbour
}

// window returns the mapping of WriteMmap.
func (a *arenaMap) window() ([]byte, error) {
	a.vonce.Do(func() {
		a.vmem, a.verr = syscall.Mmap(int(a.rw.Fd()), 0, int(a.size), syscall.PROT_READ, syscall.MAP_SHARED)
		if a.verr != nil {
			a.verr = fmt.Errorf("tidepool: zero-copy: mmap %s: %w", a.path, a.verr)
		}
		a.vrefs = map[int64]int32{}
	})
	return a.vmem, a.verr
}

// writeWindow copies buf to offset off of the arena through a window made
// writable for the copy, and returns its CRC-32C.
func (a *arenaMap) writeWindow(off int64, buf []byte) (uint32, error) {
	mem, err := a.window()
	if err != nil || len(buf) == 0 {
		return 0, err
	}
	w, err := a.openWindow(off, int64(len(buf)))
	if err != nil {
		return 0, err
	}
	crc := crc32c.Copy(mem[off:off+int64(len(buf))], buf)
	return crc, a.closeWindow(w)
}

// A slotWindow is the pages [p0, p1) of a slot made writable, and those of
// them it shares with a neighbour.
type slotWindow struct {
	p0, p1 int64
	shared []int64
}

// openWindow makes the pages of the n > 0 bytes at off writable. Pages
// inside the slot belong to it alone; its first and last page may hold a
// neighbour's bytes too (small values share pages) and be in another
// writer's window, so those two are counted, and made read-only by the
// last writer to close its window.
func (a *arenaMap) openWindow(off, n int64) (slotWindow, error) {
	pg := int64(os.Getpagesize())
	w := slotWindow{p0: off / pg, p1: (off + n + pg - 1) / pg}
	if off%pg != 0 {
		w.shared = append(w.shared, w.p0)
	}
	if (off+n)%pg != 0 && (len(w.shared) == 0 || w.shared[0] != w.p1-1) {
		w.shared = append(w.shared, w.p1-1)
	}
	a.vmu.Lock()
	defer a.vmu.Unlock()
	for _, p := range w.shared {
		a.vrefs[p]++
	}
	if err := syscall.Mprotect(a.vmem[w.p0*pg:min(w.p1*pg, int64(len(a.vmem)))], syscall.PROT_READ|syscall.PROT_WRITE); err != nil {
		a.releaseShared(w)
		return w, fmt.Errorf("tidepool: zero-copy: mprotect slot writable: %w", err)
	}
	return w, nil
}

// closeWindow makes the pages of w read-only again, but for shared pages
// still in another window.
func (a *arenaMap) closeWindow(w slotWindow) error {
	pg := int64(os.Getpagesize())
	a.vmu.Lock()
	defer a.vmu.Unlock()
	q0, q1 := w.p0, w.p1
	for _, p := range a.releaseShared(w) {
		if p == w.p0 {
			q0 = w.p0 + 1
		}
		if p == w.p1-1 {
			q1 = w.p1 - 1
		}
	}
	if q0 >= q1 {
		return nil
	}
	if err := syscall.Mprotect(a.vmem[q0*pg:min(q1*pg, int64(len(a.vmem)))], syscall.PROT_READ); err != nil {
		return fmt.Errorf("tidepool: zero-copy: mprotect slot read-only: %w", err)
	}
	return nil
}

// releaseShared uncounts the shared pages of w and returns those still in
// another window. Called with vmu held.
func (a *arenaMap) releaseShared(w slotWindow) (held []int64) {
	for _, p := range w.shared {
		if a.vrefs[p]--; a.vrefs[p] > 0 {
			held = append(held, p)
		} else {
			delete(a.vrefs, p)
		}
	}
	return held
}

// writable returns the read-write mapping of the whole arena.
func (a *arenaMap) writable() ([]byte, error) {
	a.wonce.Do(func() {
		a.wmem, a.werr = syscall.Mmap(int(a.rw.Fd()), 0, int(a.size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
		if a.werr != nil {
			a.werr = fmt.Errorf("tidepool: zero-copy: mmap %s writable: %w", a.path, a.werr)
		}
	})
	return a.wmem, a.werr
}

// keyed returns the mapping of WriteKeyed and its key.
func (a *arenaMap) keyed() ([]byte, pkey.Key, error) {
	k, err := keyForWrites()
	if err != nil {
		return nil, 0, err
	}
	a.konce.Do(func() {
		mem, err := syscall.Mmap(int(a.rw.Fd()), 0, int(a.size), syscall.PROT_NONE, syscall.MAP_SHARED)
		if err == nil {
			// Tagged before it is writable: no moment without the key.
			if err = k.Protect(mem, syscall.PROT_READ|syscall.PROT_WRITE); err != nil {
				syscall.Munmap(mem)
			}
		}
		if err != nil {
			a.kerr = fmt.Errorf("tidepool: zero-copy: mmap %s keyed: %w", a.path, err)
			return
		}
		a.kmem = mem
		a.kfilled = make([]atomic.Bool, (a.size+fillChunk-1)/fillChunk)
	})
	return a.kmem, k, a.kerr
}

// fillChunk is the stretch of a keyed mapping whose page table fill fills
// at once, at the first write into it.
const fillChunk = 2 << 20

// madvPopulateWrite is MADV_POPULATE_WRITE (Linux ≥ 5.14): fault the range
// in, writable, now.
const madvPopulateWrite = 23

// fill faults in the fillChunks of the keyed mapping that [off, off+n)
// touches and no write touched before, one madvise each: a write fault per
// 4 KiB page costs about twice as much as the kernel filling the page table
// in one call (the first pass of a process through the arenas). It runs
// inside the key's Write: the kernel checks the caller's access rights as
// it faults the pages in. Two writers may fill one chunk at once; harmless.
func (a *arenaMap) fill(off, n int64) {
	if n <= 0 || a.knofill.Load() {
		return
	}
	for i := off / fillChunk; i <= (off+n-1)/fillChunk; i++ {
		if a.kfilled[i].Load() {
			continue
		}
		start := i * fillChunk
		if err := syscall.Madvise(a.kmem[start:min(start+fillChunk, a.size)], madvPopulateWrite); err != nil {
			a.knofill.Store(true) // EINVAL before 5.14
			return
		}
		a.kfilled[i].Store(true)
	}
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

// spareKey groups unbound reservations: a put uses one of its namespace
// and exact size.
type spareKey struct {
	ns   string
	size int64
}

// spareMargin: a spare reservation with less time than this left before
// its deadline is not used (the write and the Commit must land before it).
const spareMargin = 5 * time.Second

// takeSpare returns an unbound reservation of ns for size bytes, if the
// client holds one with time left.
func (z *zeroCopy) takeSpare(ns string, size int64) (Reservation, bool) {
	z.spareMu.Lock()
	defer z.spareMu.Unlock()
	k := spareKey{ns, size}
	list := z.spares[k]
	for len(list) > 0 {
		r := list[len(list)-1]
		list = list[:len(list)-1]
		z.nspares--
		if time.Until(r.Deadline) > spareMargin {
			z.spares[k] = list
			return r, true
		}
		// Too close to its deadline: dropped (the server reclaims it).
	}
	delete(z.spares, k)
	return Reservation{}, false
}

// keepSpare keeps an unbound reservation for a later put; it reports false
// (the caller aborts it) when the client holds enough.
func (z *zeroCopy) keepSpare(ns string, size int64, r Reservation) bool {
	z.spareMu.Lock()
	defer z.spareMu.Unlock()
	if z.nspares >= z.maxSpares {
		return false
	}
	if z.spares == nil {
		z.spares = map[spareKey][]Reservation{}
	}
	k := spareKey{ns, size}
	z.spares[k] = append(z.spares[k], r)
	z.nspares++
	return true
}

// dropSpares forgets every spare reservation and returns their tokens.
func (z *zeroCopy) dropSpares() []int64 {
	z.spareMu.Lock()
	defer z.spareMu.Unlock()
	var tokens []int64
	for _, list := range z.spares {
		for _, r := range list {
			tokens = append(tokens, r.Token)
		}
	}
	z.spares, z.nspares = nil, 0
	return tokens
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

// SetWriteMode chooses how PutFrom writes slots (benchmarks compare them).
// The default is WriteKeyed, which writes with pwrite where the machine
// has no protection keys.
func (c *Client) SetWriteMode(m WriteMode) {
	c.zc.mode.Store(int32(m))
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

// releaseBatch is the most lease ids in one background Release (under the
// server's default max_batch).
const releaseBatch = 256

// releaser releases the leases of GetInto in the background, batching the
// ids queued while a Release is in flight into the next one: one round trip
// per GetInto instead of two. Close releases what is queued.
type releaser struct {
	mu      sync.Mutex
	ids     []int64
	kick    chan struct{} // buffered 1: ids are queued
	done    chan struct{} // closed by stop
	exited  chan struct{} // closed when the goroutine ends
	started bool
	stopped bool

	calls, items atomic.Int64 // Releases made, ids sent in them
}

// add queues id, starting the goroutine on first use. After stop the
// release is synchronous.
func (r *releaser) add(c *Client, id int64) {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		c.Release(context.Background(), []int64{id})
		return
	}
	if !r.started {
		r.started = true
		r.kick = make(chan struct{}, 1)
		r.done = make(chan struct{})
		r.exited = make(chan struct{})
		go r.loop(c)
	}
	r.ids = append(r.ids, id)
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *releaser) loop(c *Client) {
	defer close(r.exited)
	for {
		select {
		case <-r.kick:
		case <-r.done:
			r.flush(c)
			return
		}
		r.flush(c)
	}
}

// flush releases every queued id. Failures need no handling: an id that
// could not be released expires at its deadline.
func (r *releaser) flush(c *Client) {
	for {
		r.mu.Lock()
		n := min(len(r.ids), releaseBatch)
		batch := append([]int64(nil), r.ids[:n]...)
		r.ids = r.ids[n:]
		r.mu.Unlock()
		if n == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r.calls.Add(1)
		r.items.Add(int64(len(batch)))
		c.Release(ctx, batch)
		cancel()
	}
}

// stop releases what is queued and ends the goroutine. Safe to call twice.
func (r *releaser) stop() {
	r.mu.Lock()
	started, stopped := r.started, r.stopped
	r.stopped = true
	r.mu.Unlock()
	if started && !stopped {
		close(r.done)
		<-r.exited
	}
}

// errNoArenas reports a server that offers no arenas or that this host
// cannot map (the client does not share the sidecar's volume).
func errNoArenas(format string, args ...any) error {
	return &Error{Code: CodeUnavailable, Message: "zero-copy: " + fmt.Sprintf(format, args...)}
}

// mapArenas maps the arenas listed by Hello unless they are mapped
// already; with remap it replaces the current mappings (the server
// restarted and made new files).
func (c *Client) mapArenas(ctx context.Context, remap bool) error {
	z := &c.zc
	if !remap {
		// The common case, without z.mu (every GetInto and PutFrom asks).
		z.rw.RLock()
		mapped := z.arenas != nil && !z.closed
		z.rw.RUnlock()
		if mapped {
			return nil
		}
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	z.rw.RLock()
	have, closed := z.arenas != nil, z.closed
	z.rw.RUnlock()
	if closed {
		return errNoArenas("client closed")
	}
	if have && !remap {
		return nil
	}
	h, err := c.Hello(ctx)
	if err != nil {
		return err
	}
	if len(h.Arenas) == 0 {
		return errNoArenas("the server offers no shared arenas")
	}
	if h.LayoutVersion != ArenaLayoutVersion {
		return errNoArenas("arena layout version %d, this client knows %d", h.LayoutVersion, ArenaLayoutVersion)
	}
	if h.Limits != nil && h.Limits.MaxBatch > 0 {
		z.maxBatch.Store(h.Limits.MaxBatch)
	}
	z.commitNext.Store(slices.Contains(h.Features, FeatureCommitNext))
	if remap {
		c.abortQuietly(z.dropSpares()) // reserved in the arenas being replaced
	}
	var out []*arenaMap
	fail := func(err error) error {
		for _, a := range out {
			a.close()
		}
		return err
	}
	for i, ai := range h.Arenas {
		if ai == nil || int(ai.Id) != i || ai.Size <= 0 {
			return fail(errNoArenas("malformed arena list"))
		}
		a, err := openArena(ai.Path, ai.Size)
		if err != nil {
			return fail(errNoArenas("%v (is the arena directory shared with this container?)", err))
		}
		out = append(out, a)
	}
	z.rw.Lock()
	defer z.rw.Unlock()
	if z.closed {
		return fail(errNoArenas("client closed"))
	}
	for _, a := range z.arenas {
		a.close()
	}
	z.arenas = out
	return nil
}

// withArenas maps the arenas if needed and runs fn while they stay mapped.
func (c *Client) withArenas(ctx context.Context, fn func([]*arenaMap) error) error {
	if err := c.mapArenas(ctx, false); err != nil {
		return err
	}
	z := &c.zc
	z.rw.RLock()
	defer z.rw.RUnlock()
	if z.closed || z.arenas == nil {
		return errNoArenas("client closed")
	}
	return fn(z.arenas)
}

func openArena(path string, size int64) (*arenaMap, error) {
	rw, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	st, err := rw.Stat()
	if err != nil {
		rw.Close()
		return nil, err
	}
	if st.Size() < size {
		rw.Close()
		return nil, fmt.Errorf("arena %s is %d bytes, Hello says %d", path, st.Size(), size)
	}
	var ino uint64
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		ino = s.Ino
	}
	mem, err := syscall.Mmap(int(rw.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		rw.Close()
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	return &arenaMap{path: path, size: size, ino: ino, mem: mem, rw: rw}, nil
}

// stale reports whether the file at a.path is no longer the mapped one.
func (a *arenaMap) stale() bool {
	var st syscall.Stat_t
	if err := syscall.Stat(a.path, &st); err != nil {
		return true
	}
	return st.Ino != a.ino
}

func (a *arenaMap) close() {
	if a.vmem != nil {
		_ = syscall.Munmap(a.vmem)
		a.vmem = nil
	}
	if a.wmem != nil {
		_ = syscall.Munmap(a.wmem)
		a.wmem = nil
	}
	if a.kmem != nil {
		_ = syscall.Munmap(a.kmem)
		a.kmem = nil
	}
	if a.mem != nil {
		_ = syscall.Munmap(a.mem)
		a.mem = nil
	}
	if a.rw != nil {
		a.rw.Close()
		a.rw = nil
	}
}

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

// view returns the read-only bytes of s.
func view(arenas []*arenaMap, s Slot) ([]byte, error) {
	if s.Arena < 0 || int(s.Arena) >= len(arenas) || s.Offset < 0 || s.Length < 0 || s.Offset+s.Length > arenas[s.Arena].size {
		return nil, &Error{Code: CodeInternal, Message: fmt.Sprintf("zero-copy: slot %+v outside the arenas", s)}
	}
	return arenas[s.Arena].mem[s.Offset : s.Offset+s.Length : s.Offset+s.Length], nil
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

// writeSlot writes buf into a reserved slot and returns its CRC-32C.
func (c *Client) writeSlot(arenas []*arenaMap, s Slot, buf []byte) (uint32, error) {
	if _, err := view(arenas, s); err != nil {
		return 0, err
	}
	a := arenas[s.Arena]
	switch WriteMode(c.zc.mode.Load()) {
	case WriteMapped:
		mem, err := a.writable()
		if err != nil {
			return 0, err
		}
		return crc32c.Copy(mem[s.Offset:s.Offset+s.Length], buf), nil
	case WriteMmap:
		return a.writeWindow(s.Offset, buf)
	case WriteKeyed:
		if mem, k, err := a.keyed(); err == nil {
			var crc uint32
			k.Write(func() {
				a.fill(s.Offset, s.Length)
				crc = crc32c.Copy(mem[s.Offset:s.Offset+s.Length], buf)
			})
			return crc, nil
		} else if !errors.Is(err, pkey.ErrUnsupported) {
			return 0, err
		}
		// No protection keys: pwrite.
	}
	// A piece at a time: pwrite copies it (reading buf from memory), then
	// the checksum reads it again from cache. Checksumming the whole of buf
	// first read it twice from memory (a 1 MiB CRC-32C from memory runs at
	// a third of its speed from cache).
	var crc uint32
	for off := int64(0); off < int64(len(buf)); off += pwriteChunk {
		p := buf[off:min(off+pwriteChunk, int64(len(buf)))]
		if _, err := a.rw.WriteAt(p, s.Offset+off); err != nil {
			return 0, fmt.Errorf("tidepool: zero-copy: write slot: %w", err)
		}
		crc = crc32c.Update(crc, p)
	}
	return crc, nil
}

// pwriteChunk is the piece writeSlot writes with one pwrite before it
// checksums it: small enough to stay in the L2 cache, large enough that
// the syscalls cost little (8 per MiB).
const pwriteChunk = 128 << 10

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

// remapIfStale remaps the arenas when a file was replaced (server restart)
// and reports whether it did.
func (c *Client) remapIfStale(ctx context.Context) bool {
	z := &c.zc
	z.rw.RLock()
	stale := false
	for _, a := range z.arenas {
		if a.stale() {
			stale = true
			break
		}
	}
	z.rw.RUnlock()
	return stale && c.mapArenas(ctx, true) == nil
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
