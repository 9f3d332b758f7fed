package client

import (
	"context"
	"encoding/binary"

	"github.com/cloudwego/gopkg/protocol/thrift"

	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
)

// AppendGet is Get that appends the block's bytes to dst and returns the
// extended slice, as strconv.AppendInt does: a caller that passes a
// buffer with room for the block (dst[:0] of a buffer it reuses) reads
// blocks through the socket without an allocation per call. The bytes
// are copied once, from the reply as it is decoded. On a miss or an error
// dst comes back unchanged.
func (c *Client) AppendGet(ctx context.Context, dst []byte, ns string, key []byte) (value []byte, found bool, err error) {
	return c.AppendGetScope(ctx, dst, ns, key, ScopeDefault)
}

// AppendGetScope is AppendGet with an explicit scope.
func (c *Client) AppendGetScope(ctx context.Context, dst []byte, ns string, key []byte, scope Scope) (value []byte, found bool, err error) {
	res := appendGet{dst: dst, base: len(dst)}
	if err := c.call(ctx, "Get", &tp.TidepoolGetArgs{Req: &tp.GetRequest{Ns: ns, Key: key, Scope: scope}}, &res); err != nil {
		return dst, false, err
	}
	if !res.found {
		return dst, false, nil
	}
	return res.dst, true, nil
}

// appendGet decodes a Get reply (the shape of tp.TidepoolGetResult:
// field 0 the GetResponse, field 1 the declared exception) with the value
// appended to dst, where the generated decoder allocates a new slice for
// it. Kitex decodes replies through thrift.FastCodec; the write half only
// completes that interface (a reply is never encoded by a client).
type appendGet struct {
	dst   []byte
	base  int // len(dst) before the call: a repeated field replaces, not appends
	found bool
	err   *tp.TidepoolError
}

func (r *appendGet) GetErr() *tp.TidepoolError { return r.err }

func (r *appendGet) BLength() int { return 1 }

func (r *appendGet) FastWriteNocopy(buf []byte, _ thrift.NocopyWriter) int {
	return thrift.Binary.WriteFieldStop(buf)
}

func (r *appendGet) FastRead(buf []byte) (int, error) {
	return readFields(buf, func(t thrift.TType, id int16, b []byte) (int, error) {
		switch {
		case id == 0 && t == thrift.STRUCT:
			r.found, r.dst = false, r.dst[:r.base] // a repeated field replaces
			return readFields(b, r.readResponseField)
		case id == 1 && t == thrift.STRUCT:
			r.err = tp.NewTidepoolError()
			return r.err.FastRead(b)
		}
		return tp.SkipField(b, t)
	})
}

// readResponseField reads one field of a GetResponse: found (1), value
// (2); the tier (3) and fields of later versions are skipped.
func (r *appendGet) readResponseField(t thrift.TType, id int16, b []byte) (int, error) {
	switch {
	case id == 1 && t == thrift.BOOL:
		v, l, err := thrift.Binary.ReadBool(b)
		r.found = v
		return l, err
	case id == 2 && t == thrift.STRING:
		if len(b) < 4 {
			return 0, thrift.NewProtocolException(thrift.INVALID_DATA, "value length past the end of the reply")
		}
		n := int64(int32(binary.BigEndian.Uint32(b)))
		if n < 0 || n > int64(len(b)-4) {
			return 0, thrift.NewProtocolException(thrift.INVALID_DATA, "value of negative length or past the end of the reply")
		}
		r.dst = append(r.dst[:r.base], b[4:4+n]...)
		return 4 + int(n), nil
	}
	return tp.SkipField(b, t)
}

// readFields walks the fields of a binary-protocol struct in buf up to its
// stop byte, calling field for each with the bytes after its header.
func readFields(buf []byte, field func(t thrift.TType, id int16, b []byte) (int, error)) (int, error) {
	off := 0
	for {
		t, id, l, err := thrift.Binary.ReadFieldBegin(buf[off:])
		off += l
		if err != nil {
			return off, err
		}
		if t == thrift.STOP {
			return off, nil
		}
		l, err = field(t, id, buf[off:])
		off += l
		if err != nil {
			return off, err
		}
	}
}
