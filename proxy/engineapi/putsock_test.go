package engineapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"

	"github.com/tidepool-kv/tidepool/client"
	"github.com/tidepool-kv/tidepool/internal/testvec"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/protocol/thriftstream"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/engineapi"
)

// putConn is a raw connection to the put socket.
type putConn struct {
	t    testing.TB
	conn net.Conn
	d    thriftstream.Decoder
}

func dialPut(t testing.TB, ts *testServer) *putConn {
	t.Helper()
	conn, err := net.Dial("unix", ts.socket+engineapi.PutSocketSuffix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	return &putConn{t: t, conn: conn, d: thriftstream.Decoder{R: bufio.NewReader(conn), What: "reply"}}
}

// inPlacePut encodes a Put call in the order the Go client writes it:
// every field before the value, which the sidecar then reads in place.
func inPlacePut(seq int32, ns string, key, value []byte, depth int32) []byte {
	w := thrift.Binary.AppendMessageBegin(nil, "Put", thrift.CALL, seq)
	return append(w, engineapi.InPlacePutArgs(ns, key, value, depth)...)
}

// reply reads one reply: the Put result, or the application exception.
func (c *putConn) reply(seq int32) (*tp.TidepoolPutResult, *thrift.ApplicationException) {
	c.t.Helper()
	typ, method, got, err := c.d.MessageBegin()
	if err != nil {
		c.t.Fatalf("reading a reply: %v", err)
	}
	if got != seq {
		c.t.Fatalf("reply %q to sequence %d, want %d", method, got, seq)
	}
	body, err := c.d.CaptureStruct()
	if err != nil {
		c.t.Fatalf("reading a reply: %v", err)
	}
	if typ == thrift.EXCEPTION {
		ex := thrift.NewApplicationException(0, "")
		if _, err := ex.FastRead(body); err != nil {
			c.t.Fatal(err)
		}
		return nil, ex
	}
	res := tp.NewTidepoolPutResult()
	if _, err := res.FastRead(body); err != nil {
		c.t.Fatal(err)
	}
	return res, nil
}

// call sends msg and returns its result, failing on an exception.
func (c *putConn) call(seq int32, msg []byte) *tp.TidepoolPutResult {
	c.t.Helper()
	if _, err := c.conn.Write(msg); err != nil {
		c.t.Fatal(err)
	}
	res, ex := c.reply(seq)
	if ex != nil {
		c.t.Fatalf("exception: %v", ex)
	}
	return res
}

// closed reports whether the server closed the connection (after any
// reply already sent): the end of the stream, or a reset when the server
// closed with bytes of the request unread.
func (c *putConn) closed() bool {
	c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.Copy(io.Discard, c.d.R)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		c.t.Logf("reading to the end: %v", err)
		return false
	}
	return true
}

// used is the DRAM tier's used bytes: reservations count, so a put that
// fails midway must leave it as it was.
func used(ts *testServer) int64 { return ts.tier.Stats().Tiers[0].UsedBytes }

func checkStored(t *testing.T, ts *testServer, ns string, key, want []byte) {
	t.Helper()
	got, found, err := ts.c.Get(context.Background(), ns, key)
	if err != nil || !found || !bytes.Equal(got, want) {
		t.Fatalf("get %q: found %v, %d bytes (want %d), err %v", key, found, len(got), len(want), err)
	}
}

func checkAbsent(t *testing.T, ts *testServer, ns string, key []byte) {
	t.Helper()
	if _, found, err := ts.c.Get(context.Background(), ns, key); err != nil || found {
		t.Fatalf("get %q: found %v, err %v; want a miss", key, found, err)
	}
}

// TestPutSocketClient: the Go client's Puts of PutSocketMin and more go
// through the put socket (Hello lists it, and its connections are
// counted), their values land in place and read back, a repeated put
// reports existed, and small values still go through the engine socket.
func TestPutSocketClient(t *testing.T) {
	ts := startServer(t, serverOpts{capacity: 128 << 20})
	ctx := context.Background()
	h, err := ts.c.Hello(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(h.Features, engineapi.FeaturePutSocket) {
		t.Fatalf("Hello features %v lack %q", h.Features, engineapi.FeaturePutSocket)
	}
	before := ts.srv.ConnStats().Accepted
	sizes := []int{0, 1, client.PutSocketMin - 1, client.PutSocketMin, 1 << 20, 8 << 20}
	for i, n := range sizes {
		key := fmt.Appendf(nil, "k%d", i)
		v := randBytes(int64(i), n)
		if existed, err := ts.c.Put(ctx, "ns", key, v, int32(i)); err != nil || existed {
			t.Fatalf("put of %d bytes: existed %v, err %v", n, existed, err)
		}
		checkStored(t, ts, "ns", key, v)
		if existed, err := ts.c.Put(ctx, "ns", key, v, int32(i)); err != nil || !existed {
			t.Fatalf("second put of %d bytes: existed %v, err %v", n, existed, err)
		}
	}
	if got := ts.srv.ConnStats().Accepted - before; got < 1 {
		t.Fatalf("no put socket connection accepted (%d)", got)
	}
	// Too large for the sidecar: its error, nothing stored, and the
	// connection goes on.
	_, err = ts.c.Put(ctx, "ns", []byte("big"), make([]byte, 9<<20), 0)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != tp.ErrorCode_TOO_LARGE {
		t.Fatalf("put over max_value_size: %v, want TOO_LARGE", err)
	}
	checkAbsent(t, ts, "ns", []byte("big"))
	// An empty key: the proxy's own error.
	if _, err := ts.c.Put(ctx, "ns", nil, make([]byte, 64<<10), 0); !errors.As(err, &ce) || ce.Code != tp.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("put with an empty key: %v, want INVALID_ARGUMENT", err)
	}
}

// TestPutSocketConcurrent: many callers of several sizes at once (run
// under the race detector), every value read back.
func TestPutSocketConcurrent(t *testing.T) {
	ts := startServer(t, serverOpts{capacity: 256 << 20})
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 8 {
				key := fmt.Appendf(nil, "g%d-%d", g, i)
				v := randBytes(int64(g*100+i), (64<<10)<<(i%5))
				if _, err := ts.c.Put(ctx, "ns", key, v, 0); err != nil {
					errs <- err
					return
				}
				got, found, err := ts.c.Get(ctx, "ns", key)
				if err != nil || !found || !bytes.Equal(got, v) {
					errs <- fmt.Errorf("%s: found %v, err %v, equal %v", key, found, err, bytes.Equal(got, v))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestPutSocketWire: what the put socket does with each kind of request,
// on one raw connection where it survives.
func TestPutSocketWire(t *testing.T) {
	ts := startServer(t, serverOpts{capacity: 64 << 20, maxValue: 4 << 20})
	c := dialPut(t, ts)
	v := randBytes(7, 1<<20)

	// In place: stored, read back; again: existed.
	if res := c.call(1, inPlacePut(1, "ns", []byte("a"), v, 3)); res.Err != nil || res.Success == nil || res.Success.Existed {
		t.Fatalf("in-place put: %+v", res)
	}
	checkStored(t, ts, "ns", []byte("a"), v)
	if res := c.call(2, inPlacePut(2, "ns", []byte("a"), v, 3)); res.Success == nil || !res.Success.Existed {
		t.Fatalf("repeated put: %+v, want existed", res)
	}

	// The generated encoder's order (value before depth): read whole,
	// stored the same.
	msg := unframedPut(&tp.PutRequest{Ns: "ns", Key: []byte("b"), Value: v, Depth: 2})
	if res := c.call(1, msg); res.Err != nil || res.Success == nil || res.Success.Existed {
		t.Fatalf("put in field order: %+v", res)
	}
	checkStored(t, ts, "ns", []byte("b"), v)

	// Errors a request carries: answered, nothing stored, nothing left
	// reserved, and the connection goes on.
	base := used(ts)
	for _, tc := range []struct {
		name string
		msg  []byte
		code tp.ErrorCode
	}{
		{"key over the limit", inPlacePut(3, "ns", bytes.Repeat([]byte("k"), 4096), v, 0), tp.ErrorCode_INVALID_ARGUMENT},
		{"value over max_value_size", inPlacePut(3, "ns", []byte("c"), make([]byte, 5<<20), 0), tp.ErrorCode_TOO_LARGE},
		{"namespace over the limit", inPlacePut(3, string(bytes.Repeat([]byte("n"), 4096)), []byte("c"), v, 0), tp.ErrorCode_INVALID_ARGUMENT},
		{"empty key", inPlacePut(3, "ns", nil, v, 0), tp.ErrorCode_INVALID_ARGUMENT},
		{"value twice", twice(inPlacePut(3, "ns", []byte("c"), v, 0)), tp.ErrorCode_INVALID_ARGUMENT},
		{"request twice", requestTwice(inPlacePut(3, "ns", []byte("c"), v, 0)), tp.ErrorCode_INVALID_ARGUMENT},
		{"namespace after the value", nsAfterValue(inPlacePut(3, "ns", []byte("c"), v, 0)), tp.ErrorCode_INVALID_ARGUMENT},
		// Block descriptions (KV events): token ids not matching the block
		// size, a token list over proxy.MaxBlockTokens.
		{"token ids not one block", withSeq(3, unframedPut(&tp.PutRequest{Ns: "ns", Key: []byte("c"), Value: v,
			TokenIds: []int32{1, 2, 3}, BlockSize: i32ptr(4)})), tp.ErrorCode_INVALID_ARGUMENT},
		{"huge token list", withSeq(3, unframedPut(&tp.PutRequest{Ns: "ns", Key: []byte("c"), Value: v,
			TokenIds: make([]int32, proxy.MaxBlockTokens+1), BlockSize: i32ptr(proxy.MaxBlockTokens + 1)})), tp.ErrorCode_INVALID_ARGUMENT},
	} {
		res := c.call(3, tc.msg)
		if res.Err == nil || res.Err.Code != tc.code {
			t.Fatalf("%s: %+v, want %v", tc.name, res, tc.code)
		}
		checkAbsent(t, ts, "ns", []byte("c"))
		if u := used(ts); u != base {
			t.Fatalf("%s: the tier uses %d bytes, %d before", tc.name, u, base)
		}
	}

	// A block description that is one: stored.
	if res := c.call(1, unframedPut(&tp.PutRequest{Ns: "ns", Key: []byte("m"), Value: v[:100],
		TokenIds: []int32{1, 2, 3, 4}, ParentKey: []byte("b"), BlockSize: i32ptr(4)})); res.Err != nil {
		t.Fatalf("put with a block description: %+v", res)
	}
	checkStored(t, ts, "ns", []byte("m"), v[:100])

	// Another method: UNKNOWN_METHOD, its arguments read past.
	get := &tp.TidepoolGetArgs{Req: &tp.GetRequest{Ns: "ns", Key: []byte("a")}}
	msg = thrift.Binary.AppendMessageBegin(nil, "Get", thrift.CALL, 4)
	msg = append(msg, make([]byte, get.BLength())...)
	get.FastWriteNocopy(msg[len(msg)-get.BLength():], nil)
	if _, err := c.conn.Write(msg); err != nil {
		t.Fatal(err)
	}
	if _, ex := c.reply(4); ex == nil || ex.TypeID() != thrift.UNKNOWN_METHOD {
		t.Fatalf("a Get on the put socket: exception %v, want UNKNOWN_METHOD", ex)
	}
	// Still serving on the same connection.
	if res := c.call(5, inPlacePut(5, "ns", []byte("d"), v[:100], 0)); res.Err != nil {
		t.Fatalf("put after the errors: %+v", res)
	}
	checkStored(t, ts, "ns", []byte("d"), v[:100])
}

// twice repeats an in-place put's value field: the first copy lands in
// place, then the request is refused and the slot freed.
func twice(msg []byte) []byte {
	// The message ends with the value field, then two stop bytes.
	body := msg[:len(msg)-2]
	i := bytes.LastIndex(body, []byte{byte(thrift.STRING), 0, 3})
	field := slices.Clone(body[i:])
	out := append(slices.Clone(body), field...)
	return append(out, 0, 0)
}

// TestPutSocketBadStreams: requests that do not parse, or end midway,
// close the connection; nothing is stored or left reserved, nothing is
// allocated for what a length claims, and the server serves on.
func TestPutSocketBadStreams(t *testing.T) {
	ts := startServer(t, serverOpts{capacity: 64 << 20, maxValue: 4 << 20, maxReqest: 8 << 20})
	v := randBytes(9, 1<<20)
	good := inPlacePut(1, "ns", []byte("t"), v, 0)
	base := used(ts)

	// Every cut of a good request at a field boundary and inside the
	// value: the connection closes with no reply.
	cuts := []int{1, 4, 11, 12, 20, 30, 40, 50, len(good) - len(v) - 2, len(good) - len(v)/2, len(good) - 3, len(good) - 1}
	for _, n := range cuts {
		c := dialPut(t, ts)
		if _, err := c.conn.Write(good[:n]); err != nil {
			t.Fatal(err)
		}
		c.conn.(*net.UnixConn).CloseWrite()
		got, _ := io.ReadAll(c.d.R)
		if len(got) != 0 {
			t.Fatalf("cut at %d of %d: got a reply %q", n, len(good), got[:min(len(got), 64)])
		}
		checkAbsent(t, ts, "ns", []byte("t"))
		if u := used(ts); u != base {
			t.Fatalf("cut at %d: the tier uses %d bytes, %d before (a slot left reserved)", n, u, base)
		}
	}

	// Malformed: an application exception, then the connection closes.
	for _, tc := range []struct {
		name string
		msg  []byte
	}{
		{"old binary protocol", append([]byte{0, 0, 0, 3}, good[4:]...)},
		{"method name of 1 GiB", binary.BigEndian.AppendUint32([]byte{0x80, 1, 0, 1}, 1<<30)},
		{"negative value length", negativeValue(good)},
		{"unknown field type", append(slices.Clone(good[:len(good)-2-len(v)-7]), 99, 0, 9, 0, 0)},
	} {
		c := dialPut(t, ts)
		go c.conn.Write(tc.msg) // the server may stop reading midway
		typ, _, _, err := c.d.MessageBegin()
		if err != nil || typ != thrift.EXCEPTION {
			t.Fatalf("%s: reply type %v, err %v; want an exception", tc.name, typ, err)
		}
		if _, err := c.d.CaptureStruct(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !c.closed() {
			t.Fatalf("%s: the connection stays open", tc.name)
		}
		checkAbsent(t, ts, "ns", []byte("t"))
		if u := used(ts); u != base {
			t.Fatalf("%s: the tier uses %d bytes, %d before", tc.name, u, base)
		}
	}

	// A value claiming 2 GiB - 1 and a few bytes of it: refused at once,
	// TOO_LARGE answered before the claimed bytes (the rest would be read
	// past); the connection ending then frees everything. The server
	// holds nothing for it.
	c := dialPut(t, ts)
	claim := inPlacePut(1, "ns", []byte("t"), nil, 0)
	claim = binary.BigEndian.AppendUint32(claim[:len(claim)-6], 1<<31-1)
	if _, err := c.conn.Write(append(claim, make([]byte, 4096)...)); err != nil {
		t.Fatal(err)
	}
	c.conn.(*net.UnixConn).CloseWrite()
	if got, _ := io.ReadAll(c.d.R); !bytes.Contains(got, []byte("value is 2147483647 bytes")) {
		t.Fatalf("a 2 GiB claim cut short: got a reply of %d bytes, want TOO_LARGE at once: %q", len(got), got)
	}

	// Unknown fields past max_request_size: the connection closes.
	c = dialPut(t, ts)
	big := thrift.Binary.AppendMessageBegin(nil, "Put", thrift.CALL, 1)
	big = thrift.Binary.AppendFieldBegin(big, thrift.STRUCT, 1)
	big = thrift.Binary.AppendFieldBegin(big, thrift.STRING, 99)
	big = thrift.Binary.AppendBinary(big, make([]byte, 9<<20))
	go c.conn.Write(big)
	if !c.closed() {
		t.Fatal("a request over max_request_size: the connection stays open")
	}

	// The server is well.
	if _, err := ts.c.Put(context.Background(), "ns", []byte("t"), v, 0); err != nil {
		t.Fatal(err)
	}
	checkStored(t, ts, "ns", []byte("t"), v)
}

// requestTwice follows an in-place put's request with a second one that
// has no value (a generated decoder would keep the second alone).
func requestTwice(msg []byte) []byte {
	return append(slices.Clone(msg[:len(msg)-1]), engineapi.ValuelessRequest("ns", []byte("c"))...)
}

// nsAfterValue gives an in-place put a second namespace after its value
// (a generated decoder would keep that one; the slot was reserved in the
// first).
func nsAfterValue(msg []byte) []byte {
	w := slices.Clone(msg[:len(msg)-2])
	w = thrift.Binary.AppendFieldBegin(w, thrift.STRING, 1)
	w = thrift.Binary.AppendString(w, "other")
	return append(w, 0, 0)
}

// negativeValue gives an in-place put's value a negative length.
func negativeValue(msg []byte) []byte {
	out := slices.Clone(msg)
	i := bytes.LastIndex(out[:len(out)-2], []byte{byte(thrift.STRING), 0, 3})
	binary.BigEndian.PutUint32(out[i+3:], 0xffffff00)
	return out
}

// TestPutSocketDisabled: without a put listener Hello does not list the
// put socket, no file is made, and the client's large puts go through the
// engine socket.
func TestPutSocketDisabled(t *testing.T) {
	ts := startServer(t, serverOpts{noPutSocket: true})
	h, err := ts.c.Hello(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(h.Features, engineapi.FeaturePutSocket) {
		t.Fatalf("Hello features %v list the put socket", h.Features)
	}
	if _, err := os.Stat(ts.socket + engineapi.PutSocketSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("put socket file: %v", err)
	}
	v := randBytes(3, 1<<20)
	if _, err := ts.c.Put(context.Background(), "ns", []byte("k"), v, 0); err != nil {
		t.Fatal(err)
	}
	checkStored(t, ts, "ns", []byte("k"), v)
}

// TestPutSocketClose: Close answers a put in flight before it closes the
// put socket's connections, closes idle ones at once, and removes the
// socket file.
func TestPutSocketClose(t *testing.T) {
	ts := startServer(t, serverOpts{capacity: 64 << 20})
	idle := dialPut(t, ts)
	busy := dialPut(t, ts)
	v := randBytes(5, 1<<20)
	msg := inPlacePut(1, "ns", []byte("late"), v, 0)
	half := len(msg) - len(v)/2
	if _, err := busy.conn.Write(msg[:half]); err != nil {
		t.Fatal(err)
	}
	// The first half is in; Close waits for the call.
	for deadline := time.Now().Add(10 * time.Second); used(ts) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the put's slot was never reserved")
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- ts.srv.Close() }()
	if !idle.closed() {
		t.Fatal("an idle put connection stays open during Close")
	}
	if _, err := busy.conn.Write(msg[half:]); err != nil {
		t.Fatal(err)
	}
	if res, ex := busy.reply(1); ex != nil || res.Err != nil || res.Success == nil {
		t.Fatalf("the put in flight at Close: %+v, %v", res, ex)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if !busy.closed() {
		t.Fatal("the put connection stays open after Close")
	}
	if _, err := os.Stat(ts.socket + engineapi.PutSocketSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("put socket file after Close: %v", err)
	}
	if got, _, err := ts.tier.Get(context.Background(), "ns", []byte("late"), nil); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("the put answered during Close: stored %d bytes, err %v", len(got), err)
	}
}

// TestPutSocketSlowValue: a value still arriving near its slot's deadline
// is not written on: the connection is closed before the deadline (after
// which the tier may give the memory to another block), nothing is
// stored, and a block stored in the freed memory afterwards is intact.
func TestPutSocketSlowValue(t *testing.T) {
	t.Parallel() // its own server; most of it is waiting past a slot's deadline
	ts := startServer(t, serverOpts{capacity: 64 << 20, reserveTimeout: 2 * time.Second})
	base := used(ts)
	c := dialPut(t, ts)
	v := randBytes(11, 1<<20)
	msg := inPlacePut(1, "ns", []byte("slow"), v, 0)
	half := len(msg) - len(v)/2
	if _, err := c.conn.Write(msg[:half]); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if !c.closed() {
		t.Fatal("a value stalled past its slot's margin: the connection stays open")
	}
	// The slot's deadline is 2 s away, its margin a quarter of that.
	if took := time.Since(start); took > 1900*time.Millisecond {
		t.Fatalf("the connection closed %v after the stall: past the slot's deadline", took)
	}
	c.conn.Write(msg[half:]) // too late: nobody reads it
	checkAbsent(t, ts, "ns", []byte("slow"))
	if u := used(ts); u != base {
		t.Fatalf("the tier uses %d bytes, %d before", u, base)
	}
	w := randBytes(12, 1<<20)
	if _, err := ts.c.Put(context.Background(), "ns", []byte("next"), w, 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // past the first slot's deadline
	checkStored(t, ts, "ns", []byte("next"), w)
}

func i32ptr(v int32) *int32 { return &v }

// withSeq sets the sequence number of an unframedPut message.
func withSeq(seq int32, msg []byte) []byte {
	binary.BigEndian.PutUint32(msg[11:], uint32(seq))
	return msg
}

// TestPutSocketVectors: a real server against protocol/testdata/putsock.txt.
// Each Put call stores its fields' value and is answered with the "stored"
// reply byte for byte, then with "existed" when sent again; each refused
// call is answered as its line says, and the connection closed or kept.
func TestPutSocketVectors(t *testing.T) {
	ts := startServer(t, serverOpts{capacity: 64 << 20, maxValue: 4 << 20})
	vecs := testvec.Load(t, "putsock.txt")
	replies := map[string][]byte{}
	for _, v := range vecs {
		if v.Kind == "ans" {
			replies[v.Name] = v.Bytes
		}
	}
	readReply := func(c *putConn, n int) []byte {
		t.Helper()
		b := make([]byte, n)
		if _, err := io.ReadFull(c.d.R, b); err != nil {
			t.Fatalf("reading a reply: %v", err)
		}
		return b
	}
	n := 0
	for _, v := range vecs {
		switch v.Kind {
		case "req":
			n++
			c := dialPut(t, ts)
			ns, key, value := string(testvec.Hex(t, v, v.Fields["ns"])), testvec.Hex(t, v, v.Fields["key"]), testvec.Hex(t, v, v.Fields["value"])
			for _, want := range []string{"stored", "existed"} {
				if _, err := c.conn.Write(v.Bytes); err != nil {
					t.Fatal(err)
				}
				if got := readReply(c, len(replies[want])); !bytes.Equal(got, replies[want]) {
					t.Errorf("%s: replied %x, want %s %x", v.Name, got, want, replies[want])
				}
			}
			checkStored(t, ts, ns, key, value)
			c.conn.Close()
		case "bad":
			n++
			c := dialPut(t, ts)
			if _, err := c.conn.Write(v.Bytes); err != nil {
				t.Fatal(err)
			}
			closing := v.Fields["close"] == "1"
			if closing {
				c.conn.(*net.UnixConn).CloseWrite() // the rest never comes
			}
			seq := int32(1)
			if s, ok := v.Fields["seq"]; ok {
				seq = int32(testvec.Int(t, v, s))
			}
			switch want := v.Fields["result"]; want {
			case "none":
			case "UNKNOWN_METHOD", "PROTOCOL_ERROR":
				if res, ex := c.reply(seq); ex == nil || ex.TypeID() != exceptionType(want) {
					t.Errorf("%s: replied %+v, %v; want the exception %s", v.Name, res, ex, want)
				}
			default:
				if res, ex := c.reply(seq); ex != nil || res.Err == nil || res.Err.Code.String() != want {
					t.Errorf("%s: replied %+v, %v; want %s", v.Name, res, ex, want)
				}
			}
			if closing {
				if !c.closed() {
					t.Errorf("%s: the connection was kept", v.Name)
				}
			} else if res := c.call(2, withSeq(2, slices.Clone(vecs[0].Bytes))); res.Err != nil {
				t.Errorf("%s: a put after it on the same connection: %+v", v.Name, res)
			}
			c.conn.Close()
		}
	}
	if n < 6 {
		t.Fatalf("%d vectors", n)
	}
}

func exceptionType(name string) int32 {
	if name == "UNKNOWN_METHOD" {
		return thrift.UNKNOWN_METHOD
	}
	return thrift.PROTOCOL_ERROR
}
