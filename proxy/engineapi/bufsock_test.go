package engineapi_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/poll"
	"github.com/tidepool-kv/tidepool/internal/testvec"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy/engineapi"
)

// bufConn is a raw connection to the buffer socket.
type bufConn struct {
	t    testing.TB
	conn *net.UnixConn
}

func dialBuf(t testing.TB, ts *testServer) *bufConn {
	t.Helper()
	conn, err := net.Dial("unix", ts.socket+engineapi.BufferSocketSuffix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	return &bufConn{t: t, conn: conn.(*net.UnixConn)}
}

type bufAnswer struct {
	code  tp.ErrorCode
	sum   uint32
	value uint64
	msg   string
}

// call sends one request (with fds, if any, on its first byte) and reads
// the answer.
func (c *bufConn) call(op, version byte, body []byte, fds ...int) bufAnswer {
	c.t.Helper()
	b := []byte{op, version, 0, 0}
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
	b = append(b, body...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.conn.WriteMsgUnix(b, oob, nil); err != nil {
		c.t.Fatal(err)
	}
	return c.answer()
}

// answer reads one answer's head and message.
func (c *bufConn) answer() bufAnswer {
	c.t.Helper()
	head := make([]byte, 16)
	if _, err := io.ReadFull(c.conn, head); err != nil {
		c.t.Fatalf("answer: %v", err)
	}
	msg := make([]byte, binary.BigEndian.Uint16(head[2:]))
	if _, err := io.ReadFull(c.conn, msg); err != nil {
		c.t.Fatal(err)
	}
	return bufAnswer{code: tp.ErrorCode(binary.BigEndian.Uint16(head)), sum: binary.BigEndian.Uint32(head[4:]),
		value: binary.BigEndian.Uint64(head[8:]), msg: string(msg)}
}

func (c *bufConn) register(size uint64, fds ...int) bufAnswer {
	return c.call(1, 1, binary.BigEndian.AppendUint64(nil, size), fds...)
}

func (c *bufConn) get(id, off, n uint64, scope byte, ns string, key []byte) bufAnswer {
	b := binary.BigEndian.AppendUint64(nil, id)
	b = binary.BigEndian.AppendUint64(b, off)
	b = binary.BigEndian.AppendUint64(b, n)
	b = append(b, scope)
	b = binary.BigEndian.AppendUint16(b, uint16(len(ns)))
	b = append(b, ns...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(key)))
	b = append(b, key...)
	return c.call(2, 1, b)
}

// closed reports whether the server closed the connection (a reset when
// it left bytes unread).
func (c *bufConn) closed() bool {
	c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.conn.Read(make([]byte, 1))
	return err == io.EOF || errors.Is(err, syscall.ECONNRESET)
}

// memfd is a buffer the way a client makes one: a memfd, sized,
// allocated and sealed (each step optional), and its mapping.
func memfd(t testing.TB, size int, seal, allocate bool) (int, []byte) {
	t.Helper()
	fd, err := unix.MemfdCreate("tp-buftest", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Skipf("memfd_create: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	if allocate {
		if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil {
			t.Fatal(err)
		}
	}
	if seal {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
			t.Fatal(err)
		}
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return fd, mem
}

// mappings counts this process's mappings of the test's memfds (the
// server runs in the test's process).
func mappings(t testing.TB) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "memfd:tp-buftest")
}

func TestBufferSocketGet(t *testing.T) {
	ts := startServer(t, serverOpts{})
	ctx := context.Background()
	h, err := ts.c.Hello(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(h.Features, ","), engineapi.FeatureBufferSocket) {
		t.Fatalf("Hello features %v lack %s", h.Features, engineapi.FeatureBufferSocket)
	}
	const size = 4 << 20
	fd, mem := memfd(t, size, true, true)
	before := mappings(t)
	c := dialBuf(t, ts)
	a := c.register(size, fd)
	if a.code != tp.ErrorCode_OK || a.value == 0 {
		t.Fatalf("register: %+v", a)
	}
	id := a.value
	if got := mappings(t); got != before+1 {
		t.Fatalf("%d mappings after register, want %d", got, before+1)
	}

	value := randBytes(1, 1<<20)
	if _, err := ts.c.Put(ctx, "ns", []byte("k"), value, 0); err != nil {
		t.Fatal(err)
	}
	for i := range mem {
		mem[i] = 0xAA
	}
	// A hit at an offset: exactly its bytes, nothing around them.
	a = c.get(id, 4096, 2<<20, 0, "ns", []byte("k"))
	if a.code != tp.ErrorCode_OK || a.value != uint64(len(value)) || a.sum != cache.Checksum(value) {
		t.Fatalf("get: %+v", a)
	}
	if !bytes.Equal(mem[4096:4096+len(value)], value) {
		t.Fatal("the buffer does not hold the block")
	}
	untouched := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if mem[i] != 0xAA {
				t.Fatalf("byte %d written (%#x)", i, mem[i])
			}
		}
	}
	untouched(0, 4096)
	untouched(4096+len(value), size)

	// A miss and a block larger than the room write nothing.
	for i := range mem {
		mem[i] = 0xAA
	}
	if a := c.get(id, 0, size, 1, "ns", []byte("absent")); a.code != tp.ErrorCode_NOT_FOUND || a.value != 0 {
		t.Fatalf("miss: %+v", a)
	}
	if a := c.get(id, 0, 1000, 0, "ns", []byte("k")); a.code != tp.ErrorCode_TOO_LARGE {
		t.Fatalf("too large: %+v", a)
	}
	untouched(0, size)

	// Calls that fail keep the connection.
	for name, a := range map[string]bufAnswer{
		"past the end":    c.get(id, size-10, 1<<20, 0, "ns", []byte("k")),
		"offset overflow": c.get(id, ^uint64(0)-5, 10, 0, "ns", []byte("k")),
		"unknown id":      c.get(id+1, 0, 10, 0, "ns", []byte("k")),
		"bad scope":       c.get(id, 0, size, 9, "ns", []byte("k")),
		"empty key":       c.get(id, 0, size, 0, "ns", nil),
	} {
		if a.code != tp.ErrorCode_INVALID_ARGUMENT {
			t.Errorf("%s: %+v", name, a)
		}
	}
	untouched(0, size)
	if a := c.get(id, 0, size, 0, "ns", []byte("k")); a.code != tp.ErrorCode_OK || !bytes.Equal(mem[:len(value)], value) {
		t.Fatalf("get after refusals: %+v", a)
	}

	// UNREGISTER unmaps; the id is gone.
	if a := c.call(3, 1, binary.BigEndian.AppendUint64(nil, id)); a.code != tp.ErrorCode_OK {
		t.Fatalf("unregister: %+v", a)
	}
	if a := c.get(id, 0, size, 0, "ns", []byte("k")); a.code != tp.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("get after unregister: %+v", a)
	}
	if a := c.call(3, 1, binary.BigEndian.AppendUint64(nil, id)); a.code != tp.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("second unregister: %+v", a)
	}
	if got := mappings(t); got != before {
		t.Fatalf("%d mappings after unregister, want %d", got, before)
	}

	// Closing the connection unmaps what it registered.
	c2 := dialBuf(t, ts)
	for range 3 {
		if a := c2.register(size, fd); a.code != tp.ErrorCode_OK {
			t.Fatalf("register: %+v", a)
		}
	}
	if got := mappings(t); got != before+3 {
		t.Fatalf("%d mappings, want %d", got, before+3)
	}
	c2.conn.Close()
	poll.Until(t, 10*time.Second, "the buffers unmapped", func() bool { return mappings(t) == before })
}

func TestBufferSocketRegisterRefusals(t *testing.T) {
	ts := startServer(t, serverOpts{})
	const size = 1 << 20
	unsealed, _ := memfd(t, size, false, true)
	holes, _ := memfd(t, size, true, false)
	good, _ := memfd(t, size, true, true)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	before := mappings(t)
	c := dialBuf(t, ts)
	for name, a := range map[string]bufAnswer{
		"no descriptor":    c.register(size),
		"two descriptors":  c.register(size, good, good),
		"unsealed":         c.register(size, unsealed),
		"holes":            c.register(size, holes),
		"a pipe":           c.register(size, int(r.Fd())),
		"larger than file": c.register(2*size, good),
		"zero bytes":       c.register(0, good),
	} {
		if a.code != tp.ErrorCode_INVALID_ARGUMENT || a.value != 0 || a.msg == "" {
			t.Errorf("%s: %+v", name, a)
		}
	}
	if got := mappings(t); got != before {
		t.Fatalf("%d mappings after refusals, want %d", got, before)
	}
	// A descriptor sent with a GET is closed, not kept for later.
	if a := c.call(2, 1, make([]byte, 29), good); a.code != tp.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("get with a descriptor: %+v", a)
	}
	if a := c.register(size); a.code != tp.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("register after a stray descriptor: %+v", a)
	}
	if a := c.register(size, good); a.code != tp.ErrorCode_OK {
		t.Fatalf("register: %+v", a)
	}
	// At most MaxBuffersPerConn per connection.
	for i := 1; i < engineapi.DefaultConfig().MaxBuffersPerConn; i++ {
		if a := c.register(4096, good); a.code != tp.ErrorCode_OK {
			t.Fatalf("register %d: %+v", i, a)
		}
	}
	if a := c.register(4096, good); a.code != tp.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("register past the limit: %+v", a)
	}
}

func TestBufferSocketBadStreams(t *testing.T) {
	ts := startServer(t, serverOpts{})
	for name, send := range map[string]func(c *bufConn) bufAnswer{
		"version 2":      func(c *bufConn) bufAnswer { return c.call(1, 2, make([]byte, 8)) },
		"unknown op":     func(c *bufConn) bufAnswer { return c.call(9, 1, nil) },
		"short register": func(c *bufConn) bufAnswer { return c.call(1, 1, make([]byte, 7)) },
		"long register":  func(c *bufConn) bufAnswer { return c.call(1, 1, make([]byte, 9)) },
		"short get":      func(c *bufConn) bufAnswer { return c.call(2, 1, make([]byte, 26)) },
		"key past body": func(c *bufConn) bufAnswer {
			b := make([]byte, 25)
			b = append(b, 0, 1, 'n', 0xff, 0xff, 'k')
			return c.call(2, 1, b)
		},
		"body too large": func(c *bufConn) bufAnswer {
			b := []byte{2, 1, 0, 0, 0xff, 0xff, 0xff, 0xff}
			if _, err := c.conn.Write(b); err != nil {
				t.Fatal(err)
			}
			head := make([]byte, 16)
			if _, err := io.ReadFull(c.conn, head); err != nil {
				t.Fatal(err)
			}
			io.ReadFull(c.conn, make([]byte, binary.BigEndian.Uint16(head[2:])))
			return bufAnswer{code: tp.ErrorCode(binary.BigEndian.Uint16(head))}
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := dialBuf(t, ts)
			if a := send(c); a.code != tp.ErrorCode_INVALID_ARGUMENT {
				t.Fatalf("answer %+v", a)
			}
			if !c.closed() {
				t.Fatal("the connection stays open after a request that does not parse")
			}
		})
	}
	// The server goes on serving.
	if _, err := ts.c.Hello(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestBufferSocketDisabled(t *testing.T) {
	ts := startServer(t, serverOpts{noBufferSocket: true})
	if _, err := os.Stat(ts.socket + engineapi.BufferSocketSuffix); !os.IsNotExist(err) {
		t.Fatalf("buffer socket file: %v", err)
	}
	h, err := ts.c.Hello(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.Join(h.Features, ","), engineapi.FeatureBufferSocket) {
		t.Fatalf("Hello lists %s without the socket", engineapi.FeatureBufferSocket)
	}
}

// TestBufferSocketClose: Close ends idle connections (their buffers
// unmapped) and removes the file.
func TestBufferSocketClose(t *testing.T) {
	ts := startServer(t, serverOpts{})
	fd, _ := memfd(t, 1<<20, true, true)
	before := mappings(t)
	c := dialBuf(t, ts)
	if a := c.register(1<<20, fd); a.code != tp.ErrorCode_OK {
		t.Fatalf("register: %+v", a)
	}
	if err := ts.srv.Close(); err != nil {
		t.Fatal(err)
	}
	if !c.closed() {
		t.Fatal("connection open after Close")
	}
	if got := mappings(t); got != before {
		t.Fatalf("%d mappings after Close, want %d", got, before)
	}
	if _, err := os.Stat(ts.socket + engineapi.BufferSocketSuffix); !os.IsNotExist(err) {
		t.Fatalf("buffer socket file after Close: %v", err)
	}
}

// putBody is a PUT request's body.
func putBody(id, off, n uint64, depth int32, flags byte, sum uint32, ns string, key []byte) []byte {
	b := binary.BigEndian.AppendUint64(nil, id)
	b = binary.BigEndian.AppendUint64(b, off)
	b = binary.BigEndian.AppendUint64(b, n)
	b = binary.BigEndian.AppendUint32(b, uint32(depth))
	b = append(b, flags)
	b = binary.BigEndian.AppendUint32(b, 0) // sync_replicas
	b = binary.BigEndian.AppendUint32(b, sum)
	b = binary.BigEndian.AppendUint16(b, uint16(len(ns)))
	b = append(b, ns...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(key)))
	return append(b, key...)
}

// registered dials the buffer socket and registers a buffer of size.
func registered(t *testing.T, ts *testServer, size int) (*bufConn, uint64, []byte) {
	t.Helper()
	fd, mem := memfd(t, size, true, true)
	c := dialBuf(t, ts)
	a := c.register(uint64(size), fd)
	if a.code != tp.ErrorCode_OK {
		t.Fatalf("register: %+v", a)
	}
	return c, a.value, mem
}

func TestBufferSocketPut(t *testing.T) {
	ts := startServer(t, serverOpts{maxValue: 2 << 20})
	ctx := context.Background()
	c, id, mem := registered(t, ts, 4<<20)
	value := randBytes(2, 1<<20)
	copy(mem[8192:], value)

	// A checksum that does not match stores nothing; the right one, or
	// none, stores the value.
	if a := c.call(4, 1, putBody(id, 8192, uint64(len(value)), 5, 2, cache.Checksum(value)^1, "ns", []byte("k"))); a.code != tp.ErrorCode_CHECKSUM_MISMATCH {
		t.Fatalf("wrong checksum: %+v", a)
	}
	if _, found, err := ts.c.Get(ctx, "ns", []byte("k")); err != nil || found {
		t.Fatalf("a put with a wrong checksum stored the block: %v %v", found, err)
	}
	if a := c.call(4, 1, putBody(id, 8192, uint64(len(value)), 5, 2, cache.Checksum(value), "ns", []byte("k"))); a.code != tp.ErrorCode_OK || a.value != 0 {
		t.Fatalf("put: %+v", a)
	}
	if a := c.call(4, 1, putBody(id, 0, 100, 0, 0, 0, "ns", []byte("k"))); a.code != tp.ErrorCode_OK || a.value != 1 {
		t.Fatalf("put of a present key: %+v (want existed)", a)
	}
	if a := c.call(4, 1, putBody(id, 0, uint64(len(value)), 0, 0, 0, "ns", []byte("k2"))); a.code != tp.ErrorCode_OK {
		t.Fatalf("put without a checksum: %+v", a)
	}
	got, info, err := ts.tier.Get(ctx, "ns", []byte("k"), nil)
	if err != nil || !bytes.Equal(got, value) || info.Depth != 5 || info.Checksum != cache.Checksum(value) {
		t.Fatalf("get: %d bytes, %+v, %v", len(got), info, err)
	}
	// Refusals that keep the connection.
	for name, a := range map[string]bufAnswer{
		"too large":    c.call(4, 1, putBody(id, 0, 4<<20, 0, 0, 0, "ns", []byte("big"))),
		"past the end": c.call(4, 1, putBody(id, 4<<20-10, 100, 0, 0, 0, "ns", []byte("x"))),
		"unknown id":   c.call(4, 1, putBody(id+1, 0, 100, 0, 0, 0, "ns", []byte("x"))),
	} {
		if a.code == tp.ErrorCode_OK {
			t.Errorf("%s: %+v", name, a)
		}
	}
	for _, k := range []string{"big", "x"} {
		if _, found, _ := ts.c.Get(ctx, "ns", []byte(k)); found {
			t.Fatalf("%s stored by a refused put", k)
		}
	}
	// Flags this build does not know: the request does not parse.
	if a := c.call(4, 1, putBody(id, 0, 100, 0, 4, 0, "ns", []byte("y"))); a.code != tp.ErrorCode_INVALID_ARGUMENT || !c.closed() {
		t.Fatalf("unknown flag: %+v", a)
	}
}

func TestBufferSocketBatches(t *testing.T) {
	ts := startServer(t, serverOpts{maxBatch: 16})
	c, id, mem := registered(t, ts, 4<<20)
	const n, size = 8, 64 << 10
	values := make([][]byte, n)
	put := binary.BigEndian.AppendUint64(nil, id)
	put = append(put, 0)                          // flags
	put = binary.BigEndian.AppendUint32(put, 0)   // sync_replicas
	put = append(put, 0, 2, 'n', 's')             // ns
	put = binary.BigEndian.AppendUint16(put, n+1) // count
	for i := range n {
		values[i] = randBytes(int64(10+i), size)
		copy(mem[i*size:], values[i])
		put = binary.BigEndian.AppendUint64(put, uint64(i*size))
		put = binary.BigEndian.AppendUint64(put, size)
		put = binary.BigEndian.AppendUint32(put, uint32(i))
		put = append(put, 0, 0, 0, 0, 0) // no checksum
		put = append(put, 0, 2, 'k', byte('0'+i))
	}
	// One more item outside the buffer: refused alone.
	put = binary.BigEndian.AppendUint64(put, 4<<20)
	put = binary.BigEndian.AppendUint64(put, size)
	put = append(put, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	put = append(put, 0, 2, 'k', 'x')
	a, items := c.batch(6, put)
	if a.code != tp.ErrorCode_OK || len(items) != n+1 {
		t.Fatalf("batch put: %+v, %d items", a, len(items))
	}
	for i, it := range items[:n] {
		if it.code != tp.ErrorCode_OK || it.value != 0 {
			t.Fatalf("item %d: %+v", i, it)
		}
	}
	if items[n].code != tp.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("item outside the buffer: %+v", items[n])
	}

	get := func(count int, keys func(i int) []byte) []byte {
		b := binary.BigEndian.AppendUint64(nil, id)
		b = append(b, 0, 0, 2, 'n', 's')
		b = binary.BigEndian.AppendUint16(b, uint16(count))
		for i := range count {
			b = binary.BigEndian.AppendUint64(b, uint64(2<<20+i*size))
			b = binary.BigEndian.AppendUint64(b, size)
			k := keys(i)
			b = binary.BigEndian.AppendUint16(b, uint16(len(k)))
			b = append(b, k...)
		}
		return b
	}
	a, items = c.batch(5, get(n+1, func(i int) []byte { return []byte{'k', byte('0' + i)} }))
	if a.code != tp.ErrorCode_OK || len(items) != n+1 {
		t.Fatalf("batch get: %+v, %d items", a, len(items))
	}
	for i := range n {
		if it := items[i]; it.code != tp.ErrorCode_OK || it.value != size || it.sum != cache.Checksum(values[i]) ||
			!bytes.Equal(mem[2<<20+i*size:2<<20+(i+1)*size], values[i]) {
			t.Fatalf("item %d: %+v", i, it)
		}
	}
	if items[n].code != tp.ErrorCode_NOT_FOUND {
		t.Fatalf("absent key: %+v", items[n])
	}
	// Over max_batch: refused whole, no items; the connection stays.
	if a, items := c.batch(5, get(17, func(i int) []byte { return []byte("k0") })); a.code != tp.ErrorCode_BATCH_TOO_LARGE || len(items) != 0 {
		t.Fatalf("over max_batch: %+v, %d items", a, len(items))
	}
	// A count the body does not hold: it does not parse.
	short := get(2, func(i int) []byte { return []byte("k0") })
	binary.BigEndian.PutUint16(short[13:], 3)
	if a, _ := c.batch(5, short); a.code != tp.ErrorCode_INVALID_ARGUMENT || !c.closed() {
		t.Fatalf("short batch: %+v", a)
	}
}

// batch sends a batch request and reads its items.
func (c *bufConn) batch(op byte, body []byte) (bufAnswer, []bufAnswer) {
	c.t.Helper()
	a := c.call(op, 1, body)
	if a.code != tp.ErrorCode_OK {
		return a, nil
	}
	items := make([]bufAnswer, a.value)
	for i := range items {
		var b [14]byte
		if _, err := io.ReadFull(c.conn, b[:]); err != nil {
			c.t.Fatal(err)
		}
		items[i] = bufAnswer{code: tp.ErrorCode(binary.BigEndian.Uint16(b[:])), sum: binary.BigEndian.Uint32(b[2:]), value: binary.BigEndian.Uint64(b[6:])}
	}
	return a, items
}

// TestBufferSocketBatchKeepsChainHead: a BatchPutFromBuffer of a 16-block
// chain into a DRAM tier that holds 8 stores blocks 0..7 and answers
// NO_SPACE for 8..15 (each names the item before it as its parent, as
// BatchPut's items do): the chain does not push out its own blocks, and
// nothing past the head is held.
func TestBufferSocketBatchKeepsChainHead(t *testing.T) {
	ts := startServer(t, serverOpts{capacity: 1 << 20, maxValue: 1 << 20})
	c, id, mem := registered(t, ts, 4<<20)
	const n, size = 16, 128 << 10
	put := binary.BigEndian.AppendUint64(nil, id)
	put = append(put, 0)                        // flags
	put = binary.BigEndian.AppendUint32(put, 0) // sync_replicas
	put = append(put, 0, 2, 'n', 's')           // ns
	put = binary.BigEndian.AppendUint16(put, n) // count
	keys := make([][]byte, n)
	for i := range n {
		keys[i] = []byte{'c', byte('a' + i)}
		copy(mem[i*size:], randBytes(int64(40+i), size))
		put = binary.BigEndian.AppendUint64(put, uint64(i*size))
		put = binary.BigEndian.AppendUint64(put, size)
		put = binary.BigEndian.AppendUint32(put, uint32(i))
		put = append(put, 0, 0, 0, 0, 0) // no checksum
		put = append(put, 0, 2)
		put = append(put, keys[i]...)
	}
	a, items := c.batch(6, put)
	if a.code != tp.ErrorCode_OK || len(items) != n {
		t.Fatalf("batch put: %+v, %d items", a, len(items))
	}
	for i, it := range items {
		if want := map[bool]tp.ErrorCode{true: tp.ErrorCode_OK, false: tp.ErrorCode_NO_SPACE}[i < 8]; it.code != want {
			t.Errorf("item %d: %v, want %v", i, it.code, want)
		}
	}
	if got := ts.tier.Present(context.Background(), "ns", keys, nil); got != 8 {
		t.Errorf("present prefix %d, want 8", got)
	}
	for i := 8; i < n; i++ {
		if _, ok := ts.tier.Stat(context.Background(), "ns", keys[i]); ok {
			t.Errorf("block %d held past the head", i)
		}
	}
}

// TestBufVectorsServer sends every request of protocol/testdata/bufsock.txt
// to a real server: a malformed one is answered with its code and the
// connection closed; a well-formed one (naming a buffer this connection
// never registered) is answered without closing it.
func TestBufVectorsServer(t *testing.T) {
	ts := startServer(t, serverOpts{})
	for _, v := range testvec.Load(t, "bufsock.txt") {
		if v.Kind != "req" && v.Kind != "bad" {
			continue
		}
		c := dialBuf(t, ts)
		if _, err := c.conn.Write(v.Bytes); err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		a := c.answer()
		if v.Kind == "req" {
			if strings.Contains(a.msg, "malformed") || strings.Contains(a.msg, "version") {
				t.Errorf("%s: refused as malformed: %+v", v.Name, a)
			}
			// The connection is kept: a second call is answered.
			if b := c.register(1 << 16); b.code != tp.ErrorCode_INVALID_ARGUMENT {
				t.Errorf("%s: REGISTER without a descriptor after it answered %+v", v.Name, b)
			}
			c.conn.Close()
			continue
		}
		if want := v.Fields["code"]; a.code.String() != want {
			t.Errorf("%s: answered %+v, want %s", v.Name, a, want)
		}
		var one [1]byte
		// Closed with the body unread, the close is a reset.
		if n, err := c.conn.Read(one[:]); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("%s: after the answer read %d bytes, %v; want the connection closed", v.Name, n, err)
		}
		c.conn.Close()
	}
}
