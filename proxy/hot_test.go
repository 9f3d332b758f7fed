package proxy

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/clock"
)

// hotPair is two proxies over DRAM tiers, a (reader) and b (owner of
// every key), with hot replication on and a fake clock.
func hotPair(t *testing.T, cfg RouteConfig) (a, b *zcFixture, peers map[string]*fakePeers, fc *clock.Fake) {
	t.Helper()
	fc = clock.NewFake(time.Unix(2_000_000, 0))
	cfg.Clock = fc
	s := &ringState{cur: []string{"b"}, r: 1}
	a, b = newZC(t, 16<<20, nil), newZC(t, 16<<20, nil)
	proxies := map[string]*Proxy{"a": a.p, "b": b.p}
	peers = map[string]*fakePeers{}
	for name, p := range proxies {
		peers[name] = &fakePeers{self: name, nodes: proxies}
		if err := p.AttachCluster(&movingCluster{self: name, s: s}, peers[name], cfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.DetachCluster(time.Second) })
	}
	return a, b, peers, fc
}

// evictedGet deletes a's copy (as eviction would) and reads the key with
// cluster scope: one remote fetch.
func evictedGet(t *testing.T, a *zcFixture, key, want []byte) {
	t.Helper()
	ctx := context.Background()
	if _, err := a.tier.Delete(ctx, "ns", key); err != nil {
		t.Fatal(err)
	}
	got, _, err := a.p.Get(ctx, "ns", key, ScopeCluster)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("get %s: %v", key, err)
	}
}

// TestHotReplica: the third fetch of a block within the window keeps it at
// full priority; the replica then serves reads without asking the owner;
// the bound refuses more; after HotTTL the replica is demoted to a
// low-priority copy; a replica the store lost is forgotten.
func TestHotReplica(t *testing.T) {
	ctx := context.Background()
	cfg := RouteConfig{HotThreshold: 3, HotWindow: time.Minute, HotTTL: 10 * time.Minute, HotMaxReplicas: 1, RebalanceRate: Off}
	a, b, peers, fc := hotPair(t, cfg)
	keys := [][]byte{[]byte("hot1"), []byte("hot2")}
	vals := [][]byte{value("hot1", 64<<10), value("hot2", 32<<10)}
	for i, k := range keys {
		if _, err := b.p.PutLocal(ctx, "ns", k, vals[i], cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 3; i++ {
		evictedGet(t, a, keys[0], vals[0])
		low, ok := lowPriority(a.tier, "ns", keys[0])
		if !ok || low != (i < 3) {
			t.Fatalf("after fetch %d: present %v, low priority %v", i, ok, low)
		}
		fc.Advance(10 * time.Second)
	}
	st := a.p.RouteStats()
	if st.Hot.Created != 1 || st.Hot.Live != 1 || st.Hot.LiveBytes != int64(len(vals[0])) || hotFetched(a.p) != 1 {
		t.Fatalf("hot stats %+v, hot fetches %d", st.Hot, hotFetched(a.p))
	}
	// Reads are served by the replica: no fetch.
	before := peers["a"].fetches.Load()
	for i := 0; i < 5; i++ {
		got, _, err := a.p.Get(ctx, "ns", keys[0], ScopeCluster)
		if err != nil || !bytes.Equal(got, vals[0]) {
			t.Fatal(err)
		}
	}
	if n := peers["a"].fetches.Load() - before; n != 0 {
		t.Fatalf("%d fetches while a hot replica is live", n)
	}
	// A second hot key: over HotMaxReplicas, kept as an ordinary copy.
	for i := 0; i < 3; i++ {
		evictedGet(t, a, keys[1], vals[1])
	}
	if low, _ := lowPriority(a.tier, "ns", keys[1]); !low {
		t.Fatal("second hot key kept at full priority beyond HotMaxReplicas")
	}
	if st := a.p.RouteStats().Hot; st.Full != 1 || st.Live != 1 {
		t.Fatalf("hot stats after the bound %+v", st)
	}
	// Expiry: demoted to a low-priority copy, still readable locally.
	a.p.router().sweepHot(ctx)
	if st := a.p.RouteStats().Hot; st.Expired != 0 || st.Live != 1 {
		t.Fatalf("expired before its TTL: %+v", st)
	}
	fc.Advance(cfg.HotTTL)
	a.p.router().sweepHot(ctx)
	if st := a.p.RouteStats().Hot; st.Expired != 1 || st.Live != 0 || st.LiveBytes != 0 {
		t.Fatalf("after the TTL: %+v", st)
	}
	if low, ok := lowPriority(a.tier, "ns", keys[0]); !ok || !low {
		t.Fatalf("expired replica: present %v, low priority %v; want a low-priority copy", ok, low)
	}
	// The slot is free; keys[1], whose fetches were counted in windows long
	// past, must earn it again.
	for i := 1; i <= 3; i++ {
		evictedGet(t, a, keys[1], vals[1])
	}
	if st := a.p.RouteStats().Hot; st.Created != 2 || st.Live != 1 {
		t.Fatalf("re-promotion: %+v", st)
	}
	// Lost: the store drops the replica; the sweep forgets it.
	if _, err := a.tier.Delete(ctx, "ns", keys[1]); err != nil {
		t.Fatal(err)
	}
	a.p.router().sweepHot(ctx)
	if st := a.p.RouteStats().Hot; st.Lost != 1 || st.Live != 0 {
		t.Fatalf("lost replica: %+v", st)
	}
}

// TestHotWindow: fetches spread wider than two windows never reach the
// threshold; with hot replication off nothing is kept.
func TestHotWindow(t *testing.T) {
	tests := []struct {
		name    string
		cfg     RouteConfig
		every   time.Duration
		fetches int
		created int64
	}{
		{"within the window", RouteConfig{HotThreshold: 3, HotWindow: time.Minute, RebalanceRate: Off}, 10 * time.Second, 3, 1},
		{"spread out", RouteConfig{HotThreshold: 3, HotWindow: time.Minute, RebalanceRate: Off}, 61 * time.Second, 6, 0},
		{"threshold 1", RouteConfig{HotThreshold: 1, HotWindow: time.Minute, RebalanceRate: Off}, time.Second, 1, 1},
		{"off", RouteConfig{RebalanceRate: Off, HotThreshold: Off}, time.Second, 6, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b, _, fc := hotPair(t, tc.cfg)
			k, v := []byte("k"), value("k", 4<<10)
			if _, err := b.p.PutLocal(context.Background(), "ns", k, v, cache.PutOptions{}); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < tc.fetches; i++ {
				evictedGet(t, a, k, v)
				fc.Advance(tc.every)
			}
			if got := a.p.RouteStats().Hot.Created; got != tc.created {
				t.Fatalf("created %d hot replicas, want %d", got, tc.created)
			}
		})
	}
}

// TestHotTrackedBound: at most HotTracked blocks are counted per window.
func TestHotTrackedBound(t *testing.T) {
	cfg := RouteConfig{HotThreshold: 2, HotTracked: 4}.withDefaults()
	h := newHotTracker(cfg, nil)
	for i := 0; i < 100; i++ {
		h.note(fmt.Sprint(i))
	}
	if len(h.cur) != 4 {
		t.Fatalf("%d blocks counted, bound 4", len(h.cur))
	}
	if !h.note("1") {
		t.Fatal("a counted block did not reach the threshold")
	}
	if h.note("99") {
		t.Fatal("an uncounted block reached the threshold")
	}
}
