package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/client"
)

// TestPeerLeavesUnderTraffic: one member (B) of a two-node cluster stops
// (SIGTERM: it leaves) and restarts, again and again, while the other (A)
// fetches B's blocks, pushes its own to B, asks B for lookups and deletes,
// and releases the leases of its fetches (B serves no named reads, so
// every fetch pins and then releases). A closes its pooled connections
// to B each time B leaves; a call or a queued lease release must then
// fail cleanly, never go through the closed client (Kitex panics on it:
// "client is already closed"). A stays up, and serves right bytes or
// misses throughout. Under -race the serve binary is built with -race too
// and must report no data race.
func TestPeerLeavesUnderTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test skipped in -short mode")
	}
	bin := raceBinary(t)
	a := clusterArgs(t, "node-a", "")
	a.d = startDaemonBin(t, bin, nil, a.args...)
	b := clusterArgs(t, "node-b", a.gossip)
	// Every fetch from B by Acquire: each queues a lease release on A.
	b.args = append(b.args, "--peer-named-reads=false")
	ca, err := client.New(a.d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	const cycles = 10
	var wrong, okGets, fails atomic.Int64
	for cycle := 0; cycle < cycles; cycle++ {
		leaveCycle(t, bin, a, b, ca, cycle, &wrong, &okGets, &fails)
	}
	t.Logf("%d cycles: %d right fetches, %d misses or errors, %d wrong", cycles, okGets.Load(), fails.Load(), wrong.Load())
	a.d.alive(t)
	if errs := a.d.stderr.String(); strings.Contains(errs, "panic:") || strings.Contains(errs, "DATA RACE") {
		t.Fatalf("A's stderr reports a panic or a data race:\n%s", errs)
	}
	if wrong.Load() != 0 {
		t.Fatalf("%d fetches returned wrong bytes", wrong.Load())
	}
	if okGets.Load() == 0 {
		t.Fatal("no fetch from B succeeded")
	}
}

// leaveCycle starts B, puts blocks on it, runs A's traffic to B, stops B
// (SIGTERM) and waits until A sees it gone; the traffic has stopped when
// it returns, whether or not it failed the test.
func leaveCycle(t *testing.T, bin string, a, b *clusterMember, ca *client.Client, cycle int, wrong, okGets, fails *atomic.Int64) {
	const nkeys = 32
	ctx := context.Background()
	{
		b.d = startDaemonBin(t, bin, nil, b.args...)
		waitView(t, a.d, "node-a", "node-b")
		cb, err := client.New(b.d.socket)
		if err != nil {
			t.Fatal(err)
		}
		// B's blocks: held by B (and pushed to their owners), fetched by A.
		keys := make([][]byte, nkeys)
		for i := range keys {
			keys[i] = fmt.Appendf(nil, "c%d-k%d", cycle, i)
			if _, err := cb.Put(ctx, "leave", keys[i], leaveVal(i), 0); err != nil {
				t.Fatalf("put on B: %v", err)
			}
		}
		cb.Close()

		stop := make(chan struct{})
		var wg sync.WaitGroup
		defer func() { close(stop); wg.Wait() }()
		run := func(f func(i int) bool) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if !f(i) {
						time.Sleep(5 * time.Millisecond) // B is down: no busy loop
					}
				}
			}()
		}
		for g := 0; g < 4; g++ {
			run(func(i int) bool { // fetches from B, then drop the local copy
				k := keys[(i*4+g)%nkeys]
				got, found, err := ca.Get(ctx, "leave", k, client.ScopeCluster)
				_, _ = ca.Delete(ctx, "leave", k, client.ScopeLocal)
				switch {
				case err != nil || !found:
					fails.Add(1)
					return false
				case !bytes.Equal(got, leaveVal((i*4+g)%nkeys)):
					wrong.Add(1)
				default:
					okGets.Add(1)
				}
				return true
			})
		}
		for g := 0; g < 3; g++ {
			run(func(i int) bool { // pushes to B (the blocks B owns) and lookups on B
				k := fmt.Appendf(nil, "a%d-%d-%d", cycle, g, i)
				_, _ = ca.Put(ctx, "pushed", k, leaveVal(i%64), 0)
				present, err := ca.Present(ctx, "leave", keys, client.ScopeCluster)
				return err == nil && present[0]
			})
		}
		run(func(i int) bool { // cluster-wide deletes: a Delete call to B
			_, err := ca.Delete(ctx, "pushed", fmt.Appendf(nil, "a%d-0-%d", cycle, i), client.ScopeCluster)
			return err == nil
		})
		time.Sleep(300 * time.Millisecond) // traffic before the leave
		b.d.stop(t, syscall.SIGTERM)
		a.d.alive(t)
		waitView(t, a.d, "node-a")
		a.d.alive(t)
		t.Logf("cycle %d: %d right fetches so far", cycle, okGets.Load())
	}
}

func leaveVal(i int) []byte { return bytes.Repeat([]byte{byte(i), byte(i >> 8), 0x5a}, 4096+i) }
