package peerapi_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/poll"
	"github.com/tidepool-kv/tidepool/proxy"
)

// TestForgetUnderCalls: the requester forgets the owner's connections
// (as serve does when a member leaves) again and again while fetches
// (each queueing a lease release), lookups and pushes to the owner are in
// flight, then closes while they still run. No call goes through a closed
// Kitex client (it panics: "client is already closed"); a call that meets
// a closed connection fails as unavailable, and the fetches that succeed
// return the right bytes. Run with -race.
func TestForgetUnderCalls(t *testing.T) {
	nodes := newCluster(t, 2, nodeOpts{noNamed: true}) // every fetch by Acquire, then a release
	a, owner := nodes[0], nodes[1]
	ctx := context.Background()
	const ns, n = "forget", 16
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = keyOwnedBy(t, nodes, ns, fmt.Sprint("k", i), owner.name)
		if _, err := owner.p.PutLocal(ctx, ns, keys[i], value(byte(i), 32<<10), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	peerAddr, _, ok := a.view.Addrs(owner.name)
	if !ok {
		t.Fatal("owner's address unknown")
	}
	var (
		stop             = make(chan struct{})
		wg               sync.WaitGroup
		fetched, refused atomic.Int64
		other            atomic.Value
	)
	check := func(err error) {
		switch {
		case err == nil:
		case errors.Is(err, cache.ErrUnavailable) || errors.Is(err, cache.ErrNotFound):
			refused.Add(1)
		default:
			other.Store(err)
		}
	}
	loop := func(f func(i int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				f(i)
			}
		}()
	}
	for g := 0; g < 4; g++ {
		loop(func(i int) {
			k := keys[(i+g*4)%n]
			v, _, err := a.p.Get(ctx, ns, k, proxy.ScopeCluster)
			check(err)
			if err == nil {
				fetched.Add(1)
				if string(v) != string(value(byte((i+g*4)%n), 32<<10)) {
					other.Store(fmt.Errorf("wrong bytes for %s", k))
				}
			}
			a.p.Delete(ctx, ns, k, proxy.ScopeLocal)
		})
	}
	loop(func(i int) {
		_, err := a.cli.Lookup(ctx, owner.name, ns, keys)
		check(err)
	})
	loop(func(i int) {
		_, err := a.cli.Push(ctx, owner.name, "pushed", []proxy.PutItem{{Key: fmt.Appendf(nil, "p%d", i), Value: value(1, 512)}})
		check(err)
	})
	loop(func(i int) {
		a.cli.Forget(peerAddr)
		time.Sleep(time.Millisecond)
	})
	poll.Until(t, 20*time.Second, "fetches and refusals", func() bool { return fetched.Load() > 50 && refused.Load() > 5 })
	// Close while the calls go on: they fail as closed, none panics.
	if err := a.cli.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	close(stop)
	wg.Wait()
	if e := other.Load(); e != nil {
		t.Fatalf("unexpected: %v", e)
	}
	t.Logf("%d fetches, %d calls refused or missed", fetched.Load(), refused.Load())
	// The owner's pins end released or expire with their lease; none
	// outlives it.
	poll.Until(t, 15*time.Second, "owner's leases released or expired", func() bool {
		return owner.p.ZeroCopyStats().LiveLeases == 0
	})
}
