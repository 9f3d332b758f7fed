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
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/client"
	"github.com/tidepool-kv/tidepool/protocol"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
)

// thriftCall is a strict-binary Thrift CALL of method with body (the
// argument struct's bytes). nameLen, when not -1, replaces the method
// name's true length in the header (the name bytes stay as they are).
func thriftCall(method string, nameLen int32, body []byte) []byte {
	var b []byte
	b = binary.BigEndian.AppendUint32(b, 0x80010001)
	if nameLen == -1 {
		nameLen = int32(len(method))
	}
	b = binary.BigEndian.AppendUint32(b, uint32(nameLen))
	b = append(b, method...)
	b = binary.BigEndian.AppendUint32(b, 1) // seq id
	return append(b, body...)
}

// framed prefixes msg with its length (Thrift's framed transport).
func framed(msg []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(msg))), msg...)
}

// hugeListArgs is an argument struct whose field 1 (the request) holds,
// at field id, a list of elem claiming 2^31-1 elements, and nothing else.
func hugeListArgs(id int16, elem byte) []byte {
	b := []byte{0x0c, 0, 1, 0x0f}
	b = binary.BigEndian.AppendUint16(b, uint16(id))
	b = append(b, elem)
	b = binary.BigEndian.AppendUint32(b, 1<<31-1)
	return append(b, 0, 0) // STOP of the request, STOP of the args
}

// vmRSS returns the resident set of pid in bytes.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// goMetric reads one unlabelled metric of d's /metrics.
func (d *daemon) goMetric(t *testing.T, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(httpGet(t, "http://"+d.metrics+"/metrics"), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics lacks %s", name)
	return 0
}

// alive fails the test if d has exited.
func (d *daemon) alive(t *testing.T) {
	t.Helper()
	select {
	case err := <-d.exited:
		d.exited <- err
		t.Fatalf("serve died: %v\n%s", err, d.stderr.String())
	default:
	}
}

// sendHostile writes msg on a fresh connection to d and waits for the
// server to answer it (an exception) or close the connection. A server
// still waiting for the bytes msg merely claims fails the test.
func (d *daemon) sendHostile(t *testing.T, msg []byte) []byte {
	t.Helper()
	conn, err := net.Dial("unix", d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write(msg); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	reply, err := io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("server neither answered nor closed within 10s (got %d bytes)", len(reply))
	}
	return reply
}

// TestHostileFramesEngineSocket: about fifty bytes that claim a list of
// 2^31-1 elements, or a 2 GiB method name, must get an error or a closed
// connection, never an allocation of what they claim: the process stays
// up, its RSS stays put, and the next normal request is served.
func TestHostileFramesEngineSocket(t *testing.T) {
	d := startDaemon(t)
	pid := d.cmd.Process.Pid
	c, err := client.New(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Put(ctx, "ns", []byte("k"), []byte("before"), 0); err != nil {
		t.Fatal(err)
	}
	base := vmRSS(t, pid)

	const (
		tString = 0x0b
		tStruct = 0x0c
	)
	msgs := []struct {
		name string
		msg  []byte
	}{
		{"method-name", thriftCall("Get", 1<<31-1, nil)},
		// A field type byte of 0x80 or more made gopkg's Skip index its
		// type table with a negative number (a panic).
		{"field-type", thriftCall("Get", -1, []byte{0x0c, 0, 1, 0xfa, 0x30, 0x30, 0, 0})},
		{"BatchGet", thriftCall("BatchGet", -1, hugeListArgs(2, tString))},
		{"Lookup", thriftCall("Lookup", -1, hugeListArgs(2, tString))},
		{"Acquire", thriftCall("Acquire", -1, hugeListArgs(2, tString))},
		{"BatchPut", thriftCall("BatchPut", -1, hugeListArgs(2, tStruct))},
		{"Commit", thriftCall("Commit", -1, hugeListArgs(1, tStruct))},
	}
	for _, m := range msgs {
		for _, transport := range []string{"framed", "buffered"} {
			t.Run(m.name+"/"+transport, func(t *testing.T) {
				msg := m.msg
				if transport == "framed" {
					msg = framed(msg)
				}
				allocated := d.goMetric(t, "go_memstats_alloc_bytes_total")
				d.sendHostile(t, msg)
				d.alive(t)
				if got := d.goMetric(t, "go_memstats_alloc_bytes_total") - allocated; got > 64<<20 {
					t.Fatalf("a %d-byte message made the server allocate %.0f bytes", len(msg), got)
				}
				if rss := vmRSS(t, pid); rss > base+128<<20 {
					t.Fatalf("RSS grew from %d to %d bytes", base, rss)
				}
				v, found, err := c.Get(ctx, "ns", []byte("k"))
				if err != nil || !found || string(v) != "before" {
					t.Fatalf("Get after the hostile frame: %q %v %v", v, found, err)
				}
			})
		}
	}
}

// TestUnknownMethodAndOldClient: a method the server does not have gets
// Thrift's standard UNKNOWN_METHOD exception (type 1); a Hello from a client version the server does not speak
// gets VERSION_MISMATCH.
func TestUnknownMethodAndOldClient(t *testing.T) {
	d := startDaemon(t)
	conn, err := net.Dial("unix", d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	// Frobnicate -- not in idl/tidepool.thrift. No argument bytes: the
	// server refuses the call on its name and closes the connection, and
	// bytes left unread there would turn its close into a reset that can
	// overtake the answer.
	if _, err := conn.Write(framed(thriftCall("Frobnicate", -1, nil))); err != nil {
		t.Fatal(err)
	}
	typ, exc := readException(t, conn)
	if typ != 1 {
		t.Fatalf("unknown method: exception type %d (%q), want 1 (UNKNOWN_METHOD)", typ, exc)
	}
	d.alive(t)
	// Kitex closes a connection after a call it could not decode; a new
	// one is served. Hello checks the version.
	conn.Close()
	if conn, err = net.Dial("unix", d.socket); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	for _, v := range []int32{1, 0, 2, -1} {
		res := hello(t, conn, v)
		if v == protocol.Version {
			if res.GetErr() != nil || res.GetSuccess().GetServerVersion() != protocol.Version {
				t.Fatalf("Hello from version %d: %v", v, res.GetErr())
			}
			continue
		}
		if res.GetErr().GetCode() != tp.ErrorCode_VERSION_MISMATCH {
			t.Fatalf("Hello from version %d: %v, want VERSION_MISMATCH", v, res.GetErr())
		}
	}
}

// hello calls Hello on conn as a client of version v.
func hello(t *testing.T, conn net.Conn, v int32) *tp.TidepoolHelloResult {
	t.Helper()
	args := &tp.TidepoolHelloArgs{Req: &tp.HelloRequest{ClientVersion: v, ClientName: "wire-test"}}
	body := make([]byte, args.BLength())
	args.FastWriteNocopy(body, nil)
	if _, err := conn.Write(framed(thriftCall("Hello", -1, body))); err != nil {
		t.Fatal(err)
	}
	reply := readFrame(t, conn)
	if binary.BigEndian.Uint32(reply) != 0x80010002 { // REPLY
		t.Fatalf("Hello reply header %#x", binary.BigEndian.Uint32(reply))
	}
	off := 8 + int(binary.BigEndian.Uint32(reply[4:])) + 4
	res := tp.NewTidepoolHelloResult()
	if _, err := res.FastRead(reply[off:]); err != nil {
		t.Fatalf("decoding the Hello reply: %v", err)
	}
	return res
}

// readFrame reads one framed message from conn.
func readFrame(t *testing.T, conn net.Conn) []byte {
	t.Helper()
	var hdr [4]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		t.Fatalf("reading the reply: %v", err)
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	if len(body) > 1<<20 {
		t.Fatalf("reply of %d bytes", len(body))
	}
	if _, err := io.ReadFull(conn, body); err != nil {
		t.Fatalf("reading the reply: %v", err)
	}
	return body
}

// readException reads one framed Thrift reply and returns the type and
// message of the TApplicationException it must carry.
func readException(t *testing.T, conn net.Conn) (int32, string) {
	t.Helper()
	r := bytes.NewReader(readFrame(t, conn))
	var ver uint32
	binary.Read(r, binary.BigEndian, &ver)
	if ver != 0x80010003 { // EXCEPTION
		t.Fatalf("reply header %#x, want an exception", ver)
	}
	var n uint32
	binary.Read(r, binary.BigEndian, &n)
	r.Seek(int64(n)+4, io.SeekCurrent) // name, seq id
	var msg string
	var typ int32 = -1
	for {
		ft, _ := r.ReadByte()
		if ft == 0 {
			break
		}
		var id int16
		binary.Read(r, binary.BigEndian, &id)
		switch ft {
		case 0x0b:
			var l uint32
			binary.Read(r, binary.BigEndian, &l)
			s := make([]byte, l)
			io.ReadFull(r, s)
			msg = string(s)
		case 0x08:
			binary.Read(r, binary.BigEndian, &typ)
		default:
			t.Fatalf("unexpected field type %d in exception", ft)
		}
	}
	return typ, msg
}

// TestEngineConnectionLimit: connections beyond engine_max_connections are
// closed on accept and counted; closing one lets a new one in.
func TestEngineConnectionLimit(t *testing.T) {
	d := startDaemon(t, "--engine-max-connections", "3")
	var held []*client.Client
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	ctx := context.Background()
	for i := range 3 {
		c, err := client.New(d.socket)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		if _, err := c.Put(ctx, "ns", []byte{byte(i)}, []byte("v"), 0); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	// The fourth connection is accepted, then closed by the server.
	conn, err := net.Dial("unix", d.socket)
	if err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := conn.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("connection over the limit: read %d, %v; want EOF", n, err)
	}
	conn.Close()
	body := httpGet(t, "http://"+d.metrics+"/metrics")
	for _, want := range []string{"tidepool_engine_connections 3", "tidepool_engine_connections_refused_total 1", "tidepool_engine_accept_errors_total 0"} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	held[0].Close()
	held = held[1:]
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(httpGet(t, "http://"+d.metrics+"/metrics"), "tidepool_engine_connections 2\n") {
		if time.Now().After(deadline) {
			t.Fatal("closing a connection did not bring the count to 2")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c, err := client.New(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	held = append(held, c)
	if _, _, err := c.Get(ctx, "ns", []byte{0}); err != nil {
		t.Fatalf("a connection after one closed: %v", err)
	}
}

// TestEngineIdleTimeout: a connection that carries nothing for
// engine_idle_timeout is closed by the server.
func TestEngineIdleTimeout(t *testing.T) {
	d := startDaemon(t, "--engine-idle-timeout", "300ms")
	conn, err := net.Dial("unix", d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	if n, err := conn.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("idle connection: read %d, %v; want EOF", n, err)
	}
}

// TestAcceptSurvivesFdExhaustion: with its descriptors used up, the server
// fails accepts (EMFILE), backs off and keeps going: once descriptors are
// free again it serves new connections. With no descriptor reserve
// (fd_reserve 0), so that clients can fill the table; with one they
// cannot (TestServeDescriptorFlood).
func TestAcceptSurvivesFdExhaustion(t *testing.T) {
	const limit = 64
	d := startDaemonWith(t, []string{"prlimit", fmt.Sprintf("--nofile=%d:%d", limit, limit), "--"}, "--fd-reserve", "0")
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range limit + 16 {
		c, err := net.Dial("unix", d.socket)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// The server holds every descriptor it may: the connections still
	// waiting in the backlog make each accept fail with EMFILE.
	pid := d.cmd.Process.Pid
	deadline := time.Now().Add(20 * time.Second)
	for openFDs(t, pid) < limit {
		if time.Now().After(deadline) {
			t.Fatalf("server holds %d descriptors, never reached its limit of %d", openFDs(t, pid), limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	d.alive(t)
	c, err := client.New(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline = time.Now().Add(20 * time.Second)
	for {
		_, err := c.Put(context.Background(), "ns", []byte("k"), []byte("v"), 0)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no call served after the descriptors came back: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !regexp.MustCompile(`tidepool_engine_accept_errors_total [1-9]`).MatchString(httpGet(t, "http://"+d.metrics+"/metrics")) {
		t.Error("accept errors not counted in /metrics")
	}
	d.stop(t, syscall.SIGTERM)
}

// openFDs counts the descriptors pid holds.
func openFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestShutdownUnderLoad: SIGTERM while engines write. The stop must exit
// 0 with no "Bad file descriptor" or RocksDB "Corruption" in the log (the
// engine socket's descriptor was closed more than once during shutdown,
// between closes RocksDB got the number for its own files, and a stray
// close shut one under it), and a restart must serve every acknowledged
// block byte for byte (docs/ssd.md: a clean stop spills DRAM to SSD). The
// default run does a few stops; TIDEPOOL_SHUTDOWN_RUNS=20 does more.
func TestShutdownUnderLoad(t *testing.T) {
	runs := 3
	if s := os.Getenv("TIDEPOOL_SHUTDOWN_RUNS"); s != "" {
		var err error
		if runs, err = strconv.Atoi(s); err != nil {
			t.Fatal(err)
		}
	}
	for run := range runs {
		t.Run(strconv.Itoa(run), func(t *testing.T) { shutdownUnderLoad(t) })
	}
}

func shutdownUnderLoad(t *testing.T) {
	const (
		writers   = 4
		perWriter = 256 // 4 x 256 x 128 KiB = 128 MiB through a 32 MiB DRAM tier
		size      = 128 << 10
		stopAfter = 48 // acknowledged puts before the SIGTERM
	)
	dataDir := t.TempDir()
	d, _ := startServeIn(t, dataDir)
	value := func(w, i int) []byte { return restartValue(w*1000+i, size) }
	key := func(w, i int) []byte { return fmt.Appendf(nil, "w%d-%04d", w, i) }

	var acked [writers]int // puts acknowledged, per writer, in order
	var total atomic.Int64
	done := make(chan struct{}, writers)
	for w := range writers {
		go func() {
			defer func() { done <- struct{}{} }()
			c, err := client.New(d.socket)
			if err != nil {
				return
			}
			defer c.Close()
			for i := range perWriter {
				if _, err := c.Put(context.Background(), "ns", key(w, i), value(w, i), int32(i)); err != nil {
					return
				}
				acked[w] = i + 1
				total.Add(1)
			}
		}()
	}
	deadline := time.Now().Add(60 * time.Second)
	for total.Load() < stopAfter {
		if time.Now().After(deadline) {
			t.Fatalf("only %d puts acknowledged", total.Load())
		}
		time.Sleep(time.Millisecond)
	}
	d.stop(t, syscall.SIGTERM)
	for range writers {
		<-done
	}
	for _, bad := range []string{"Bad file descriptor", "Corruption", "bad file descriptor"} {
		if strings.Contains(d.stderr.String(), bad) {
			t.Fatalf("%q in the log of the stop:\n%s", bad, d.stderr.String())
		}
	}

	d2, recovered := startServeIn(t, dataDir)
	n := 0
	for w := range writers {
		n += acked[w]
	}
	if recovered < n {
		t.Errorf("recovered %d blocks, want at least the %d acknowledged", recovered, n)
	}
	c, err := client.New(d2.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for w := range writers {
		for i := range acked[w] {
			v, found, err := c.Get(context.Background(), "ns", key(w, i))
			if err != nil || !found || !bytes.Equal(v, value(w, i)) {
				t.Fatalf("acknowledged block %s after restart: found=%v err=%v", key(w, i), found, err)
			}
		}
	}
	t.Logf("%d blocks acknowledged before the stop, all served after restart", n)
	d2.stop(t, syscall.SIGTERM)
	if strings.Contains(d2.stderr.String(), "Corruption") {
		t.Fatalf("Corruption in the log after restart:\n%s", d2.stderr.String())
	}
}
