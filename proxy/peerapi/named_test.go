package peerapi_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/poll"
	"github.com/tidepool-kv/tidepool/proxy"
)

// TestNamedReads: after its first Acquire answer says the owner serves
// named reads, a node fetches from it in one exchange each (no more
// Acquire calls), lands the right bytes and leaves no pin on the owner; a
// node that serves none is fetched from by Acquire as before.
func TestNamedReads(t *testing.T) {
	for _, tc := range []struct {
		name    string
		noNamed bool
	}{{"served", false}, {"not served", true}} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := newCluster(t, 2, nodeOpts{noNamed: tc.noNamed})
			a, owner := nodes[0], nodes[1]
			ctx := context.Background()
			const ns, n = "named", 12
			keys := make([][]byte, n)
			for i := range keys {
				keys[i] = keyOwnedBy(t, nodes, ns, fmt.Sprint("k", i), owner.name)
				size := 300 << 10
				if i == n-1 {
					size = 0 // an empty block lands too
				}
				if _, err := owner.p.PutLocal(ctx, ns, keys[i], value(byte(i), size), cache.PutOptions{Depth: int32(i)}); err != nil {
					t.Fatal(err)
				}
			}
			for i := range keys {
				got, info, err := a.p.Get(ctx, ns, keys[i], proxy.ScopeCluster)
				if err != nil || !bytes.Equal(got, value(byte(i), len(got))) || info.Depth != int32(i) {
					t.Fatalf("fetch %d: %d bytes depth %d, %v", i, len(got), info.Depth, err)
				}
				if _, ok, _ := a.p.Exists(ctx, ns, keys[i], proxy.ScopeLocal); !ok {
					t.Fatalf("fetched block %d did not land", i)
				}
			}
			// A miss is a miss either way.
			miss := keyOwnedBy(t, nodes, ns, "absent", owner.name)
			if _, _, err := a.p.Get(ctx, ns, miss, proxy.ScopeCluster); err == nil {
				t.Fatal("a block nobody holds was found")
			}
			checkFetchPaths(t, owner, n, tc.noNamed)
			poll.Until(t, 5*time.Second, "owner's pins given back", func() bool { return owner.p.ZeroCopyStats().LiveLeases == 0 })
		})
	}
}

// TestNamedReadsStoppedMidway: an owner that said it serves named reads
// and then answers them "unsupported" (its transport stopped serving
// them) costs no read: the block is fetched by Acquire instead.
func TestNamedReadsStoppedMidway(t *testing.T) {
	nodes := newCluster(t, 2, nodeOpts{})
	a, owner := nodes[0], nodes[1]
	ctx := context.Background()
	const ns = "named"
	keys := make([][]byte, 3)
	for i := range keys {
		keys[i] = keyOwnedBy(t, nodes, ns, fmt.Sprint("k", i), owner.name)
		if _, err := owner.p.PutLocal(ctx, ns, keys[i], value(byte(i), 64<<10), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	get := func(i int) {
		t.Helper()
		got, _, err := a.p.Get(ctx, ns, keys[i], proxy.ScopeCluster)
		if err != nil || !bytes.Equal(got, value(byte(i), 64<<10)) {
			t.Fatalf("fetch %d: %d bytes, %v", i, len(got), err)
		}
	}
	get(0) // by Acquire: the owner says it serves named reads
	owner.tr.HandleFetch(nil)
	get(1) // a named read answered "unsupported", then Acquire
	get(2) // by Acquire (the answer said so again), then "unsupported" again
	st := owner.srv.Stats()
	if st.Acquired != 3 || st.Fetched != 0 {
		t.Fatalf("owner pinned %d by Acquire and sent %d by named reads, want 3 and 0", st.Acquired, st.Fetched)
	}
	for _, s := range a.p.PeerStats() {
		if s.Failures != 0 {
			t.Fatalf("peer stats %+v: a fallback counted as a failure", s)
		}
	}
}

// checkFetchPaths checks how owner served n fetches of one node: the
// first by Acquire and the rest by named reads, or all by Acquire where it
// serves no named reads.
func checkFetchPaths(t *testing.T, owner *node, n int64, noNamed bool) {
	t.Helper()
	st := owner.srv.Stats()
	wantAcq, wantNamed := int64(1), n-1
	if noNamed {
		wantAcq, wantNamed = n, 0
	}
	if st.Acquired != wantAcq || st.Fetched != wantNamed {
		t.Fatalf("owner pinned %d blocks by Acquire and sent %d by named reads, want %d and %d", st.Acquired, st.Fetched, wantAcq, wantNamed)
	}
}
