package engineapi

import (
	"bufio"
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"

	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/cache/evict"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/protocol/thriftstream"
	"github.com/tidepool-kv/tidepool/proxy"
)

// inPlaceArgs encodes a Put call's arguments in the order the Go client
// writes them: every field of the request before the value, which the put
// socket then reads in place.
func inPlaceArgs(ns string, key, value []byte, depth int32) []byte {
	b := thrift.Binary
	w := requestHead(ns, key)
	w = b.AppendFieldBegin(w, thrift.I32, 4)
	w = b.AppendI32(w, depth)
	w = b.AppendFieldBegin(w, thrift.BOOL, 5)
	w = b.AppendBool(w, false)
	w = b.AppendFieldBegin(w, thrift.I32, 6)
	w = b.AppendI32(w, 0)
	w = b.AppendFieldBegin(w, thrift.STRING, 3)
	w = b.AppendBinary(w, value)
	w = b.AppendFieldStop(w)
	return b.AppendFieldStop(w)
}

// valuelessRequest is a request field of a Put call's arguments with a
// namespace and key and no value, then the arguments' stop: appended to
// a call's arguments less their stop, it repeats the request.
func valuelessRequest(ns string, key []byte) []byte {
	return thrift.Binary.AppendFieldStop(thrift.Binary.AppendFieldStop(requestHead(ns, key)))
}

// requestHead opens the arguments' request field and writes its namespace
// and key.
func requestHead(ns string, key []byte) []byte {
	b := thrift.Binary
	w := b.AppendFieldBegin(nil, thrift.STRUCT, 1)
	w = b.AppendFieldBegin(w, thrift.STRING, 1)
	w = b.AppendString(w, ns)
	w = b.AppendFieldBegin(w, thrift.STRING, 2)
	return b.AppendBinary(w, key)
}

// FuzzPutSocketRequest: whatever a Put call's arguments hold, the put
// socket's reader never stores a block the generated decoder would not
// read from the same bytes, stores exactly the value that decoder reads,
// and leaves nothing reserved: the DRAM tier's use returns to zero once
// what was stored is deleted.
func FuzzPutSocketRequest(f *testing.F) {
	dir := f.TempDir()
	// A tier and proxy of their own for each input, so that what one
	// leaves is not blamed on the next.
	fresh := func(t *testing.T) (*dram.Tier, *putServer) {
		dcfg := dram.DefaultConfig()
		dcfg.Dir = dir
		dcfg.Capacity = 4 << 20
		dcfg.ArenaSize = 4 << 20
		dcfg.MaxValueSize = 1 << 20
		dcfg.Policy = evict.NewLRU
		tier, err := dram.New(dcfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tier.Close() })
		pcfg := proxy.DefaultConfig()
		pcfg.NodeID = "fuzz"
		pcfg.MaxValueBytes = 1 << 20
		p, err := proxy.New(pcfg, proxy.Deps{Store: tier, ZeroCopy: tier, Scan: tier}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tier, &putServer{p: p, maxRequest: 4 << 20, maxAhead: 8 << 20}
	}

	args := func(req *tp.PutRequest) []byte {
		a := &tp.TidepoolPutArgs{Req: req}
		b := make([]byte, a.BLength())
		a.FastWriteNocopy(b, nil)
		return b
	}
	inPlace := func(ns string, key, value []byte) []byte { return inPlaceArgs(ns, key, value, 1) }
	f.Add(inPlace("ns", []byte("k"), []byte("value in place")))
	f.Add(inPlace("ns", []byte("k"), bytes.Repeat([]byte{7}, 3000)))
	f.Add(args(&tp.PutRequest{Ns: "ns", Key: []byte("k"), Value: []byte("field order"), Depth: 2}))
	f.Add(args(&tp.PutRequest{Ns: "ns", Key: []byte("k"), Value: []byte("durable"), Durable: true}))
	f.Add(args(&tp.PutRequest{Ns: "", Key: []byte("k"), Value: []byte("no namespace")}))
	two := inPlace("ns", []byte("k"), []byte("one"))
	f.Add(append(two[:len(two)-2], append(inPlace("ns", []byte("k"), []byte("two"))[3:], 0)...))
	// The request twice, the second without a value: a generated decoder
	// keeps only the second.
	f.Add(append(two[:len(two)-1], valuelessRequest("ns", []byte("k"))...))

	f.Fuzz(func(t *testing.T, body []byte) {
		tier, s := fresh(t)
		msg := thrift.Binary.AppendMessageBegin(nil, "Put", thrift.CALL, 1)
		msg = append(msg, body...)
		d := &thriftstream.Decoder{R: bufio.NewReaderSize(&limitReader{r: bytes.NewReader(msg), left: s.maxRequest}, putReadBuffer), What: "request"}
		var early []byte
		reply, _ := s.call(d, nil, func(time.Time) {}, func(b []byte) { early = append(early, b...) })
		reply = append(early, reply...)

		stored := false
		if len(reply) > 0 {
			rd := thriftstream.Decoder{R: bufio.NewReader(bytes.NewReader(reply)), What: "reply"}
			typ, _, _, err := rd.MessageBegin()
			if err != nil {
				t.Fatalf("the reply does not parse: %v", err)
			}
			if typ == thrift.REPLY {
				b, err := rd.CaptureStruct()
				if err != nil {
					t.Fatal(err)
				}
				res := tp.NewTidepoolPutResult()
				if _, err := res.FastRead(b); err != nil {
					t.Fatalf("the result does not parse: %v", err)
				}
				stored = res.Success != nil && !res.Success.Existed
			}
		}
		var want tp.TidepoolPutArgs
		_, gerr := want.FastRead(body)
		if stored {
			if gerr != nil || want.Req == nil {
				t.Fatalf("stored a block from arguments the generated decoder refuses: %v", gerr)
			}
			got, _, err := tier.Get(context.Background(), want.Req.Ns, want.Req.Key, nil)
			if err != nil || !bytes.Equal(got, want.Req.Value) {
				t.Fatalf("stored %q (err %v), the generated decoder reads %q", got, err, want.Req.Value)
			}
		}
		// Clean: whatever was stored goes; then nothing may remain.
		if gerr == nil && want.Req != nil {
			// (An invalid key or namespace cannot have been stored: the
			// check below says so.)
			_, _ = tier.Delete(context.Background(), want.Req.Ns, want.Req.Key)
		}
		if st := tier.Stats().Tiers[0]; st.UsedBytes != 0 || st.Blocks != 0 {
			t.Fatalf("after the call (reply %q): %d bytes in %d blocks left in the tier", reply, st.UsedBytes, st.Blocks)
		}
	})
}
