//go:build linux

package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/cache/ssd"
	"github.com/tidepool-kv/tidepool/cache/tiered"
	"github.com/tidepool-kv/tidepool/internal/clock"
)

var bg = context.Background()

// zcFixture is a proxy over a real DRAM tier with a fake clock.
type zcFixture struct {
	p    *Proxy
	tier *dram.Tier
	fc   *clock.Fake
	cfg  dram.Config
}

// newZC builds a proxy over a DRAM tier: with every ability the tier has,
// or with the dependencies deps returns.
func newZC(t *testing.T, capacity int64, deps func(*dram.Tier) Deps) *zcFixture {
	t.Helper()
	fc := clock.NewFake(time.Unix(1_000_000, 0))
	dcfg := dram.DefaultConfig()
	dcfg.Dir = filepath.Join(t.TempDir(), "arenas")
	dcfg.Capacity = capacity
	dcfg.ArenaSize = 4 << 20
	dcfg.MaxValueSize = 4 << 20
	dcfg.LeaseTimeout = time.Second
	dcfg.ReserveTimeout = 2 * time.Second
	dcfg.LazyFault = true
	dcfg.Clock = fc
	tier, err := dram.New(dcfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tier.Close() })
	d := Deps{Store: tier, ZeroCopy: tier, Scan: tier}
	if deps != nil {
		d = deps(tier)
	}
	cfg := DefaultConfig()
	cfg.MaxValueBytes = 8 << 20
	cfg.MaxBatch = 8
	p, err := New(cfg, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &zcFixture{p: p, tier: tier, fc: fc, cfg: dcfg}
}

// writeSlot writes val into a slot through the arena file, as a client in
// another process would.
func (f *zcFixture) writeSlot(t *testing.T, s Slot, val []byte) {
	t.Helper()
	arenas, _ := f.p.Arenas()
	fh, err := os.OpenFile(arenas[s.Arena].Path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.WriteAt(val[:s.Length], s.Offset); err != nil {
		t.Fatal(err)
	}
}

func (f *zcFixture) readSlot(t *testing.T, s Slot) []byte {
	t.Helper()
	arenas, _ := f.p.Arenas()
	fh, err := os.Open(arenas[s.Arena].Path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	b := make([]byte, s.Length)
	if _, err := fh.ReadAt(b, s.Offset); err != nil {
		t.Fatal(err)
	}
	return b
}

func value(key string, n int) []byte {
	v := make([]byte, n)
	for i := range v {
		v[i] = byte(i*7) ^ key[i%len(key)]
	}
	return v
}

// put stores key through Reserve, a write into the arena file and Commit.
func (f *zcFixture) put(t *testing.T, ns, key string, val []byte) {
	t.Helper()
	rs, err := f.p.Reserve(bg, ns, []ReserveItem{{Key: []byte(key), Size: int64(len(val))}}, 0, false)
	if err != nil || rs[0].Err != nil {
		t.Fatalf("Reserve %s: %v %v", key, err, rs)
	}
	f.writeSlot(t, rs[0].Slot, val)
	cs, err := f.p.Commit(bg, []CommitItem{{Token: rs[0].Token, Checksum: cache.Checksum(val), HasChecksum: true}})
	if err != nil || cs[0] != nil {
		t.Fatalf("Commit %s: %v %v", key, err, cs)
	}
}

func TestZeroCopyRoundTrip(t *testing.T) {
	f := newZC(t, 8<<20, nil)
	arenas, ver := f.p.Arenas()
	if len(arenas) != 2 || arenas[0].Size != 4<<20 || ver != ArenaLayoutVersion {
		t.Fatalf("Arenas = %+v, %d", arenas, ver)
	}
	a, b := value("a", 300<<10), value("b", 1000)
	rs, err := f.p.Reserve(bg, "ns", []ReserveItem{
		{Key: []byte("a"), Size: int64(len(a)), Depth: 0},
		{Key: []byte("b"), Size: int64(len(b)), Depth: 1},
		{Key: []byte(""), Size: 1},
	}, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Err != nil || rs[1].Err != nil || !errors.Is(rs[2].Err, ErrInvalidArgument) {
		t.Fatalf("Reserve results %+v", rs)
	}
	if rs[0].Token == rs[1].Token || rs[0].Token <= 0 || rs[0].Deadline != f.fc.Now().Add(2*time.Second) {
		t.Fatalf("tokens %d %d deadline %v", rs[0].Token, rs[1].Token, rs[0].Deadline)
	}
	// Invisible before Commit.
	if n, _ := f.p.Lookup(bg, "ns", [][]byte{[]byte("a")}, ScopeLocal); n != 0 {
		t.Fatal("reserved block visible to Lookup")
	}
	f.writeSlot(t, rs[0].Slot, a)
	f.writeSlot(t, rs[1].Slot, b)
	cs, err := f.p.Commit(bg, []CommitItem{
		{Token: rs[0].Token, Checksum: cache.Checksum(a), HasChecksum: true},
		{Token: rs[1].Token}, // the server computes it
	})
	if err != nil || cs[0] != nil || cs[1] != nil {
		t.Fatalf("Commit = %v, %v", cs, err)
	}
	if got, _, err := f.p.Get(bg, "ns", []byte("a"), ScopeLocal); err != nil || !bytes.Equal(got, a) {
		t.Fatalf("inline Get after Commit: %v", err)
	}

	ac, err := f.p.Acquire(bg, "ns", [][]byte{[]byte("a"), []byte("b"), []byte("missing")}, 0, ScopeLocal)
	if err != nil {
		t.Fatal(err)
	}
	if ac[0].Err != nil || ac[1].Err != nil || !errors.Is(ac[2].Err, cache.ErrNotFound) {
		t.Fatalf("Acquire %+v", ac)
	}
	if !bytes.Equal(f.readSlot(t, ac[0].Slot), a) || !bytes.Equal(f.readSlot(t, ac[1].Slot), b) {
		t.Fatal("acquired bytes differ")
	}
	if ac[1].Info.Checksum != cache.Checksum(b) || ac[1].Info.Depth != 1 || ac[0].Deadline != f.fc.Now().Add(time.Second) {
		t.Fatalf("lease info %+v deadline %v", ac[1].Info, ac[0].Deadline)
	}
	st := f.p.ZeroCopyStats()
	if st.LiveLeases != 2 || st.Acquired != 2 || st.Committed != 2 || st.Reserved != 2 || st.LiveReservations != 0 {
		t.Fatalf("stats %+v", st)
	}
	fc := f.fc
	fc.Advance(900 * time.Millisecond)
	res, d, err := f.p.Renew(bg, []int64{ac[0].LeaseID, 12345}, 3*time.Second)
	if err != nil || res[0] != nil || !errors.Is(res[1], ErrNoLease) || d != fc.Now().Add(3*time.Second) {
		t.Fatalf("Renew = %v, %v, %v", res, d, err)
	}
	fc.Advance(200 * time.Millisecond) // b's lease has expired, a's is renewed
	rel, err := f.p.Release(bg, []int64{ac[0].LeaseID, ac[1].LeaseID, ac[0].LeaseID})
	if err != nil {
		t.Fatal(err)
	}
	if rel[0] != nil || !errors.Is(rel[1], cache.ErrLeaseExpired) || !errors.Is(rel[2], ErrNoLease) {
		t.Fatalf("Release = %v", rel)
	}
	st = f.p.ZeroCopyStats()
	if st.LiveLeases != 0 || st.Released != 1 || st.LeaseExpirations != 1 || st.Renewed != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestZeroCopyBadInput covers the list of bad inputs, one per row.
func TestZeroCopyBadInput(t *testing.T) {
	f := newZC(t, 4<<20, nil)
	reserve := func(t *testing.T, key string, size int64) ReserveResult {
		t.Helper()
		rs, err := f.p.Reserve(bg, "ns", []ReserveItem{{Key: []byte(key), Size: size}}, 0, false)
		if err != nil {
			t.Fatal(err)
		}
		return rs[0]
	}
	tests := []struct {
		name string
		run  func(t *testing.T) error
		want error
	}{
		{"commit of an unknown token", func(t *testing.T) error {
			cs, _ := f.p.Commit(bg, []CommitItem{{Token: 42}})
			return cs[0]
		}, ErrNoReservation},
		{"double commit", func(t *testing.T) error {
			r := reserve(t, "dc", 10)
			if cs, _ := f.p.Commit(bg, []CommitItem{{Token: r.Token}}); cs[0] != nil {
				t.Fatal(cs[0])
			}
			cs, _ := f.p.Commit(bg, []CommitItem{{Token: r.Token}})
			return cs[0]
		}, ErrNoReservation},
		{"commit of an expired token", func(t *testing.T) error {
			r := reserve(t, "exp", 10)
			f.fc.Advance(3 * time.Second)
			cs, _ := f.p.Commit(bg, []CommitItem{{Token: r.Token}})
			return cs[0]
		}, cache.ErrLeaseExpired},
		{"commit with a wrong checksum", func(t *testing.T) error {
			r := reserve(t, "crc", 10)
			cs, _ := f.p.Commit(bg, []CommitItem{{Token: r.Token, Checksum: 1, HasChecksum: true}})
			return cs[0]
		}, cache.ErrChecksum},
		{"abort twice", func(t *testing.T) error {
			r := reserve(t, "ab", 10)
			if as, _ := f.p.Abort(bg, []int64{r.Token}); as[0] != nil {
				t.Fatal(as[0])
			}
			as, _ := f.p.Abort(bg, []int64{r.Token})
			return as[0]
		}, ErrNoReservation},
		{"release of a lease not held", func(t *testing.T) error {
			rs, _ := f.p.Release(bg, []int64{7})
			return rs[0]
		}, ErrNoLease},
		{"reserve larger than the maximum", func(t *testing.T) error {
			return reserve(t, "big", 8<<20+1).Err
		}, cache.ErrTooLarge},
		{"reserve larger than the tier's largest value", func(t *testing.T) error {
			return reserve(t, "big", 4<<20+1).Err // under MaxValueBytes, over the tier
		}, cache.ErrTooLarge},
		{"reserve beside pinned space", func(t *testing.T) error {
			r := reserve(t, "half", 3<<20)
			defer f.p.Abort(bg, []int64{r.Token})
			return reserve(t, "other", 2<<20).Err
		}, cache.ErrNoSpace},
		{"negative size", func(t *testing.T) error { return reserve(t, "neg", -1).Err }, ErrInvalidArgument},
		{"negative ttl", func(t *testing.T) error {
			_, err := f.p.Reserve(bg, "ns", []ReserveItem{{Key: []byte("k"), Size: 1}}, -time.Second, false)
			return err
		}, ErrInvalidArgument},
		{"negative lease", func(t *testing.T) error {
			_, err := f.p.Acquire(bg, "ns", [][]byte{[]byte("k")}, -1, ScopeLocal)
			return err
		}, ErrInvalidArgument},
		{"batch too large", func(t *testing.T) error {
			_, err := f.p.Release(bg, make([]int64, 9))
			return err
		}, ErrBatchTooLarge},
		{"reserve of a present key", func(t *testing.T) error {
			f.put(t, "ns", "present", value("p", 10))
			return reserve(t, "present", 10).Err
		}, cache.ErrExists},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.run(t); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// TestZeroCopyDeadClient: a client that reserves and disconnects, and one
// that dies holding leases, are cleaned up by their deadlines; another
// client's blocks and leases are not affected.
func TestZeroCopyDeadClient(t *testing.T) {
	f := newZC(t, 4<<20, nil)
	good := value("good", 1<<20)
	f.put(t, "ns", "good", good)
	long, err := f.p.Acquire(bg, "ns", [][]byte{[]byte("good")}, 10*time.Second, ScopeLocal)
	if err != nil || long[0].Err != nil {
		t.Fatal(err, long)
	}

	// The dead client: two reservations never committed, and leases.
	for _, k := range []string{"d1", "d2"} {
		rs, err := f.p.Reserve(bg, "ns", []ReserveItem{{Key: []byte(k), Size: 1 << 20}}, time.Second, false)
		if err != nil || rs[0].Err != nil {
			t.Fatal(err, rs)
		}
	}
	f.put(t, "ns", "pinned", value("pinned", 512<<10))
	if ac, _ := f.p.Acquire(bg, "ns", [][]byte{[]byte("pinned"), []byte("good")}, time.Second, ScopeLocal); ac[0].Err != nil || ac[1].Err != nil {
		t.Fatal(ac)
	}
	// Now the tier is full of reserved and pinned bytes.
	rs, _ := f.p.Reserve(bg, "ns", []ReserveItem{{Key: []byte("new"), Size: 1 << 20}}, 0, false)
	if !errors.Is(rs[0].Err, cache.ErrNoSpace) {
		t.Fatalf("Reserve in a full tier = %v", rs[0].Err)
	}

	f.fc.Advance(1500 * time.Millisecond)
	st := f.p.ZeroCopyStats()
	if st.LiveReservations != 0 || st.ReservationsReclaimed != 2 || st.LiveLeases != 1 || st.LeaseExpirations != 2 {
		t.Fatalf("after the deadlines: %+v", st)
	}
	if rs := f.tier.ReserveStats(); rs.Open != 0 || rs.OpenBytes != 0 {
		t.Fatalf("tier reservations %+v", rs)
	}
	// The space is usable again, "pinned" is evictable, "good" stays put.
	for i := 0; i < 3; i++ {
		f.put(t, "ns", fmt.Sprint("new", i), value("n", 1<<20))
	}
	if !bytes.Equal(f.readSlot(t, long[0].Slot), good) {
		t.Fatal("another client's leased block changed")
	}
	if rel, _ := f.p.Release(bg, []int64{long[0].LeaseID}); rel[0] != nil {
		t.Fatalf("the live client's Release: %v", rel[0])
	}
}

// TestZeroCopyAcquireFromSlowerTier: Acquire of a block that only the SSD
// tier holds brings it into the arenas (the tiered store's Acquire does).
func TestZeroCopyAcquireFromSlowerTier(t *testing.T) {
	val := value("s", 200<<10)
	cfg := tiered.DefaultConfig()
	cfg.DRAM = dram.DefaultConfig()
	cfg.DRAM.Dir, cfg.DRAM.Capacity, cfg.DRAM.ArenaSize, cfg.DRAM.LazyFault = t.TempDir(), 4<<20, 4<<20, true
	sc := ssd.DefaultConfig()
	sc.Dir, sc.Capacity, sc.MinFreeBytes, sc.WriteBufferSize = t.TempDir(), 256<<20, 0, 8<<20
	cfg.SSD = &sc
	store, err := tiered.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	// On SSD only, as after a demotion.
	if _, err := store.SSD().Put(bg, "ns", []byte("s"), val, cache.PutOptions{Depth: 3}); err != nil {
		t.Fatal(err)
	}
	p, err := New(DefaultConfig(), Deps{Store: store, ZeroCopy: store}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &zcFixture{p: p}
	ac, err := f.p.Acquire(bg, "ns", [][]byte{[]byte("s"), []byte("none")}, 0, ScopeCluster)
	if err != nil || ac[0].Err != nil || !errors.Is(ac[1].Err, cache.ErrNotFound) {
		t.Fatalf("Acquire = %v %+v", err, ac)
	}
	if !bytes.Equal(f.readSlot(t, ac[0].Slot), val) || ac[0].Info.Depth != 3 || ac[0].Info.Tier != dram.TierName {
		t.Fatalf("promoted block %+v", ac[0].Info)
	}
	f.p.Release(bg, []int64{ac[0].LeaseID})
}

func TestZeroCopyNoArenas(t *testing.T) {
	f := newZC(t, 4<<20, func(t *dram.Tier) Deps { return Deps{Store: t} })
	if a, _ := f.p.Arenas(); a != nil {
		t.Fatalf("Arenas = %v", a)
	}
	if _, err := f.p.Reserve(bg, "ns", []ReserveItem{{Key: []byte("k"), Size: 1}}, 0, false); !errors.Is(err, ErrNoArenas) {
		t.Fatalf("Reserve = %v", err)
	}
	if _, err := f.p.Acquire(bg, "ns", [][]byte{[]byte("k")}, 0, ScopeLocal); !errors.Is(err, ErrNoArenas) {
		t.Fatalf("Acquire = %v", err)
	}
}

// TestZeroCopyConcurrent: many callers reserving, committing, acquiring and
// releasing at once (run under -race).
func TestZeroCopyConcurrent(t *testing.T) {
	f := newZC(t, 8<<20, nil)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				key := []byte(fmt.Sprintf("k%d", i%10)) // shared keys: EXISTS races
				rs, err := f.p.Reserve(bg, "ns", []ReserveItem{{Key: key, Size: 4096}}, 0, false)
				if err != nil {
					t.Error(err)
					return
				}
				if rs[0].Err == nil {
					if cs, _ := f.p.Commit(bg, []CommitItem{{Token: rs[0].Token}}); cs[0] != nil && !errors.Is(cs[0], cache.ErrExists) {
						t.Error(cs[0])
					}
				} else if !errors.Is(rs[0].Err, cache.ErrExists) {
					t.Error(rs[0].Err)
				}
				ac, _ := f.p.Acquire(bg, "ns", [][]byte{key}, 0, ScopeLocal)
				if ac[0].Err != nil {
					t.Error(ac[0].Err)
					continue
				}
				if rel, _ := f.p.Release(bg, []int64{ac[0].LeaseID}); rel[0] != nil {
					t.Error(rel[0])
				}
			}
		}()
	}
	wg.Wait()
	st := f.p.ZeroCopyStats()
	if st.LiveLeases != 0 || st.LiveReservations != 0 || st.Committed != 10 || st.Acquired != 160 || st.Released != 160 {
		t.Fatalf("stats %+v", st)
	}
}

// TestZeroCopyCommitPushesToOwners: a committed block goes to its owners
// like any put (in the background).
func TestZeroCopyCommitPushesToOwners(t *testing.T) {
	a, b, key := twoNodes(t)
	val := value("pushed", 100<<10)
	rs, err := a.p.Reserve(bg, "ns", []ReserveItem{{Key: key, Size: int64(len(val))}}, 0, false)
	if err != nil || rs[0].Err != nil {
		t.Fatal(err, rs)
	}
	a.writeSlot(t, rs[0].Slot, val)
	cs, err := a.p.Commit(bg, []CommitItem{{Token: rs[0].Token, Checksum: cache.Checksum(val), HasChecksum: true}})
	if err != nil || cs[0] != nil {
		t.Fatal(err, cs)
	}
	for deadline := time.Now().Add(10 * time.Second); a.p.RouteStats().Pushes+a.p.RouteStats().PushFailures == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the commit was never pushed")
		}
		time.Sleep(time.Millisecond)
	}
	got, _, err := b.p.Get(bg, "ns", key, ScopeLocal)
	if err != nil || !bytes.Equal(got, val) {
		t.Fatalf("owner b after the commit on a: %v", err)
	}
}

// twoNodes returns two proxies over DRAM tiers in one cluster (a fake
// one: nothing moves on its own) and a key of ns "ns" that b owns.
func twoNodes(t *testing.T) (a, b *zcFixture, key []byte) {
	t.Helper()
	a, b = newZC(t, 4<<20, nil), newZC(t, 4<<20, nil)
	nodes := map[string]*Proxy{"a": a.p, "b": b.p}
	for name, p := range nodes {
		if err := p.AttachCluster(&fakeCluster{self: name, nodes: []string{"a", "b"}}, &fakePeers{self: name, nodes: nodes}, RouteConfig{RebalanceRate: Off, HotThreshold: Off}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.DetachCluster(0) })
	}
	fc := &fakeCluster{nodes: []string{"a", "b"}}
	for i := 0; key == nil; i++ {
		if k := []byte(fmt.Sprint("k", i)); fc.Owners("ns", k)[0] == "b" {
			key = k
		}
	}
	return a, b, key
}

// TestZeroCopyStatePerProxy: each proxy has its own handle tables and
// counters (the field Proxy.zc): a token or lease id of one proxy means
// nothing to another, even over the same store.
func TestZeroCopyStatePerProxy(t *testing.T) {
	a := newZC(t, 4<<20, nil)
	b, err := New(DefaultConfig(), Deps{Store: a.tier, ZeroCopy: a.tier}, nil)
	if err != nil {
		t.Fatal(err)
	}
	val := value("x", 4096)
	rs, err := a.p.Reserve(bg, "ns", []ReserveItem{{Key: []byte("x"), Size: int64(len(val))}}, 0, false)
	if err != nil || rs[0].Err != nil {
		t.Fatal(err, rs)
	}
	if st := b.ZeroCopyStats(); st.LiveReservations != 0 || st.Reserved != 0 {
		t.Fatalf("b counts a's reservation: %+v", st)
	}
	if cs, _ := b.Commit(bg, []CommitItem{{Token: rs[0].Token}}); !errors.Is(cs[0], ErrNoReservation) {
		t.Fatalf("b committed a's token: %v", cs[0])
	}
	a.writeSlot(t, rs[0].Slot, val)
	if cs, _ := a.p.Commit(bg, []CommitItem{{Token: rs[0].Token}}); cs[0] != nil {
		t.Fatalf("a's Commit of its own token: %v", cs[0])
	}
	ac, err := a.p.Acquire(bg, "ns", [][]byte{[]byte("x")}, 0, ScopeLocal)
	if err != nil || ac[0].Err != nil {
		t.Fatal(err, ac)
	}
	if rel, _ := b.Release(bg, []int64{ac[0].LeaseID}); !errors.Is(rel[0], ErrNoLease) {
		t.Fatalf("b released a's lease: %v", rel[0])
	}
	if st := a.p.ZeroCopyStats(); st.LiveLeases != 1 || st.Committed != 1 {
		t.Fatalf("a's counters: %+v", st)
	}
	if rel, _ := a.p.Release(bg, []int64{ac[0].LeaseID}); rel[0] != nil {
		t.Fatalf("a's Release of its own lease: %v", rel[0])
	}
}
