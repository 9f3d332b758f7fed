package proxy

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
)

// TestReservePut: a value written into its slot and committed reads back;
// a present key is existed with nothing to write; an aborted one leaves
// nothing; bad keys and sizes are refused before anything is reserved;
// a durable put and a store without arenas are ErrNoStream.
func TestReservePut(t *testing.T) {
	f := newZC(t, 4<<20, nil)
	val := value("in place", 200<<10)
	pp, existed, err := f.p.ReservePut(bg, "ns", []byte("k"), int64(len(val)), cache.PutOptions{Depth: 1})
	if err != nil || existed || pp == nil {
		t.Fatalf("ReservePut = %v, %v, %v", pp, existed, err)
	}
	copy(pp.Bytes(), val)
	if existed, err := pp.Commit(bg, cache.Checksum(val)); err != nil || existed {
		t.Fatalf("Commit = %v, %v", existed, err)
	}
	if got, _, err := f.p.Get(bg, "ns", []byte("k"), ScopeLocal); err != nil || !bytes.Equal(got, val) {
		t.Fatalf("Get after the commit: %v", err)
	}
	if pp, existed, err := f.p.ReservePut(bg, "ns", []byte("k"), 10, cache.PutOptions{}); err != nil || !existed || pp != nil {
		t.Fatalf("ReservePut of a present key = %v, %v, %v", pp, existed, err)
	}

	used := f.tier.Stats().Tiers[0].UsedBytes
	pp, _, err = f.p.ReservePut(bg, "ns", []byte("aborted"), 100<<10, cache.PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pp.Abort()
	if _, _, err := f.p.Get(bg, "ns", []byte("aborted"), ScopeLocal); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("Get of an aborted put: %v", err)
	}
	if u := f.tier.Stats().Tiers[0].UsedBytes; u != used {
		t.Fatalf("the tier uses %d bytes after the abort, %d before", u, used)
	}

	for _, tc := range []struct {
		key  []byte
		size int64
		want error
	}{
		{nil, 1, ErrInvalidArgument},
		{[]byte("k2"), -1, ErrInvalidArgument},
		{[]byte("k2"), f.p.cfg.MaxValueBytes + 1, cache.ErrTooLarge},
	} {
		if pp, _, err := f.p.ReservePut(bg, "ns", tc.key, tc.size, cache.PutOptions{}); !errors.Is(err, tc.want) || pp != nil {
			t.Fatalf("ReservePut(%q, %d) = %v, want %v", tc.key, tc.size, err, tc.want)
		}
	}
	if _, _, err := f.p.ReservePut(bg, "ns", []byte("d"), 10, cache.PutOptions{Durable: true}); !errors.Is(err, ErrNoStream) {
		t.Fatalf("durable ReservePut = %v, want ErrNoStream", err)
	}
	if u := f.tier.Stats().Tiers[0].UsedBytes; u != used {
		t.Fatalf("refused puts left %d bytes used, %d before", u, used)
	}
	plain := newZC(t, 4<<20, func(t *dram.Tier) Deps { return Deps{Store: t} })
	if _, _, err := plain.p.ReservePut(bg, "ns", []byte("k"), 10, cache.PutOptions{}); !errors.Is(err, ErrNoStream) {
		t.Fatalf("ReservePut without arenas = %v, want ErrNoStream", err)
	}
}

// TestReservePutPushesToOwners: a put written in place on a node that does
// not own the key reaches the owner, as a Put does.
func TestReservePutPushesToOwners(t *testing.T) {
	a, b, key := twoNodes(t)
	val := value("pushed in place", 100<<10)
	ctx := bg
	pp, _, err := a.p.ReservePut(ctx, "ns", key, int64(len(val)), cache.PutOptions{SyncReplicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	copy(pp.Bytes(), val)
	if _, err := pp.Commit(ctx, cache.Checksum(val)); err != nil {
		t.Fatal(err)
	}
	got, _, err := b.p.Get(bg, "ns", key, ScopeLocal)
	if err != nil || !bytes.Equal(got, val) {
		t.Fatalf("owner b after the put on a: %v", err)
	}
}

// TestReservePutTooSlow: a value still being written when its slot's
// deadline passed is not stored, and the error says why.
func TestReservePutTooSlow(t *testing.T) {
	f := newZC(t, 4<<20, nil)
	val := value("slow", 64<<10)
	pp, _, err := f.p.ReservePut(bg, "ns", []byte("slow"), int64(len(val)), cache.PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	copy(pp.Bytes(), val)
	f.fc.Advance(f.cfg.ReserveTimeout + time.Second)
	if _, err := pp.Commit(bg, cache.Checksum(val)); !errors.Is(err, cache.ErrUnavailable) || errors.Is(err, cache.ErrLeaseExpired) {
		t.Fatalf("Commit after the deadline = %v, want ErrUnavailable", err)
	}
	if _, _, err := f.p.Get(bg, "ns", []byte("slow"), ScopeLocal); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("Get of a put past its deadline: %v", err)
	}
}
