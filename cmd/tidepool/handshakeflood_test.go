package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/client"
)

// holdSilent holds n connections to addr that send nothing, each reopened
// when the node closes it, until stop is closed (a connection closed within
// 20 ms is reopened after a 20 ms pause). It returns how many it opened.
func holdSilent(addr string, n int, stop chan struct{}, wg *sync.WaitGroup) *atomic.Int64 {
	opened := new(atomic.Int64)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				c, err := net.Dial("tcp", addr)
				if err == nil {
					opened.Add(1)
					done := make(chan struct{})
					go func() {
						select {
						case <-stop:
						case <-done:
						}
						c.Close()
					}()
					_, _ = io.Copy(io.Discard, c) // until the node closes it
					close(done)
				}
				if time.Since(start) < 20*time.Millisecond {
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
				}
			}
		}()
	}
	return opened
}

// TestHandshakeFloodMembersGetIn: a stranger holds 1,200 silent
// connections to a real node's peer API and transfer ports, from the
// members' own address (loopback), more than peer_max_conns on each, and
// reopens each as the node closes it. A second node joins during the
// flood and reads 100 blocks that the attacked node owns, with the right
// bytes; it restarts, still during the flood, and reads them again. Before
// the handshake budget, unauthenticated connections took the members'
// places under peer_max_conns and the newcomer read none.
func TestHandshakeFloodMembersGetIn(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test skipped in -short mode")
	}
	a := clusterArgs(t, "flood-a", "")
	a.d = startDaemon(t, append(a.args, "--peer-max-conns", "500")...)
	b := clusterArgs(t, "flood-b", a.gossip)
	ca, err := client.New(a.d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	ctx := context.Background()
	const ns, n = "flood", 100
	names := []string{"flood-a", "flood-b"}
	vals := map[string][]byte{}
	var keys []string
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprint("blk-", i)
		if ringOwner(t, names, ns, k) != "flood-a" {
			continue
		}
		vals[k] = randValue(int64(i), 16<<10+i)
		if _, err := ca.Put(ctx, ns, []byte(k), vals[k], 0); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	opened := holdSilent(a.flag(t, "--peer-addr"), 600, stop, &wg)
	openedX := holdSilent(a.flag(t, "--transfer-addr"), 600, stop, &wg)
	for deadline := time.Now().Add(60 * time.Second); opened.Load() < 600 || openedX.Load() < 600; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the flood opened only %d and %d connections", opened.Load(), openedX.Load())
		}
	}

	readAll := func(d *daemon, round string) {
		t.Helper()
		cb, err := client.New(d.socket)
		if err != nil {
			t.Fatal(err)
		}
		defer cb.Close()
		// Each block gets three tries (a member's connection must get in,
		// not win a race for a place a stranger's timeout freed).
		got := 0
		var lastErr error
		for _, k := range keys {
			for try := 0; try < 3; try++ {
				v, found, err := cb.Get(ctx, ns, []byte(k), client.ScopeCluster)
				if err == nil && found {
					if !bytes.Equal(v, vals[k]) {
						t.Fatalf("%s: wrong bytes for %s", round, k)
					}
					got++
					break
				}
				lastErr = fmt.Errorf("found %v, %v", found, err)
				time.Sleep(100 * time.Millisecond)
			}
		}
		if got != n {
			t.Fatalf("%s: read %d of %d blocks from the attacked node during the flood (last miss: %v); its metrics:\n%s",
				round, got, n, lastErr, grepLines(httpGet(t, "http://"+a.d.metrics+"/metrics"), "tidepool_port_"))
		}
	}
	b.d = startDaemon(t, b.args...)
	waitView(t, b.d, names...)
	readAll(b.d, "after joining")
	b.d.stop(t, syscall.SIGTERM)
	b.d = startDaemon(t, b.args...)
	waitView(t, b.d, names...)
	readAll(b.d, "after restarting")

	a.d.alive(t)
	for _, port := range []string{"peer_api", "transfer"} {
		if v := metric(t, a.d, `tidepool_port_refused_total{port="`+port+`",reason="displaced"}`); v == 0 {
			t.Fatalf("%s: no handshake displaced during the flood", port)
		}
		if v := metric(t, a.d, `tidepool_port_handshakes{port="`+port+`"}`); v > 16 {
			t.Fatalf("%s: %v handshakes at once from one address, budget 16", port, v)
		}
	}
	t.Logf("stranger connections opened: %d peer API, %d transfer", opened.Load(), openedX.Load())
}
