//go:build linux

package dram

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
)

// TestReserveUnbound: a slot reserved ahead takes its key at Bind and is
// then committed like any other; what Bind and Commit refuse leaves the
// tier as it was.
func TestReserveUnbound(t *testing.T) {
	cfg, _ := testConfig(t, 4<<20)
	tr := newTier(t, cfg)
	val := pattern("k", 100<<10)
	size := int64(len(val))

	r, err := tr.ReserveUnbound(ctx, "ns", size, cache.PutOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	copy(r.Bytes(), val)
	if got := tr.unboundBytes.Load(); got != footprint(size) {
		t.Fatalf("unbound bytes %d, want %d", got, footprint(size))
	}
	if err := r.Bind([]byte(""), cache.PutOptions{}); !errors.Is(err, cache.ErrInvalidKey) {
		t.Fatalf("Bind of an empty key: %v", err)
	}
	if err := r.Bind([]byte("k"), cache.PutOptions{Depth: 7}); err != nil {
		t.Fatal(err)
	}
	if err := r.Bind([]byte("k2"), cache.PutOptions{}); err == nil {
		t.Fatal("a second Bind succeeded")
	}
	if got := tr.unboundBytes.Load(); got != 0 {
		t.Fatalf("unbound bytes %d after Bind", got)
	}
	if existed, err := r.Commit(ctx, cache.Checksum(val), true); existed || err != nil {
		t.Fatalf("Commit = %v, %v", existed, err)
	}
	got, info, err := tr.Get(ctx, "ns", []byte("k"), nil)
	if err != nil || !bytes.Equal(got, val) || info.Depth != 7 {
		t.Fatalf("Get after Commit: %v, depth %d", err, info.Depth)
	}

	// Bind to a key that is present: ErrExists, and the slot stays open
	// (the caller aborts it).
	r2, err := tr.ReserveUnbound(ctx, "ns", size, cache.PutOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := r2.Bind([]byte("k"), cache.PutOptions{}); !errors.Is(err, cache.ErrExists) {
		t.Fatalf("Bind to a stored key: %v", err)
	}
	if err := r2.Abort(); err != nil {
		t.Fatal(err)
	}

	// Commit without Bind fails and frees the slot.
	r3, err := tr.ReserveUnbound(ctx, "ns", size, cache.PutOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r3.Commit(ctx, 0, false); !errors.Is(err, cache.ErrInvalidKey) {
		t.Fatalf("Commit without a key: %v", err)
	}
	if rs := tr.ReserveStats(); rs.Open != 0 || rs.OpenBytes != 0 || tr.unboundBytes.Load() != 0 {
		t.Fatalf("left reserved: %+v, unbound %d", rs, tr.unboundBytes.Load())
	}
	if st := tr.Stats().Tiers[0]; st.Blocks != 1 || st.UsedBytes != footprint(size) {
		t.Fatalf("stats: %+v", st)
	}
}

// TestReserveUnboundShare: slots reserved ahead take at most
// 1/MaxUnboundShare of the capacity; past it ReserveUnbound is refused
// without evicting anything, and a bound Reserve still works.
func TestReserveUnboundShare(t *testing.T) {
	cfg, _ := testConfig(t, 4<<20)
	tr := newTier(t, cfg)
	if _, err := tr.Put(ctx, "ns", []byte("resident"), pattern("r", 64<<10), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	slot := int64(64 << 10)
	n := int(cfg.Capacity / MaxUnboundShare / footprint(slot))
	var held []cache.Reservation
	for i := 0; i < n; i++ {
		r, err := tr.ReserveUnbound(ctx, "ns", slot, cache.PutOptions{}, 0)
		if err != nil {
			t.Fatalf("slot %d of %d: %v", i, n, err)
		}
		held = append(held, r)
	}
	if _, err := tr.ReserveUnbound(ctx, "ns", slot, cache.PutOptions{}, 0); !errors.Is(err, cache.ErrNoSpace) {
		t.Fatalf("past the share: %v", err)
	}
	if _, ok := tr.Stat(ctx, "ns", []byte("resident")); !ok {
		t.Fatal("a refused ReserveUnbound evicted a block")
	}
	r := reserve(t, tr, "ns", "bound", slot, 0)
	if err := r.Abort(); err != nil {
		t.Fatal(err)
	}
	// A bound slot no longer counts: room for one more.
	if err := held[0].Bind([]byte("x"), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.ReserveUnbound(ctx, "ns", slot, cache.PutOptions{}, 0); err != nil {
		t.Fatalf("after a Bind: %v", err)
	}
}

// TestReserveUnboundReclaimed: a slot reserved ahead and never used is
// reclaimed at its deadline like any reservation; a late Bind says so.
func TestReserveUnboundReclaimed(t *testing.T) {
	cfg, fc := testConfig(t, 4<<20)
	tr := newTier(t, cfg)
	r, err := tr.ReserveUnbound(ctx, "ns", 64<<10, cache.PutOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	fc.Advance(cfg.ReserveTimeout + time.Second)
	if n := tr.Reap(); n != 1 {
		t.Fatalf("Reap reclaimed %d", n)
	}
	if err := r.Bind([]byte("k"), cache.PutOptions{}); !errors.Is(err, cache.ErrLeaseExpired) {
		t.Fatalf("Bind after the deadline: %v", err)
	}
	if rs := tr.ReserveStats(); rs.Open != 0 || rs.OpenBytes != 0 || tr.unboundBytes.Load() != 0 || tr.Stats().Tiers[0].UsedBytes != 0 {
		t.Fatalf("left: %+v, unbound %d", rs, tr.unboundBytes.Load())
	}
}
