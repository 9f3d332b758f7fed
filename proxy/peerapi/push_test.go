package peerapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/proxy"
)

// TestPushLargerThanMessageBound: pushes whose blocks together are far
// larger than one peer API message (here 8 MiB both ways), in blocks of
// 3 MiB, on plain and on encrypted connections, reach their owner whole:
// the client cuts them into calls within the bound, and the owner reads
// each call whole (frame.go: an encrypted connection hands Kitex 16 KiB a
// read, and before it the owner failed any block over about 1.6 MiB with
// "ReadFieldBegin: buf too small"). A block whose call alone exceeds the
// bound is refused here (TOO_LARGE), the others of its push are stored,
// and nothing counts against the owner: a proxy pushing such a batch
// stores every block on the owner and never marks it down.
func TestPushLargerThanMessageBound(t *testing.T) {
	for _, encrypt := range []bool{false, true} {
		t.Run(fmt.Sprintf("encrypt=%v", encrypt), func(t *testing.T) {
			nodes := newCluster(t, 2, nodeOpts{secret: "push-secret-0123456789", encrypt: encrypt,
				maxMessage: 8 << 20, capacity: 128 << 20, fetchTimeout: 20 * time.Second}) // not a test of speed
			a, b := nodes[0], nodes[1]
			ctx := context.Background()
			const ns, n, size = "push", 12, 3 << 20
			items := make([]proxy.PutItem, 0, n+1)
			for i := range n {
				items = append(items, proxy.PutItem{Key: keyOwnedBy(t, nodes, ns, fmt.Sprint("direct", i), "n1"), Value: value(byte(i), size)})
			}
			// One block larger than a message, among the others.
			big := proxy.PutItem{Key: keyOwnedBy(t, nodes, ns, "big", "n1"), Value: value(99, 9<<20)}
			items = append(items[:5], append([]proxy.PutItem{big}, items[5:]...)...)

			res, err := a.cli.Push(ctx, "n1", ns, items)
			if err != nil {
				t.Fatalf("push: %v", err)
			}
			for i, e := range res {
				switch {
				case i == 5 && !errors.Is(e, cache.ErrTooLarge):
					t.Fatalf("the block over the bound: %v, want TOO_LARGE", e)
				case i != 5 && e != nil:
					t.Fatalf("block %d: %v", i, e)
				}
			}
			for i, it := range items {
				got, _, err := b.p.Get(ctx, ns, it.Key, proxy.ScopeLocal)
				switch {
				case i == 5:
					if !errors.Is(err, cache.ErrNotFound) {
						t.Fatalf("the block over the bound on n1: %v", err)
					}
				case err != nil || !bytes.Equal(got, it.Value):
					t.Fatalf("block %d on n1: %v (equal %v)", i, err, bytes.Equal(got, it.Value))
				}
			}

			// Through the proxy: a BatchPut on n0 of blocks n1 owns, pushed in
			// the background.
			batch := make([]proxy.PutItem, n)
			for i := range batch {
				batch[i] = proxy.PutItem{Key: keyOwnedBy(t, nodes, ns, fmt.Sprint("batch", i), "n1"), Value: value(byte(50+i), size)}
			}
			if res, err := a.p.BatchPut(ctx, ns, batch); err != nil {
				t.Fatal(err)
			} else {
				for i, e := range res {
					if e != nil {
						t.Fatalf("batch put %d: %v", i, e)
					}
				}
			}
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				if rs := a.p.RouteStats(); rs.Pushes+rs.PushFailures >= n {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the pushes never ended")
				}
			}
			if rs := a.p.RouteStats(); rs.Pushes != n || rs.PushFailures != 0 || rs.PeerDownOpens != 0 {
				t.Fatalf("pushes %d, failures %d, owner marked down %d times; want %d, 0, 0", rs.Pushes, rs.PushFailures, rs.PeerDownOpens, n)
			}
			for i, it := range batch {
				if got, _, err := b.p.Get(ctx, ns, it.Key, proxy.ScopeLocal); err != nil || !bytes.Equal(got, it.Value) {
					t.Fatalf("pushed block %d on n1: %v", i, err)
				}
			}
		})
	}
}
