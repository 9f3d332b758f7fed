package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/client"
	"github.com/tidepool-kv/tidepool/internal/poll"
)

// zeroCopyPut stores value under key on c as an engine's connector does
// (Reserve, write the slot, Commit with the CRC-32C of what it wrote).
func zeroCopyPut(t *testing.T, c *client.Client, ns, key string, value []byte) {
	t.Helper()
	ctx := context.Background()
	rs, err := c.Reserve(ctx, ns, []client.ReserveItem{{Key: []byte(key), Size: int64(len(value))}}, 0)
	if err != nil || rs[0].Code != client.CodeOK {
		t.Fatalf("Reserve %s: %v %+v", key, err, rs)
	}
	crc, err := c.WriteSlot(ctx, rs[0].Slot, value)
	if err != nil {
		t.Fatal(err)
	}
	if errs, err := c.Commit(ctx, []client.CommitItem{{Token: rs[0].Token, Checksum: crc, HasChecksum: true}}); err != nil || errs[0] != nil {
		t.Fatalf("Commit %s: %v %v", key, err, errs)
	}
}

// metricLines are the lines of a /metrics page of the metrics whose
// names match re.
func metricLines(page, re string) []string {
	return regexp.MustCompile(`(?m)^(`+re+`)( |\{).*$`).FindAllString(page, -1)
}

// TestBlocksPutWhileOwnerDownReachIt: node f2 hangs (SIGSTOP) long enough
// for f1 to declare it failed, then runs again. Blocks put through f1
// meanwhile, zero-copy (Reserve/Commit, as the vLLM connector saves) and
// inline, both before f1 noticed (their pushes to f2 fail) and while f2
// was out of f1's ring (f1 owned them), end up held by f2 where f2 owns
// them once it is back, and every block reads through f2 with the right
// bytes. Shipped detection timings; only loopback.
func TestBlocksPutWhileOwnerDownReachIt(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test skipped in -short mode")
	}
	f1 := clusterArgs(t, "f1", "")
	f1.d = startDaemon(t, f1.args...)
	f2 := clusterArgs(t, "f2", f1.gossip)
	f2.d = startDaemon(t, f2.args...)
	waitView(t, f1.d, "f1", "f2")
	waitView(t, f2.d, "f1", "f2")
	zc, err := client.New(f1.d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer zc.Close()
	metric := func(name string) float64 {
		m := metricLines(httpGet(t, "http://"+f1.d.metrics+"/metrics"), name)
		if len(m) != 1 {
			t.Fatalf("metric %s: %q", name, m)
		}
		v, err := strconv.ParseFloat(m[0][len(name)+1:], 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	const ns = "flap"
	names := []string{"f1", "f2"}
	dir := t.TempDir()
	vals := map[string][]byte{}
	var order []string
	next := 0
	// put stores through f1 blocks of which theirs are owned by f2 and
	// ours by f1, zero-copy or inline.
	put := func(phase string, theirs, ours int, zeroCopy bool) {
		t.Helper()
		for ; theirs+ours > 0; next++ {
			key := fmt.Sprintf("%s-%d", phase, next)
			if ringOwner(t, names, ns, key) == "f2" {
				if theirs == 0 {
					continue
				}
				theirs--
			} else {
				if ours == 0 {
					continue
				}
				ours--
			}
			vals[key] = randValue(int64(1000+next), 48<<10+next)
			order = append(order, key)
			if zeroCopy {
				zeroCopyPut(t, zc, ns, key, vals[key])
			} else {
				putFile(t, f1.d, dir, ns, key, vals[key])
			}
		}
	}
	// Before the stop: f1's connections to f2 are open (a hung peer then
	// hangs on a live connection) and f2 holds what it owns.
	put("before", 2, 2, false)
	for _, key := range order {
		if ringOwner(t, names, ns, key) == "f2" {
			waitHeld(t, f2.d, ns, key)
		}
	}

	if err := f2.d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f2.d.cmd.Process.Signal(syscall.SIGCONT) })
	// f2 hangs and f1 does not know yet (gossip takes a second or more to
	// declare it failed; the zero-copy puts over the open connection take
	// milliseconds): pushes to f2 are attempted, and fail.
	put("hungzc", 3, 1, true)
	put("hung", 4, 2, false)
	waitView(t, f1.d, "f1")
	// f2 is out of f1's ring: f1 owns every block put now.
	put("down", 4, 2, false)
	put("downzc", 3, 1, true)
	// The pushes to the hung f2 have failed (timed out, then f2 was marked
	// down) rather than landing when it runs again.
	poll.Until(t, 30*time.Second, "f1's pushes to the hung f2 to fail", func() bool {
		return metric("tidepool_push_failures_total") >= 1 && metric("tidepool_push_queue_depth") == 0
	})
	t.Logf("pushes to the hung f2 that failed: %v", metric("tidepool_push_failures_total"))
	if err := f2.d.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitView(t, f1.d, "f1", "f2")
	waitView(t, f2.d, "f1", "f2")

	// Every block f2 owns reaches it (pushed: it asks nobody for them).
	var theirs []string
	for _, key := range order {
		if ringOwner(t, names, ns, key) == "f2" {
			theirs = append(theirs, key)
		}
	}
	var lacks []string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("f2 lacks %v; f1: %q", lacks, metricLines(httpGet(t, "http://"+f1.d.metrics+"/metrics"), `tidepool_(rebalance|push)_\w+`))
		}
	})
	took := poll.Until(t, 45*time.Second, "f2 to hold every block it owns", func() bool {
		lacks = lacks[:0]
		for i, r := range existsOn(t, f2.d, "local", ns, theirs...) {
			if !r.Present {
				lacks = append(lacks, theirs[i])
			}
		}
		return len(lacks) == 0
	})
	t.Logf("f2 held its %d blocks %v after it was back; f1: %q", len(theirs), took,
		metricLines(httpGet(t, "http://"+f1.d.metrics+"/metrics"), `tidepool_rebalance_\w+`))
	// And every block reads through f2, cluster scope, with its bytes.
	for _, key := range order {
		got, errs, code := f2.d.tp(t, nil, "get", "--ns", ns, "--scope", "cluster", key)
		if code != 0 || !bytes.Equal([]byte(got), vals[key]) {
			t.Fatalf("get %s through f2: exit %d, right bytes %v, %s", key, code, bytes.Equal([]byte(got), vals[key]), errs)
		}
	}
}
