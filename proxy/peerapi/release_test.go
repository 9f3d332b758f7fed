package peerapi_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/poll"
	"github.com/tidepool-kv/tidepool/proxy"
)

// TestReleasesRideAlong: the owner's pins of a fetch are released by the
// next Acquire to that owner (no Release call of their own) or, when none
// comes, by a Release call shortly after; either way the owner ends with no
// live lease, and Close of the requester releases what is still queued.
func TestReleasesRideAlong(t *testing.T) {
	nodes := newCluster(t, 2, nodeOpts{noNamed: true}) // every fetch by Acquire
	a, owner := nodes[0], nodes[1]
	ctx := context.Background()
	const ns, n = "ride", 20
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = keyOwnedBy(t, nodes, ns, fmt.Sprint("k", i), owner.name)
		if _, err := owner.p.PutLocal(ctx, ns, keys[i], value(byte(i), 64<<10), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range keys {
		if _, _, err := a.p.Get(ctx, ns, keys[i], proxy.ScopeCluster); err != nil {
			t.Fatalf("fetch %d: %v", i, err)
		}
	}
	// Back to back: all but the last fetch's pin rode on a later Acquire,
	// or on a timed Release if the fetches were slow; none is lost.
	poll.Until(t, 10*time.Second, "owner's leases released", func() bool {
		st := owner.srv.Stats()
		return st.Acquired == n && st.Released == n && owner.p.ZeroCopyStats().LiveLeases == 0
	})

	// A fetch followed by Close: Close releases the queued pin.
	k := keyOwnedBy(t, nodes, ns, "last", owner.name)
	if _, err := owner.p.PutLocal(ctx, ns, k, value(99, 4096), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	a.p.Delete(ctx, ns, k, proxy.ScopeLocal)
	if _, _, err := a.p.Get(ctx, ns, k, proxy.ScopeCluster); err != nil {
		t.Fatal(err)
	}
	if err := a.cli.Close(); err != nil {
		t.Fatal(err)
	}
	if live := owner.p.ZeroCopyStats().LiveLeases; live != 0 {
		t.Fatalf("%d owner leases live after the requester's Close", live)
	}
}
