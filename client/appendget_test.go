//go:build linux

package client_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"

	"github.com/tidepool-kv/tidepool/client"
	"github.com/tidepool-kv/tidepool/internal/poll"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy/engineapi"
)

// TestAppendGet: blocks read through a real sidecar come back appended to
// the caller's bytes, in the caller's buffer when it has room and in a
// grown one when it has not; a miss and an error leave dst as it was.
func TestAppendGet(t *testing.T) {
	c := startSidecar(t, 64<<20)
	ctx := context.Background()
	for _, n := range []int{1, 4095, 70_000, 1 << 20} {
		v := sized(int64(n), n)
		key := []byte(fmt.Sprint("k", n))
		if _, err := c.Put(ctx, "ns", key, v, 0); err != nil {
			t.Fatal(err)
		}

		buf := make([]byte, 3, 3+n) // room for the block after a prefix
		copy(buf, "hdr")
		got, found, err := c.AppendGet(ctx, buf, "ns", key)
		if err != nil || !found || !bytes.Equal(got, append([]byte("hdr"), v...)) {
			t.Fatalf("%d bytes into a buffer with room: found %v, err %v, %d bytes back, equal %v", n, found, err, len(got), bytes.Equal(got[min(3, len(got)):], v))
		}
		if &got[0] != &buf[:1][0] {
			t.Fatalf("%d bytes: a buffer with room for the block was not used", n)
		}

		small := []byte("x") // no room: grown, the prefix kept
		got, found, err = c.AppendGet(ctx, small, "ns", key)
		if err != nil || !found || len(got) != 1+n || got[0] != 'x' || !bytes.Equal(got[1:], v) {
			t.Fatalf("%d bytes into a short buffer: found %v, err %v, %d bytes", n, found, err, len(got))
		}

		got, found, err = c.AppendGet(ctx, nil, "ns", key, client.ScopeLocal)
		if err != nil || !found || !bytes.Equal(got, v) {
			t.Fatalf("%d bytes into nil: found %v, err %v", n, found, err)
		}
	}

	dst := []byte("keep")
	got, found, err := c.AppendGet(ctx, dst, "ns", []byte("absent"))
	if err != nil || found || string(got) != "keep" || &got[0] != &dst[0] {
		t.Fatalf("miss: %q, found %v, err %v", got, found, err)
	}
	got, found, err = c.AppendGet(ctx, dst, strings.Repeat("n", 1000), []byte("k")) // namespace too long
	if client.CodeOf(err) != client.CodeInvalidArgument || found || string(got) != "keep" {
		t.Fatalf("bad namespace: %q, found %v, err %v", got, found, err)
	}
}

// TestGetOwnsItsValue: Get (AppendGet into a pooled buffer) returns a
// slice of the value's own, which later Gets do not overwrite; an empty
// block is found and not nil, a miss is nil; a bad request and a closed
// client are errors.
func TestGetOwnsItsValue(t *testing.T) {
	c := startSidecar(t, 64<<20)
	ctx := context.Background()
	vals := map[string][]byte{"empty": {}}
	for _, n := range []int{1, 70_000, 1 << 20, 3 << 20} {
		vals[fmt.Sprint("k", n)] = sized(int64(n), n)
	}
	for k, v := range vals {
		if _, err := c.Put(ctx, "ns", []byte(k), v, 0); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string][]byte{}
	for range 2 { // the second round reuses the pooled buffers
		for k := range vals {
			v, found, err := c.Get(ctx, "ns", []byte(k), client.ScopeLocal)
			if err != nil || !found || v == nil {
				t.Fatalf("Get %s: found %v, err %v, nil %v", k, found, err, v == nil)
			}
			if len(v) != cap(v) {
				t.Fatalf("Get %s: %d bytes in a slice of %d", k, len(v), cap(v))
			}
			got[k] = v
		}
	}
	for k, v := range vals {
		if !bytes.Equal(got[k], v) {
			t.Fatalf("Get %s: %d bytes, not the block's %d after later Gets", k, len(got[k]), len(v))
		}
	}
	if v, found, err := c.Get(ctx, "ns", []byte("absent")); err != nil || found || v != nil {
		t.Fatalf("miss: %v, found %v, err %v", v, found, err)
	}
	if _, _, err := c.Get(ctx, strings.Repeat("n", 1000), []byte("k")); client.CodeOf(err) != client.CodeInvalidArgument {
		t.Fatalf("bad namespace: %v", err)
	}
	c.Close()
	if _, _, err := c.Get(ctx, "ns", []byte("k1")); client.CodeOf(err) != client.CodeUnavailable {
		t.Fatalf("closed client: %v", err)
	}
}

// getReply is a Get reply message (header and result) as the sidecar's
// generated encoder writes it, for call seq.
func getReply(seq int32, r *tp.TidepoolGetResult) []byte {
	return append(thrift.Binary.AppendMessageBegin(nil, "Get", thrift.REPLY, seq), thrift.FastMarshal(r)...)
}

// decode decodes msg as AppendGet does for call 7, with no bound below 1 GiB.
func decode(dst, msg []byte) ([]byte, bool, *tp.TidepoolError, error) {
	return client.DecodeAppendGet(dst, bytes.NewReader(msg), 7, 1<<30)
}

// TestAppendGetDecoder: the decoder of AppendGet against the replies a
// sidecar writes and against broken ones: every broken reply is an error,
// never a panic, never an allocation for bytes that did not arrive.
func TestAppendGetDecoder(t *testing.T) {
	v := sized(1, 5000)
	ok := getReply(7, &tp.TidepoolGetResult{Success: &tp.GetResponse{Found: true, Value: v, Tier: "dram"}})
	r := bytes.NewReader(append(bytes.Clone(ok), "next"...))
	got, found, exc, err := client.DecodeAppendGet([]byte("p"), r, 7, 1<<30)
	if err != nil || !found || exc != nil || !bytes.Equal(got, append([]byte("p"), v...)) {
		t.Fatalf("hit: found %v, exc %v, err %v", found, exc, err)
	}
	// A value from a reader whose reads are short still lands whole.
	if got, _, _, err := client.DecodeAppendGet(nil, iotest.OneByteReader(bytes.NewReader(ok)), 7, 1<<30); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("hit, one byte per read: %d bytes, err %v", len(got), err)
	}
	if _, _, _, err := client.DecodeAppendGet(nil, bytes.NewReader(ok), 7, len(v)-1); err == nil {
		t.Fatalf("a value over MaxResponseBytes decoded")
	}

	miss := getReply(7, &tp.TidepoolGetResult{Success: &tp.GetResponse{Found: false, Tier: ""}})
	if got, found, _, err := decode([]byte("p"), miss); err != nil || found || string(got) != "p" {
		t.Fatalf("miss: %q, found %v, err %v", got, found, err)
	}

	excReply := getReply(7, &tp.TidepoolGetResult{Err: &tp.TidepoolError{Code: tp.ErrorCode_UNAVAILABLE, Message: "draining"}})
	if _, found, exc, err := decode(nil, excReply); err != nil || found || exc == nil || exc.Code != tp.ErrorCode_UNAVAILABLE || exc.Message != "draining" {
		t.Fatalf("exception: found %v, exc %v, err %v", found, exc, err)
	}

	// The message header: another call's reply, another method, another
	// message type, no strict header, an application exception.
	result := ok[len(thrift.Binary.AppendMessageBegin(nil, "Get", thrift.REPLY, 7)):]
	app := thrift.Binary.AppendMessageBegin(nil, "Get", thrift.EXCEPTION, 7)
	app = append(app, thrift.FastMarshal(thrift.NewApplicationException(thrift.UNKNOWN_METHOD, "no such method"))...)
	for name, msg := range map[string][]byte{
		"sequence":  getReply(8, &tp.TidepoolGetResult{Success: &tp.GetResponse{Found: true, Value: v}}),
		"method":    append(thrift.Binary.AppendMessageBegin(nil, "Put", thrift.REPLY, 7), result...),
		"type":      append(thrift.Binary.AppendMessageBegin(nil, "Get", thrift.CALL, 7), result...),
		"version":   append([]byte{0, 0, 0, 3}, ok[4:]...),
		"long name": append(binary.BigEndian.AppendUint32(bytes.Clone(ok[:4]), 1<<30), ok[8:]...),
		"exception": app,
	} {
		_, found, _, err := decode(nil, msg)
		if err == nil || found {
			t.Fatalf("%s: found %v, err %v", name, found, err)
		}
		if name == "exception" && !strings.Contains(err.Error(), "no such method") {
			t.Fatalf("application exception: %v", err)
		}
	}

	// Every cut short of the end is an error.
	for i := 0; i < len(ok); i++ {
		if _, _, _, err := decode(nil, ok[:i]); err == nil {
			t.Fatalf("reply cut at %d of %d bytes decoded", i, len(ok))
		}
	}

	// The value's length field: where it sits, after the field headers
	// (result field 0, response field 1 bool, response field 2).
	at := bytes.Index(ok, append([]byte{byte(thrift.STRING), 0, 2}, binary.BigEndian.AppendUint32(nil, uint32(len(v)))...)) + 3
	for _, claim := range []uint32{0xffffffff, 0x80000000, 0x7fffffff, 0x3fffffff, uint32(len(ok)), uint32(len(v) + 1)} {
		bad := bytes.Clone(ok)
		binary.BigEndian.PutUint32(bad[at:], claim)
		got, _, _, err := decode(make([]byte, 0, 8), bad)
		if err == nil {
			t.Fatalf("value claiming %d bytes of %d decoded", claim, len(v))
		}
		// Room grows with what arrives, not with the claim.
		if cap(got) > 64<<10+2*len(bad) {
			t.Fatalf("value claiming %d bytes of a %d-byte reply: grew dst to %d", claim, len(bad), cap(got))
		}
	}

	badType := bytes.Clone(ok)
	badType[at-3] = 99 // not a Thrift type
	if _, _, _, err := decode(nil, badType); err == nil {
		t.Fatal("a field of type 99 decoded")
	}

	// A repeated response replaces what the first one appended.
	twice := getReply(7, &tp.TidepoolGetResult{Success: &tp.GetResponse{Found: true, Value: []byte("first")}})
	second := thrift.FastMarshal(&tp.TidepoolGetResult{Success: &tp.GetResponse{Found: true, Value: []byte("second")}})
	twice = append(twice[:len(twice)-1], second...)
	if got, found, _, err := decode([]byte("p"), twice); err != nil || !found || string(got) != "psecond" {
		t.Fatalf("repeated response: %q, found %v, err %v", got, found, err)
	}

	// Skipped fields of every kind (fields of a later version), nested.
	unknown := thrift.Binary.AppendMessageBegin(nil, "Get", thrift.REPLY, 7)
	unknown = append(unknown, byte(thrift.STRUCT), 0, 0) // the response
	unknown = append(unknown, byte(thrift.MAP), 0, 9, byte(thrift.I32), byte(thrift.LIST), 0, 0, 0, 1, 0, 0, 0, 5,
		byte(thrift.STRING), 0, 0, 0, 2, 0, 0, 0, 1, 'a', 0, 0, 0, 0)
	unknown = append(unknown, byte(thrift.I64), 0, 10, 1, 2, 3, 4, 5, 6, 7, 8, byte(thrift.DOUBLE), 0, 11, 1, 2, 3, 4, 5, 6, 7, 8)
	unknown = append(unknown, byte(thrift.I16), 0, 12, 1, 2, byte(thrift.BYTE), 0, 13, 1)
	unknown = append(unknown, byte(thrift.SET), 0, 14, byte(thrift.STRUCT), 0, 0, 0, 1, byte(thrift.BOOL), 0, 1, 1, 0)
	unknown = append(unknown, byte(thrift.BOOL), 0, 1, 1, byte(thrift.STRING), 0, 2, 0, 0, 0, 2, 'o', 'k', 0) // found, value, stop
	unknown = append(unknown, byte(thrift.I32), 0, 5, 0, 0, 0, 1, 0)                                          // a result field 5, stop
	if got, found, _, err := decode(nil, unknown); err != nil || !found || string(got) != "ok" {
		t.Fatalf("unknown fields: %q, found %v, err %v", got, found, err)
	}
	// Nesting deeper than the skip allows.
	deep := thrift.Binary.AppendMessageBegin(nil, "Get", thrift.REPLY, 7)
	for range 100 {
		deep = append(deep, byte(thrift.STRUCT), 0, 9)
	}
	if _, _, _, err := decode(nil, deep); err == nil || !strings.Contains(err.Error(), "nested") {
		t.Fatalf("100 nested structs: %v", err)
	}
}

// FuzzAppendGetDecoder: on any result, AppendGet's decoder agrees with the
// generated one (tp.TidepoolGetResult.FastRead): both fail, or both succeed
// with the same block and exception; it never panics.
func FuzzAppendGetDecoder(f *testing.F) {
	f.Add(thrift.FastMarshal(&tp.TidepoolGetResult{Success: &tp.GetResponse{Found: true, Value: []byte("value"), Tier: "dram"}}))
	f.Add(thrift.FastMarshal(&tp.TidepoolGetResult{Success: &tp.GetResponse{}}))
	f.Add(thrift.FastMarshal(&tp.TidepoolGetResult{Err: &tp.TidepoolError{Code: tp.ErrorCode_INTERNAL, Message: "m"}}))
	f.Add([]byte{byte(thrift.STRUCT), 0, 0, byte(thrift.STRING), 0, 2, 0x7f, 0xff, 0xff, 0xff})
	f.Add([]byte{byte(thrift.LIST), 0, 3, byte(thrift.MAP), 0, 0, 0, 1, byte(thrift.I16), byte(thrift.SET), 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, payload []byte) {
		msg := append(thrift.Binary.AppendMessageBegin(nil, "Get", thrift.REPLY, 7), payload...)
		got, found, exc, err := decode([]byte("p"), msg)
		var want tp.TidepoolGetResult
		_, werr := want.FastRead(payload)
		if (err == nil) != (werr == nil) {
			t.Fatalf("AppendGet's decoder: %v; generated: %v", err, werr)
		}
		if err != nil {
			return
		}
		wfound := want.Success != nil && want.Success.Found
		if found != wfound || (exc == nil) != (want.Err == nil) {
			t.Fatalf("found %v, exception %v; generated: found %v, exception %v", found, exc, wfound, want.Err)
		}
		if found && !bytes.Equal(got[1:], want.Success.Value) {
			t.Fatalf("value %q; generated %q", got[1:], want.Success.Value)
		}
		if exc != nil && (exc.Code != want.Err.Code || exc.Message != want.Err.Message) {
			t.Fatalf("exception %v; generated %v", exc, want.Err)
		}
	})
}

// TestAppendGetConnections: AppendGet's own connections against a real
// sidecar: concurrent callers, a pooled connection the sidecar closed for
// idleness and one that died with the sidecar are replaced without an
// error, and a closed client refuses.
func TestAppendGetConnections(t *testing.T) {
	shm, err := os.MkdirTemp("/dev/shm", "tpag")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) })
	ecfg := engineapi.DefaultConfig()
	ecfg.IdleTimeout = 100 * time.Millisecond
	stop, _ := runSidecarWith(t, shm, 64<<20, ecfg)
	c, err := client.New(filepath.Join(shm, "tp.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	blocks := make([][]byte, 8)
	for i := range blocks {
		blocks[i] = sized(int64(i), 100_000+i)
		if _, err := c.Put(ctx, "ns", []byte(fmt.Sprint("k", i)), blocks[i], 0); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			buf := make([]byte, 0, 200_000)
			for j := range 50 {
				i := (g + j) % len(blocks)
				got, found, err := c.AppendGet(ctx, buf[:0], "ns", []byte(fmt.Sprint("k", i)))
				if err != nil || !found || !bytes.Equal(got, blocks[i]) {
					t.Errorf("caller %d, get %d of k%d: found %v, err %v", g, j, i, found, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if _, idle := client.RawIdleClosed(c); idle == 0 {
		t.Fatal("no connection kept for reuse")
	}

	// The sidecar closes the idle connections; the next gets still work.
	poll.Until(t, 10*time.Second, "the sidecar to close the idle connections", func() bool {
		closed, idle := client.RawIdleClosed(c)
		return closed == idle
	})
	for i := range 3 {
		if got, found, err := c.AppendGet(ctx, nil, "ns", []byte("k1")); err != nil || !found || !bytes.Equal(got, blocks[1]) {
			t.Fatalf("get %d after the idle close: found %v, err %v", i, found, err)
		}
	}

	// A new sidecar on the same socket: a miss, not an error.
	stop()
	runSidecarWith(t, shm, 64<<20, engineapi.DefaultConfig())
	if _, found, err := c.AppendGet(ctx, nil, "ns", []byte("k1")); err != nil || found {
		t.Fatalf("get from a restarted sidecar: found %v, err %v", found, err)
	}

	c.Close()
	if _, _, err := c.AppendGet(ctx, nil, "ns", []byte("k1")); client.CodeOf(err) != client.CodeUnavailable {
		t.Fatalf("get on a closed client: %v", err)
	}
}

// TestAppendGetStuckSidecar: a peer that reads the request and never
// answers, or answers another call: the call ends at the client's Timeout
// or the context's end with a clear error, and the connection is not used
// again.
func TestAppendGetStuckSidecar(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "stuck.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	reply := make(chan []byte, 8) // what the peer writes after reading a request; nothing when empty
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer conn.Close()
				buf := make([]byte, 4096)
				for {
					if _, err := conn.Read(buf); err != nil {
						return
					}
					select {
					case b := <-reply:
						conn.Write(b)
					default:
					}
				}
			}()
		}
	}()

	cfg := client.DefaultConfig(sock)
	cfg.Timeout = 200 * time.Millisecond
	c, err := client.NewWithConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	start := time.Now()
	dst := []byte("keep")
	got, _, err := c.AppendGet(context.Background(), dst, "ns", []byte("k"))
	if !errors.Is(err, context.DeadlineExceeded) || string(got) != "keep" {
		t.Fatalf("no answer: %q, %v", got, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("no answer: returned after %v with a 200ms timeout", d)
	}

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, _, err := c.AppendGet(ctx, nil, "ns", []byte("k")); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}

	// The answer to another call: refused, and the connection dropped.
	reply <- getReply(99, &tp.TidepoolGetResult{Success: &tp.GetResponse{Found: true, Value: []byte("other")}})
	if _, found, err := c.AppendGet(context.Background(), nil, "ns", []byte("k")); err == nil || found || !strings.Contains(err.Error(), "sequence") {
		t.Fatalf("reply to another call: found %v, %v", found, err)
	}
	// A value claiming 512 MiB, then the connection closes: an error, and
	// no 512 MiB allocated.
	huge := thrift.Binary.AppendMessageBegin(nil, "Get", thrift.REPLY, 1)
	huge = append(huge, byte(thrift.STRUCT), 0, 0, byte(thrift.STRING), 0, 2)
	huge = binary.BigEndian.AppendUint32(huge, 512<<20)
	reply <- append(huge, "short"...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, found, err := c.AppendGet(context.Background(), nil, "ns", []byte("k")); err == nil || found {
		t.Fatalf("a value cut short: found %v, %v", found, err)
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
		t.Fatalf("a value claiming 512 MiB allocated %d bytes", grew)
	}
	// Each failed call dropped its connection: one new connection per call.
	if n := accepted.Load(); n != 4 {
		t.Fatalf("%d connections for 4 failed calls", n)
	}
}
