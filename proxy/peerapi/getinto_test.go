package peerapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/poll"
	"github.com/tidepool-kv/tidepool/proxy"
)

// TestGetIntoRemote: GetInto reads a block another node holds straight
// into the caller's memory over a named read (not kept here), checked
// against its checksum; it writes nothing for a miss or a block larger
// than the room; where the owner serves no named reads, or this node
// should keep the block (a hot key), it goes through the store.
func TestGetIntoRemote(t *testing.T) {
	for _, tc := range []struct {
		name    string
		noNamed bool
	}{{"named", false}, {"no named reads", true}} {
		t.Run(tc.name, func(t *testing.T) {
			route := &proxy.RouteConfig{HotThreshold: 4, HotWindow: time.Minute, HotTTL: time.Minute, RebalanceRate: proxy.Off}
			nodes := newCluster(t, 2, nodeOpts{noNamed: tc.noNamed, route: route})
			a, owner := nodes[0], nodes[1]
			ctx := context.Background()
			const ns, n = "into", 8
			keys := make([][]byte, n)
			for i := range keys {
				keys[i] = keyOwnedBy(t, nodes, ns, fmt.Sprint("k", i), owner.name)
				size := 200<<10 + i*4097
				if i == n-1 {
					size = 0 // an empty block lands too
				}
				if _, err := owner.p.PutLocal(ctx, ns, keys[i], value(byte(i), size), cache.PutOptions{Depth: int32(i)}); err != nil {
					t.Fatal(err)
				}
			}
			dst := make([]byte, 1<<20)
			fill := func() {
				for i := range dst {
					dst[i] = 0x5A
				}
			}
			untouchedFrom := func(from int) {
				t.Helper()
				for i := from; i < len(dst); i++ {
					if dst[i] != 0x5A {
						t.Fatalf("byte %d written", i)
					}
				}
			}
			fetchedBefore := owner.srv.Stats().Fetched
			for i := range keys {
				fill()
				want := value(byte(i), 200<<10+i*4097)
				if i == n-1 {
					want = nil
				}
				got, info, err := a.p.GetInto(ctx, ns, keys[i], dst, proxy.ScopeCluster)
				if err != nil || got != int64(len(want)) || !bytes.Equal(dst[:got], want) || info.Depth != int32(i) || info.Checksum != cache.Checksum(want) {
					t.Fatalf("GetInto %d: %d bytes, %+v, %v", i, got, info, err)
				}
				untouchedFrom(len(want))
				_, local, _ := a.p.Exists(ctx, ns, keys[i], proxy.ScopeLocal)
				// The first fetch from a node goes through the store (its
				// Acquire answer says whether it serves named reads);
				// after it, named reads land in the caller's memory only.
				if wantLocal := tc.noNamed || i == 0; local != wantLocal {
					t.Fatalf("block %d kept here: %v, want %v", i, local, wantLocal)
				}
			}
			if fetched := owner.srv.Stats().Fetched - fetchedBefore; !tc.noNamed && fetched != n-1 {
				t.Fatalf("owner sent %d named reads, want %d", fetched, n-1)
			}

			// Too large and a miss write nothing; a local scope does not
			// ask the owner.
			fill()
			if _, _, err := a.p.GetInto(ctx, ns, keys[1], dst[:1000], proxy.ScopeCluster); !errors.Is(err, cache.ErrTooLarge) {
				t.Fatalf("too large: %v", err)
			}
			miss := keyOwnedBy(t, nodes, ns, "absent", owner.name)
			if _, _, err := a.p.GetInto(ctx, ns, miss, dst, proxy.ScopeCluster); !errors.Is(err, cache.ErrNotFound) {
				t.Fatalf("miss: %v", err)
			}
			if !tc.noNamed {
				if _, _, err := a.p.GetInto(ctx, ns, keys[2], dst, proxy.ScopeLocal); !errors.Is(err, cache.ErrNotFound) {
					t.Fatalf("local scope: %v", err)
				}
			}
			untouchedFrom(0)

			if !tc.noNamed {
				// A key read often becomes a hot replica: that read goes
				// through the store and the block stays here.
				for range 4 {
					if _, _, err := a.p.GetInto(ctx, ns, keys[3], dst, proxy.ScopeCluster); err != nil {
						t.Fatal(err)
					}
				}
				if _, local, _ := a.p.Exists(ctx, ns, keys[3], proxy.ScopeLocal); !local {
					t.Fatal("a hot block read into a buffer was not kept")
				}
				if !bytes.Equal(dst[:200<<10+3*4097], value(3, 200<<10+3*4097)) {
					t.Fatal("hot read: wrong bytes")
				}
			}
			poll.Until(t, 5*time.Second, "owner's pins given back", func() bool { return owner.p.ZeroCopyStats().LiveLeases == 0 })
		})
	}
}
