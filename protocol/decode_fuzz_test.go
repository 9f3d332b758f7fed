package protocol_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/cloudwego/gopkg/protocol/thrift"

	peer "github.com/tidepool-kv/tidepool/protocol/gen/peer"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
)

// The generated FastRead of every request struct the engine API and the
// peer API decode. scripts/gen-idl.sh bounds each container length by the
// bytes left before the make (bound_lists); these tests and fuzz targets
// hold it to that.
var requestDecoders = []struct {
	name string
	new  func() thrift.FastCodec
}{
	{"engine.Hello", func() thrift.FastCodec { return tp.NewHelloRequest() }},
	{"engine.Put", func() thrift.FastCodec { return tp.NewPutRequest() }},
	{"engine.BatchPut", func() thrift.FastCodec { return tp.NewBatchPutRequest() }},
	{"engine.Get", func() thrift.FastCodec { return tp.NewGetRequest() }},
	{"engine.BatchGet", func() thrift.FastCodec { return tp.NewBatchGetRequest() }},
	{"engine.Exists", func() thrift.FastCodec { return tp.NewExistsRequest() }},
	{"engine.BatchExists", func() thrift.FastCodec { return tp.NewBatchExistsRequest() }},
	{"engine.Lookup", func() thrift.FastCodec { return tp.NewLookupRequest() }},
	{"engine.Delete", func() thrift.FastCodec { return tp.NewDeleteRequest() }},
	{"engine.Prefetch", func() thrift.FastCodec { return tp.NewPrefetchRequest() }},
	{"engine.Reserve", func() thrift.FastCodec { return tp.NewReserveRequest() }},
	{"engine.Commit", func() thrift.FastCodec { return tp.NewCommitRequest() }},
	{"engine.Abort", func() thrift.FastCodec { return tp.NewAbortRequest() }},
	{"engine.Acquire", func() thrift.FastCodec { return tp.NewAcquireRequest() }},
	{"engine.Release", func() thrift.FastCodec { return tp.NewReleaseRequest() }},
	{"engine.Renew", func() thrift.FastCodec { return tp.NewRenewRequest() }},
	{"peer.Lookup", func() thrift.FastCodec { return peer.NewLookupRequest() }},
	{"peer.Acquire", func() thrift.FastCodec { return peer.NewAcquireRequest() }},
	{"peer.Release", func() thrift.FastCodec { return peer.NewReleaseRequest() }},
	{"peer.Put", func() thrift.FastCodec { return peer.NewPutRequest() }},
}

const (
	tList   = 0x0f
	tString = 0x0b
	tStruct = 0x0c
	tI64    = 0x0a
)

// hostileList is a struct whose field id is a list of elem claiming n
// elements, followed by nothing: about ten bytes that claim gigabytes.
func hostileList(id int16, elem byte, n uint32) []byte {
	b := []byte{tList, 0, 0, elem, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(b[1:], uint16(id))
	binary.BigEndian.PutUint32(b[4:], n)
	return append(b, 0) // a STOP byte, so that the message is not merely short
}

// hostileCases: every list of every request, with a length of 2^31-1.
var hostileCases = []struct {
	decoder string
	input   []byte
}{
	{"engine.BatchPut", hostileList(2, tStruct, 1<<31-1)},
	{"engine.BatchGet", hostileList(2, tString, 1<<31-1)},
	{"engine.BatchExists", hostileList(2, tString, 1<<31-1)},
	{"engine.Lookup", hostileList(2, tString, 1<<31-1)},
	{"engine.Prefetch", hostileList(2, tString, 1<<31-1)},
	{"engine.Reserve", hostileList(2, tStruct, 1<<31-1)},
	{"engine.Commit", hostileList(1, tStruct, 1<<31-1)},
	{"engine.Abort", hostileList(1, tI64, 1<<31-1)},
	{"engine.Acquire", hostileList(2, tString, 1<<31-1)},
	{"engine.Release", hostileList(1, tI64, 1<<31-1)},
	{"engine.Renew", hostileList(1, tI64, 1<<31-1)},
	{"peer.Lookup", hostileList(3, tString, 1<<31-1)},
	{"peer.Acquire", hostileList(3, tString, 1<<31-1)},
	{"peer.Acquire", hostileList(5, tI64, 1<<31-1)},
	{"peer.Release", hostileList(2, tI64, 1<<31-1)},
	{"peer.Put", hostileList(3, tStruct, 1<<31-1)},
	// One more element than bytes left: the smallest length refused.
	{"engine.BatchGet", hostileList(2, tString, 2)},
}

func decoderByName(t testing.TB, name string) func() thrift.FastCodec {
	for _, d := range requestDecoders {
		if d.name == name {
			return d.new
		}
	}
	t.Fatalf("no decoder %s", name)
	return nil
}

// heapAllocated returns the bytes allocated by f.
func heapAllocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestDecodersRefuseContainerLongerThanMessage(t *testing.T) {
	for _, c := range hostileCases {
		t.Run(fmt.Sprintf("%s/%x", c.decoder, c.input), func(t *testing.T) {
			msg := decoderByName(t, c.decoder)()
			var err error
			got := heapAllocated(func() { _, err = msg.FastRead(c.input) })
			var pe *thrift.ProtocolException
			if !errors.As(err, &pe) || pe.TypeID() != thrift.INVALID_DATA {
				t.Fatalf("FastRead(%x) = %v, want an INVALID_DATA protocol exception", c.input, err)
			}
			if got > 64<<10 {
				t.Fatalf("FastRead(%d bytes) allocated %d bytes", len(c.input), got)
			}
		})
	}
}

// TestDecodersCapContainerLength: a list of 2^20+1 empty structs is all
// there (one STOP byte each), yet refused: each would cost its Go size,
// 64 times the byte it takes.
func TestDecodersCapContainerLength(t *testing.T) {
	const n = 1<<20 + 1
	in := hostileList(2, tStruct, n)
	in = append(in[:len(in)-1], make([]byte, n+1)...) // n STOP bytes, then the request's STOP
	msg := tp.NewBatchPutRequest()
	var err error
	got := heapAllocated(func() { _, err = msg.FastRead(in) })
	var pe *thrift.ProtocolException
	if !errors.As(err, &pe) || pe.TypeID() != thrift.INVALID_DATA {
		t.Fatalf("FastRead of %d empty items = %v, want an INVALID_DATA protocol exception", n, err)
	}
	if got > 64<<10 {
		t.Fatalf("FastRead allocated %d bytes", got)
	}
	// One element fewer is accepted.
	in = hostileList(2, tStruct, n-1)
	in = append(in[:len(in)-1], make([]byte, n)...)
	if _, err := tp.NewBatchPutRequest().FastRead(in); err != nil {
		t.Fatalf("FastRead of %d empty items: %v", n-1, err)
	}
}

// TestHostileSeedsInCorpus keeps the hostile cases in the fuzz corpus, so
// that `go test` (which runs the seeds) and any fuzzing start from them.
func TestHostileSeedsInCorpus(t *testing.T) {
	for _, c := range hostileCases {
		idx := -1
		for i, d := range requestDecoders {
			if d.name == c.decoder {
				idx = i
			}
		}
		name := fmt.Sprintf("hostile-%s-%x", c.decoder, c.input)
		path := filepath.Join("testdata", "fuzz", "FuzzRequestDecoders", name)
		want := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", append([]byte{byte(idx)}, c.input...))
		got, err := os.ReadFile(path)
		if os.Getenv("TIDEPOOL_WRITE_CORPUS") != "" {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err != nil || string(got) != want {
			t.Errorf("corpus file %s missing or stale (rerun with TIDEPOOL_WRITE_CORPUS=1): %v", path, err)
		}
	}
}

// FuzzRequestDecoders feeds arbitrary bytes to every request decoder: the
// first byte picks the decoder, the rest is the message. A decoder must
// never panic, and never allocate far beyond what the input holds (an
// element takes at least one byte; the largest element struct is a few
// hundred bytes in Go).
func FuzzRequestDecoders(f *testing.F) {
	for i, d := range requestDecoders {
		msg := d.new()
		buf := make([]byte, msg.BLength())
		msg.FastWriteNocopy(buf, nil)
		f.Add(append([]byte{byte(i)}, buf...))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		d := requestDecoders[int(data[0])%len(requestDecoders)]
		in := data[1:]
		var n int
		var err error
		msg := d.new()
		got := heapAllocated(func() { n, err = msg.FastRead(in) })
		if limit := uint64(512*len(in) + 64<<10); got > limit {
			t.Fatalf("%s: FastRead of %d bytes allocated %d", d.name, len(in), got)
		}
		if err != nil {
			return
		}
		if n > len(in) {
			t.Fatalf("%s: FastRead read %d of %d bytes", d.name, n, len(in))
		}
		// What decodes re-encodes into a message that decodes whole. (Not
		// always to the same length: an absent list comes back empty.)
		out := make([]byte, msg.BLength())
		msg.FastWriteNocopy(out, nil)
		again := d.new()
		if n, err := again.FastRead(out); err != nil || n != len(out) {
			t.Fatalf("%s: re-encoded message (%d bytes) decodes %d bytes: %v", d.name, len(out), n, err)
		}
	})
}
