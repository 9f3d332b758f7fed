package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fdFloodLimit is the descriptor limit the flooded serve runs under (soft
// and hard, set by prlimit for the child); its reserve is a quarter.
const fdFloodLimit = 256

// answers reports whether d's /metrics and engine API (a put and a get
// of a fresh key, through the SSD tier as well: durable) still answer.
func answers(t *testing.T, d *daemon, key string) error {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get("http://" + d.metrics + "/metrics")
	if err != nil {
		return fmt.Errorf("/metrics: %w", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "tidepool_fd_limit") {
		return fmt.Errorf("/metrics: status %d, %d bytes", resp.StatusCode, len(body))
	}
	val := make([]byte, 100<<10)
	rand.New(rand.NewSource(int64(len(key)))).Read(val)
	done := make(chan error, 1)
	go func() {
		if _, errs, code := d.tp(t, val, "put", "--ns", "flood", "--durable", key); code != 0 {
			done <- fmt.Errorf("put: exit %d: %s", code, errs)
			return
		}
		got, errs, code := d.tp(t, nil, "get", "--ns", "flood", key)
		if code != 0 || got != string(val) {
			done <- fmt.Errorf("get: exit %d, %d bytes: %s", code, len(got), errs)
			return
		}
		done <- nil
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		return fmt.Errorf("engine API: no answer in 20s")
	}
}

// TestServeDescriptorFlood: a real `tidepool serve` with the SSD tier on
// runs under a limit of 256 descriptors. One client of the buffer socket
// sends a 1 MiB request one byte per sendmsg, each byte carrying the same
// descriptor four times (the audit's attack); the descriptors are closed
// as they come, the process never holds more than a few of them, the
// request is refused, and /metrics and the engine API (durable puts
// through RocksDB included) answer during and after the flood. Then
// connections are opened on all three sockets until the process refuses
// them: clients never get the reserve, so /metrics and RocksDB still work
// while the flood connections are held, and the engine API once they go.
func TestServeDescriptorFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	d := startDaemonWith(t, []string{"prlimit", fmt.Sprintf("--nofile=%d:%d", fdFloodLimit, fdFloodLimit), "--"},
		"--ssd-capacity", "256MiB")
	pid := d.cmd.Process.Pid
	if !strings.Contains(d.stderr.String(), "descriptor limit") {
		t.Fatalf("no logged descriptor limit:\n%s", d.stderr.String())
	}
	if v := metricSum(t, d, "tidepool_fd_limit"); v != fdFloodLimit {
		t.Fatalf("tidepool_fd_limit %v, want %d", v, fdFloodLimit)
	}
	if err := answers(t, d, "before"); err != nil {
		t.Fatal(err)
	}
	base := openFDs(t, pid)

	// The descriptor flood.
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: d.socket + ".buf", Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const body = 1 << 20
	head := []byte{2, 1, 0, 0, 0, 0, 0, 0} // GET, version 1, body length
	binary.BigEndian.PutUint32(head[4:], body)
	if _, err := c.Write(head); err != nil {
		t.Fatal(err)
	}
	rights := syscall.UnixRights(fd, fd, fd, fd)
	const sent = 4000 // 16,000 descriptors, 60 times the limit
	peak := 0
	for i := range sent {
		if _, _, err := c.WriteMsgUnix([]byte{0}, rights, nil); err != nil {
			t.Fatalf("sendmsg %d: %v", i, err)
		}
		if i%500 == 499 {
			peak = max(peak, openFDs(t, pid))
		}
	}
	// Mid-request, the flood connection still open: the process answers.
	if err := answers(t, d, "during-flood"); err != nil {
		t.Fatalf("during the descriptor flood: %v (serve holds %d descriptors)", err, openFDs(t, pid))
	}
	peak = max(peak, openFDs(t, pid))
	if peak > base+16 {
		t.Fatalf("serve held up to %d descriptors during the flood, %d before", peak, base)
	}
	// The rest of the body, no descriptors: the request is refused.
	if _, err := c.Write(make([]byte, body-sent)); err != nil {
		t.Fatal(err)
	}
	ans := make([]byte, 16)
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(c, ans); err != nil {
		t.Fatal(err)
	}
	if code := binary.BigEndian.Uint16(ans); code != 4 { // INVALID_ARGUMENT
		t.Fatalf("flooded request answered code %d, want INVALID_ARGUMENT", code)
	}
	if v := metricSum(t, d, "tidepool_buffer_socket_descriptors_refused_total"); v < sent {
		t.Fatalf("tidepool_buffer_socket_descriptors_refused_total %v after %d descriptor messages", v, sent)
	}
	c.Close()

	// The connection flood, on the three sockets in turn, until the
	// process closes what it accepts.
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for _, path := range []string{d.socket, d.socket + ".put", d.socket + ".buf"} {
		for range fdFloodLimit {
			c, err := net.Dial("unix", path)
			if err != nil {
				break
			}
			held = append(held, c)
		}
	}
	// Every connection the process closed at once reads EOF; count the
	// ones it holds.
	live := 0
	for _, c := range held {
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil && os.IsTimeout(err) {
			live++
		}
	}
	if live >= fdFloodLimit-fdFloodLimit/4 {
		t.Fatalf("serve holds %d client connections, more than its limit less the reserve", live)
	}
	if v := metricSum(t, d, "tidepool_fd_reserve_refused_total"); v == 0 {
		t.Fatalf("no connection refused for the reserve (%d held, %d live)", len(held), live)
	}
	if n := openFDs(t, pid); n >= fdFloodLimit {
		t.Fatalf("serve at %d descriptors, its limit", n)
	}
	// /metrics answers while clients hold every descriptor they can.
	hc := &http.Client{Timeout: 5 * time.Second}
	if resp, err := hc.Get("http://" + d.metrics + "/metrics"); err != nil {
		t.Fatalf("/metrics during the connection flood: %v", err)
	} else {
		resp.Body.Close()
	}
	for _, c := range held {
		c.Close()
	}
	held = nil
	// Once the flood connections are gone, the engine API serves again.
	var last error
	for try := 0; try < 50; try++ {
		if last = answers(t, d, fmt.Sprintf("after-%d", try)); last == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if last != nil {
		t.Fatalf("after the floods: %v", last)
	}
	select {
	case err := <-d.exited:
		d.exited <- err
		t.Fatalf("serve exited: %v", err)
	default:
	}
}
