package proxy

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/internal/poll"
)

// ringState is a membership shared by the fake clusters of one test: the
// current members and, after a change, the previous ones (as
// clusterview's grace ring lists them).
type ringState struct {
	mu        sync.Mutex
	cur, prev []string
	r         int
}

func (s *ringState) set(cur []string) {
	s.mu.Lock()
	s.prev, s.cur = s.cur, cur
	s.mu.Unlock()
}

// movingCluster places keys by rendezvous hashing over a ringState.
type movingCluster struct {
	self string
	s    *ringState
}

func rendezvous(nodes []string, ns string, key []byte, n int) []string {
	type scored struct {
		node  string
		score uint64
	}
	var sc []scored
	for _, node := range nodes {
		h := fnv.New64a()
		h.Write([]byte(ns))
		h.Write(key)
		h.Write([]byte(node))
		x := h.Sum64() // splitmix64's finalizer: FNV alone ranks nodes alike for every key
		x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
		x = (x ^ x>>27) * 0x94d049bb133111eb
		sc = append(sc, scored{node, x ^ x>>31})
	}
	sort.Slice(sc, func(i, j int) bool { return sc[i].score > sc[j].score })
	var out []string
	for i := 0; i < n && i < len(sc); i++ {
		out = append(out, sc[i].node)
	}
	return out
}

func (c *movingCluster) Self() string { return c.self }
func (c *movingCluster) Replicas() int {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.s.r
}
func (c *movingCluster) Owners(ns string, key []byte) []string {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	out := rendezvous(c.s.cur, ns, key, c.s.r)
	for _, n := range rendezvous(c.s.prev, ns, key, c.s.r) {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}
func (c *movingCluster) Members() []MemberInfo { return nil }

// newMovingCluster attaches proxies over DRAM tiers to one ringState whose
// current members are first (the others are built but not members yet).
func newMovingCluster(t *testing.T, cfg RouteConfig, names []string, first []string) (*ringState, map[string]*zcFixture, map[string]*fakePeers) {
	t.Helper()
	s := &ringState{cur: first, r: 1}
	fx := map[string]*zcFixture{}
	proxies := map[string]*Proxy{}
	peers := map[string]*fakePeers{}
	for _, n := range names {
		fx[n] = newZC(t, 16<<20, nil)
		proxies[n] = fx[n].p
	}
	for _, n := range names {
		peers[n] = &fakePeers{self: n, nodes: proxies}
		if err := proxies[n].AttachCluster(&movingCluster{self: n, s: s}, peers[n], cfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { proxies[n].DetachCluster(time.Second) })
	}
	return s, fx, peers
}

func lowPriority(tier *dram.Tier, ns string, key []byte) (low, ok bool) {
	tier.Scan(func(r dram.BlockRef) bool {
		if r.Namespace == ns && string(r.Key) == string(key) {
			low, ok = r.LowPriority, true
			return false
		}
		return true
	})
	return low, ok
}

// TestRebalanceMovesOwnedBlocksToNewOwner: a node that held every block
// alone pushes to a joining node the blocks it now owns, shallowest first,
// no faster than the rate; it skips blocks the new owner has, never moves
// low-priority copies or blocks it keeps owning, and demotes what it
// moved to low-priority copies.
func TestRebalanceMovesOwnedBlocksToNewOwner(t *testing.T) {
	const ns, size, rate = "ns", 16 << 10, 2 << 20 // 2 MiB/s: ~1/4 s for the ~32 blocks b gets
	cfg := RouteConfig{RebalanceRate: rate, RebalanceDelay: 10 * time.Millisecond, HotThreshold: Off}
	s, fx, peers := newMovingCluster(t, cfg, []string{"a", "b"}, []string{"a"})
	a, b := fx["a"].p, fx["b"].p
	ctx := context.Background()
	keys := make([][]byte, 64)
	for i := range keys {
		keys[i] = []byte(fmt.Sprint("k", i))
		if _, err := a.Put(ctx, ns, keys[i], value(string(keys[i]), size), cache.PutOptions{Depth: int32(i % 8)}); err != nil {
			t.Fatal(err)
		}
	}
	copyKey := []byte("copy")
	if _, err := fx["a"].tier.Put(ctx, ns, copyKey, value("copy", size), cache.PutOptions{LowPriority: true}); err != nil {
		t.Fatal(err)
	}
	s.set([]string{"a", "b"})
	toB := 0
	var already []byte
	for _, k := range keys {
		if rendezvous([]string{"a", "b"}, ns, k, 1)[0] == "b" {
			if already == nil {
				// b has this one already (say, filled lazily).
				already = k
				if _, err := b.PutLocal(ctx, ns, k, value(string(k), size), cache.PutOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			toB++
		}
	}
	if rendezvous([]string{"a", "b"}, ns, copyKey, 1)[0] != "b" {
		t.Log("the low-priority copy is not b's: the copy check is weaker")
	}
	var mu sync.Mutex
	var depths []int32
	peers["a"].onPush = func(it PutItem) {
		mu.Lock()
		depths = append(depths, it.Opts.Depth)
		mu.Unlock()
	}
	start := time.Now()
	a.MembershipChanged()
	b.MembershipChanged() // b holds nothing: its pass plans nothing
	poll.Until(t, 20*time.Second, "a's pass to finish", func() bool {
		st := a.RouteStats().Rebalance
		return st.Passes == 1 && !st.Running
	})
	elapsed := time.Since(start)
	st := a.RouteStats().Rebalance
	t.Logf("a: %+v in %v", st, elapsed)
	if st.PlannedBlocks != int64(toB) || st.PlannedBytes != int64(toB*size) {
		t.Fatalf("planned %d blocks / %d bytes, want %d / %d", st.PlannedBlocks, st.PlannedBytes, toB, toB*size)
	}
	if st.MovedBlocks != int64(toB-1) || st.Skipped != 1 || st.Failed != 0 || st.MovedBytes != int64((toB-1)*size) {
		t.Fatalf("moved %d, skipped %d, failed %d; want %d, 1, 0", st.MovedBlocks, st.Skipped, st.Failed, toB-1)
	}
	if st.Demoted != int64(toB) {
		t.Fatalf("demoted %d, want %d", st.Demoted, toB)
	}
	// Rate: by time t at most rate·t bytes plus one block.
	if limit := float64(rate)*elapsed.Seconds() + size; float64(st.MovedBytes) > limit {
		t.Fatalf("moved %d bytes in %v: over the rate (%0.f)", st.MovedBytes, elapsed, limit)
	}
	if n := peers["a"].pushes.Load(); n != int64(toB-1) {
		t.Fatalf("%d pushes, want %d", n, toB-1)
	}
	mu.Lock()
	if !slices.IsSorted(depths) {
		t.Fatalf("pushed depths %v: not shallowest first", depths)
	}
	mu.Unlock()
	for _, k := range keys {
		owner := rendezvous([]string{"a", "b"}, ns, k, 1)[0]
		lowA, okA := lowPriority(fx["a"].tier, ns, k)
		lowB, okB := lowPriority(fx["b"].tier, ns, k)
		switch {
		case owner == "b" && (!okB || lowB || !okA || !lowA):
			t.Fatalf("%s (b's): on b %v low %v, on a %v low %v; want owned on b, a copy on a", k, okB, lowB, okA, lowA)
		case owner == "a" && (okB || !okA || lowA):
			t.Fatalf("%s (a's): moved or demoted", k)
		}
	}
	if _, ok := lowPriority(fx["b"].tier, ns, copyKey); ok {
		t.Fatal("a low-priority copy was moved")
	}
	if bs := b.RouteStats().Rebalance; bs.PlannedBlocks != 0 || bs.Passes != 1 {
		t.Fatalf("b's rebalance %+v", bs)
	}
	// A second change with the same members plans nothing new for moved
	// blocks: a holds them as copies now.
	s.set([]string{"a", "b"})
	s.set([]string{"a", "b"})
	a.MembershipChanged()
	poll.Until(t, 10*time.Second, "a's second pass", func() bool {
		st := a.RouteStats().Rebalance
		return st.Passes == 2 && !st.Running
	})
	if st2 := a.RouteStats().Rebalance; st2.PlannedBlocks != st.PlannedBlocks {
		t.Fatalf("second pass planned %d more", st2.PlannedBlocks-st.PlannedBlocks)
	}
}

// TestRebalanceCancel: a newer change cancels a running pass and starts
// another; DetachCluster cancels one promptly.
func TestRebalanceCancel(t *testing.T) {
	const ns, size = "ns", 64 << 10
	cfg := RouteConfig{RebalanceRate: 64 << 10, RebalanceDelay: time.Millisecond, HotThreshold: Off} // one block per second
	s, fx, _ := newMovingCluster(t, cfg, []string{"a", "b"}, []string{"a"})
	a := fx["a"].p
	ctx := context.Background()
	for i := 0; i < 40; i++ {
		k := []byte(fmt.Sprint("k", i))
		if _, err := a.Put(ctx, ns, k, value(string(k), size), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	s.set([]string{"a", "b"})
	a.MembershipChanged()
	poll.Until(t, 10*time.Second, "a pass to move a block", func() bool { return a.RouteStats().Rebalance.MovedBlocks >= 1 })
	a.MembershipChanged()
	poll.Until(t, 10*time.Second, "the pass to be cancelled and another to start", func() bool {
		st := a.RouteStats().Rebalance
		return st.Cancelled == 1 && st.Passes == 2
	})
	r := a.router()
	start := time.Now()
	a.DetachCluster(5 * time.Second)
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("DetachCluster took %v with a pass running", d)
	}
	if st := r.rebal.stats(); st.Running || st.Cancelled != 2 {
		t.Fatalf("after DetachCluster: %+v", st)
	}
}

func TestRouteConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*RouteConfig)
		bad  int
	}{
		{"zero", func(*RouteConfig) {}, 0},
		{"defaults", func(c *RouteConfig) { *c = DefaultRouteConfig() }, 0},
		{"negatives", func(c *RouteConfig) { c.PushQueue, c.HotWindow, c.HotTTL = -1, -1, -1 }, 3},
		{"off", func(c *RouteConfig) { c.RebalanceRate, c.RebalanceMaxBytes, c.HotThreshold = Off, Off, Off }, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var c RouteConfig
			tc.mod(&c)
			err := c.Validate()
			n := 0
			if err != nil {
				n = len(err.(interface{ Unwrap() []error }).Unwrap())
			}
			if n != tc.bad {
				t.Fatalf("%d problems (%v), want %d", n, err, tc.bad)
			}
		})
	}
}

// TestLazyFillKeepsOwnedBlocks: a new owner that fetches a block it now
// owns from the previous owner keeps it at full priority (an owned block,
// not a copy), so the rebalancer finds it held and skips it.
func TestLazyFillKeepsOwnedBlocks(t *testing.T) {
	const ns = "ns"
	s, fx, _ := newMovingCluster(t, RouteConfig{RebalanceRate: Off, HotThreshold: Off}, []string{"a", "b"}, []string{"a"})
	ctx := context.Background()
	var key []byte
	for i := 0; key == nil; i++ {
		if k := []byte(fmt.Sprint("k", i)); rendezvous([]string{"a", "b"}, ns, k, 1)[0] == "b" {
			key = k
		}
	}
	v := value("lazy", 8<<10)
	if _, err := fx["a"].p.Put(ctx, ns, key, v, cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	s.set([]string{"a", "b"})
	got, _, err := fx["b"].p.Get(ctx, ns, key, ScopeCluster)
	if err != nil || string(got) != string(v) {
		t.Fatalf("lazy fill on the new owner: %v", err)
	}
	if low, ok := lowPriority(fx["b"].tier, ns, key); !ok || low {
		t.Fatalf("new owner holds the block: %v, low priority %v; want owned", ok, low)
	}
	if n := hotFetched(fx["b"].p); n != 1 {
		t.Fatalf("%d full-priority fetches, want 1", n)
	}
	if st := fx["b"].p.RouteStats().Hot; st.Created != 0 {
		t.Fatalf("an owned block counted as a hot replica: %+v", st)
	}
}
