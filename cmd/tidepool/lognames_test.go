package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLoggerNamesNotDoubled starts a one-node cluster member at debug
// level, makes its transfer layer log (a connection that fails
// authentication), stops it cleanly, and reads every logger name of its
// log. No name repeats a segment: "rdma.rdma.tcp" and "cluster.cluster"
// came from cmd naming a component that names itself. The transfer layer
// and the membership layer must have logged under their own names, so the
// check saw them.
func TestLoggerNamesNotDoubled(t *testing.T) {
	m := clusterArgs(t, "logs", "")
	d := startDaemon(t, append(m.args, "--log-level", "debug")...)
	transfer := m.args[slices.Index(m.args, "--transfer-addr")+1]
	nc, err := net.Dial("tcp", transfer)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Write(bytes.Repeat([]byte{0x5a}, 4096)); err != nil {
		t.Fatal(err)
	}
	_ = nc.(*net.TCPConn).CloseWrite()
	// The server logs the refusal before it closes (or resets) the
	// connection, which ends this read.
	_ = nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	var ne net.Error
	if _, err := io.Copy(io.Discard, nc); errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("transfer port did not close the refused connection: %v", err)
	}
	nc.Close()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err = <-d.exited
	d.exited <- err // for the cleanup
	if err != nil {
		t.Fatalf("serve did not stop cleanly: %v", err)
	}
	names := map[string]int{}
	// Console encoding (debug level): time, level, [logger,] caller, message.
	for _, line := range strings.Split(d.stderr.String(), "\n") {
		f := strings.Split(line, "\t")
		if len(f) > 3 && !strings.Contains(f[2], ".go:") {
			names[f[2]]++
		}
	}
	for name := range names {
		segs := strings.Split(name, ".")
		for i := 1; i < len(segs); i++ {
			if segs[i] == segs[i-1] {
				t.Errorf("logger name %q repeats %q", name, segs[i])
			}
		}
	}
	for _, want := range []string{"cluster", "rdma.tcp"} {
		if names[want] == 0 {
			t.Errorf("no log line from logger %q; loggers seen: %v", want, names)
		}
	}
}
