package peerapi_test

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/internal/poll"
	"github.com/tidepool-kv/tidepool/proxy"
)

// lowPriority reports whether tier holds (ns, key), and as a low-priority
// copy.
func lowPriority(tier *dram.Tier, ns string, key []byte) (low, ok bool) {
	tier.Scan(func(r dram.BlockRef) bool {
		if r.Namespace == ns && bytes.Equal(r.Key, key) {
			low, ok = r.LowPriority, true
			return false
		}
		return true
	})
	return low, ok
}

// TestRebalanceOnJoin: real sidecars on loopback (memberlist, views,
// rdma/tcp, peer API). Two nodes hold a set of blocks; a third joins; the
// previous owners push the blocks the newcomer now owns to it, within the
// rate, without the newcomer reading anything, and keep them only as
// low-priority copies.
func TestRebalanceOnJoin(t *testing.T) {
	const (
		ns     = "llama"
		blocks = 48
		size   = 64 << 10
		rate   = 1 << 20 // bytes/s: ~16 blocks move, ~0.5 s per old owner
	)
	o := nodeOpts{route: &proxy.RouteConfig{RebalanceRate: rate, RebalanceDelay: 200 * time.Millisecond, HotThreshold: proxy.Off},
		notes: true}
	desc := func(i int) *cache.BlockMeta {
		return &cache.BlockMeta{Tokens: []uint32{uint32(i), 1}, Parent: []byte(fmt.Sprintf("blk-%03d", max(i-1, 0))), BlockSize: 2}
	}
	nodes := newCluster(t, 2, o)
	ctx := context.Background()
	keys := make([][]byte, blocks)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("blk-%03d", i))
		// Synchronous pushes: each owner holds its blocks when Put returns.
		if _, err := nodes[0].p.Put(ctx, ns, keys[i], value(byte(i), size),
			cache.PutOptions{Depth: int32(i % 6), Meta: desc(i), SyncReplicas: 1}); err != nil {
			t.Fatal(err)
		}
	}
	prevOwner := map[string]string{}
	for _, k := range keys {
		prevOwner[string(k)] = nodes[0].view.Owners(ns, k)[0]
	}

	start := time.Now()
	n2 := newNode(t, "n2", o, nodes[0].c.Addr())
	all := append(nodes, n2)
	poll.Until(t, 10*time.Second, "views converge on three nodes", func() bool {
		for _, n := range all {
			if n.view.Stats().Members != 3 {
				return false
			}
		}
		return true
	})
	var moved [][]byte
	for _, k := range keys {
		if n2.view.Owners(ns, k)[0] == n2.name {
			moved = append(moved, k)
		}
	}
	if len(moved) < 4 {
		t.Fatalf("only %d of %d keys moved to the new node", len(moved), blocks)
	}
	// Done: the new owner holds its blocks and the previous owners' passes
	// have ended (a push is counted after the owner answered).
	var movedBlocks, skipped int64
	poll.Until(t, 30*time.Second, "the new owner to hold its blocks and the passes to end", func() bool {
		for _, k := range moved {
			if _, ok, _ := n2.p.Exists(ctx, ns, k, proxy.ScopeLocal); !ok {
				return false
			}
		}
		movedBlocks, skipped = 0, 0
		for _, n := range nodes {
			st := n.p.RouteStats().Rebalance
			if st.Running {
				return false
			}
			movedBlocks += st.MovedBlocks
			skipped += st.Skipped
		}
		return movedBlocks+skipped >= int64(len(moved))
	})
	elapsed := time.Since(start)
	for _, n := range nodes {
		st := n.p.RouteStats().Rebalance
		t.Logf("%s: %+v", n.name, st)
		// Each pass paces from its own start: at most rate × its time plus
		// one block, and passes run one after another.
		if limit := float64(rate)*elapsed.Seconds() + float64(st.Passes*size); float64(st.MovedBytes) > limit {
			t.Fatalf("%s moved %d bytes in %v, over the rate (%.0f)", n.name, st.MovedBytes, elapsed, limit)
		}
		if st.Failed != 0 {
			t.Fatalf("%s: %d moves failed", n.name, st.Failed)
		}
	}
	t.Logf("%d blocks to the new node in %v", len(moved), elapsed)
	if movedBlocks == 0 {
		t.Fatal("nothing was pushed")
	}
	// The newcomer read nothing: the blocks were pushed, not filled lazily.
	for _, s := range n2.p.PeerStats() {
		if s.Fetches != 0 {
			t.Fatalf("new node fetched from %s: %+v", s.Node, s)
		}
	}
	for _, k := range moved {
		got, _, err := n2.p.Get(ctx, ns, k, proxy.ScopeLocal)
		if err != nil || !bytes.Equal(got, value(byte(indexOf(keys, k)), size)) {
			t.Fatalf("%s on the new owner: %v", k, err)
		}
		if low, ok := lowPriority(n2.tier, ns, k); !ok || low {
			t.Fatalf("%s on the new owner: present %v, low priority %v", k, ok, low)
		}
		// With its description, for the new owner's KV events.
		if got, want := n2.notes.get(ns, k), desc(indexOf(keys, k)); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s on the new owner described as %+v, want %+v", k, got, want)
		}
	}
	// The previous owners keep what they moved as low-priority copies.
	for _, k := range moved {
		for _, n := range nodes {
			if n.name != prevOwner[string(k)] {
				continue
			}
			if low, ok := lowPriority(n.tier, ns, k); ok && !low {
				t.Fatalf("%s still owned on its previous owner %s", k, n.name)
			}
		}
	}
}

func indexOf(keys [][]byte, k []byte) int {
	for i, x := range keys {
		if bytes.Equal(x, k) {
			return i
		}
	}
	return -1
}

// TestHotReplicaServesReads: real sidecars. A block this node fetches from
// its owner three times (its copy evicted in between) is kept as a
// full-priority hot replica; later reads are served here without asking
// the owner.
func TestHotReplicaServesReads(t *testing.T) {
	const ns = "llama"
	o := nodeOpts{route: &proxy.RouteConfig{HotThreshold: 3, HotWindow: time.Minute, HotTTL: time.Minute, RebalanceRate: proxy.Off}}
	nodes := newCluster(t, 3, o)
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	k := keyOwnedBy(t, nodes, ns, "hot", b.name)
	v := value(7, 256<<10)
	if _, err := b.p.PutLocal(ctx, ns, k, v, cache.PutOptions{Depth: 1}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		if _, err := a.tier.Delete(ctx, ns, k); err != nil { // as eviction would
			t.Fatal(err)
		}
		got, _, err := a.p.Get(ctx, ns, k, proxy.ScopeCluster)
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("fetch %d: %v", i, err)
		}
		if low, ok := lowPriority(a.tier, ns, k); !ok || low != (i < 3) {
			t.Fatalf("after fetch %d: present %v, low priority %v", i, ok, low)
		}
	}
	hs := a.p.RouteStats().Hot
	if hs.Created != 1 || hs.Live != 1 || hs.LiveBytes != int64(len(v)) {
		t.Fatalf("hot stats %+v", hs)
	}
	if s := a.stats(b.name); s.HotFetched != 1 || s.Fetches != 3 {
		t.Fatalf("peer stats %+v: want 3 fetches, the last hot", s)
	}
	acquired, fetches := b.srv.Stats().Acquired, a.stats(b.name).Fetches
	for i := 0; i < 5; i++ {
		got, _, err := a.p.Get(ctx, ns, k, proxy.ScopeCluster)
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("read of the hot replica: %v", err)
		}
	}
	if d := b.srv.Stats().Acquired - acquired; d != 0 {
		t.Fatalf("the owner pinned the block %d more times", d)
	}
	if d := a.stats(b.name).Fetches - fetches; d != 0 {
		t.Fatalf("%d more fetch calls", d)
	}
}
