package dram

import (
	"bytes"
	"errors"
	"os"
	"runtime/debug"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tidepool-kv/tidepool/cache"
)

// TestPin: the bytes in place, verified; a miss is not counted; a pin
// outlives any lease deadline (eviction and reclamation skip it), a delete
// while pinned frees the block at Release, and a flipped bit is reported.
func TestPin(t *testing.T) {
	cfg, fc := testConfig(t, 4<<20)
	cfg.VerifyReads = true // for the flipped bit below (the default does not check)
	tr := newTier(t, cfg)
	val := pattern("k", 1<<20)
	if _, err := tr.Put(ctx, "ns", []byte("k"), val, cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Pin(ctx, "ns", []byte("nope")); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("Pin of a missing key: %v", err)
	}
	if st := tr.Stats().Tiers[0]; st.Misses != 0 {
		t.Fatalf("a Pin miss was counted: %+v", st)
	}
	l, err := tr.Pin(ctx, "ns", []byte("k"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(l.Bytes(), val) || l.Info().Size != int64(len(val)) {
		t.Fatal("Pin returned other bytes")
	}
	if st := tr.Stats().Tiers[0]; st.Hits != 1 {
		t.Fatalf("a Pin hit was not counted: %+v", st)
	}
	// Far past every lease deadline, fill the tier: the pinned block stays.
	fc.Advance(time.Hour)
	for i := 0; i < 8; i++ {
		tr.Put(ctx, "fill", []byte{byte(i)}, pattern("f", 1<<20), cache.PutOptions{})
	}
	if !bytes.Equal(l.Bytes(), val) {
		t.Fatal("a pinned block was reclaimed")
	}
	// Deleted while pinned: gone from the index, freed at Release.
	if ok, err := tr.Delete(ctx, "ns", []byte("k")); !ok || err != nil {
		t.Fatalf("Delete: %v %v", ok, err)
	}
	used := tr.Stats().Tiers[0].UsedBytes
	if err := l.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if after := tr.Stats().Tiers[0].UsedBytes; after != used-l.(*Lease).b.foot {
		t.Fatalf("used %d -> %d after releasing a deleted pinned block of %d", used, after, l.(*Lease).b.foot)
	}

	// A flipped bit: ErrChecksum, counted, nothing pinned.
	if _, err := tr.Put(ctx, "ns", []byte("c"), val, cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	l, err = tr.Pin(ctx, "ns", []byte("c"))
	if err != nil {
		t.Fatal(err)
	}
	ai, off, _ := l.Location()
	l.Release()
	tr.arenas[ai].mem[off+4242] ^= 0x10
	if _, err := tr.Pin(ctx, "ns", []byte("c")); !errors.Is(err, cache.ErrChecksum) {
		t.Fatalf("Pin of a corrupt block: %v", err)
	}
	if st := tr.Stats().Tiers[0]; st.ChecksumFailures != 1 {
		t.Fatalf("ChecksumFailures = %d", st.ChecksumFailures)
	}
}

// TestCloseWaitsForPins: Close waits for a pin's Release; with a pin never
// released it gives up after closeWait, reports it and leaves the memory
// mapped (a writer still reading it must not fault).
func TestCloseWaitsForPins(t *testing.T) {
	cfg, _ := testConfig(t, 4<<20)
	tr, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	val := pattern("k", 100000)
	tr.Put(ctx, "ns", []byte("k"), val, cache.PutOptions{})
	l, err := tr.Pin(ctx, "ns", []byte("k"))
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- tr.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a pin was held", err)
	case <-time.After(50 * time.Millisecond):
	}
	l.Release()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}

	defer func(d time.Duration) { closeWait = d }(closeWait)
	closeWait = 20 * time.Millisecond
	tr, err = New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr.Put(ctx, "ns", []byte("k"), val, cache.PutOptions{})
	l, err = tr.Pin(ctx, "ns", []byte("k"))
	if err != nil {
		t.Fatal(err)
	}
	inPlace := l.Bytes() // as a socket write holds it
	if err := tr.Close(); err == nil {
		t.Fatal("Close with a pin never released reported nothing")
	}
	if !bytes.Equal(inPlace, val) {
		t.Fatal("the pinned bytes changed after Close")
	}
}

// TestCommitChecked: the block is published with the caller's checksum,
// not a recomputed one; should that checksum be wrong, the first verified
// read out reports the mismatch (a verified read never returns bytes that
// fail it).
func TestCommitChecked(t *testing.T) {
	cfg, _ := testConfig(t, 4<<20)
	cfg.VerifyReads = true // by default the scrubber, not the read, finds it
	tr := newTier(t, cfg)
	val := pattern("v", 70000)
	for _, tc := range []struct {
		key string
		crc uint32
		ok  bool
	}{{"right", cache.Checksum(val), true}, {"wrong", cache.Checksum(val) ^ 1, false}} {
		r, err := tr.Reserve(ctx, "ns", []byte(tc.key), int64(len(val)), cache.PutOptions{}, 0)
		if err != nil {
			t.Fatal(err)
		}
		copy(r.Bytes(), val)
		if _, err := r.CommitChecked(ctx, tc.crc); err != nil {
			t.Fatal(err)
		}
		info, ok := tr.Stat(ctx, "ns", []byte(tc.key))
		if !ok || info.Checksum != tc.crc {
			t.Fatalf("%s: stored checksum %08x, want %08x", tc.key, info.Checksum, tc.crc)
		}
		v, _, err := tr.Get(ctx, "ns", []byte(tc.key), nil)
		if tc.ok != (err == nil) || tc.ok && !bytes.Equal(v, val) || !tc.ok && !errors.Is(err, cache.ErrChecksum) {
			t.Fatalf("%s: Get = %d bytes, %v", tc.key, len(v), err)
		}
	}
}

// TestPinLandedFresh: a block checked in place as it landed
// (CommitChecked) is not checksummed again by its first Pin within
// landedFresh; later Pins, and a first Pin after that window, verify it as
// any other.
func TestPinLandedFresh(t *testing.T) {
	cfg, fc := testConfig(t, 4<<20)
	cfg.VerifyReads = true // the landing window matters only when Pin verifies
	tr := newTier(t, cfg)
	val := pattern("f", 200000)
	r, err := tr.Reserve(ctx, "ns", []byte("f"), int64(len(val)), cache.PutOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	copy(r.Bytes(), val)
	if _, err := r.CommitChecked(ctx, cache.Checksum(val)); err != nil {
		t.Fatal(err)
	}
	info, _ := tr.Stat(ctx, "ns", []byte("f"))
	l, err := tr.Acquire(ctx, "ns", []byte("f"), 0)
	if err != nil {
		t.Fatal(err)
	}
	ai, off, _ := l.Location()
	l.Release()
	tr.arenas[ai].mem[off+99] ^= 1 // damaged after landing
	l, err = tr.Pin(ctx, "ns", []byte("f"))
	if err != nil || l.Info().Checksum != info.Checksum {
		t.Fatalf("first Pin within the landing window: %v", err)
	}
	l.Release()
	if _, err := tr.Pin(ctx, "ns", []byte("f")); !errors.Is(err, cache.ErrChecksum) {
		t.Fatalf("second Pin: %v, want ErrChecksum", err)
	}

	// A first Pin after the window checks.
	r, err = tr.Reserve(ctx, "ns", []byte("h"), int64(len(val)), cache.PutOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	copy(r.Bytes(), val)
	if _, err := r.CommitChecked(ctx, cache.Checksum(val)); err != nil {
		t.Fatal(err)
	}
	l, err = tr.Acquire(ctx, "ns", []byte("h"), 0)
	if err != nil {
		t.Fatal(err)
	}
	ai, off, _ = l.Location()
	l.Release()
	tr.arenas[ai].mem[off+7] ^= 1
	fc.Advance(landedFresh)
	if _, err := tr.Pin(ctx, "ns", []byte("h")); !errors.Is(err, cache.ErrChecksum) {
		t.Fatalf("first Pin after the landing window: %v, want ErrChecksum", err)
	}
	// Commit (the engine's two-phase put) does not skip: its CRC is of
	// the slot, but nothing checked it against the writer's.
	r, err = tr.Reserve(ctx, "ns", []byte("g"), int64(len(val)), cache.PutOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	copy(r.Bytes(), val)
	if _, err := r.Commit(ctx, 0, false); err != nil {
		t.Fatal(err)
	}
	l, _ = tr.Pin(ctx, "ns", []byte("g"))
	ai, off, _ = l.Location()
	l.Release()
	tr.arenas[ai].mem[off+5] ^= 1
	if _, err := tr.Pin(ctx, "ns", []byte("g")); !errors.Is(err, cache.ErrChecksum) {
		t.Fatalf("Pin of a damaged committed block: %v, want ErrChecksum", err)
	}
	// Nor does CommitSummed (the put socket: the sidecar computed the
	// checksum as it wrote): its block is published with that checksum,
	// and the first Pin, in the window, checks it.
	r, err = tr.Reserve(ctx, "ns", []byte("s"), int64(len(val)), cache.PutOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	copy(r.Bytes(), val)
	if _, err := r.CommitSummed(ctx, cache.Checksum(val)); err != nil {
		t.Fatal(err)
	}
	if info, _ := tr.Stat(ctx, "ns", []byte("s")); info.Checksum != cache.Checksum(val) {
		t.Fatalf("CommitSummed stored checksum %08x, want %08x", info.Checksum, cache.Checksum(val))
	}
	l, err = tr.Acquire(ctx, "ns", []byte("s"), 0)
	if err != nil {
		t.Fatal(err)
	}
	ai, off, _ = l.Location()
	l.Release()
	tr.arenas[ai].mem[off+11] ^= 1
	if _, err := tr.Pin(ctx, "ns", []byte("s")); !errors.Is(err, cache.ErrChecksum) {
		t.Fatalf("first Pin of a damaged CommitSummed block in the window: %v, want ErrChecksum", err)
	}
}

// TestLeaseNotLengthenedByTierPins: the tier's own short pins on a leased
// block (a Get's copy, a Pin for a socket write, a scrub) end at their
// Release and leave the lease's deadline alone: once it passes, a put that
// needs the room evicts the block, and a deleted one is freed.
func TestLeaseNotLengthenedByTierPins(t *testing.T) {
	cfg, fc := testConfig(t, 4<<20)
	cfg.LeaseTimeout = 5 * time.Second
	tr := newTier(t, cfg)
	for i := range 4 {
		if _, err := tr.Put(ctx, "ns", []byte{byte(i)}, pattern("v", 1<<20-4096), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var leases []cache.Lease
	for i := range 4 {
		l, err := tr.Acquire(ctx, "ns", []byte{byte(i)}, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	// Within the lease, the tier pins each block for itself and lets go.
	if _, _, err := tr.Get(ctx, "ns", []byte{0}, nil); err != nil {
		t.Fatal(err)
	}
	p, err := tr.Pin(ctx, "ns", []byte{1})
	if err != nil {
		t.Fatal(err)
	}
	p.Release()
	sc, err := NewScrubber(tr, ScrubConfig{Rate: 1 << 40, Clock: fc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fc.Advance(time.Millisecond)
	if sc.step() == 0 {
		t.Fatal("the scrubber checked nothing")
	}
	if _, err := tr.Delete(ctx, "ns", []byte{3}); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Put(ctx, "ns", []byte("big"), pattern("b", 2<<20), cache.PutOptions{}); !errors.Is(err, cache.ErrNoSpace) {
		t.Fatalf("put within the leases: %v", err)
	}
	fc.Advance(2300 * time.Millisecond)
	if _, err := tr.Put(ctx, "ns", []byte("big"), pattern("b", 2<<20), cache.PutOptions{}); err != nil {
		t.Fatalf("put 2.3 s into 2 s leases: %v", err)
	}
	for _, l := range leases {
		if err := l.Release(); !errors.Is(err, cache.ErrLeaseExpired) && err != nil {
			t.Fatal(err)
		}
	}
}

// TestGetFaultReleasesPin: a Get whose copy faults writing the caller's
// memory (a mapping whose file shrank, as a buffer socket client's can)
// panics with the fault, as the engine API's buffer socket expects, and
// leaves no pin behind: the block, deleted, is freed at once.
func TestGetFaultReleasesPin(t *testing.T) {
	cfg, _ := testConfig(t, 4<<20)
	tr := newTier(t, cfg)
	val := pattern("k", 64<<10)
	if _, err := tr.Put(ctx, "ns", []byte("k"), val, cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp(t.TempDir(), "dst")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(len(val))); err != nil {
		t.Fatal(err)
	}
	dst, err := unix.Mmap(int(f.Fd()), 0, len(val), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(dst)
	if err := f.Truncate(0); err != nil { // every page of dst now faults
		t.Fatal(err)
	}
	faulted := func() (fault any) {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() { fault = recover() }()
		tr.Get(ctx, "ns", []byte("k"), dst)
		return nil
	}()
	if faulted == nil {
		t.Fatal("Get into a truncated mapping did not fault")
	}
	used := tr.Stats().Tiers[0].UsedBytes
	if ok, err := tr.Delete(ctx, "ns", []byte("k")); !ok || err != nil {
		t.Fatalf("Delete: %v %v", ok, err)
	}
	if after := tr.Stats().Tiers[0].UsedBytes; after >= used {
		t.Fatalf("used %d -> %d: the faulted Get still pins the block", used, after)
	}
}
