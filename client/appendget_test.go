//go:build linux

package client_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/cloudwego/gopkg/protocol/thrift"

	"github.com/tidepool-kv/tidepool/client"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
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

		got, found, err = c.AppendGetScope(ctx, nil, "ns", key, client.ScopeLocal)
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

// encodeGetResult is a reply payload as the sidecar's generated encoder
// writes it.
func encodeGetResult(r *tp.TidepoolGetResult) []byte {
	return thrift.FastMarshal(r)
}

// TestAppendGetDecoder: the decoder of AppendGet against the replies a
// sidecar writes and against broken ones: every broken reply is an error,
// never a panic, never more bytes than the reply holds.
func TestAppendGetDecoder(t *testing.T) {
	v := sized(1, 5000)
	ok := encodeGetResult(&tp.TidepoolGetResult{Success: &tp.GetResponse{Found: true, Value: v, Tier: "dram"}})
	got, found, exc, n, err := client.DecodeAppendGet([]byte("p"), ok)
	if err != nil || !found || exc != nil || n != len(ok) || !bytes.Equal(got, append([]byte("p"), v...)) {
		t.Fatalf("hit: found %v, exc %v, n %d of %d, err %v", found, exc, n, len(ok), err)
	}

	miss := encodeGetResult(&tp.TidepoolGetResult{Success: &tp.GetResponse{Found: false, Tier: ""}})
	if got, found, _, _, err := client.DecodeAppendGet([]byte("p"), miss); err != nil || found || string(got) != "p" {
		t.Fatalf("miss: %q, found %v, err %v", got, found, err)
	}

	excReply := encodeGetResult(&tp.TidepoolGetResult{Err: &tp.TidepoolError{Code: tp.ErrorCode_UNAVAILABLE, Message: "draining"}})
	if _, found, exc, _, err := client.DecodeAppendGet(nil, excReply); err != nil || found || exc == nil || exc.Code != tp.ErrorCode_UNAVAILABLE || exc.Message != "draining" {
		t.Fatalf("exception: found %v, exc %v, err %v", found, exc, err)
	}

	// Every cut short of the end is an error.
	for i := 0; i < len(ok); i++ {
		if _, _, _, _, err := client.DecodeAppendGet(nil, ok[:i]); err == nil {
			t.Fatalf("reply cut at %d of %d bytes decoded", i, len(ok))
		}
	}

	// The value's length field: where it sits, after the field headers
	// (result field 0, response field 1 bool, response field 2).
	at := bytes.Index(ok, append([]byte{byte(thrift.STRING), 0, 2}, binary.BigEndian.AppendUint32(nil, uint32(len(v)))...)) + 3
	for _, claim := range []uint32{0xffffffff, 0x80000000, 0x7fffffff, uint32(len(ok)), uint32(len(v) + 1)} {
		bad := bytes.Clone(ok)
		binary.BigEndian.PutUint32(bad[at:], claim)
		dst := make([]byte, 0, 8)
		got, _, _, _, err := client.DecodeAppendGet(dst, bad)
		if err == nil {
			t.Fatalf("value claiming %d bytes of %d decoded", claim, len(v))
		}
		// More than the reply holds: nothing allocated for it.
		if claim > uint32(len(ok)) && cap(got) != 8 {
			t.Fatalf("value claiming %d bytes of a %d-byte reply: grew dst to %d", claim, len(ok), cap(got))
		}
	}

	badType := bytes.Clone(ok)
	badType[at-3] = 99 // not a Thrift type
	if _, _, _, _, err := client.DecodeAppendGet(nil, badType); err == nil {
		t.Fatal("a field of type 99 decoded")
	}

	// A repeated response replaces what the first one appended.
	twice := encodeGetResult(&tp.TidepoolGetResult{Success: &tp.GetResponse{Found: true, Value: []byte("first")}})
	second := encodeGetResult(&tp.TidepoolGetResult{Success: &tp.GetResponse{Found: true, Value: []byte("second")}})
	twice = append(twice[:len(twice)-1], second...)
	if got, found, _, _, err := client.DecodeAppendGet([]byte("p"), twice); err != nil || !found || string(got) != "psecond" {
		t.Fatalf("repeated response: %q, found %v, err %v", got, found, err)
	}
}

// FuzzAppendGetDecoder: on any payload, AppendGet's decoder agrees with the
// generated one (tp.TidepoolGetResult.FastRead): both fail, or both succeed
// with the same block and exception; it never panics.
func FuzzAppendGetDecoder(f *testing.F) {
	f.Add(encodeGetResult(&tp.TidepoolGetResult{Success: &tp.GetResponse{Found: true, Value: []byte("value"), Tier: "dram"}}))
	f.Add(encodeGetResult(&tp.TidepoolGetResult{Success: &tp.GetResponse{}}))
	f.Add(encodeGetResult(&tp.TidepoolGetResult{Err: &tp.TidepoolError{Code: tp.ErrorCode_INTERNAL, Message: "m"}}))
	f.Add([]byte{byte(thrift.STRUCT), 0, 0, byte(thrift.STRING), 0, 2, 0x7f, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, payload []byte) {
		got, found, exc, _, err := client.DecodeAppendGet([]byte("p"), payload)
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
