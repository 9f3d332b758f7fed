package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/client"
)

// helperProcess runs this test binary as a child engine when the
// environment asks for one, and reports whether it did (TestMain then
// returns at once). TIDEPOOL_LEASE_HOLDER=socket,ns,n,lease_ms acquires
// keys blk-0 … blk-(n-1) of ns with that lease, reads them, prints "held"
// and waits to be killed.
func helperProcess() bool {
	spec := os.Getenv("TIDEPOOL_LEASE_HOLDER")
	if spec == "" {
		return false
	}
	var sock, ns string
	var n, ms int
	f := strings.Split(spec, ",")
	if len(f) != 4 {
		fmt.Fprintln(os.Stderr, "bad TIDEPOOL_LEASE_HOLDER", spec)
		os.Exit(2)
	}
	sock, ns = f[0], f[1]
	fmt.Sscan(f[2], &n)
	fmt.Sscan(f[3], &ms)
	c, err := client.New(sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "blk-%d", i)
	}
	ls, _, err := c.Acquire(context.Background(), ns, keys, time.Duration(ms)*time.Millisecond)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for i, l := range ls {
		if l.Code != client.CodeOK {
			fmt.Fprintln(os.Stderr, "acquire", i, l.Code)
			os.Exit(1)
		}
	}
	// Reads of the blocks it holds (as an engine checking a copy does):
	// the tier pins a block for the copy, and that pin must not lengthen
	// the lease.
	for _, k := range keys {
		if _, _, err := c.Get(context.Background(), ns, k); err != nil {
			fmt.Fprintln(os.Stderr, "get", err)
			os.Exit(1)
		}
	}
	fmt.Println("held")
	select {} // until killed
}

// TestServeExpiredLeaseFreesRoom: an engine process acquires 15 of the 16
// MiB of a DRAM tier with a 2,000 ms lease, reads those blocks (inline
// Get; the scrubber reads them too) and is killed (kill -9: it releases
// nothing); 2.3 s later a 2 MiB Put succeeds, as do the next ones: a Put
// that needs room treats pins whose deadline passed as gone
// (docs/zerocopy.md), and the tier's own short pins for a copy or a scrub
// never lengthen a lease. The puts are inline (no put socket: its calls
// sweep the lease table first) and DRAM is the only tier (with SSD a put
// that finds no room goes there).
func TestServeExpiredLeaseFreesRoom(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	d := startDaemon(t, "--dram-capacity", "16MiB", "--max-value-size", "4MiB", "--put-socket=false", "--ssd-capacity", "0",
		"--max-request-size", "8MiB")
	const bs, nb = 1 << 20, 15
	ctx := context.Background()
	c, err := client.New(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	val := make([]byte, bs)
	for i := range nb {
		val[0] = byte(i)
		if _, err := c.Put(ctx, "ns", fmt.Appendf(nil, "blk-%d", i), val, 0); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	holder := exec.Command(os.Args[0], "-test.run=^$")
	holder.Env = append(os.Environ(), "TIDEPOOL_LEASE_HOLDER="+d.socket+",ns,"+fmt.Sprint(nb)+",2000")
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	holder.Stderr = os.Stderr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Kill()
	line, _ := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "held" {
		t.Fatalf("lease holder said %q", line)
	}
	acquired := time.Now()
	holder.Process.Kill()
	holder.Wait()
	time.Sleep(time.Until(acquired.Add(2300 * time.Millisecond)))
	big := make([]byte, 2<<20)
	for i := range 3 {
		big[0] = byte(i)
		if _, err := c.Put(ctx, "ns", fmt.Appendf(nil, "big-%d", i), big, 0); err != nil {
			t.Fatalf("2 MiB put %d, 2.3 s after the lease holder was killed: %v", i, err)
		}
	}
}
