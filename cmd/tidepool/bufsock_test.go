package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/client"
)

// TestServeBufferSocket: two real `tidepool serve` processes. Blocks put
// on A are read through B into a buffer registered with B (the buffer
// socket): identical bytes, those B does not hold landing there from a
// named read; a put from a registered buffer on B is read back through A.
// The socket file has the engine socket's mode and goes at SIGTERM;
// --buffer-socket=false serves none.
func TestServeBufferSocket(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	a := clusterArgs(t, "node-a", "")
	a.d = startDaemon(t, a.args...)
	b := clusterArgs(t, "node-b", a.gossip)
	b.d = startDaemon(t, b.args...)
	waitView(t, b.d, "node-a", "node-b")
	buf := b.d.socket + ".buf"
	if fi, err := os.Stat(buf); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("buffer socket %s: %v, mode %v", buf, err, fi)
	}

	const n = 16
	vals := make([][]byte, n)
	dir := t.TempDir()
	for i := range vals {
		vals[i] = make([]byte, 512<<10+i*4099)
		rand.New(rand.NewSource(int64(i))).Read(vals[i])
		f := filepath.Join(dir, fmt.Sprint(i))
		os.WriteFile(f, vals[i], 0o600)
		if _, errs, code := a.d.tp(t, nil, "put", "--ns", "kv", fmt.Sprintf("blk-%d", i), f); code != 0 {
			t.Fatalf("put %d on A: %s", i, errs)
		}
	}
	ctx := context.Background()
	c, err := client.New(b.d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rb, err := c.RegisterBuffer(ctx, 2<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Close()
	named0 := metricSum(t, b.d, "tidepool_peer_named_reads_total")
	for i := range vals {
		clear(rb.Bytes())
		key := []byte(fmt.Sprintf("blk-%d", i))
		size, found, err := rb.Get(ctx, "kv", key, 4096, 1<<20, client.ScopeCluster)
		for try := 0; err == nil && !found && try < 20; try++ {
			// A's push to B of a block B owns may still be in flight.
			time.Sleep(100 * time.Millisecond)
			size, found, err = rb.Get(ctx, "kv", key, 4096, 1<<20, client.ScopeCluster)
		}
		if err != nil || !found || size != len(vals[i]) || !bytes.Equal(rb.Bytes()[4096:4096+size], vals[i]) {
			t.Fatalf("get %d through B: %d bytes, found %v, %v", i, size, found, err)
		}
	}
	if metricSum(t, b.d, "tidepool_peer_named_reads_total") == named0 {
		t.Fatal("no block landed in the buffer from a named read")
	}

	copy(rb.Bytes(), vals[0])
	if existed, err := rb.Put(ctx, "kv", []byte("from-b"), 0, len(vals[0]), 0); err != nil || existed {
		t.Fatalf("put from the buffer: existed %v, %v", existed, err)
	}
	got, errs, code := a.d.tp(t, nil, "get", "--ns", "kv", "from-b")
	if code != 0 || got != string(vals[0]) {
		t.Fatalf("get on A of the put from B's buffer: code %d, %d bytes: %s", code, len(got), errs)
	}

	b.d.stop(t, syscall.SIGTERM)
	if _, err := os.Stat(buf); !os.IsNotExist(err) {
		t.Fatalf("%s left behind after a graceful exit: %v", buf, err)
	}
	off := startDaemon(t, "--buffer-socket=false")
	if _, err := os.Stat(off.socket + ".buf"); !os.IsNotExist(err) {
		t.Fatalf("buffer_socket off: %v", err)
	}
	oc, err := client.New(off.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Close()
	if _, err := oc.RegisterBuffer(ctx, 1<<20); client.CodeOf(err) != client.CodeUnavailable {
		t.Fatalf("RegisterBuffer without the socket: %v", err)
	}
}
