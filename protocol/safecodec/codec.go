// Package safecodec wraps Kitex's default codec with the checks it lacks
// on what a client merely claims.
//
// Kitex reads a Thrift message's method name by allocating the length
// the message states (gopkg's BufferReader.ReadString), before anything
// looks at it: a message claiming a 2 GiB name makes the server allocate
// 2 GiB, and the heap target it leaves behind keeps RSS high for minutes.
// The codec here peeks at the length first and refuses anything longer
// than MaxMethodNameBytes, or longer than the frame it arrived in.
// Container lengths inside the payload are bounded by the generated
// decoders themselves (scripts/gen-idl.sh, bound_lists).
//
// It also lends request bytes to the handler (borrow.go): the put values of
// requests whose decoders borrow them are slices of the request's own
// buffer, kept until the call has finished, instead of copies.
package safecodec

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cloudwego/kitex/pkg/remote"
	"github.com/cloudwego/kitex/pkg/remote/codec"
	"github.com/cloudwego/kitex/pkg/remote/codec/perrors"
)

// MaxMethodNameBytes bounds a Thrift method name; the longest name in
// idl/ is a fraction of it.
const MaxMethodNameBytes = 128

// thriftVersion1 is the strict binary protocol's version word (high half).
const thriftVersion1 = 0x80010000

// Codec is a remote.Codec that checks the Thrift message header before
// Kitex's default codec decodes it.
type Codec struct {
	inner   remote.Codec
	meta    remote.MetaDecoder
	maxSize int
}

var (
	_ remote.Codec       = (*Codec)(nil)
	_ remote.MetaDecoder = (*Codec)(nil)
)

// New returns a codec that refuses payloads above maxSize bytes (as
// codec.NewDefaultCodecWithSizeLimit does) and method names above
// MaxMethodNameBytes.
func New(maxSize int) *Codec {
	inner := codec.NewDefaultCodecWithSizeLimit(maxSize)
	return &Codec{inner: inner, meta: inner.(remote.MetaDecoder), maxSize: maxSize}
}

// Encode implements remote.Codec.
func (c *Codec) Encode(ctx context.Context, msg remote.Message, out remote.ByteBuffer) error {
	return c.inner.Encode(ctx, msg, out)
}

// Decode implements remote.Codec.
func (c *Codec) Decode(ctx context.Context, msg remote.Message, in remote.ByteBuffer) error {
	if err := c.DecodeMeta(ctx, msg, in); err != nil {
		return err
	}
	return c.DecodePayload(ctx, msg, in)
}

// DecodeMeta implements remote.MetaDecoder: the transport header (framed,
// TTHeader) as Kitex decodes it, then the check of the method name length.
func (c *Codec) DecodeMeta(ctx context.Context, msg remote.Message, in remote.ByteBuffer) error {
	if err := c.meta.DecodeMeta(ctx, msg, in); err != nil {
		return err
	}
	b, err := in.Peek(8)
	if err != nil {
		return perrors.NewProtocolErrorWithErrMsg(err, fmt.Sprintf("safecodec: reading the message header: %s", err))
	}
	if binary.BigEndian.Uint32(b)&0xffff0000 != thriftVersion1 {
		return nil // not Thrift binary: Kitex's codec decides
	}
	n := int32(binary.BigEndian.Uint32(b[4:]))
	if n < 0 || n > MaxMethodNameBytes {
		return perrors.NewProtocolErrorWithType(perrors.InvalidData,
			fmt.Sprintf("safecodec: method name length %d outside [0, %d]", n, MaxMethodNameBytes))
	}
	if pl := msg.PayloadLen(); pl > 0 && int(n)+12 > pl {
		return perrors.NewProtocolErrorWithType(perrors.InvalidData,
			fmt.Sprintf("safecodec: method name length %d exceeds the frame of %d bytes", n, pl))
	}
	return nil
}

// DecodePayload implements remote.MetaDecoder. A server serves one
// service here, so a method it cannot find is an unknown method: Kitex
// reports it as "unknown service" (its exception type 20, which standard
// Thrift clients do not know); it is answered with Thrift's standard
// UNKNOWN_METHOD (1) instead.
func (c *Codec) DecodePayload(ctx context.Context, msg remote.Message, in remote.ByteBuffer) error {
	if msg.PayloadLen() == 0 && c.maxSize > 0 {
		// Unframed ("buffered") Thrift states no length: Kitex's size
		// limit never sees it, so the reads are counted here.
		in = &capped{ByteBuffer: in, start: in.ReadLen(), max: c.maxSize}
	}
	// Kitex makes the arguments (msg.Data) once it has read the method
	// name, inside DecodePayload: a large frame is lent before it is known
	// whether they borrow from it, and given back at once if they do not.
	var loans *Loans
	if msg.PayloadLen() >= minLend {
		var err error
		if in, loans, err = lend(ctx, msg, in); err != nil {
			return err
		}
	}
	err := c.meta.DecodePayload(ctx, msg, in)
	bw, borrows := msg.Data().(Borrower)
	switch {
	case borrows && loans == nil:
		// The values point into a buffer Kitex releases when this returns.
		bw.OwnValues()
	case !borrows && loans != nil:
		loans.releaseLast()
	}
	var te *remote.TransError
	if errors.As(err, &te) && te.TypeID() == remote.UnknownService {
		method := ""
		if ri := msg.RPCInfo(); ri != nil && ri.Invocation() != nil {
			method = ri.Invocation().MethodName()
		}
		return remote.NewTransErrorWithMsg(remote.UnknownMethod, fmt.Sprintf("unknown method %s", method))
	}
	return err
}

// Name implements remote.Codec.
func (c *Codec) Name() string { return "tidepool-safe" }

// capped refuses to read more than max bytes past start. It hides the
// netpoll reader of the buffer it wraps, so that Kitex's skip decoder
// reads through it too.
type capped struct {
	remote.ByteBuffer
	start, max int
}

func (c *capped) check(n int) error {
	if n < 0 || c.ByteBuffer.ReadLen()-c.start+n > c.max {
		return perrors.NewProtocolErrorWithType(perrors.InvalidData,
			fmt.Sprintf("safecodec: unframed request exceeds %d bytes", c.max))
	}
	return nil
}

func (c *capped) Next(n int) ([]byte, error) {
	if err := c.check(n); err != nil {
		return nil, err
	}
	return c.ByteBuffer.Next(n)
}

func (c *capped) Peek(n int) ([]byte, error) {
	if err := c.check(n); err != nil {
		return nil, err
	}
	return c.ByteBuffer.Peek(n)
}

func (c *capped) Skip(n int) error {
	if err := c.check(n); err != nil {
		return err
	}
	return c.ByteBuffer.Skip(n)
}

func (c *capped) ReadString(n int) (string, error) {
	if err := c.check(n); err != nil {
		return "", err
	}
	return c.ByteBuffer.ReadString(n)
}

func (c *capped) ReadBinary(p []byte) (int, error) {
	if err := c.check(len(p)); err != nil {
		return 0, err
	}
	return c.ByteBuffer.ReadBinary(p)
}

func (c *capped) Read(p []byte) (int, error) {
	if err := c.check(len(p)); err != nil {
		return 0, err
	}
	return c.ByteBuffer.Read(p)
}
