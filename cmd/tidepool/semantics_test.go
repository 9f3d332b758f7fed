package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cluster"
)

// ringOwner is the owner (R = 1) of (ns, key) among names, as every
// sidecar places it (clusterview: ring key ns + "\x00" + key).
func ringOwner(t *testing.T, names []string, ns, key string) string {
	t.Helper()
	r, err := cluster.NewRing(names, cluster.DefaultRingConfig())
	if err != nil {
		t.Fatal(err)
	}
	return r.Owners([]byte(ns+"\x00"+key), 1)[0]
}

// putFile puts value under key on d.
func putFile(t *testing.T, d *daemon, dir, ns, key string, value []byte) {
	t.Helper()
	f := filepath.Join(dir, key)
	if err := os.WriteFile(f, value, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := d.tp(t, nil, "put", "--ns", ns, key, f); code != 0 {
		t.Fatalf("put %s: %s", key, errs)
	}
}

type existsRow struct {
	Key     string `json:"key"`
	Present bool   `json:"present"`
	Tier    string `json:"tier"`
	Node    string `json:"node"`
}

// existsOn runs `exists --json` on d.
func existsOn(t *testing.T, d *daemon, scope, ns string, keys ...string) []existsRow {
	t.Helper()
	out, errs, code := d.tp(t, nil, append([]string{"exists", "--ns", ns, "--json", "--scope", scope}, keys...)...)
	var rows []existsRow
	if (code != 0 && code != exitNotFound) || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != len(keys) {
		t.Fatalf("exists: code %d %q %s", code, out, errs)
	}
	return rows
}

// waitHeld polls until d holds key locally.
func waitHeld(t *testing.T, d *daemon, ns, key string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !existsOn(t, d, "local", ns, key)[0].Present {
		if time.Now().After(deadline) {
			t.Fatalf("%s never reached its owner", key)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func randValue(seed int64, n int) []byte {
	v := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(v)
	return v
}

// TestHungOwnerFailsFast stops the owner of some blocks with SIGSTOP (a
// hung process: its sockets accept, nothing answers). Reads of its blocks
// from the other node miss within the short remote bound (remote_timeout,
// 500 ms) instead of the 5 s fetch timeout, then at once while the owner
// is marked down, and at once after gossip declared it failed. The bound
// asserted (1.5 s per CLI call, process start included) is far from both
// the expected ~0.5 s and the old 5 s.
func TestHungOwnerFailsFast(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test skipped in -short mode")
	}
	h1 := clusterArgs(t, "h1", "")
	h1.d = startDaemon(t, h1.args...)
	h2 := clusterArgs(t, "h2", h1.gossip)
	h2.d = startDaemon(t, h2.args...)
	waitView(t, h1.d, "h1", "h2")
	waitView(t, h2.d, "h1", "h2")

	const ns = "hang"
	dir := t.TempDir()
	var owned []string // blocks h2 owns: held on h2 only
	for i := 0; len(owned) < 4; i++ {
		key := fmt.Sprint("blk-", i)
		if ringOwner(t, []string{"h1", "h2"}, ns, key) != "h2" {
			continue
		}
		putFile(t, h2.d, dir, ns, key, randValue(int64(i), 32<<10))
		owned = append(owned, key)
	}
	// The owner answers while it runs (this also opens h1's connections
	// to it: a stopped peer then hangs on a live connection).
	if _, errs, code := h1.d.tp(t, nil, "get", "--ns", ns, "-o", filepath.Join(dir, "out"), owned[0]); code != 0 {
		t.Fatalf("get before the stop: %s", errs)
	}
	if _, _, code := h1.d.tp(t, nil, "delete", "--ns", ns, "--scope", "local", owned[0]); code != 0 {
		t.Fatal("local delete of the fetched copy failed")
	}

	if err := h2.d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h2.d.cmd.Process.Signal(syscall.SIGCONT) })
	const bound = 1500 * time.Millisecond
	timed := func(what string, args ...string) (string, int) {
		t.Helper()
		start := time.Now()
		out, _, code := h1.d.tp(t, nil, args...)
		if took := time.Since(start); took > bound {
			t.Fatalf("%s took %v while the owner hangs (bound %v)", what, took, bound)
		}
		return out, code
	}
	for round, key := range owned {
		if _, code := timed("get", "get", "--ns", ns, "--timeout", "10s", key); code != exitNotFound {
			t.Fatalf("round %d: get of a hung owner's block: exit %d, want a miss", round, code)
		}
		if out, _ := timed("lookup", "lookup", "--ns", ns, "--timeout", "10s", key); !strings.HasPrefix(out, "0 of 1") {
			t.Fatalf("round %d: lookup: %q", round, out)
		}
		if out, code := timed("exists", "exists", "--ns", ns, "--timeout", "10s", key); code != exitNotFound {
			t.Fatalf("round %d: exists: %q", round, out)
		}
	}
	// Gossip declares it failed: reads no longer ask it at all.
	waitView(t, h1.d, "h1")
	for _, key := range owned {
		if _, code := timed("get after the failure", "get", "--ns", ns, "--timeout", "10s", key); code != exitNotFound {
			t.Fatalf("get after the failure: exit %d", code)
		}
	}
	metrics := httpGet(t, "http://"+h1.d.metrics+"/metrics")
	for _, name := range []string{"tidepool_remote_peer_down_total", "tidepool_remote_fast_fails_total"} {
		m := regexp.MustCompile(`(?m)^` + name + ` (\d+)`).FindStringSubmatch(metrics)
		if m == nil || m[1] == "0" {
			t.Fatalf("%s not counted:\n%s", name, grepLines(metrics, "tidepool_remote_"))
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestJoinReadsFromPreviousOwner: two nodes hold blocks; a third joins with
// the rebalancer off everywhere, so nothing moves to it. A read through the
// newcomer of a block it now owns is served from the block's owner before
// the join (the newcomer's join ring), with the right bytes.
func TestJoinReadsFromPreviousOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test skipped in -short mode")
	}
	off := []string{"--rebalance-rate", "0"}
	j1 := clusterArgs(t, "j1", "")
	j1.d = startDaemon(t, append(j1.args, off...)...)
	j2 := clusterArgs(t, "j2", j1.gossip)
	j2.d = startDaemon(t, append(j2.args, off...)...)
	waitView(t, j1.d, "j1", "j2")
	waitView(t, j2.d, "j1", "j2")

	const ns = "join"
	dir := t.TempDir()
	vals := map[string][]byte{}
	var theirs []string // blocks j3 will own
	for i := 0; len(theirs) < 6; i++ {
		key := fmt.Sprint("blk-", i)
		vals[key] = randValue(int64(100+i), 64<<10+i)
		putFile(t, j1.d, dir, ns, key, vals[key])
		if owner := ringOwner(t, []string{"j1", "j2"}, ns, key); owner == "j2" {
			waitHeld(t, j2.d, ns, key) // pushed in the background
		}
		if ringOwner(t, []string{"j1", "j2", "j3"}, ns, key) == "j3" {
			theirs = append(theirs, key)
		}
	}

	j3 := clusterArgs(t, "j3", j1.gossip)
	j3.d = startDaemon(t, append(j3.args, off...)...)
	waitView(t, j3.d, "j1", "j2", "j3")
	for _, key := range theirs {
		if got := existsOn(t, j3.d, "local", ns, key)[0]; got.Present {
			t.Fatalf("%s reached j3 before any read (rebalancer off)", key)
		}
	}
	if out, _, code := j3.d.tp(t, nil, append([]string{"lookup", "--ns", ns}, theirs...)...); code != 0 || !strings.HasPrefix(out, fmt.Sprintf("%d of %d", len(theirs), len(theirs))) {
		t.Fatalf("lookup through j3: %d %q", code, out)
	}
	for _, key := range theirs {
		got, errs, code := j3.d.tp(t, nil, "get", "--ns", ns, key)
		if code != 0 || !bytes.Equal([]byte(got), vals[key]) {
			t.Fatalf("get %s through its new owner j3: exit %d, right bytes %v, %s", key, code, bytes.Equal([]byte(got), vals[key]), errs)
		}
	}
}

// TestClusterDeleteClearAndHolder: cluster-scope Exists names the node that
// holds a block (its owner), not the node answering; Delete and Clear in
// the default scope remove the block everywhere (owner and copies), while
// --scope local removes this node's copy only.
func TestClusterDeleteClearAndHolder(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test skipped in -short mode")
	}
	names := []string{"d1", "d2", "d3"}
	ms := map[string]*clusterMember{}
	for i, n := range names {
		join := ""
		if i > 0 {
			join = ms["d1"].gossip
		}
		ms[n] = clusterArgs(t, n, join)
		ms[n].d = startDaemon(t, ms[n].args...)
	}
	for _, n := range names {
		waitView(t, ms[n].d, names...)
	}
	const ns = "del"
	dir := t.TempDir()
	keys := make([]string, 9)
	owner := map[string]string{}
	for i := range keys {
		keys[i] = fmt.Sprint("blk-", i)
		owner[keys[i]] = ringOwner(t, names, ns, keys[i])
		putFile(t, ms["d1"].d, dir, ns, keys[i], randValue(int64(200+i), 16<<10))
		waitHeld(t, ms[owner[keys[i]]].d, ns, keys[i])
	}

	// Exists from d3 names the holder.
	for i, row := range existsOn(t, ms["d3"].d, "cluster", ns, keys...) {
		if !row.Present || row.Node != owner[keys[i]] {
			t.Fatalf("exists %s from d3: %+v, want held by %s", keys[i], row, owner[keys[i]])
		}
	}

	// A key held on d1 (the writer's copy) and on its owner elsewhere.
	var k string
	for _, key := range keys {
		if owner[key] != "d1" {
			k = key
			break
		}
	}
	// Local scope: d1's copy only.
	if _, _, code := ms["d1"].d.tp(t, nil, "delete", "--ns", ns, "--scope", "local", k); code != 0 {
		t.Fatal("local delete failed")
	}
	if existsOn(t, ms["d1"].d, "local", ns, k)[0].Present || !existsOn(t, ms[owner[k]].d, "local", ns, k)[0].Present {
		t.Fatal("a local delete did not stay local")
	}
	// Default (cluster) scope from the third node: gone everywhere.
	if out, errs, code := ms["d3"].d.tp(t, nil, "delete", "--ns", ns, k); code != 0 {
		t.Fatalf("cluster delete: %d %q %s", code, out, errs)
	}
	for _, n := range names {
		if existsOn(t, ms[n].d, "cluster", ns, k)[0].Present {
			t.Fatalf("%s still finds %s after a cluster delete", n, k)
		}
	}

	// Clear from d2: every node's blocks of the namespace are gone.
	out, errs, code := ms["d2"].d.tp(t, nil, "clear", "--ns", ns, "--json")
	var cj struct{ Removed int64 }
	if code != 0 || json.Unmarshal([]byte(out), &cj) != nil || cj.Removed < int64(len(keys)-1) {
		t.Fatalf("clear: %d %q %s", code, out, errs)
	}
	for _, n := range names {
		for _, row := range existsOn(t, ms[n].d, "cluster", ns, keys...) {
			if row.Present {
				t.Fatalf("%s still finds %s after a cluster clear (%+v)", n, row.Key, row)
			}
		}
		if _, _, code := ms[n].d.tp(t, nil, "get", "--ns", ns, keys[0]); code != exitNotFound {
			t.Fatalf("get on %s after the clear: exit %d", n, code)
		}
	}
}
