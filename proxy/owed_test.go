package proxy

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/poll"
)

// owedCfg is a route config whose retries come quickly: a node that failed
// a call is probed again after 20 ms, and passes wait 10 ms.
func owedCfg() RouteConfig {
	return RouteConfig{RebalanceDelay: 10 * time.Millisecond, PeerDownFor: 20 * time.Millisecond, HotThreshold: Off}
}

// putOwned stores n blocks through a, inline and zero-copy alternately,
// whose owner under members is want, and returns their keys.
func putOwned(t *testing.T, a *zcFixture, ns string, members []string, want string, n int) [][]byte {
	t.Helper()
	var keys [][]byte
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprint("k", i)
		if rendezvous(members, ns, []byte(k), 1)[0] != want {
			continue
		}
		if len(keys)%2 == 0 {
			if _, err := a.p.Put(context.Background(), ns, []byte(k), value(k, 8<<10), cache.PutOptions{}); err != nil {
				t.Fatal(err)
			}
		} else {
			a.put(t, ns, k, value(k, 8<<10)) // Reserve, write, Commit: as the vLLM connector saves
		}
		keys = append(keys, []byte(k))
	}
	return keys
}

// heldOwned reports whether p holds every key as an owned (full-priority)
// block with its bytes.
func heldOwned(t *testing.T, f *zcFixture, ns string, keys [][]byte) bool {
	t.Helper()
	for _, k := range keys {
		if low, ok := lowPriority(f.tier, ns, k); !ok || low {
			return false
		}
		v, _, err := f.p.Get(context.Background(), ns, k, ScopeLocal)
		if err != nil || string(v) != string(value(string(k), 8<<10)) {
			t.Fatalf("%s on its owner: %v, right bytes %v", k, err, string(v) == string(value(string(k), 8<<10)))
		}
	}
	return true
}

// TestOwedPushRetried: the pushes of blocks put on a to their owner b fail
// (b unreachable, still a member); no membership change follows. Once b
// answers again, a's retry pass pushes them, and b holds them as owned
// blocks. Before, a failed push was forgotten and b never got them.
func TestOwedPushRetried(t *testing.T) {
	const ns = "ns"
	_, fx, peers := newMovingCluster(t, owedCfg(), []string{"a", "b"}, []string{"a", "b"})
	a, b := fx["a"], fx["b"]
	peers["a"].down.Store("b", struct{}{})
	keys := putOwned(t, a, ns, []string{"a", "b"}, "b", 6)
	poll.Until(t, 10*time.Second, "a's pushes to fail and the blocks to be owed", func() bool {
		return a.p.RouteStats().Rebalance.Owed == int64(len(keys))
	})
	if heldOwned(t, b, ns, keys[:1]) {
		t.Fatal("b holds a block whose push failed")
	}
	peers["a"].down.Delete("b")
	poll.Until(t, 10*time.Second, "a retry pass to push the owed blocks to b", func() bool {
		return heldOwned(t, b, ns, keys)
	})
	poll.Until(t, 10*time.Second, "the owed blocks to be settled", func() bool {
		return a.p.RouteStats().Rebalance.Owed == 0
	})
	st := a.p.RouteStats().Rebalance
	t.Logf("a: %+v", st)
	if st.MovedBlocks < int64(len(keys)) || st.OwedDropped != 0 {
		t.Fatalf("rebalance %+v: want ≥ %d moved, none dropped", st, len(keys))
	}
	for _, k := range keys { // a keeps its copies low-priority
		if low, ok := lowPriority(a.tier, ns, k); !ok || !low {
			t.Fatalf("%s on a: held %v, low-priority %v", k, ok, low)
		}
	}
}

// TestOwedWaitsForOwnerToReturn: b hangs and then drops out of the ring
// (gossip declared it failed), so the blocks whose push to it failed have
// no owner but a; they stay owed. When b is back in the ring, the pass of
// that change pushes them, the blocks a owned meanwhile too, and a move
// that fails there (b still unreachable at first) is retried until it
// lands.
func TestOwedWaitsForOwnerToReturn(t *testing.T) {
	const ns = "ns"
	s, fx, peers := newMovingCluster(t, owedCfg(), []string{"a", "b"}, []string{"a", "b"})
	a, b := fx["a"], fx["b"]
	peers["a"].down.Store("b", struct{}{})
	hung := putOwned(t, a, ns, []string{"a", "b"}, "b", 4)
	poll.Until(t, 10*time.Second, "the pushes to the hung b to be owed", func() bool {
		return a.p.RouteStats().Rebalance.Owed == int64(len(hung))
	})
	s.set([]string{"a"}) // b declared failed
	p0 := a.p.RouteStats().Rebalance.Passes
	a.p.MembershipChanged()
	poll.Until(t, 10*time.Second, "the pass after b's failure", func() bool {
		st := a.p.RouteStats().Rebalance
		return st.Passes > p0 && !st.Running
	})
	if st := a.p.RouteStats().Rebalance; st.Owed != int64(len(hung)) || st.OwedDropped != 0 {
		t.Fatalf("with b out of the ring: %+v, want %d owed", st, len(hung))
	}
	// a owns everything now: blocks put meanwhile are owned, not pushed.
	var down [][]byte
	for i := 0; len(down) < 4; i++ {
		k := fmt.Sprint("d", i)
		if rendezvous([]string{"a", "b"}, ns, []byte(k), 1)[0] != "b" {
			continue
		}
		if _, err := a.p.Put(context.Background(), ns, []byte(k), value(k, 8<<10), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		down = append(down, []byte(k))
	}
	f0 := a.p.RouteStats().Rebalance.Failed
	s.set([]string{"a", "b"}) // b is back, unreachable a little longer
	a.p.MembershipChanged()
	poll.Until(t, 10*time.Second, "moves to the unreachable b to fail", func() bool {
		return a.p.RouteStats().Rebalance.Failed >= f0+int64(len(hung)+len(down))
	})
	peers["a"].down.Delete("b")
	all := append(append([][]byte{}, hung...), down...)
	poll.Until(t, 10*time.Second, "b to hold every block it owns", func() bool {
		return heldOwned(t, b, ns, all)
	})
	poll.Until(t, 10*time.Second, "nothing owed", func() bool { return a.p.RouteStats().Rebalance.Owed == 0 })
	t.Logf("a: %+v", a.p.RouteStats().Rebalance)
}

// TestOwedSetBounds: an owed block is given up owedFor after its first
// failed push (a later failure does not restart the time), and past
// maxOwed blocks a new one is given up at once; both are counted. A block
// is due only while a current owner other than self exists.
func TestOwedSetBounds(t *testing.T) {
	var o owedSet
	t0 := time.Unix(1_000_000, 0)
	owners := map[string][]string{"x": {"b", "a"}, "y": {"a", "b"}}
	of := func(ns string, key []byte) []string { return owners[string(key)] }
	if !o.add(t0, "ns", [][]byte{[]byte("x"), []byte("y")}) {
		t.Fatal("nothing added")
	}
	if o.add(t0.Add(time.Minute), "ns", [][]byte{[]byte("x")}) {
		t.Fatal("a block owed already was added again")
	}
	if !o.due(t0, "a", 1, of) {
		t.Fatal("x, owned by b, is not due")
	}
	o.settle([]string{owedKey("ns", []byte("x"))})
	if o.due(t0, "a", 1, of) {
		t.Fatal("y, owned by this node alone, is due")
	}
	if !o.due(t0, "a", 2, of) {
		t.Fatal("y, with a second owner b (R = 2), is not due")
	}
	if k := o.keys(t0.Add(owedFor)); len(k) != 1 || o.dropped.Load() != 0 {
		t.Fatalf("at owedFor: %v owed, %d dropped", k, o.dropped.Load())
	}
	if k := o.keys(t0.Add(owedFor + time.Second)); len(k) != 0 || o.dropped.Load() != 1 {
		t.Fatalf("past owedFor: %v owed, %d dropped", k, o.dropped.Load())
	}
	keys := make([][]byte, maxOwed+3)
	for i := range keys {
		keys[i] = []byte(fmt.Sprint(i))
	}
	o.add(t0, "ns", keys)
	if o.len() != maxOwed || o.dropped.Load() != 1+3 {
		t.Fatalf("%d owed, %d dropped; want %d, 4", o.len(), o.dropped.Load(), maxOwed)
	}
}

// TestOwedCommitAfterOwnerLeft: a zero-copy put reserved while b owned the
// block (a low-priority copy here) and committed after b left the ring
// pushes nothing (a owns it now); the block is owed, and reaches b when b
// is back. Before, it stayed a copy here that no pass moved.
func TestOwedCommitAfterOwnerLeft(t *testing.T) {
	const ns = "ns"
	s, fx, _ := newMovingCluster(t, owedCfg(), []string{"a", "b"}, []string{"a", "b"})
	a, b := fx["a"], fx["b"]
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprint("k", i); rendezvous([]string{"a", "b"}, ns, []byte(k), 1)[0] == "b" {
			key = k
		}
	}
	val := value(key, 8<<10)
	rs, err := a.p.Reserve(bg, ns, []ReserveItem{{Key: []byte(key), Size: int64(len(val))}}, 0, false)
	if err != nil || rs[0].Err != nil {
		t.Fatalf("Reserve: %v %v", err, rs)
	}
	a.writeSlot(t, rs[0].Slot, val)
	s.set([]string{"a"}) // b declared failed between Reserve and Commit
	if cs, err := a.p.Commit(bg, []CommitItem{{Token: rs[0].Token, Checksum: cache.Checksum(val), HasChecksum: true}}); err != nil || cs[0] != nil {
		t.Fatalf("Commit: %v %v", err, cs)
	}
	if st := a.p.RouteStats(); st.Rebalance.Owed != 1 || st.Pushes+st.PushFailures != 0 {
		t.Fatalf("after the commit: %+v, want the block owed and no push", st)
	}
	s.set([]string{"a", "b"}) // b is back
	a.p.MembershipChanged()
	poll.Until(t, 10*time.Second, "the block to reach b", func() bool {
		return heldOwned(t, b, ns, [][]byte{[]byte(key)})
	})
	poll.Until(t, 10*time.Second, "nothing owed", func() bool { return a.p.RouteStats().Rebalance.Owed == 0 })
}
