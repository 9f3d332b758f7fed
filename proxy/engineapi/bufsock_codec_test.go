package engineapi

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/cloudwego/gopkg/protocol/thrift"

	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
)

// The buffer socket's GET as the Thrift call it could be, to measure the
// hand-written encoding against (docs/architecture.md, "Hand-written wire
// formats"):
//
//	struct GetIntoBufferRequest { 1: i64 id, 2: i64 off, 3: i64 len,
//	    4: Scope scope, 5: binary ns, 6: binary key }
//	struct BufferAnswer { 1: ErrorCode code, 2: string message,
//	    3: i32 checksum, 4: i64 value }
//
// each in a Thrift message (name, type, sequence id), coded with the calls
// Kitex's generated fastcodec makes (thrift.Binary): what the server does
// per op is the request's decoding and the answer's encoding.

var errBufThrift = errors.New("buffer thrift: field of the wrong type")

func encodeGetThrift(r bufRequest) []byte {
	p := thrift.Binary
	b := p.AppendMessageBegin(nil, "GetIntoBuffer", thrift.CALL, 1)
	b = p.AppendFieldBegin(b, thrift.STRUCT, 1) // the args struct's req
	for i, v := range []uint64{r.id, r.off, r.n} {
		b = p.AppendFieldBegin(b, thrift.I64, int16(i+1))
		b = p.AppendI64(b, int64(v))
	}
	b = p.AppendFieldBegin(b, thrift.I32, 4)
	b = p.AppendI32(b, int32(r.scope))
	b = p.AppendFieldBegin(b, thrift.STRING, 5)
	b = p.AppendBinary(b, r.ns)
	b = p.AppendFieldBegin(b, thrift.STRING, 6)
	b = p.AppendBinary(b, r.key)
	b = p.AppendFieldStop(b)
	return p.AppendFieldStop(b)
}

// decodeGetThrift reads as generated code does (a loop over field
// headers, a switch on the id); ns and key share b's memory, as
// decodeBufRequest's do.
func decodeGetThrift(b []byte) (bufRequest, error) {
	p := thrift.Binary
	_, _, _, o, err := p.ReadMessageBegin(b)
	if err != nil {
		return bufRequest{}, err
	}
	typ, id, l, err := p.ReadFieldBegin(b[o:])
	if err != nil || typ != thrift.STRUCT || id != 1 {
		return bufRequest{}, errors.Join(err, errBufThrift)
	}
	o += l
	r := bufRequest{method: "GetIntoBuffer"}
	for {
		typ, id, l, err := p.ReadFieldBegin(b[o:])
		o += l
		if err != nil {
			return bufRequest{}, err
		}
		if typ == thrift.STOP {
			break
		}
		var v int64
		switch {
		case id >= 1 && id <= 3 && typ == thrift.I64:
			v, l, err = p.ReadI64(b[o:])
			*[...]*uint64{&r.id, &r.off, &r.n}[id-1] = uint64(v)
		case id == 4 && typ == thrift.I32:
			var s int32
			s, l, err = p.ReadI32(b[o:])
			r.scope = tp.Scope(s)
		case id == 5 && typ == thrift.STRING, id == 6 && typ == thrift.STRING:
			var s []byte
			s, l, err = readBinaryNocopy(b[o:])
			if id == 5 {
				r.ns = s
			} else {
				r.key = s
			}
		default:
			l, err = p.Skip(b[o:], typ)
		}
		o += l
		if err != nil {
			return bufRequest{}, err
		}
	}
	if typ, _, l, err = p.ReadFieldBegin(b[o:]); err != nil || typ != thrift.STOP || o+l != len(b) {
		return bufRequest{}, errors.Join(err, errBufThrift)
	}
	return r, nil
}

// readBinaryNocopy reads a binary field sharing b's memory (Kitex's
// ReadBinary copies; its no-copy reads share the buffer the same way).
func readBinaryNocopy(b []byte) ([]byte, int, error) {
	n, l, err := thrift.Binary.ReadI32(b)
	if err != nil || n < 0 || int(n) > len(b)-l {
		return nil, 0, errors.Join(err, errBufThrift)
	}
	return b[l : l+int(n) : l+int(n)], l + int(n), nil
}

func encodeAnswerThrift(code tp.ErrorCode, msg string, sum uint32, value uint64) []byte {
	p := thrift.Binary
	b := make([]byte, 0, p.MessageBeginLength("GetIntoBuffer")+3+4+3+4+len(msg)+3+4+3+8+2)
	b = p.AppendMessageBegin(b, "GetIntoBuffer", thrift.REPLY, 1)
	b = p.AppendFieldBegin(b, thrift.STRUCT, 0) // the result struct's success
	b = p.AppendFieldBegin(b, thrift.I32, 1)
	b = p.AppendI32(b, int32(code))
	b = p.AppendFieldBegin(b, thrift.STRING, 2)
	b = p.AppendString(b, msg)
	b = p.AppendFieldBegin(b, thrift.I32, 3)
	b = p.AppendI32(b, int32(sum))
	b = p.AppendFieldBegin(b, thrift.I64, 4)
	b = p.AppendI64(b, int64(value))
	b = p.AppendFieldStop(b)
	return p.AppendFieldStop(b)
}

// getVector is the GET request of protocol/testdata/bufsock.txt
// ("get-default"): a 13-byte namespace and a 32-byte key.
func getVector(tb testing.TB) (op byte, body []byte) {
	b, err := hex.DecodeString("020100000000004a0000000000000007000000000000100000000000000007d000000d6c6c616d61332d38622f7470310020000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")
	if err != nil {
		tb.Fatal(err)
	}
	return b[0], b[bufHeader:]
}

// TestBufGetAgainstThrift: the Thrift coding above reads back the same
// request (so the benchmark compares working code), and is the larger;
// the byte counts beside the entry in docs/architecture.md.
func TestBufGetAgainstThrift(t *testing.T) {
	op, body := getVector(t)
	want, err := decodeBufRequest(op, body)
	if err != nil {
		t.Fatal(err)
	}
	th := encodeGetThrift(want)
	got, err := decodeGetThrift(th)
	if err != nil || got.id != want.id || got.off != want.off || got.n != want.n || got.scope != want.scope ||
		!bytes.Equal(got.ns, want.ns) || !bytes.Equal(got.key, want.key) {
		t.Fatalf("thrift read back %+v, %v; want %+v", got, err, want)
	}
	ours, ans := bufHeader+len(body), len(bufAnswer(tp.ErrorCode_OK, "", 0xdeadbeef, 2000, nil))
	tans := len(encodeAnswerThrift(tp.ErrorCode_OK, "", 0xdeadbeef, 2000))
	t.Logf("GET request: ours %d B, Thrift binary %d B; answer: ours %d B, Thrift binary %d B", ours, len(th), ans, tans)
	if ours >= len(th) || ans >= tans {
		t.Fatal("the reason written in docs/architecture.md no longer holds")
	}
}

// BenchmarkBufCodec: the server's coding work for one GET, the request's
// decoding and the answer's encoding, the buffer socket's against the
// Thrift call above, side by side in one run.
func BenchmarkBufCodec(b *testing.B) {
	op, body := getVector(b)
	req, err := decodeBufRequest(op, body)
	if err != nil {
		b.Fatal(err)
	}
	th := encodeGetThrift(req)
	b.Run("bufsock", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r, err := decodeBufRequest(op, body)
			if err != nil {
				b.Fatal(err)
			}
			_ = bufAnswer(tp.ErrorCode_OK, "", 0xdeadbeef, r.n, nil)
		}
	})
	b.Run("thrift-binary", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r, err := decodeGetThrift(th)
			if err != nil {
				b.Fatal(err)
			}
			_ = encodeAnswerThrift(tp.ErrorCode_OK, "", 0xdeadbeef, r.n)
		}
	})
}
