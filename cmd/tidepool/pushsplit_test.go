package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/client"
	"github.com/tidepool-kv/tidepool/cluster"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy/clusterview"
)

// TestServeLargePushReachesOwner is issue 35's push defect against two real
// `tidepool serve` processes, with plain and with encrypted peer
// connections: one inline BatchPut on node-1 of 24 blocks of 4 MiB, 20 of
// them owned by node-2 (80 MiB for one owner, more than a peer API message
// held before), ends with every one of those 20 readable from node-2's own
// tiers, node-1 counting 20 pushes, no failure and no owner marked down.
// Before the fix the push went as one 80 MiB call, over the peer client's
// 64 MiB frame limit, and failed whole (and an encrypted connection failed
// any block over about 1.6 MiB: the owner's reader gave up on it).
func TestServeLargePushReachesOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test skipped in -short mode")
	}
	for _, encrypt := range []bool{false, true} {
		t.Run(fmt.Sprintf("encrypt=%v", encrypt), func(t *testing.T) {
			extra := []string{"--dram-capacity", "128MiB", "--max-value-size", "8MiB", "--log-level", "warn"}
			if encrypt {
				extra = append(extra, "--peer-encrypt", "true")
			}
			const ns = "big"
			m1, m2 := startPair(t, extra...)
			ownedBy := func(prefix, owner string, n int) [][]byte { return ownedKeys(t, ns, prefix, owner, n) }
			c1, err := client.New(m1.d.socket)
			if err != nil {
				t.Fatal(err)
			}
			defer c1.Close()
			c2, err := client.New(m2.d.socket)
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			ctx := context.Background()

			// node-1's view places keys on node-2 once a small block put
			// there reaches node-2.
			deadline := time.Now().Add(30 * time.Second)
			for i := 0; ; i++ {
				probe := ownedBy(fmt.Sprint("probe", i), "node-2", 1)[0]
				if errs, err := c1.BatchPut(ctx, ns, []client.Item{{Key: probe, Value: []byte("probe")}}); err != nil || errs[0] != nil {
					t.Fatal(err, errs)
				}
				waitUntil := time.Now().Add(2 * time.Second)
				found := false
				for !found && time.Now().Before(waitUntil) {
					_, found, _ = c2.Get(ctx, ns, probe, client.ScopeLocal)
					time.Sleep(20 * time.Millisecond)
				}
				if found {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("no small block put on node-1 reached node-2")
				}
			}
			pushed := metric(t, m1.d, "tidepool_pushes_total")

			theirs := ownedBy("blk", "node-2", 20)
			keys := append(ownedBy("own", "node-1", 4), theirs...)
			items := make([]client.Item, len(keys))
			for i, k := range keys {
				v := make([]byte, 4<<20)
				for j := 0; j < len(v); j += 4096 {
					v[j] = byte(i)
				}
				copy(v, k)
				items[i] = client.Item{Key: k, Value: v}
			}
			errs, err := c1.BatchPut(ctx, ns, items)
			if err != nil {
				t.Fatal(err)
			}
			for i, e := range errs {
				if e != nil {
					t.Fatalf("put %d: %v", i, e)
				}
			}
			end := time.Now().Add(30 * time.Second)
			for metric(t, m1.d, "tidepool_pushes_total")+metric(t, m1.d, "tidepool_push_failures_total") < pushed+float64(len(theirs)) {
				if time.Now().After(end) {
					t.Fatalf("pushes %v, failures %v: the pushes never ended", metric(t, m1.d, "tidepool_pushes_total")-pushed,
						metric(t, m1.d, "tidepool_push_failures_total"))
				}
				time.Sleep(20 * time.Millisecond)
			}
			if got, fails, down := metric(t, m1.d, "tidepool_pushes_total")-pushed, metric(t, m1.d, "tidepool_push_failures_total"),
				metric(t, m1.d, "tidepool_remote_peer_down_total"); got != float64(len(theirs)) || fails != 0 || down != 0 {
				t.Fatalf("node-1: %v pushes, %v failures, owner marked down %v times; want %d, 0, 0", got, fails, down, len(theirs))
			}
			for i, k := range theirs {
				v, found, err := c2.Get(ctx, ns, k, client.ScopeLocal)
				if err != nil || !found || !bytes.Equal(v, items[4+i].Value) {
					t.Fatalf("block %q on node-2: found %v, %v (equal %v)", k, found, err, bytes.Equal(v, items[4+i].Value))
				}
			}
		})
	}
}

// TestServeSyncReplicasPut: a Put on node-1's put socket with
// sync_replicas 1 of a block node-2 owns (the request's field, now a put
// option rather than a context value) answers once node-2 stores it: the
// block is on node-2 when the answer comes. With node-2 stopped (SIGSTOP)
// the same put is answered UNAVAILABLE (the owner did not store it), where
// a put with sync_replicas 0 is answered at once.
func TestServeSyncReplicasPut(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test skipped in -short mode")
	}
	extra := []string{"--rebalance-rate", "0", "--log-level", "warn"}
	m1, m2 := startPair(t, extra...)
	const ns = "sync"
	theirs := func(prefix string) []byte { return ownedKeys(t, ns, prefix, "node-2", 1)[0] }
	c2, err := client.New(m2.d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	ctx := context.Background()
	// put sends one Put on node-1's put socket and returns the error code
	// it was answered with (the result's field 1), 0 for success.
	put := func(key []byte, sync int32) (code int32) {
		t.Helper()
		pc, err := net.Dial("unix", m1.d.socket+".put")
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		val := bytes.Repeat([]byte{7}, 4096)
		req := putClaim(ns, string(key), uint32(len(val)))
		binary.BigEndian.PutUint32(req[len(req)-4-3-4:], uint32(sync)) // sync_replicas, before the value's field header
		req = append(append(req, val...), 0, 0)                        // the request's and the arguments' stops
		if _, err := pc.Write(req); err != nil {
			t.Fatal(err)
		}
		pc.SetReadDeadline(time.Now().Add(30 * time.Second))
		head := make([]byte, 4+4+3+4)
		if _, err := io.ReadFull(pc, head); err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		field := make([]byte, 3)
		if _, err := io.ReadFull(pc, field); err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		if field[0] != 12 || field[2] != 1 {
			return 0
		}
		errCode := make([]byte, 3+4) // TidepoolError's field 1, the code
		if _, err := io.ReadFull(pc, errCode); err != nil {
			t.Fatalf("reading the error: %v", err)
		}
		return int32(binary.BigEndian.Uint32(errCode[3:]))
	}

	// Up: stored on node-2 by the time the answer came.
	k := theirs("up")
	if code := put(k, 1); code != 0 {
		t.Fatalf("a synchronous put with node-2 up failed: code %d", code)
	}
	if _, found, err := c2.Get(ctx, ns, k, client.ScopeLocal); err != nil || !found {
		t.Fatalf("node-2 does not hold the block when the synchronous put answered: found %v, %v", found, err)
	}

	// Stopped: the synchronous put fails, the background one does not.
	if err := m2.d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer m2.d.cmd.Process.Signal(syscall.SIGCONT)
	if code := put(theirs("async"), 0); code != 0 {
		t.Fatalf("a background put failed with node-2 stopped: code %d", code)
	}
	if code := put(theirs("stopped"), 1); code != int32(tp.ErrorCode_UNAVAILABLE) {
		t.Fatalf("a synchronous put with node-2 stopped: code %d, want UNAVAILABLE", code)
	}
}

// startPair starts node-1 and node-2, clustered, with extra flags, and
// waits until each sees both alive.
func startPair(t *testing.T, extra ...string) (m1, m2 *clusterMember) {
	t.Helper()
	m1 = clusterArgs(t, "node-1", "")
	m1.d = startDaemon(t, append(m1.args, extra...)...)
	m2 = clusterArgs(t, "node-2", m1.gossip)
	m2.d = startDaemon(t, append(m2.args, extra...)...)
	waitView(t, m1.d, "node-1", "node-2")
	waitView(t, m2.d, "node-1", "node-2")
	return m1, m2
}

// ownedKeys returns n keys "prefix-i" of ns whose owner is owner in the
// cluster of node-1 and node-2. Placement is a pure function of the
// members: clusterview's ring, over the ring key ns "\x00" key.
func ownedKeys(t *testing.T, ns, prefix, owner string, n int) [][]byte {
	t.Helper()
	ring, err := cluster.NewRing([]string{"node-1", "node-2"}, clusterview.DefaultConfig().Ring)
	if err != nil {
		t.Fatal(err)
	}
	var keys [][]byte
	for i := 0; len(keys) < n; i++ {
		k := []byte(fmt.Sprintf("%s-%d", prefix, i))
		if ring.Owner(append([]byte(ns+"\x00"), k...)) == owner {
			keys = append(keys, k)
		}
	}
	return keys
}
