package main

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

// TestClusterLookupThroughTheOtherNode: two real `tidepool serve`
// processes; blocks written through node b, looked up through node a. a
// holds the blocks it owns (pushed to it) and asks b about the others in
// one call; a lookup stops at a block a owns and lacks, and asks b nothing
// past it (tidepool_remote_lookups_total counts the keys asked).
func TestClusterLookupThroughTheOtherNode(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test skipped in -short mode")
	}
	names := []string{"la", "lb"}
	a := clusterArgs(t, "la", "")
	started := time.Now()
	a.d = startDaemon(t, a.args...)
	// b joins after a's join settling (clusterview's JoinSettle, 3 s from
	// a's start) is over, so that a's view has no join ring: a key a owns
	// has no other owner there (the ring before b joined is a alone).
	time.Sleep(time.Until(started.Add(4 * time.Second)))
	b := clusterArgs(t, "lb", a.gossip)
	b.d = startDaemon(t, b.args...)
	waitView(t, a.d, names...)
	waitView(t, b.d, names...)

	const ns = "chain"
	dir := t.TempDir()
	owned := map[string][]string{}
	for i := 0; len(owned["la"]) < 3 || len(owned["lb"]) < 4; i++ {
		k := fmt.Sprint("blk-", i)
		o := ringOwner(t, names, ns, k)
		owned[o] = append(owned[o], k)
	}
	ka, kb := owned["la"], owned["lb"]
	for _, k := range append(append([]string{}, ka...), kb...) {
		putFile(t, b.d, dir, ns, k, randValue(int64(len(k)), 4<<10))
	}
	for _, k := range ka {
		waitHeld(t, a.d, ns, k)
	}
	// a no longer holds ka[1]: it owns it, so nobody else is asked.
	if _, errs, code := a.d.tp(t, nil, "delete", "--ns", ns, "--scope", "local", ka[1]); code != 0 {
		t.Fatalf("delete %s on a: %s", ka[1], errs)
	}
	lookup := func(keys ...string) int {
		t.Helper()
		out, errs, code := a.d.tp(t, nil, append([]string{"lookup", "--ns", ns, "--json"}, keys...)...)
		var r struct{ Matched, Keys int }
		if code != 0 || json.Unmarshal([]byte(out), &r) != nil || r.Keys != len(keys) {
			t.Fatalf("lookup %v on a: %d %q %s", keys, code, out, errs)
		}
		return r.Matched
	}
	cases := []struct {
		name  string
		keys  []string
		want  int
		asked float64 // keys a asks b about
	}{
		{"b's blocks found on b", []string{kb[0], ka[0], kb[1], ka[2], kb[2]}, 5, 3},
		{"stops at a's own miss", []string{kb[0], ka[0], kb[1], ka[1], kb[2], kb[3]}, 3, 2},
		{"a's own miss first", []string{ka[1], kb[0], kb[1]}, 0, 0},
		{"b lacks one", []string{kb[0], "never-written", ka[0]}, 1, 0},
	}
	for _, c := range cases {
		if c.keys[1] == "never-written" {
			if ringOwner(t, names, ns, c.keys[1]) == "la" {
				c.asked = 1 // kb[0] only: a owns the missing key
			} else {
				c.asked = 2
			}
		}
		before := metricSum(t, a.d, "tidepool_remote_lookups_total")
		got := lookup(c.keys...)
		asked := metricSum(t, a.d, "tidepool_remote_lookups_total") - before
		if got != c.want || asked != c.asked {
			t.Errorf("%s: matched %d, %v keys asked of b; want %d, %v", c.name, got, asked, c.want, c.asked)
		}
	}
}
