package client

import (
	"bufio"
	"context"
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
	"github.com/tidepool-kv/tidepool/protocol/thriftstream"
)

// Get and AppendGet do not go through Kitex. Kitex reads a whole reply
// into netpoll's buffers before it decodes it, so a block crossed the
// socket into those buffers and was then copied into dst: a profile of 16
// callers of 1 MiB gets put that second copy at 14 % of all CPU. AppendGet
// writes its request on a connection of its own (the same binary
// protocol, unframed, that Kitex and the plain Thrift clients speak) and
// reads the reply as a stream: the value's bytes go from the socket
// straight into dst, one copy in all, as a Redis client reads a bulk
// string.

// rawConn is one connection of the pool of Get and AppendGet.
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

// rawPool keeps idle connections (those of Get and AppendGet, or of the
// put socket).
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
		return nil, false, errClientClosed
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
		return nil, false, dialError{fmt.Errorf("tidepool: dial %s: %w", p.socket, err)}
	}
	if uc, ok := conn.(*net.UnixConn); ok {
		_ = uc.SetWriteBuffer(requestSendBuffer) // best effort, as sndbufDialer
	}
	return &rawConn{conn: conn, r: bufio.NewReaderSize(conn, rawReadBuffer)}, false, nil
}

// dialError marks a failure to connect, as against one of a call.
type dialError struct{ err error }

func (e dialError) Error() string { return e.err.Error() }
func (e dialError) Unwrap() error { return e.err }

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

// rawGet is one Get on a pooled connection, its value appended to dst. On
// an error the result is empty: the caller keeps dst.
func (c *Client) rawGet(ctx context.Context, dst []byte, req *tp.GetRequest) (res appendGet, err error) {
	err = c.raw.call(ctx, func(conn *rawConn) (replied bool, err error) {
		res, replied, err = conn.get(ctx, &c.raw, dst, req)
		return replied, err
	})
	if err != nil {
		return appendGet{}, err
	}
	return res, nil
}

// call makes one call with do on a pooled connection. A pooled connection
// the sidecar closed while it was idle (its idle timeout, a restart) fails
// before any byte of a reply arrives: the call is then made once more, on
// a new connection (the other idle ones are likely closed too). do reports
// whether any byte of a reply arrived (after which a call is not
// repeated).
func (p *rawPool) call(ctx context.Context, do func(conn *rawConn) (replied bool, err error)) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("tidepool: %w", err)
	}
	for attempt := 0; ; attempt++ {
		conn, pooled, err := p.get(ctx, attempt > 0)
		if err != nil {
			return err
		}
		// A context that ends without a deadline ends the call too: the
		// connection's deadline moves to the past.
		stop := context.AfterFunc(ctx, func() { conn.conn.SetDeadline(time.Unix(1, 0)) })
		replied, err := do(conn)
		// When the context ended as the call did, its deadline may land
		// on the connection at any time: it is not used again.
		if stop() && err == nil {
			p.put(conn)
			return nil
		}
		conn.conn.Close() // a reply half read, an error of the connection, or a context ending
		if err == nil {
			return nil
		}
		if !pooled || replied || attempt > 0 || ctx.Err() != nil {
			return err
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
	res = appendGet{dst: dst, base: len(dst), maxValue: p.maxValue}
	d := thriftstream.Decoder{R: c.r, What: "reply"}
	if err := readReply(&d, "Get", c.seq, res.readResultField); err != nil {
		var ioe thriftstream.IOError
		if errors.As(err, &ioe) {
			return res, true, c.ioError(ctx, ioe.Err)
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

// readReply reads the message header of the reply to method's call seq,
// then its result struct, each field of which goes to result. A Thrift
// application exception (the server's own failure to handle the call) is
// returned as an error.
func readReply(d *thriftstream.Decoder, method string, seq int32, result func(d *thriftstream.Decoder, t thrift.TType, id int16) error) error {
	typ, name, got, err := d.MessageBegin()
	if err != nil {
		return err
	}
	if name != method {
		return d.Errorf("reply to %q, want %q", name, method)
	}
	if got != seq {
		return d.Errorf("reply sequence %d, want %d", got, seq)
	}
	switch typ {
	case thrift.REPLY:
		return d.ReadStruct(result)
	case thrift.EXCEPTION:
		b, err := d.CaptureStruct()
		if err != nil {
			return err
		}
		ex := thrift.NewApplicationException(0, "")
		if _, err := ex.FastRead(b); err != nil {
			return d.Errorf("application exception: %v", err)
		}
		return ex
	}
	return d.Errorf("message type %d", typ)
}

// readError decodes the declared exception of a result (field 1).
func readError(d *thriftstream.Decoder) (*tp.TidepoolError, error) {
	b, err := d.CaptureStruct()
	if err != nil {
		return nil, err
	}
	e := tp.NewTidepoolError()
	if _, err := e.FastRead(b); err != nil {
		return nil, d.Errorf("error: %v", err)
	}
	return e, nil
}

// readResultField reads one field of the result: the GetResponse (0) or
// the declared exception (1).
func (r *appendGet) readResultField(d *thriftstream.Decoder, t thrift.TType, id int16) (err error) {
	switch {
	case id == 0 && t == thrift.STRUCT:
		r.found, r.dst = false, r.dst[:r.base] // a repeated field replaces
		return d.ReadStruct(r.readStreamResponseField)
	case id == 1 && t == thrift.STRUCT:
		r.err, err = readError(d)
		return err
	}
	return d.Skip(t, 0)
}

// readStreamResponseField reads one field of a GetResponse: found (1),
// value (2) into dst; others are skipped.
func (r *appendGet) readStreamResponseField(d *thriftstream.Decoder, t thrift.TType, id int16) error {
	switch {
	case id == 1 && t == thrift.BOOL:
		b, err := d.Byte()
		r.found = b == 1 // as the generated decoder reads a bool
		return err
	case id == 2 && t == thrift.STRING:
		n, err := d.Length("value", int64(r.maxValue))
		if err != nil {
			return err
		}
		r.dst, err = d.AppendN(r.dst[:r.base], n)
		return err
	}
	return d.Skip(t, 0)
}
