package client

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"

	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
)

// AppendGet's calls do not go through Kitex. Kitex reads a whole reply
// into netpoll's buffers before it decodes it, so a block crossed the
// socket into those buffers and was then copied into dst: a profile of 16
// callers of 1 MiB gets put that second copy at 14 % of all CPU. AppendGet
// writes its request on a connection of its own (the same binary
// protocol, unframed, that Kitex and the plain Thrift clients speak) and
// reads the reply as a stream: the value's bytes go from the socket
// straight into dst, one copy in all, as a Redis client reads a bulk
// string.

// rawConn is one connection of AppendGet's pool.
type rawConn struct {
	conn net.Conn
	r    *bufio.Reader
	w    []byte // the request being written, reused
	seq  int32
}

// rawReadBuffer is the reader's buffer: big enough for a reply's header
// and small fields in one read; a value larger than what is buffered is
// read from the socket straight into dst (bufio reads directly into a
// destination at least this large).
const rawReadBuffer = 16 << 10

// rawPool keeps AppendGet's idle connections.
type rawPool struct {
	socket      string
	dialTimeout time.Duration
	timeout     time.Duration
	maxIdle     int
	maxValue    int

	mu     sync.Mutex
	idle   []*rawConn
	closed bool
}

// get returns an idle connection, or a new one when there is none or fresh
// is set.
func (p *rawPool) get(ctx context.Context, fresh bool) (c *rawConn, pooled bool, err error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, false, &Error{Code: CodeUnavailable, Message: "client closed"}
	}
	if n := len(p.idle); n > 0 && !fresh {
		c = p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return c, true, nil
	}
	p.mu.Unlock()
	d := net.Dialer{Timeout: p.dialTimeout}
	conn, err := d.DialContext(ctx, "unix", p.socket)
	if err != nil {
		return nil, false, fmt.Errorf("tidepool: dial %s: %w", p.socket, err)
	}
	if uc, ok := conn.(*net.UnixConn); ok {
		_ = uc.SetWriteBuffer(requestSendBuffer) // best effort, as sndbufDialer
	}
	return &rawConn{conn: conn, r: bufio.NewReaderSize(conn, rawReadBuffer)}, false, nil
}

// put returns c to the pool, or closes it when the pool is full or closed.
func (p *rawPool) put(c *rawConn) {
	p.mu.Lock()
	if !p.closed && len(p.idle) < p.maxIdle {
		p.idle = append(p.idle, c)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	c.conn.Close()
}

func (p *rawPool) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, c := range idle {
		c.conn.Close()
	}
}

// rawGet is one Get on a pooled connection, its value appended to dst. A
// pooled connection the sidecar closed while it was idle (its idle
// timeout, a restart) fails before any byte of a reply arrives: the call
// is made once more, on a new connection (the other idle ones are likely
// closed too). On an error the result is empty: the caller keeps dst.
func (c *Client) rawGet(ctx context.Context, dst []byte, req *tp.GetRequest) (appendGet, error) {
	if err := ctx.Err(); err != nil {
		return appendGet{}, fmt.Errorf("tidepool: %w", err)
	}
	for attempt := 0; ; attempt++ {
		conn, pooled, err := c.raw.get(ctx, attempt > 0)
		if err != nil {
			return appendGet{}, err
		}
		// A context that ends without a deadline ends the call too: the
		// connection's deadline moves to the past.
		stop := context.AfterFunc(ctx, func() { conn.conn.SetDeadline(time.Unix(1, 0)) })
		res, replied, err := conn.get(ctx, &c.raw, dst, req)
		// When the context ended as the call did, its deadline may land
		// on the connection at any time: it is not used again.
		if stop() && err == nil {
			c.raw.put(conn)
			return res, nil
		}
		conn.conn.Close() // a reply half read, an error of the connection, or a context ending
		if err == nil {
			return res, nil
		}
		if !pooled || replied || attempt > 0 || ctx.Err() != nil {
			return appendGet{}, err
		}
	}
}

// get writes the request and reads its reply. replied reports whether any
// byte of a reply arrived (after which the call is not repeated).
func (c *rawConn) get(ctx context.Context, p *rawPool, dst []byte, req *tp.GetRequest) (res appendGet, replied bool, err error) {
	deadline := time.Now().Add(p.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := c.conn.SetDeadline(deadline); err != nil {
		return res, false, fmt.Errorf("tidepool: %w", err)
	}
	c.seq++
	c.w = appendCall(c.w[:0], "Get", c.seq, &tp.TidepoolGetArgs{Req: req})
	if _, err := c.conn.Write(c.w); err != nil {
		return res, false, c.ioError(ctx, err)
	}
	if _, err := c.r.Peek(1); err != nil {
		return res, false, c.ioError(ctx, err)
	}
	res = appendGet{dst: dst, base: len(dst)}
	d := streamDecoder{r: c.r, maxValue: p.maxValue}
	if err := d.readReply("Get", c.seq, &res); err != nil {
		var ioe ioError
		if errors.As(err, &ioe) {
			return res, true, c.ioError(ctx, ioe.err)
		}
		return res, true, fmt.Errorf("tidepool: %w", err)
	}
	return res, true, nil
}

// ioError words an error of the connection: the context's error when it
// ended the call, else a timeout or the error itself.
func (c *rawConn) ioError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("tidepool: %w", ctx.Err())
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("tidepool: call timed out: %w", context.DeadlineExceeded)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
		return &Error{Code: CodeUnavailable, Message: "connection closed by the sidecar: " + err.Error()}
	}
	return fmt.Errorf("tidepool: %w", err)
}

// appendCall appends a binary-protocol CALL message of method with args
// to b.
func appendCall(b []byte, method string, seq int32, args thrift.FastCodec) []byte {
	b = thrift.Binary.AppendMessageBegin(b, method, thrift.CALL, seq)
	n := len(b)
	b = append(b, make([]byte, args.BLength())...)
	args.FastWriteNocopy(b[n:], nil)
	return b
}

// ioError marks an error of reading the connection, as against a reply
// that reads but does not parse.
type ioError struct{ err error }

func (e ioError) Error() string { return e.err.Error() }
func (e ioError) Unwrap() error { return e.err }

// streamDecoder reads one binary-protocol reply from a stream. It never
// allocates for what a length field claims, only for bytes that arrived,
// and bounds nesting and what it keeps of a skipped value.
type streamDecoder struct {
	r        *bufio.Reader
	maxValue int
	scratch  [8]byte
	// tee, when not nil, receives every byte read (captureStruct).
	tee *[]byte
}

const (
	// maxSkipDepth bounds the nesting of a value the decoder skips.
	maxSkipDepth = 64
	// maxCaptureBytes bounds a value kept whole for a generated decoder
	// (an error struct, an application exception).
	maxCaptureBytes = 1 << 20

	msgVersionMask = 0xffff0000
	msgVersion1    = 0x80010000
)

func protoErr(msg string) error {
	return thrift.NewProtocolException(thrift.INVALID_DATA, "reply: "+msg)
}

// read returns the next n (≤ 8) bytes, valid until the next read.
func (d *streamDecoder) read(n int) ([]byte, error) {
	b := d.scratch[:n]
	if _, err := io.ReadFull(d.r, b); err != nil {
		return nil, ioError{eof(err)}
	}
	return b, d.keep(b)
}

func (d *streamDecoder) byte1() (byte, error) {
	b, err := d.read(1)
	if err != nil {
		return 0, err
	}
	return b[0], nil
}

func (d *streamDecoder) i16() (int16, error) {
	b, err := d.read(2)
	if err != nil {
		return 0, err
	}
	return int16(binary.BigEndian.Uint16(b)), nil
}

func (d *streamDecoder) i32() (int32, error) {
	b, err := d.read(4)
	if err != nil {
		return 0, err
	}
	return int32(binary.BigEndian.Uint32(b)), nil
}

// keep appends b to the capture, if one is on.
func (d *streamDecoder) keep(b []byte) error {
	if d.tee == nil {
		return nil
	}
	if len(*d.tee)+len(b) > maxCaptureBytes {
		return protoErr(fmt.Sprintf("a field the client decodes whole is over %d bytes", maxCaptureBytes))
	}
	*d.tee = append(*d.tee, b...)
	return nil
}

// discard skips the next n bytes (into the capture, if one is on).
func (d *streamDecoder) discard(n int) error {
	if d.tee != nil {
		if len(*d.tee)+n > maxCaptureBytes {
			return protoErr(fmt.Sprintf("a field the client decodes whole is over %d bytes", maxCaptureBytes))
		}
		var err error
		*d.tee, err = d.appendN(*d.tee, n)
		return err
	}
	if k, err := d.r.Discard(n); err != nil || k < n {
		return ioError{eof(err)}
	}
	return nil
}

// eof turns the end of the stream inside a reply into ErrUnexpectedEOF.
func eof(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// readReply reads the message header of the reply to method's call seq,
// then its result struct into res. A Thrift application exception (the
// server's own failure to handle the call) is returned as an error.
func (d *streamDecoder) readReply(method string, seq int32, res *appendGet) error {
	v, err := d.i32()
	if err != nil {
		return err
	}
	if uint32(v)&msgVersionMask != msgVersion1 {
		return protoErr(fmt.Sprintf("message header %#x: not the strict binary protocol", uint32(v)))
	}
	typ := thrift.TMessageType(v & 0xffff)
	n, err := d.i32()
	if err != nil {
		return err
	}
	if n < 0 || n > 64 {
		return protoErr(fmt.Sprintf("method name of %d bytes", n))
	}
	name := make([]byte, 0, n)
	if name, err = d.appendN(name, int(n)); err != nil {
		return err
	}
	if string(name) != method {
		return protoErr(fmt.Sprintf("reply to %q, want %q", name, method))
	}
	got, err := d.i32()
	if err != nil {
		return err
	}
	if got != seq {
		return protoErr(fmt.Sprintf("reply sequence %d, want %d", got, seq))
	}
	switch typ {
	case thrift.REPLY:
		return d.readStruct(res.readResultField)
	case thrift.EXCEPTION:
		b, err := d.captureStruct()
		if err != nil {
			return err
		}
		ex := thrift.NewApplicationException(0, "")
		if _, err := ex.FastRead(b); err != nil {
			return protoErr("application exception: " + err.Error())
		}
		return ex
	}
	return protoErr(fmt.Sprintf("message type %d", typ))
}

// readStruct reads the fields of a struct up to its stop byte, calling
// field for each with its type and id; field reads (or skips) its value.
func (d *streamDecoder) readStruct(field func(d *streamDecoder, t thrift.TType, id int16) error) error {
	for {
		t, err := d.byte1()
		if err != nil {
			return err
		}
		if thrift.TType(t) == thrift.STOP {
			return nil
		}
		id, err := d.i16()
		if err != nil {
			return err
		}
		if err := field(d, thrift.TType(t), id); err != nil {
			return err
		}
	}
}

// readResultField reads one field of the result: the GetResponse (0) or
// the declared exception (1).
func (r *appendGet) readResultField(d *streamDecoder, t thrift.TType, id int16) error {
	switch {
	case id == 0 && t == thrift.STRUCT:
		r.found, r.dst = false, r.dst[:r.base] // a repeated field replaces
		return d.readStruct(r.readStreamResponseField)
	case id == 1 && t == thrift.STRUCT:
		b, err := d.captureStruct()
		if err != nil {
			return err
		}
		r.err = tp.NewTidepoolError()
		if _, err := r.err.FastRead(b); err != nil {
			return protoErr("error: " + err.Error())
		}
		return nil
	}
	return d.skip(t, 0)
}

// readStreamResponseField reads one field of a GetResponse: found (1),
// value (2) into dst; others are skipped.
func (r *appendGet) readStreamResponseField(d *streamDecoder, t thrift.TType, id int16) error {
	switch {
	case id == 1 && t == thrift.BOOL:
		b, err := d.byte1()
		r.found = b == 1 // as the generated decoder reads a bool
		return err
	case id == 2 && t == thrift.STRING:
		n, err := d.i32()
		if err != nil {
			return err
		}
		if n < 0 || int64(n) > int64(d.maxValue) {
			return protoErr(fmt.Sprintf("value of %d bytes (MaxResponseBytes %d)", n, d.maxValue))
		}
		r.dst, err = d.appendN(r.dst[:r.base], int(n))
		return err
	}
	return d.skip(t, 0)
}

// appendN appends the next n bytes of the stream to dst. Room is made as
// bytes arrive (at most what has arrived again, from 64 KiB), not for
// what n claims. A read of at least the reader's buffer size goes from
// the socket straight into dst.
func (d *streamDecoder) appendN(dst []byte, n int) ([]byte, error) {
	end := len(dst) + n
	for len(dst) < end {
		if len(dst) == cap(dst) {
			grow := min(end-len(dst), max(len(dst), 64<<10))
			dst = append(dst, make([]byte, grow)...)[:len(dst)]
		}
		k, err := d.r.Read(dst[len(dst):min(cap(dst), end)])
		dst = dst[:len(dst)+k]
		if err != nil && len(dst) < end {
			return dst, ioError{eof(err)}
		}
	}
	return dst, nil
}

// captureStruct reads a struct whole and returns its encoding (its fields
// and stop byte), for a generated decoder. Its fields are skipped as the
// generated decoder skips them: each from depth 0.
func (d *streamDecoder) captureStruct() ([]byte, error) {
	var buf []byte
	d.tee = &buf
	defer func() { d.tee = nil }()
	if err := d.skipStruct(-1); err != nil {
		return nil, err
	}
	return buf, nil
}

// skip reads past a value of type t.
func (d *streamDecoder) skip(t thrift.TType, depth int) error {
	if depth >= maxSkipDepth {
		return protoErr("nested too deep")
	}
	switch t {
	case thrift.BOOL, thrift.BYTE:
		return d.discard(1)
	case thrift.I16:
		return d.discard(2)
	case thrift.I32:
		return d.discard(4)
	case thrift.I64, thrift.DOUBLE:
		return d.discard(8)
	case thrift.STRING:
		n, err := d.i32()
		if err != nil {
			return err
		}
		if n < 0 {
			return protoErr(fmt.Sprintf("string of %d bytes", n))
		}
		return d.discard(int(n))
	case thrift.STRUCT:
		return d.skipStruct(depth)
	case thrift.MAP:
		// An element type of 0x80 and above is refused even in an empty
		// container, as the generated decoder refuses it; another unknown
		// type fails when an element of it is read.
		kt, err := d.byte1()
		if err != nil {
			return err
		}
		vt, err := d.byte1()
		if err != nil {
			return err
		}
		n, err := d.i32()
		if err != nil {
			return err
		}
		if n < 0 || kt >= 0x80 || vt >= 0x80 {
			return protoErr(fmt.Sprintf("map<%d,%d> of %d entries", kt, vt, n))
		}
		// Every value takes at least one byte of the stream, so a count
		// that claims more than arrives ends in a read error, not a loop
		// without input.
		for range n {
			if err := d.skip(thrift.TType(kt), depth+1); err != nil {
				return err
			}
			if err := d.skip(thrift.TType(vt), depth+1); err != nil {
				return err
			}
		}
		return nil
	case thrift.SET, thrift.LIST:
		et, err := d.byte1()
		if err != nil {
			return err
		}
		n, err := d.i32()
		if err != nil {
			return err
		}
		if n < 0 || et >= 0x80 {
			return protoErr(fmt.Sprintf("list<%d> of %d elements", et, n))
		}
		for range n {
			if err := d.skip(thrift.TType(et), depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	return protoErr(fmt.Sprintf("unknown data type %d", t))
}

func (d *streamDecoder) skipStruct(depth int) error {
	return d.readStruct(func(d *streamDecoder, t thrift.TType, _ int16) error { return d.skip(t, depth+1) })
}
