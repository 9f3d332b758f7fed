package main

import (
	"bytes"
	"encoding/json"
	"io"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tidepool-kv/tidepool/cmd/tidepool/internal/clitest"
	"github.com/tidepool-kv/tidepool/rdma/verbs"
)

// binPath is the tidepool binary built once for the process tests.
var binPath string

func TestMain(m *testing.M) {
	if helperProcess() {
		return
	}
	var tags []string
	if verbs.Built {
		tags = append(tags, "verbs")
	}
	clitest.Main(m, &binPath, tags...)
}

// daemon is a real `tidepool serve` process (clitest.Daemon).
type daemon struct {
	cmd     *exec.Cmd
	socket  string
	metrics string // host:port
	stderr  *clitest.SyncBuffer
	exited  chan error
	lines   chan string // standard output after the first line
}

func startDaemon(t *testing.T, extra ...string) *daemon {
	t.Helper()
	return startDaemonWith(t, nil, extra...)
}

// startDaemonWith starts `tidepool serve` under a command prefix (such as
// `ip netns exec NS`), with extra flags (a flag given again in extra
// overrides the default here), and returns once it printed its first line.
func startDaemonWith(t *testing.T, prefix []string, extra ...string) *daemon {
	t.Helper()
	return startDaemonBin(t, binPath, prefix, extra...)
}

// startDaemonBin is startDaemonWith running the binary bin.
func startDaemonBin(t *testing.T, bin string, prefix []string, extra ...string) *daemon {
	t.Helper()
	d := clitest.Start(t, bin, prefix, extra...)
	return &daemon{cmd: d.Cmd, socket: d.Socket, metrics: d.Metrics, stderr: d.Stderr, exited: d.Exited, lines: d.Lines}
}

// tp runs a client command against d and returns stdout, stderr, exit code.
func (d *daemon) tp(t *testing.T, stdin []byte, args ...string) (string, string, int) {
	t.Helper()
	return (&clitest.Daemon{Socket: d.socket}).Run(t, binPath, stdin, args...)
}

func TestCLIEndToEnd(t *testing.T) {
	d := startDaemon(t)
	value := make([]byte, 300000)
	rand.New(rand.NewSource(1)).Read(value)

	out, errs, code := d.tp(t, value, "put", "--ns", "llama", "block-0")
	if code != 0 || !strings.Contains(out, "stored block-0 (300000 bytes)") {
		t.Fatalf("put: %d %q %q", code, out, errs)
	}
	out, _, code = d.tp(t, value, "put", "--ns", "llama", "block-0")
	if code != 0 || !strings.Contains(out, "exists") {
		t.Fatalf("second put: %d %q", code, out)
	}
	// Value from a file, key in hex.
	f := filepath.Join(t.TempDir(), "v")
	os.WriteFile(f, []byte("from a file"), 0o600)
	if _, errs, code := d.tp(t, nil, "put", "--ns", "llama", "--hex", "--depth", "1", "00ff", f); code != 0 {
		t.Fatalf("put --hex: %d %s", code, errs)
	}

	got, _, code := d.tp(t, nil, "get", "--ns", "llama", "block-0")
	if code != 0 || !bytes.Equal([]byte(got), value) {
		t.Fatalf("get: code %d, %d bytes, equal=%v", code, len(got), bytes.Equal([]byte(got), value))
	}
	got, _, code = d.tp(t, nil, "get", "--ns", "llama", "--hex", "00ff")
	if code != 0 || got != "from a file" {
		t.Fatalf("get --hex: %d %q", code, got)
	}
	_, errs, code = d.tp(t, nil, "get", "--ns", "llama", "nope")
	if code != exitNotFound || !strings.Contains(errs, "not found") {
		t.Fatalf("get missing: %d %q", code, errs)
	}
	out, _, code = d.tp(t, nil, "get", "--ns", "llama", "--json", "--hex", "00ff")
	var gj struct {
		Found bool   `json:"found"`
		Value []byte `json:"value"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &gj) != nil || !gj.Found || string(gj.Value) != "from a file" {
		t.Fatalf("get --json: %d %q", code, out)
	}

	out, _, code = d.tp(t, nil, "exists", "--ns", "llama", "block-0", "nope")
	if code != exitNotFound || !strings.Contains(out, "block-0\tpresent\tdram") || !strings.Contains(out, "nope\tabsent") {
		t.Fatalf("exists: %d %q", code, out)
	}
	out, _, code = d.tp(t, nil, "lookup", "--ns", "llama", "--json", "block-0", "nope", "block-0")
	var lj struct{ Matched, Keys int }
	if code != 0 || json.Unmarshal([]byte(out), &lj) != nil || lj.Matched != 1 || lj.Keys != 3 {
		t.Fatalf("lookup: %d %q", code, out)
	}
	out, _, code = d.tp(t, nil, "stat", "--json")
	var sj struct {
		Tiers      []struct{ Name string }
		Namespaces []struct {
			Ns     string
			Blocks int64
		}
	}
	if code != 0 || json.Unmarshal([]byte(out), &sj) != nil || len(sj.Tiers) == 0 || len(sj.Namespaces) != 1 || sj.Namespaces[0].Blocks != 2 {
		t.Fatalf("stat --json: %d %q", code, out)
	}
	if out, _, code = d.tp(t, nil, "stat"); code != 0 || !strings.Contains(out, "llama") {
		t.Fatalf("stat: %d %q", code, out)
	}
	if out, _, code = d.tp(t, nil, "delete", "--ns", "llama", "block-0"); code != 0 || !strings.Contains(out, "deleted") {
		t.Fatalf("delete: %d %q", code, out)
	}
	if _, _, code = d.tp(t, nil, "delete", "--ns", "llama", "block-0"); code != exitNotFound {
		t.Fatalf("second delete: %d", code)
	}
	if out, _, code = d.tp(t, nil, "clear", "--ns", "llama"); code != 0 || !strings.Contains(out, "removed 1 blocks") {
		t.Fatalf("clear: %d %q", code, out)
	}

	// Bad input: clear errors with the protocol code, nothing crashes.
	long := strings.Repeat("k", 129)
	out, errs, code = d.tp(t, []byte("v"), "put", "--ns", "llama", "--json", long)
	if code != exitError || !strings.Contains(out, "INVALID_ARGUMENT") || !strings.Contains(errs, "limit 128") {
		t.Fatalf("long key: %d %q %q", code, out, errs)
	}
	_, errs, code = d.tp(t, make([]byte, 9<<20), "put", "--ns", "llama", "big")
	if code != exitError || !strings.Contains(errs, "TOO_LARGE") {
		t.Fatalf("big value: %d %q", code, errs)
	}
	if _, _, code = d.tp(t, nil, "get", "--ns", "llama", "--hex", "zz"); code != exitUsage {
		t.Fatalf("bad hex: %d", code)
	}
	if _, _, code = d.tp(t, nil, "get"); code != exitUsage {
		t.Fatalf("get without key: %d", code)
	}

	// Metrics, health and readiness on the loopback port.
	if d.metrics == "" {
		t.Fatal("no metrics address printed")
	}
	body := httpGet(t, "http://"+d.metrics+"/metrics")
	for _, want := range []string{
		`tidepool_request_duration_seconds_count{code="OK",method="Put"}`,
		`tidepool_request_duration_seconds_count{code="INVALID_ARGUMENT",method="Put"}`,
		`tidepool_tier_capacity_bytes{tier="dram"} 6.7108864e+07`,
		`tidepool_tier_hits_total{tier="dram"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if b := httpGet(t, "http://"+d.metrics+"/healthz"); b != "ok\n" {
		t.Errorf("/healthz = %q", b)
	}
	if b := httpGet(t, "http://"+d.metrics+"/readyz"); b != "ready\n" {
		t.Errorf("/readyz = %q", b)
	}

	// A second server on the same socket refuses to start and leaves the
	// first one serving.
	second := exec.Command(binPath, "serve", "--socket", d.socket, "--arena-dir", t.TempDir(), "--dram-capacity", "64MiB", "--metrics-addr", "")
	outb, err := second.CombinedOutput()
	if err == nil || !strings.Contains(string(outb), "in use") {
		t.Fatalf("second serve on a live socket: %v\n%s", err, outb)
	}
	if _, _, code := d.tp(t, nil, "stat"); code != 0 {
		t.Fatal("first server hurt by the second")
	}

	// SIGTERM: graceful exit, socket removed.
	d.stop(t, syscall.SIGTERM)
	if _, err := os.Stat(d.socket); !os.IsNotExist(err) {
		t.Fatalf("socket left behind after graceful exit: %v", err)
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestServeRefusesBadConfig(t *testing.T) {
	cmd := exec.Command(binPath, "serve", "--dram-capacity", "nonsense", "--log-level", "loud")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("exit %v, want 2\n%s", err, out)
	}
	if !strings.Contains(string(out), "--dram-capacity") {
		t.Fatalf("output does not name the bad flag:\n%s", out)
	}
}

func TestVersionAndUsage(t *testing.T) {
	out, err := exec.Command(binPath, "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "tidepool ") {
		t.Fatalf("version: %v %q", err, out)
	}
	cmd := exec.Command(binPath, "frobnicate")
	b, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(b), "unknown command") {
		t.Fatalf("unknown command: %v %q", err, b)
	}
}

// TestClientBeforeSocket: a client command run before its sidecar's socket
// exists prints its error once, not a Kitex warning per retry first.
func TestClientBeforeSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "absent.sock")
	for _, args := range [][]string{
		{"stat", "--socket", sock, "--timeout", "5s"},
		{"bench", "--socket", sock, "--duration", "1s"},
	} {
		out, err := exec.Command(binPath, args...).CombinedOutput()
		if err == nil {
			t.Fatalf("%s of an absent socket succeeded:\n%s", args[0], out)
		}
		if strings.Contains(string(out), "KITEX") || strings.Count(string(out), "\n") != 1 {
			t.Fatalf("%s: want one line of error, got:\n%s", args[0], out)
		}
	}
}

// TestServePutSocket: serve makes the put socket beside the engine socket
// (same mode), a large put goes through it and reads back, its calls and
// connections are counted, and SIGTERM removes it with the engine socket;
// with put_socket off there is no such file and puts still work.
func TestServePutSocket(t *testing.T) {
	d := startDaemon(t)
	put := d.socket + ".put"
	fi, err := os.Stat(put)
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("put socket %s: %v, mode %v", put, err, fi)
	}
	value := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	if _, stderr, code := d.tp(t, value, "put", "big"); code != 0 {
		t.Fatalf("put: exit %d: %s", code, stderr)
	}
	out, stderr, code := d.tp(t, nil, "get", "big")
	if code != 0 || out != string(value) {
		t.Fatalf("get: exit %d, %d bytes (want %d): %s", code, len(out), len(value), stderr)
	}
	body := httpGet(t, "http://"+d.metrics+"/metrics")
	if !strings.Contains(body, `tidepool_request_duration_seconds_count{code="OK",method="Put"} 1`) {
		t.Errorf("/metrics does not count the put: %s", grepLines(body, "request_duration_seconds_count"))
	}
	d.stop(t, syscall.SIGTERM)
	for _, p := range []string{d.socket, put} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s left behind after graceful exit: %v", p, err)
		}
	}

	off := startDaemon(t, "--put-socket=false")
	if _, err := os.Stat(off.socket + ".put"); !os.IsNotExist(err) {
		t.Fatalf("put_socket off: %v", err)
	}
	if _, stderr, code := off.tp(t, value, "put", "big"); code != 0 {
		t.Fatalf("put without the put socket: exit %d: %s", code, stderr)
	}
	if out, _, code := off.tp(t, nil, "get", "big"); code != 0 || out != string(value) {
		t.Fatalf("get without the put socket: exit %d, %d bytes", code, len(out))
	}
}
