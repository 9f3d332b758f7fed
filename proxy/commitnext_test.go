package proxy

import (
	"bytes"
	"errors"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
)

// TestCommitNext: a put into a slot reserved ahead takes one call: the
// Commit binds the key, checks the bytes, and answers the slot of the next
// put. What the calls refuse leaves nothing reserved.
func TestCommitNext(t *testing.T) {
	f := newZC(t, 8<<20, nil)
	a, b := value("a", 300<<10), value("b", 300<<10)
	size := int64(len(a))

	rs, err := f.p.Reserve(bg, "ns", []ReserveItem{
		{Size: size, Unbound: true},
		{Key: []byte("x"), Size: size, Unbound: true}, // an unbound item has no key
		{Size: -1, Unbound: true},
		{Size: 5 << 20, Unbound: true},
	}, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Err != nil || !errors.Is(rs[1].Err, ErrInvalidArgument) || !errors.Is(rs[2].Err, ErrInvalidArgument) ||
		!errors.Is(rs[3].Err, cache.ErrTooLarge) {
		t.Fatalf("Reserve results %+v", rs)
	}
	f.writeSlot(t, rs[0].Slot, a)
	cs, next, err := f.p.CommitNext(bg, []CommitItem{{Token: rs[0].Token, Checksum: cache.Checksum(a), HasChecksum: true,
		Key: []byte("a"), Depth: 3, NextSize: size}})
	if err != nil || cs[0] != nil {
		t.Fatalf("CommitNext: %v %v", err, cs)
	}
	if len(next) != 1 || next[0].Err != nil || next[0].Token == 0 || next[0].Slot.Length != size {
		t.Fatalf("next = %+v", next)
	}
	if zs := f.p.ZeroCopyStats(); zs.ReservedAhead != 1 || zs.LiveReservations != 1 {
		t.Fatalf("stats with one slot reserved ahead: %+v", zs)
	}
	if got, info, err := f.p.Get(bg, "ns", []byte("a"), ScopeLocal); err != nil || !bytes.Equal(got, a) || info.Depth != 3 {
		t.Fatalf("Get a: %v depth %d", err, info.Depth)
	}

	// The next slot, bound to b at its commit; asking for none answers nil.
	f.writeSlot(t, next[0].Slot, b)
	cs, none, err := f.p.CommitNext(bg, []CommitItem{{Token: next[0].Token, Checksum: cache.Checksum(b), HasChecksum: true, Key: []byte("b")}})
	if err != nil || cs[0] != nil || none != nil {
		t.Fatalf("CommitNext b: %v %v %+v", err, cs, none)
	}
	if got, _, err := f.p.Get(bg, "ns", []byte("b"), ScopeLocal); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("Get b: %v", err)
	}

	// Refused commits: an unbound slot without its key, a bound one with a
	// key, an unbound one bound to a stored key (EXISTS), bad bytes.
	unbound := func() ReserveResult {
		rs, err := f.p.Reserve(bg, "ns", []ReserveItem{{Size: size, Unbound: true}}, 0, false)
		if err != nil || rs[0].Err != nil {
			t.Fatalf("Reserve: %v %+v", err, rs)
		}
		return rs[0]
	}
	bound, err := f.p.Reserve(bg, "ns", []ReserveItem{{Key: []byte("c"), Size: size}}, 0, false)
	if err != nil || bound[0].Err != nil {
		t.Fatal(err, bound)
	}
	u1, u2, u3 := unbound(), unbound(), unbound()
	f.writeSlot(t, u3.Slot, a)
	cs, err = f.p.Commit(bg, []CommitItem{
		{Token: u1.Token},
		{Token: bound[0].Token, Key: []byte("c")},
		{Token: u2.Token, Key: []byte("a")},
		{Token: u3.Token, Key: []byte("d"), Checksum: cache.Checksum(b), HasChecksum: true},
	})
	if err != nil || !errors.Is(cs[0], ErrInvalidArgument) || !errors.Is(cs[1], ErrInvalidArgument) ||
		!errors.Is(cs[2], cache.ErrExists) || !errors.Is(cs[3], cache.ErrChecksum) {
		t.Fatalf("refused commits: %v %v", err, cs)
	}
	for _, k := range []string{"c", "d"} {
		if _, _, err := f.p.Get(bg, "ns", []byte(k), ScopeLocal); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("Get %s after a refused commit: %v", k, err)
		}
	}
	if zs := f.p.ZeroCopyStats(); zs.LiveReservations != 0 || zs.ReservedAhead != 0 || zs.CommitExists != 1 {
		t.Fatalf("stats %+v", zs)
	}
	if rs := f.tier.ReserveStats(); rs.Open != 0 {
		t.Fatalf("left reserved: %+v", rs)
	}
}
