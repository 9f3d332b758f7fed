package main

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// netns is a network namespace this test creates: its own test host.
type netns struct{ name string }

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// twoHosts makes two namespaces joined by a veth pair, 10.231.X.1 and
// 10.231.X.2 (addresses that exist only inside them), or skips the test
// with the reason when namespaces cannot be made here.
func twoHosts(t *testing.T) (a, b netns, ipA, ipB, linkA string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("partition test needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("partition test needs iproute2 (ip)")
	}
	id := os.Getpid() % 200
	a, b = netns{fmt.Sprintf("tpa%d", id)}, netns{fmt.Sprintf("tpb%d", id)}
	linkA, linkB := fmt.Sprintf("tpva%d", id), fmt.Sprintf("tpvb%d", id)
	ipA, ipB = fmt.Sprintf("10.231.%d.1", id), fmt.Sprintf("10.231.%d.2", id)
	if err := ipCmd("netns", "add", a.name); err != nil {
		t.Skipf("cannot create network namespaces here: %v", err)
	}
	t.Cleanup(func() { ipCmd("netns", "del", a.name) })
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(ipCmd("netns", "add", b.name))
	t.Cleanup(func() { ipCmd("netns", "del", b.name) })
	must(ipCmd("link", "add", linkA, "netns", a.name, "type", "veth", "peer", "name", linkB, "netns", b.name))
	for _, h := range []struct{ ns, link, ip string }{{a.name, linkA, ipA}, {b.name, linkB, ipB}} {
		must(ipCmd("-n", h.ns, "link", "set", "lo", "up"))
		must(ipCmd("-n", h.ns, "addr", "add", h.ip+"/24", "dev", h.link))
		must(ipCmd("-n", h.ns, "link", "set", h.link, "up"))
	}
	return a, b, ipA, ipB, linkA
}

func nsMember(t *testing.T, name, ip, join string) *clusterMember {
	m := &clusterMember{name: name, gossip: fmt.Sprintf("%s:%d", ip, 7000+rand.Intn(900))}
	m.args = []string{
		"--node-name", name,
		"--gossip-addr", m.gossip,
		"--peer-addr", fmt.Sprintf("%s:%d", ip, 8000+rand.Intn(900)),
		"--transfer-addr", fmt.Sprintf("%s:%d", ip, 9000+rand.Intn(900)),
		"--ssd-capacity", "0",
	}
	m.args = append(m.args, credArgs(t, testGossipKey, testPeerSecret)...)
	if join != "" {
		m.args = append(m.args, "--join", join)
	}
	return m
}

// TestPartition cuts one node off the other two with a network namespace
// link going down: both sides notice, reads on the majority side return the
// right bytes or a miss (never wrong bytes, never a hang), and the cut-off
// node keeps serving what it holds itself. When the link comes back, the
// two sides merge into one view again (the cluster's reconnect loop).
func TestPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("partition test skipped in -short mode")
	}
	hostA, hostB, ipA, ipB, linkA := twoHosts(t)
	inA := []string{"ip", "netns", "exec", hostA.name}
	inB := []string{"ip", "netns", "exec", hostB.name}

	n1 := nsMember(t, "p1", ipA, "")
	n1.d = startDaemonWith(t, inA, n1.args...)
	n2 := nsMember(t, "p2", ipA, n1.gossip)
	n2.d = startDaemonWith(t, inA, n2.args...)
	n3 := nsMember(t, "p3", ipB, n1.gossip)
	n3.d = startDaemonWith(t, inB, n3.args...)
	waitView(t, n1.d, "p1", "p2", "p3")
	waitView(t, n3.d, "p1", "p2", "p3")

	dir := t.TempDir()
	const n = 12
	vals := make([][]byte, n)
	for i := range vals {
		vals[i] = make([]byte, 64<<10+i)
		rand.New(rand.NewSource(int64(i))).Read(vals[i])
		f := filepath.Join(dir, fmt.Sprint(i))
		os.WriteFile(f, vals[i], 0o600)
		if _, errs, code := n3.d.tp(t, nil, "put", "--ns", "p", fmt.Sprintf("k%d", i), f); code != 0 {
			t.Fatalf("put on p3: %s", errs)
		}
	}

	// Cut p3 off.
	if err := ipCmd("-n", hostA.name, "link", "set", linkA, "down"); err != nil {
		t.Fatal(err)
	}
	waitView(t, n1.d, "p1", "p2")
	waitView(t, n3.d, "p3")

	// The majority side: right bytes (blocks pushed to owners p1/p2 before
	// the cut) or a miss (blocks owned by p3), within the call timeout.
	for i := range vals {
		start := time.Now()
		got, _, code := n1.d.tp(t, nil, "get", "--ns", "p", "--timeout", "10s", fmt.Sprintf("k%d", i))
		if time.Since(start) > 15*time.Second {
			t.Fatalf("get k%d hung for %v", i, time.Since(start))
		}
		if code == 0 && !bytes.Equal([]byte(got), vals[i]) {
			t.Fatalf("wrong bytes for k%d during the partition", i)
		}
	}
	// The cut-off node serves what it holds (every block was put there).
	for i := range vals {
		got, _, code := n3.d.tp(t, nil, "get", "--ns", "p", "--scope", "local", fmt.Sprintf("k%d", i))
		if code != 0 || !bytes.Equal([]byte(got), vals[i]) {
			t.Fatalf("p3 lost k%d during the partition (code %d)", i, code)
		}
	}

	// Heal: both sides merge back into one view.
	if err := ipCmd("-n", hostA.name, "link", "set", linkA, "up"); err != nil {
		t.Fatal(err)
	}
	waitView(t, n1.d, "p1", "p2", "p3")
	waitView(t, n3.d, "p1", "p2", "p3")
	for i := range vals {
		got, _, code := n1.d.tp(t, nil, "get", "--ns", "p", "--timeout", "10s", fmt.Sprintf("k%d", i))
		if code == 0 && !bytes.Equal([]byte(got), vals[i]) {
			t.Fatalf("wrong bytes for k%d after the partition healed", i)
		}
	}
}
