package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/internal/peerauth"
	"github.com/tidepool-kv/tidepool/protocol/frame"
)

// Credentials the cluster tests share (every member of a test cluster gets
// the same files).
const (
	testGossipKey  = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=" // base64 of 32 bytes
	testPeerSecret = "tidepool-test-peer-secret-0123456789"
)

// credArgs writes the gossip key and peer secret to files and returns the
// flags naming them (an empty value leaves that flag out).
func credArgs(t *testing.T, gossipKey, peerSecret string) []string {
	t.Helper()
	dir := t.TempDir()
	var args []string
	if gossipKey != "" {
		f := filepath.Join(dir, "gossip.key")
		if err := os.WriteFile(f, []byte(gossipKey+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--gossip-key-file", f)
	}
	if peerSecret != "" {
		f := filepath.Join(dir, "peer.secret")
		if err := os.WriteFile(f, []byte(peerSecret+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--peer-secret-file", f)
	}
	return args
}

// plainClusterArgs are clusterArgs without credentials.
func plainClusterArgs(t *testing.T, name, join string) *clusterMember {
	m := clusterArgs(t, name, join)
	var out []string
	for i := 0; i < len(m.args); i++ {
		if m.args[i] == "--gossip-key-file" || m.args[i] == "--peer-secret-file" {
			i++
			continue
		}
		out = append(out, m.args[i])
	}
	m.args = out
	return m
}

func (m *clusterMember) flag(t *testing.T, name string) string {
	t.Helper()
	for i := 0; i+1 < len(m.args); i++ {
		if m.args[i] == name {
			return m.args[i+1]
		}
	}
	t.Fatalf("no %s in %v", name, m.args)
	return ""
}

// metric reads one sample of d's /metrics (0 when absent).
func metric(t *testing.T, d *daemon, name string) float64 {
	t.Helper()
	body := httpGet(t, "http://"+d.metrics+"/metrics")
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` ([0-9.e+]+)$`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// waitMetric polls until d's metric name is at least want.
func waitMetric(t *testing.T, d *daemon, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if metric(t, d, name) >= want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s never reached %v (last %v)", name, want, metric(t, d, name))
}

func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no VmRSS in /proc/%d/status", pid)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// TestClusterServeNeedsCredentials: serve in cluster mode without a gossip
// key and a peer secret refuses to start and says why; with
// insecure_cluster it starts and logs a loud warning.
func TestClusterServeNeedsCredentials(t *testing.T) {
	for _, tc := range []struct {
		name  string
		creds []string
	}{
		{"none", nil},
		{"gossip key only", credArgs(t, testGossipKey, "")},
		{"peer secret only", credArgs(t, "", testPeerSecret)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := plainClusterArgs(t, "lonely", "")
			args := append([]string{"serve", "--socket", filepath.Join(t.TempDir(), "tp.sock"), "--data-dir", t.TempDir(),
				"--arena-dir", t.TempDir(), "--dram-capacity", "64MiB", "--metrics-addr", ""}, m.args...)
			args = append(args, tc.creds...)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, binPath, args...).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("serve without credentials: err %v, want a non-zero exit\n%s", err, out)
			}
			for _, want := range []string{"needs credentials", "gossip_key_file", "peer_secret_file", "insecure_cluster"} {
				if !strings.Contains(string(out), want) {
					t.Errorf("error does not mention %q:\n%s", want, out)
				}
			}
		})
	}
	t.Run("insecure", func(t *testing.T) {
		m := plainClusterArgs(t, "open", "")
		d := startDaemon(t, append(m.args, "--insecure-cluster", "true")...)
		d.stop(t, syscall.SIGTERM)
		if !strings.Contains(d.stderr.String(), "INSECURE CLUSTER") {
			t.Fatalf("no loud warning in the log:\n%s", d.stderr.String())
		}
	})
}

// hostileThrift is a framed Thrift call whose first field is a list that
// claims 2^31-1 elements: decoded, it would ask for gigabytes.
func hostileThrift() []byte {
	var body []byte
	body = binary.BigEndian.AppendUint32(body, 0x80010001) // binary protocol, CALL
	body = binary.BigEndian.AppendUint32(body, 3)
	body = append(body, "Put"...)
	body = binary.BigEndian.AppendUint32(body, 1) // seq id
	body = append(body, 12)                       // field 1: struct (req)
	body = binary.BigEndian.AppendUint16(body, 1)
	body = append(body, 15) // field: list
	body = binary.BigEndian.AppendUint16(body, 3)
	body = append(body, 12) // of structs
	body = binary.BigEndian.AppendUint32(body, 0x7fffffff)
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// refusedBeforeReply dials addr, sends payload and reports what came back
// before the server closed the connection.
func refusedBeforeReply(t *testing.T, addr string, payload []byte) (int, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	_, _ = c.Write(payload) // the server may close before all of it is read
	n, err := io.Copy(io.Discard, c)
	return int(n), err
}

// TestClusterPortsRefuseStrangers runs a real node with credentials: a
// client without them is disconnected from the peer API before any Thrift
// is decoded (a hostile 2^31-1 list header leaves the node alive with its
// memory bounded), and from the transfer port before a frame is answered;
// a client with the wrong secret fails the handshake on both. The refusals
// are counted in /metrics.
func TestClusterPortsRefuseStrangers(t *testing.T) {
	if testing.Short() {
		t.Skip("process test skipped in -short mode")
	}
	a := clusterArgs(t, "guarded", "")
	a.d = startDaemon(t, a.args...)
	peerAddr, xferAddr := a.flag(t, "--peer-addr"), a.flag(t, "--transfer-addr")
	pid := a.d.cmd.Process.Pid
	before := rssKiB(t, pid)

	const rounds = 20
	for i := 0; i < rounds; i++ {
		if n, err := refusedBeforeReply(t, peerAddr, hostileThrift()); n != 0 {
			t.Fatalf("peer API answered %d bytes to an unauthenticated client (err %v)", n, err)
		}
	}
	var hdr [frame.HeaderSize]byte
	hello := frame.Encode(hdr[:], frame.Header{Op: frame.OpHello, RequestID: 1})
	read := frame.Encode(make([]byte, frame.HeaderSize), frame.Header{Op: frame.OpRead, RequestID: 2, Region: 1, Length: 4096})
	for _, p := range [][]byte{hello, append(append([]byte{}, hello...), read...)} {
		if n, err := refusedBeforeReply(t, xferAddr, p); n != 0 {
			t.Fatalf("transfer port answered %d bytes to an unauthenticated client (err %v)", n, err)
		}
	}
	wrong, err := peerauth.NewKey([]byte("not-the-cluster-secret-at-all"), "test")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		addr    string
		purpose peerauth.Purpose
	}{{peerAddr, peerauth.PurposePeerAPI}, {xferAddr, peerauth.PurposeTransfer}} {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := wrong.Client(c, p.purpose, time.Now().Add(10*time.Second)); !errors.Is(err, peerauth.ErrRefused) {
			t.Fatalf("handshake with the wrong secret on %s: %v, want ErrRefused", p.addr, err)
		}
		c.Close()
	}
	waitMetric(t, a.d, `tidepool_port_refused_total{port="peer_api",reason="auth"}`, rounds+1)
	waitMetric(t, a.d, `tidepool_port_refused_total{port="transfer",reason="auth"}`, 3)

	// Still alive and serving, memory bounded.
	dir := t.TempDir()
	f := filepath.Join(dir, "v")
	os.WriteFile(f, []byte("still here"), 0o600)
	if _, errs, code := a.d.tp(t, nil, "put", "--ns", "kv", "k", f); code != 0 {
		t.Fatalf("put after the hostile clients: %s", errs)
	}
	if got, errs, code := a.d.tp(t, nil, "get", "--ns", "kv", "k"); code != 0 || got != "still here" {
		t.Fatalf("get after the hostile clients: %q %s", got, errs)
	}
	if after := rssKiB(t, pid); after-before > 64<<10 {
		t.Fatalf("RSS grew from %d KiB to %d KiB", before, after)
	}
}

// TestClusterMembershipNeedsPeerSecret: a node that holds the gossip key
// but not the cluster's peer secret (another secret, or none with
// insecure_cluster) is refused as a member: the cluster counts the refusal
// and never lists it, so it never owns a block.
func TestClusterMembershipNeedsPeerSecret(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test skipped in -short mode")
	}
	a := clusterArgs(t, "member-a", "")
	a.d = startDaemon(t, a.args...)
	for i, creds := range [][]string{
		credArgs(t, testGossipKey, "another-secret-of-enough-bytes"),
		append(credArgs(t, testGossipKey, ""), "--insecure-cluster", "true"),
	} {
		name := fmt.Sprintf("intruder-%d", i)
		m := plainClusterArgs(t, name, a.gossip)
		args := append([]string{"serve", "--socket", filepath.Join(t.TempDir(), "tp.sock"), "--data-dir", t.TempDir(),
			"--arena-dir", t.TempDir(), "--dram-capacity", "64MiB", "--metrics-addr", ""}, m.args...)
		refused := metric(t, a.d, "tidepool_cluster_refused_total")
		cmd := exec.Command(binPath, append(args, creds...)...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitMetric(t, a.d, "tidepool_cluster_refused_total", refused+1)
		if got := members(t, a.d); got[name] != "" {
			t.Fatalf("%s (gossip key, no peer secret) is a member: %v", name, got)
		}
		cmd.Process.Kill()
		cmd.Wait()
	}
	waitView(t, a.d, "member-a")
}

// TestClusterEncrypted: two real nodes with peer_encrypt move a block
// between them; a node with the same secret but without peer_encrypt is
// refused as a member (it could not talk to them).
func TestClusterEncrypted(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test skipped in -short mode")
	}
	a := clusterArgs(t, "enc-a", "")
	a.d = startDaemon(t, append(a.args, "--peer-encrypt", "true")...)
	b := clusterArgs(t, "enc-b", a.gossip)
	b.d = startDaemon(t, append(b.args, "--peer-encrypt", "true")...)
	waitView(t, b.d, "enc-a", "enc-b")
	dir := t.TempDir()
	for i := 0; i < 8; i++ {
		f := filepath.Join(dir, fmt.Sprint(i))
		os.WriteFile(f, []byte(fmt.Sprintf("encrypted block %d", i)), 0o600)
		if _, errs, code := a.d.tp(t, nil, "put", "--ns", "kv", fmt.Sprintf("blk-%d", i), f); code != 0 {
			t.Fatalf("put %d: %s", i, errs)
		}
	}
	for i := 0; i < 8; i++ {
		// Retried once: a background push to the owner may be in flight.
		var got, errs string
		var code int
		for try := 0; try < 2; try++ {
			if got, errs, code = b.d.tp(t, nil, "get", "--ns", "kv", fmt.Sprintf("blk-%d", i)); code == 0 {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if code != 0 || got != fmt.Sprintf("encrypted block %d", i) {
			t.Fatalf("get %d on b: %q %s", i, got, errs)
		}
	}
	if metric(t, b.d, "tidepool_transfer_bytes_in_total")+metric(t, b.d, "tidepool_transfer_bytes_out_total") == 0 {
		t.Fatal("no block crossed the transfer port")
	}

	plain := clusterArgs(t, "plain-c", a.gossip) // same secret, no encryption
	args := append([]string{"serve", "--socket", filepath.Join(t.TempDir(), "tp.sock"), "--data-dir", t.TempDir(),
		"--arena-dir", t.TempDir(), "--dram-capacity", "64MiB", "--metrics-addr", ""}, plain.args...)
	refused := metric(t, a.d, "tidepool_cluster_refused_total")
	cmd := exec.Command(binPath, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	waitMetric(t, a.d, "tidepool_cluster_refused_total", refused+1)
	if got := members(t, a.d); got["plain-c"] != "" {
		t.Fatalf("a node without peer_encrypt joined an encrypted cluster: %v", got)
	}
}

// TestClusterPortLimits: on a real node, connections over peer_max_conns
// are closed as they come on both ports (counted), and an authenticated
// connection that stays idle past peer_idle_timeout is closed by the node.
func TestClusterPortLimits(t *testing.T) {
	if testing.Short() {
		t.Skip("process test skipped in -short mode")
	}
	a := clusterArgs(t, "limited", "")
	a.d = startDaemon(t, append(a.args, "--peer-max-conns", "2", "--peer-idle-timeout", "1s")...)
	key, err := peerauth.NewKey([]byte(testPeerSecret), "test")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		name, addr string
		purpose    peerauth.Purpose
	}{{"peer_api", a.flag(t, "--peer-addr"), peerauth.PurposePeerAPI}, {"transfer", a.flag(t, "--transfer-addr"), peerauth.PurposeTransfer}} {
		var held []net.Conn
		for i := 0; i < 2; i++ {
			c, err := net.Dial("tcp", p.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := key.Client(c, p.purpose, time.Now().Add(10*time.Second)); err != nil {
				t.Fatalf("%s: connection %d under the cap: %v", p.name, i, err)
			}
			held = append(held, c)
		}
		if n, _ := refusedBeforeReply(t, p.addr, nil); n != 0 {
			t.Fatalf("%s: a connection over the cap got %d bytes", p.name, n)
		}
		waitMetric(t, a.d, `tidepool_port_refused_total{port="`+p.name+`",reason="limit"}`, 1)
		// The held connections send nothing: the node closes them.
		for _, c := range held {
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
				t.Fatalf("%s: idle connection: %v, want EOF (closed by the node)", p.name, err)
			}
		}
		waitMetric(t, a.d, `tidepool_port_accepted_total{port="`+p.name+`"}`, 2)
	}
}

// TestClusterCredentialSettings: the credential settings parse from flags,
// variables and YAML alike, and Validate asks for both files in cluster
// mode unless insecure_cluster is set.
func TestClusterCredentialSettings(t *testing.T) {
	cluster := []string{"--gossip-addr", "127.0.0.1:7946", "--peer-addr", "127.0.0.1:7950", "--transfer-addr", "127.0.0.1:7960"}
	dir := t.TempDir()
	yml := filepath.Join(dir, "c.yaml")
	os.WriteFile(yml, []byte("insecure_cluster: true\npeer_encrypt: false\n"), 0o600)
	for _, tc := range []struct {
		name    string
		args    []string
		env     []string
		wantErr string
	}{
		{"no credentials", cluster, nil, "needs credentials"},
		{"gossip key only", append(cluster, "--gossip-key-file", "/k"), nil, "needs credentials"},
		{"both files", append(cluster, "--gossip-key-file", "/k", "--peer-secret-file", "/s"), nil, ""},
		{"insecure flag", append(cluster, "--insecure-cluster", "true"), nil, ""},
		{"insecure variable", cluster, []string{"TIDEPOOL_INSECURE_CLUSTER=true"}, ""},
		{"insecure yaml", append(cluster, "--config", yml), nil, ""},
		{"not a boolean", append(cluster, "--insecure-cluster", "maybe"), nil, "not a boolean"},
		{"encrypt without secret", append(cluster, "--insecure-cluster", "true", "--peer-encrypt", "true"), nil, "peer_encrypt needs peer_secret_file"},
		{"zero conns", append(cluster, "--gossip-key-file", "/k", "--peer-secret-file", "/s", "--peer-max-conns", "0"), nil, "peer_max_conns"},
		{"single node needs nothing", nil, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.args, tc.env)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestReadKeyRawBytesWithWhiteSpace: a raw gossip key whose first or last
// byte is white space is taken whole (trimmed, it was one byte short and
// serve refused to start: about one random key in 20); base64 text and a
// raw key followed by a newline read as before.
func TestReadKeyRawBytesWithWhiteSpace(t *testing.T) {
	dir := t.TempDir()
	raw := []byte(" 0123456789abcdef0123456789abcd\n") // 32 bytes
	want := map[string][]byte{
		"raw":             raw,
		"raw+newline":     append(append([]byte{}, raw...), '\n'),
		"base64":          []byte(testGossipKey + "\n"),
		"raw16+newline":   []byte("0123456789abcdef\n"),
		"31 bytes, wrong": raw[:31],
	}
	for name, content := range want {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := readKey(path)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		switch name {
		case "raw", "raw+newline":
			if !bytes.Equal(got, raw) {
				t.Errorf("%s: read %q, want the 32 raw bytes", name, got)
			}
		case "base64":
			if len(got) != 32 {
				t.Errorf("%s: read %d bytes, want the 32 decoded", name, len(got))
			}
		case "raw16+newline":
			if string(got) != "0123456789abcdef" {
				t.Errorf("%s: read %q", name, got)
			}
		default:
			if validKeyLen(len(got)) {
				t.Errorf("%s: read a valid key of %d bytes from a 31-byte file", name, len(got))
			}
		}
	}
}
