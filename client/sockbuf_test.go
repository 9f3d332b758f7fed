package client

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDialerSetsSendBuffer: connections to the sidecar get a send buffer
// of requestSendBuffer, as far as net.core.wmem_max lets them.
func TestDialerSetsSendBuffer(t *testing.T) {
	dir, err := os.MkdirTemp("", "tp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			time.Sleep(time.Second)
		}
	}()
	conn, err := newDialer().DialTimeout("unix", path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fd := conn.(interface{ Fd() int }).Fd()
	got, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_SNDBUF)
	if err != nil {
		t.Fatal(err)
	}
	want := 2 * requestSendBuffer // Linux doubles what is asked for
	if b, err := os.ReadFile("/proc/sys/net/core/wmem_max"); err == nil {
		if max, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			want = 2 * min(requestSendBuffer, max)
		}
	}
	if got < want {
		t.Fatalf("SO_SNDBUF = %d, want %d", got, want)
	}
}
