package client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/internal/testvec"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
)

// vectorBuffer is a Buffer whose connection is one end of a socket pair;
// the other end, returned, plays the sidecar.
func vectorBuffer(t *testing.T) (*Buffer, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		conns[i], err = net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { conns[1].Close() })
	b := &Buffer{mem: make([]byte, 1<<20), timeout: 10 * time.Second, conn: conns[0].(*net.UnixConn)}
	t.Cleanup(func() {
		if b.conn != nil {
			b.conn.Close()
		}
	})
	return b, conns[1]
}

// vectorRawConn is a raw connection (AppendGet's and the put socket's)
// on one end of a socket pair; the other end, returned, plays the sidecar.
func vectorRawConn(t *testing.T) (*rawConn, net.Conn) {
	t.Helper()
	b, peer := vectorBuffer(t)
	c := &rawConn{conn: b.conn, r: bufio.NewReaderSize(b.conn, rawReadBuffer)}
	b.conn = nil // c's now
	t.Cleanup(func() { c.conn.Close() })
	return c, peer
}

// sidecar reads a request of n bytes from conn into *got, writes answer
// and, when hangUp, closes conn.
func sidecar(conn net.Conn, n int, got *[]byte, answer []byte, hangUp bool) <-chan error {
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, n)
		_, err := io.ReadFull(conn, buf)
		*got = buf
		if err == nil {
			_, err = conn.Write(answer)
		}
		if hangUp {
			conn.Close()
		}
		done <- err
	}()
	return done
}

// TestBufVectorsRequests: Buffer.Get and Buffer.Put write the requests of
// protocol/testdata/bufsock.txt that they can express byte for byte (the
// Go client sends PUT without flags, sync_replicas or a checksum, and no
// batch).
func TestBufVectorsRequests(t *testing.T) {
	ctx := context.Background()
	n := 0
	for _, v := range testvec.Load(t, "bufsock.txt") {
		if v.Kind != "req" {
			continue
		}
		f := v.Fields
		var call func(b *Buffer) error
		switch f["op"] {
		case "2":
			call = func(b *Buffer) error {
				_, _, err := b.Get(ctx, string(testvec.Hex(t, v, f["ns"])), testvec.Hex(t, v, f["key"]),
					int(testvec.Uint(t, v, f["off"])), int(testvec.Uint(t, v, f["len"])), Scope(testvec.Uint(t, v, f["scope"])))
				return err
			}
		case "4":
			if f["flags"] != "0" || f["sync"] != "0" || f["sum"] != "-" {
				continue
			}
			call = func(b *Buffer) error {
				_, err := b.Put(ctx, string(testvec.Hex(t, v, f["ns"])), testvec.Hex(t, v, f["key"]),
					int(testvec.Uint(t, v, f["off"])), int(testvec.Uint(t, v, f["len"])), int32(testvec.Int(t, v, f["depth"])))
				return err
			}
		default:
			continue
		}
		n++
		b, peer := vectorBuffer(t)
		b.id = testvec.Uint(t, v, f["id"]) // what REGISTER answered
		var got []byte
		done := sidecar(peer, len(v.Bytes), &got, make([]byte, bufHead), false) // OK, value 0
		if err := call(b); err != nil {
			t.Errorf("%s: %v", v.Name, err)
		}
		if err := <-done; err != nil {
			t.Errorf("%s: %v", v.Name, err)
		}
		if !bytes.Equal(got, v.Bytes) {
			t.Errorf("%s: wrote\n  %x\nwant\n  %x", v.Name, got, v.Bytes)
		}
	}
	if n < 3 {
		t.Fatalf("%d request vectors the Go client speaks", n)
	}
}

// TestBufVectorsAnswers: the Go client reads each answer of bufsock.txt
// to an op it sends (REGISTER, GET, PUT) as its fields say, and refuses
// each "badans" one, closing the connection.
func TestBufVectorsAnswers(t *testing.T) {
	ctx := context.Background()
	n := 0
	for _, v := range testvec.Load(t, "bufsock.txt") {
		if (v.Kind != "ans" && v.Kind != "badans") || v.Op > bufPut {
			continue
		}
		n++
		b, peer := vectorBuffer(t)
		body := []byte{1, 2, 3}
		var got []byte
		done := sidecar(peer, 8+len(body), &got, v.Bytes, v.Kind == "badans")
		a, err := b.call(ctx, byte(v.Op), body, nil)
		if e := <-done; e != nil {
			t.Fatalf("%s: %v", v.Name, e)
		}
		if v.Kind == "badans" {
			var te *Error
			if err == nil || errors.As(err, &te) {
				t.Errorf("%s: read as %+v, %v; want a connection error", v.Name, a, err)
			}
			if b.conn != nil {
				t.Errorf("%s: the connection was kept", v.Name)
			}
			continue
		}
		f := v.Fields
		code, cerr := tp.ErrorCodeFromString(f["code"])
		if cerr != nil {
			t.Fatal(cerr)
		}
		if code == tp.ErrorCode_OK {
			if err != nil || a.sum != uint32(testvec.Uint(t, v, f["sum"])) || a.value != testvec.Uint(t, v, f["value"]) {
				t.Errorf("%s: read %+v, %v; want sum=%s value=%s", v.Name, a, err, f["sum"], f["value"])
			}
			continue
		}
		var te *Error
		if !errors.As(err, &te) || te.Code != code || te.Message != string(testvec.Hex(t, v, f["msg"])) {
			t.Errorf("%s: read %v; want %s %q", v.Name, err, code, testvec.Hex(t, v, f["msg"]))
		}
	}
	if n < 5 {
		t.Fatalf("%d answer vectors the Go client reads", n)
	}
}
