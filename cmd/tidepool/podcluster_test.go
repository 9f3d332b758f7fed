package main

import (
	"bytes"
	"fmt"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// podNet stands in for a Kubernetes pod network on loopback: each process
// runs in a mount namespace of its own where /etc/hosts resolves one name
// (a headless Service) to every pod address, and /etc/resolv.conf points
// at a server that is not there, so other names fail at once.
type podNet struct {
	name          string
	hosts, resolv string
}

func newPodNet(t *testing.T, name string, ips ...string) *podNet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (a mount namespace per process)")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare(1)")
	}
	dir := t.TempDir()
	n := &podNet{name: name, hosts: filepath.Join(dir, "hosts"), resolv: filepath.Join(dir, "resolv.conf")}
	var b strings.Builder
	b.WriteString("127.0.0.1 localhost\n")
	for _, ip := range ips {
		fmt.Fprintf(&b, "%s %s\n", ip, name)
	}
	if err := os.WriteFile(n.hosts, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.resolv, []byte("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return n
}

// start runs `tidepool serve` as pod podName on ip with only the pod's
// facts (POD_NAME, a bind address), --join of the Service name, and the
// cluster credentials from the mounted Secret; extra flags are appended.
func (n *podNet) start(t *testing.T, podName, ip, join string, extra ...string) *daemon {
	t.Helper()
	prefix := []string{"env", "POD_NAME=" + podName, "TP_HOSTS=" + n.hosts, "TP_RESOLV=" + n.resolv,
		"unshare", "-m", "sh", "-c", `mount --bind "$TP_HOSTS" /etc/hosts && mount --bind "$TP_RESOLV" /etc/resolv.conf && exec "$0" "$@"`}
	args := append([]string{"--bind-addr", ip, "--join", join, "--ssd-capacity", "0"}, credArgs(t, testGossipKey, testPeerSecret)...)
	return startDaemonWith(t, prefix, append(args, extra...)...)
}

// waitStates polls until d sees every name in want in that state; it
// fails at once when a member is seen in a state listed in never.
func waitStates(t *testing.T, d *daemon, want map[string]string, never ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var got map[string]string
	for time.Now().Before(deadline) {
		got = members(t, d)
		ok := got != nil
		for name, st := range want {
			for _, bad := range never {
				if got[name] == bad {
					t.Fatalf("%s seen %s: %v", name, bad, got)
				}
			}
			ok = ok && got[name] == st
		}
		if ok {
			return
		}
		time.Sleep(100 * time.Millisecond) // poll interval
	}
	t.Fatalf("never saw %v; last %v", want, got)
}

// getEventually polls a get on d until it returns want; wrong bytes fail
// at once, misses are retried until the deadline.
func getEventually(t *testing.T, d *daemon, ns, key string, want []byte) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, errs, code := d.tp(t, nil, "get", "--ns", ns, "--timeout", "5s", key)
		if code == 0 && !bytes.Equal([]byte(got), want) {
			t.Fatalf("get %s: wrong bytes (%d, want %d)", key, len(got), len(want))
		}
		if code == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("get %s never found it: code %d %s", key, code, errs)
		}
		time.Sleep(100 * time.Millisecond) // poll interval
	}
}

func putValues(t *testing.T, d *daemon, ns string, n int) [][]byte {
	t.Helper()
	dir := t.TempDir()
	vals := make([][]byte, n)
	for i := range vals {
		vals[i] = make([]byte, 64<<10+i)
		rand.New(rand.NewSource(int64(i))).Read(vals[i])
		f := filepath.Join(dir, fmt.Sprint(i))
		os.WriteFile(f, vals[i], 0o600)
		if _, errs, code := d.tp(t, nil, "put", "--ns", ns, fmt.Sprintf("blk-%d", i), f); code != 0 {
			t.Fatalf("put %d: %s", i, errs)
		}
	}
	return vals
}

// TestClusterOnPodFacts: three sidecars on 127.0.0.2-4, each started with
// only --join of one name that resolves to all three (a headless Service),
// a bind address, its pod name and the credentials, started in reverse
// order: the first is ready alone, they form one cluster, and a block put
// on one is fetched on another.
func TestClusterOnPodFacts(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test skipped in -short mode")
	}
	ips := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}
	net := newPodNet(t, "tidepool.inference.test", ips...)
	pods := make([]*daemon, len(ips))
	names := []string{"pod-2", "pod-3", "pod-4"}
	start := time.Now()
	for i := len(ips) - 1; i >= 0; i-- {
		pods[i] = net.start(t, names[i], ips[i], net.name)
		if i == len(ips)-1 {
			// The first pod found nobody and is ready all the same.
			if b := httpGet(t, "http://"+pods[i].metrics+"/readyz"); b != "ready\n" {
				t.Fatalf("first pod /readyz = %q", b)
			}
		}
	}
	all := map[string]string{"pod-2": "alive", "pod-3": "alive", "pod-4": "alive"}
	for _, d := range pods {
		waitStates(t, d, all)
	}
	t.Logf("three pods formed one cluster %v after the first started", time.Since(start).Round(time.Millisecond))
	if out, _, _ := pods[2].tp(t, nil, "members"); !strings.Contains(out, "127.0.0.3:7946") || !strings.Contains(out, "127.0.0.2:7947") {
		t.Fatalf("members do not show the well-known ports on the pod addresses:\n%s", out)
	}

	vals := putValues(t, pods[0], "kv", 8)
	for i, v := range vals {
		getEventually(t, pods[2], "kv", fmt.Sprintf("blk-%d", i), v)
	}
}

// TestJoinUnresolvable: a --join name that does not resolve is logged
// clearly and retried in the background; the node serves and is ready on
// its own and never crashes.
func TestJoinUnresolvable(t *testing.T) {
	net := newPodNet(t, "tidepool.inference.test", "127.0.0.8")
	d := net.start(t, "lonely", "127.0.0.8", "no-such-service.inference.test")
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(d.stderr.String(), "join failed; retrying in the background") < 3 {
		select {
		case err := <-d.exited:
			d.exited <- err
			t.Fatalf("serve exited: %v\n%s", err, d.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no three join retries logged:\n%s", d.stderr.String())
		}
		time.Sleep(100 * time.Millisecond) // poll interval
	}
	log := d.stderr.String()
	if !strings.Contains(log, "no-such-service.inference.test") {
		t.Fatalf("the retry log does not name the join target:\n%s", log)
	}
	if b := httpGet(t, "http://"+d.metrics+"/readyz"); b != "ready\n" {
		t.Fatalf("/readyz = %q", b)
	}
	if f := metric(t, d, "tidepool_cluster_join_failures_total"); f < 3 {
		t.Fatalf("tidepool_cluster_join_failures_total = %v, want >= 3", f)
	}
	if got := members(t, d); len(got) != 1 || got["lonely"] != "alive" {
		t.Fatalf("members %v", got)
	}
	if _, errs, code := d.tp(t, []byte("v"), "put", "--ns", "kv", "k"); code != 0 {
		t.Fatalf("put on a node still joining: %s", errs)
	}
	d.stop(t, syscall.SIGTERM)
}

// TestPodLeavesOnSIGTERM: SIGTERM to one of three clustered pods turns its
// /readyz false first, announces its leave, and stops (exit 0, so within
// shutdown_timeout: past it the process exits 1); the others see it left,
// never failed, and every block put on a survivor stays readable.
func TestPodLeavesOnSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test skipped in -short mode")
	}
	ips := []string{"127.0.0.5", "127.0.0.6", "127.0.0.7"}
	names := []string{"pod-a", "pod-b", "pod-c"}
	net := newPodNet(t, "tidepool-leave.test", ips...)
	pods := make([]*daemon, len(ips))
	for i := range ips {
		pods[i] = net.start(t, names[i], ips[i], net.name, "--shutdown-timeout", "15s")
	}
	all := map[string]string{"pod-a": "alive", "pod-b": "alive", "pod-c": "alive"}
	for _, d := range pods {
		waitStates(t, d, all)
	}
	vals := putValues(t, pods[0], "kv", 16)

	start := time.Now()
	pods[1].stop(t, syscall.SIGTERM) // exit status 0: stopped within shutdown_timeout
	took := time.Since(start)
	for _, d := range []*daemon{pods[0], pods[2]} {
		waitStates(t, d, map[string]string{"pod-a": "alive", "pod-b": "left", "pod-c": "alive"}, "failed")
	}
	t.Logf("pod-b stopped in %v; peers saw it left %v after SIGTERM", took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	log := pods[1].stderr.String()
	if strings.Contains(log, "deadline exceeded") {
		// Idle pooled connections from the peers held the peer API's
		// drain open until drain_timeout: peers close theirs to a member
		// that leaves.
		t.Fatalf("a drain ran into its deadline:\n%s", log)
	}
	notReady, left := strings.Index(log, "shutting down: not ready"), strings.Index(log, "left cluster")
	if notReady < 0 || left < 0 || notReady > left {
		t.Fatalf("want /readyz false before the leave (at %d, %d):\n%s", notReady, left, log)
	}
	for i, v := range vals {
		getEventually(t, pods[2], "kv", fmt.Sprintf("blk-%d", i), v)
		getEventually(t, pods[0], "kv", fmt.Sprintf("blk-%d", i), v)
	}
}

// TestMetricsOffLoopback: the probe and metrics listener may be bound to a
// pod address (here the host's first non-loopback IPv4 address, as
// $POD_IP is in a pod), and serves read-only GETs only: other methods are
// refused and nothing else (pprof, debug) is there.
func TestMetricsOffLoopback(t *testing.T) {
	ip := nonLoopbackIP()
	if ip == "" || strings.Contains(ip, ":") {
		t.Skip("no non-loopback IPv4 address")
	}
	d := startDaemon(t, "--metrics-addr", ip+":0")
	if !strings.HasPrefix(d.metrics, ip+":") {
		t.Fatalf("metrics on %q, want %s", d.metrics, ip)
	}
	base := "http://" + d.metrics
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/metrics", 200},
		{"HEAD", "/metrics", 200},
		{"GET", "/healthz", 200},
		{"GET", "/readyz", 200},
		{"POST", "/metrics", 405},
		{"PUT", "/readyz", 405},
		{"DELETE", "/healthz", 405},
		{"GET", "/debug/pprof/", 404},
		{"GET", "/debug/vars", 404},
		{"GET", "/", 404},
	} {
		req, _ := http.NewRequest(tc.method, base+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s = %d, want %d", tc.method, tc.path, resp.StatusCode, tc.want)
		}
	}
}
