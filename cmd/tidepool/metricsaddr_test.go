package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

const exposedMetricsWarning = "metrics listener reachable beyond this host"

// TestMetricsOffLoopbackWarns: a real serve whose metrics listener binds
// every address (0.0.0.0) outside a pod logs a warning naming what the
// listener exposes; bound to loopback (the default), or in a pod (POD_IP or
// KUBERNETES_SERVICE_HOST set), it does not. The wildcard binds run in a
// network namespace of the test's own, whose only interface is loopback.
func TestMetricsOffLoopbackWarns(t *testing.T) {
	if testing.Short() {
		t.Skip("process test skipped in -short mode")
	}
	if d := startDaemonWith(t, []string{"env", "-u", "POD_IP", "-u", "KUBERNETES_SERVICE_HOST"}); strings.Contains(d.stderr.String(), exposedMetricsWarning) {
		t.Fatalf("warning with metrics on loopback:\n%s", d.stderr.String())
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2 (ip)")
	}
	ns := fmt.Sprintf("tpm%d", os.Getpid()%1000)
	if err := ipCmd("netns", "add", ns); err != nil {
		t.Skipf("cannot create a network namespace here: %v", err)
	}
	t.Cleanup(func() { ipCmd("netns", "del", ns) })
	if err := ipCmd("-n", ns, "link", "set", "lo", "up"); err != nil {
		t.Fatal(err)
	}
	host := []string{"ip", "netns", "exec", ns, "env", "-u", "POD_IP", "-u", "KUBERNETES_SERVICE_HOST"}
	d := startDaemonWith(t, host, "--metrics-addr", "0.0.0.0:0")
	errs := d.stderr.String()
	if !strings.Contains(errs, exposedMetricsWarning) {
		t.Fatalf("no warning with metrics on 0.0.0.0 outside a pod:\n%s", errs)
	}
	for _, what := range []string{"namespace names", "member names and addresses", "/healthz", "127.0.0.1", `"metrics_addr": "0.0.0.0:`} {
		if !strings.Contains(errs, what) {
			t.Errorf("the warning does not name %q:\n%s", what, errs)
		}
	}
	pod := []string{"ip", "netns", "exec", ns, "env", "-u", "POD_IP", "KUBERNETES_SERVICE_HOST=10.96.0.1"}
	if d := startDaemonWith(t, pod, "--metrics-addr", "0.0.0.0:0"); strings.Contains(d.stderr.String(), exposedMetricsWarning) {
		t.Fatalf("warning in a pod:\n%s", d.stderr.String())
	}
}
