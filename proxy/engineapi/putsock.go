package engineapi

// The put socket: a second Unix socket beside the engine socket that
// serves Put alone, reading each value from the socket straight into its
// arena slot. Through Kitex a 1 MiB inline put is copied three times: the
// client's send into the kernel, the kernel into netpoll's buffers, and
// those buffers into the arena with the CRC-32C. Here the second copy
// lands in the arena itself, checksummed a chunk at a time while the
// chunk is still in cache: two copies, as a Redis SET makes.
//
// The wire is the engine API's own Put call (binary protocol, unframed),
// so any Thrift client can use it. A value is written in place only when
// the request's namespace, key, depth, durable flag and sync_replicas all
// come before it (the Go client's order); otherwise it is read whole and
// put as the engine socket would. One call at a time per connection; the
// connections count toward MaxConnections and IdleTimeout as the engine
// socket's do.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"
	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/crc32c"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/protocol/thriftstream"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/wirecode"
)

// FeaturePutSocket, listed in HelloResponse.features: the file named as
// the engine socket plus PutSocketSuffix, in the same directory, serves
// Put calls whose values go straight into the arenas.
const FeaturePutSocket = "put_socket"

// PutSocketSuffix names the put socket after the engine socket.
const PutSocketSuffix = ".put"

const (
	// putCallTimeout bounds one call once its first byte arrived: reading
	// the rest of the request, and writing the reply.
	putCallTimeout = time.Minute
	// putReadBuffer holds a request's header and small fields; a value's
	// bytes bypass it.
	putReadBuffer = 16 << 10
	// putChunk is how much of a value is read before it is checksummed,
	// small enough to be checksummed from the cache.
	putChunk = 128 << 10
	// putSlotMargin is how long before its slot's deadline a value must
	// have arrived (at most a quarter of the time the slot was given): a
	// read into the slot never starts later, so that the kernel never
	// writes into memory the tier may have given to another block.
	putSlotMargin = 5 * time.Second
)

// putServer serves the put socket.
type putServer struct {
	sockConns
	p     *proxy.Proxy
	conns *connTracker
	obs   Observer
	// maxRequest bounds the bytes one call may read (MaxRequestBytes).
	maxRequest int64
	// ahead is the bytes of arena slots reserved for values whose bytes
	// have not all arrived, all connections together; maxAhead bounds it
	// (Config.PutReserveAhead). A value that would pass the bound is read
	// whole first, so that claimed lengths alone evict at most maxAhead.
	ahead    atomic.Int64
	maxAhead int64
}

func newPutServer(ln net.Listener, p *proxy.Proxy, conns *connTracker, cfg Config, lg *zap.Logger) *putServer {
	return &putServer{sockConns: newSockConns(ln, lg, "put socket", cfg.DrainTimeout, cfg.FDGuard), p: p, conns: conns, obs: cfg.Observer,
		maxRequest: int64(cfg.MaxRequestBytes), maxAhead: cfg.PutReserveAhead}
}

func (s *putServer) start() { s.sockConns.start(s.admit) }

// admit starts serving a connection accepted on the put socket.
func (s *putServer) admit(conn net.Conn) {
	if uc, ok := conn.(*net.UnixConn); ok {
		_ = uc.SetReadBuffer(replySendBuffer) // best effort: a 1 MiB request in one read
	}
	ctx, err := s.conns.OnActive(context.Background(), conn)
	if err != nil { // over MaxConnections
		s.conns.OnInactive(ctx, conn)
		conn.Close()
		return
	}
	pc := &sockConn{conn: conn}
	if !s.add(pc) {
		s.conns.OnInactive(ctx, conn)
		conn.Close()
		return
	}
	go s.serve(ctx, pc)
}

// serve answers pc's calls one after another until it closes, idles out,
// sends what does not parse, or the server closes.
func (s *putServer) serve(ctx context.Context, pc *sockConn) {
	defer func() {
		s.conns.OnInactive(ctx, pc.conn)
		pc.conn.Close()
		s.done(pc)
	}()
	lr := &limitReader{r: pc.conn}
	var callDeadline time.Time
	r := bufio.NewReaderSize(lr, putReadBuffer)
	d := &thriftstream.Decoder{R: r, What: "request"}
	var w []byte
	for {
		// Idle until a request's first byte (the tracker's reaper closes
		// the connection after IdleTimeout; close wakes it too).
		if !s.idle(pc) {
			return
		}
		lr.left = s.maxRequest // the next call's allowance (what is buffered came under the last one's)
		if _, err := r.Peek(1); err != nil {
			return
		}
		if !s.begin(pc) {
			return
		}
		_, _ = s.conns.OnRead(ctx, pc.conn)
		callDeadline = time.Now().Add(putCallTimeout)
		_ = pc.conn.SetDeadline(callDeadline)
		var ok bool
		w, ok = s.call(d, w[:0], func(slot time.Time) {
			// Reading into a slot: stop before its deadline.
			_ = pc.conn.SetReadDeadline(earliest(callDeadline, slot))
		}, func(reply []byte) {
			// Answered before the value's bytes (which are then read
			// past): the client learns at once.
			_, _ = pc.conn.Write(reply)
		})
		if len(w) > 0 {
			if _, err := pc.conn.Write(w); err != nil {
				ok = false
			}
		}
		_, _ = s.conns.Write(ctx, pc.conn, nil)
		if closing := s.end(pc); !ok || closing {
			return
		}
	}
}

// call reads one request and appends its reply to w. ok is false when the
// connection must close: the request did not parse (the reply is then an
// application exception, when one can be sent) or the stream failed.
func (s *putServer) call(d *thriftstream.Decoder, w []byte, slotDeadline func(time.Time), send func([]byte)) (_ []byte, ok bool) {
	typ, method, seq, err := d.MessageBegin()
	if err != nil {
		return exception(w, method, seq, err), false
	}
	if typ != thrift.CALL || method != "Put" {
		// Another call: refused as a Thrift server refuses a method it
		// lacks, after reading past its arguments.
		err := d.Skip(thrift.STRUCT, 0)
		msg := fmt.Sprintf("the put socket serves Put calls only, not %q (message type %d): use the engine socket", method, typ)
		if err != nil {
			return exception(w, method, seq, err), false
		}
		return exception(w, method, seq, thrift.NewApplicationException(thrift.UNKNOWN_METHOD, msg)), true
	}
	start := time.Now()
	req := putRequest{s: s, slotDeadline: slotDeadline}
	req.answerNow = func(err error) {
		send(putReply(nil, method, seq, false, err))
		if s.obs != nil {
			s.obs("Put", time.Since(start), wirecode.Code(err).String())
		}
	}
	seen := false
	err = d.ReadStruct(func(d *thriftstream.Decoder, t thrift.TType, id int16) error {
		if id == 1 && t == thrift.STRUCT {
			if seen {
				// A generated decoder would keep the second alone; the
				// first may already be in its slot: refused whole.
				req.fail(fmt.Errorf("%w: the call carries its request twice", proxy.ErrInvalidArgument))
				return d.Skip(t, 0)
			}
			seen = true
			return d.ReadStruct(req.field)
		}
		return d.Skip(t, 0)
	})
	if err != nil {
		req.abort()
		if req.answered {
			return w, false // the stream failed after the answer
		}
		return exception(w, method, seq, err), false
	}
	if req.answered {
		req.abort()
		return w, true
	}
	existed, perr := req.finish()
	if s.obs != nil {
		s.obs("Put", time.Since(start), wirecode.Code(perr).String())
	}
	return putReply(w, method, seq, existed, perr), true
}

// putReply appends the reply to a Put: existed, or err.
func putReply(w []byte, method string, seq int32, existed bool, err error) []byte {
	res := tp.TidepoolPutResult{}
	if err != nil {
		res.Err = toThrift(err).(*tp.TidepoolError)
	} else {
		res.Success = &tp.PutResponse{Existed: existed}
	}
	w = thrift.Binary.AppendMessageBegin(w, method, thrift.REPLY, seq)
	n := len(w)
	w = append(w, make([]byte, res.BLength())...)
	res.FastWriteNocopy(w[n:], nil)
	return w
}

// exception appends an application exception for a request that did not
// parse, or nothing when the stream itself failed (there is no one to
// answer).
func exception(w []byte, method string, seq int32, err error) []byte {
	var ioe thriftstream.IOError
	if errors.As(err, &ioe) {
		return w
	}
	var ex *thrift.ApplicationException
	if !errors.As(err, &ex) {
		ex = thrift.NewApplicationException(thrift.PROTOCOL_ERROR, err.Error())
	}
	w = thrift.Binary.AppendMessageBegin(w, method, thrift.EXCEPTION, seq)
	n := len(w)
	w = append(w, make([]byte, ex.BLength())...)
	ex.FastWriteNocopy(w[n:], nil)
	return w
}

// earliest returns the earlier of two times.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// limitReader reads from r until left bytes have been read; then it
// fails, which ends the call and closes the connection.
type limitReader struct {
	r    io.Reader
	left int64
}

func (l *limitReader) Read(b []byte) (int, error) {
	if l.left <= 0 {
		return 0, errRequestTooLarge
	}
	if int64(len(b)) > l.left {
		b = b[:l.left]
	}
	n, err := l.r.Read(b)
	l.left -= int64(n)
	return n, err
}

var errRequestTooLarge = errors.New("engineapi: put socket: request over max_request_size")

// putRequest is a PutRequest as its fields arrive.
type putRequest struct {
	s *putServer
	// slotDeadline bounds the connection's reads by the slot's deadline.
	slotDeadline func(time.Time)
	// answerNow sends the reply for err before the rest of the request
	// is read (past); answered records that it was.
	answerNow func(err error)
	answered  bool
	ns        []byte
	key       []byte
	// seen marks the fields read so far, by id.
	seen uint8
	opts cache.PutOptions

	// The value: written in place (pending, with its checksum), read whole
	// (value), or neither (dropped: a present key, or an error).
	pending  *proxy.PendingPut
	crc      uint32
	value    []byte
	hasValue bool
	existed  bool
	// err is the request's error, known before its end (a field over its
	// limit, a refused reservation); the rest of it is read and dropped.
	err error
}

const inPlaceFields = 1<<1 | 1<<2 | 1<<4 | 1<<5 | 1<<6 // ns, key, depth, durable, sync_replicas

func (q *putRequest) field(d *thriftstream.Decoder, t thrift.TType, id int16) error {
	cfg := q.s.p.Config()
	if q.pending != nil && id > 0 && id < 8 && inPlaceFields&(1<<id) != 0 {
		// The slot was reserved with this field's earlier value; a
		// generated decoder would keep the later one.
		q.fail(fmt.Errorf("%w: field %d of the request comes again after its value", proxy.ErrInvalidArgument, id))
	}
	switch {
	case id == 1 && t == thrift.STRING:
		return q.str(d, &q.ns, "namespace", int64(cfg.MaxNamespaceBytes), 1)
	case id == 2 && t == thrift.STRING:
		return q.str(d, &q.key, "key", int64(cfg.MaxKeyBytes), 2)
	case id == 3 && t == thrift.STRING:
		return q.readValue(d, cfg.MaxValueBytes)
	case id == 4 && t == thrift.I32:
		v, err := d.I32()
		q.opts.Depth, q.seen = v, q.seen|1<<4
		return err
	case id == 5 && t == thrift.BOOL:
		b, err := d.Byte()
		q.opts.Durable, q.seen = b == 1, q.seen|1<<5 // as the generated decoder reads a bool
		return err
	case id == 6 && t == thrift.I32:
		v, err := d.I32()
		q.opts.SyncReplicas, q.seen = int(v), q.seen|1<<6
		return err
	case id == 7 && t == thrift.LIST:
		return q.tokens(d)
	case id == 8 && t == thrift.STRING:
		q.meta()
		return q.str(d, &q.opts.Meta.Parent, "parent_key", int64(cfg.MaxKeyBytes), 0)
	case id == 9 && t == thrift.I32:
		v, err := d.I32()
		q.meta().BlockSize = v
		return err
	}
	return d.Skip(t, 0)
}

// meta is the request's block description, made at its first field.
func (q *putRequest) meta() *cache.BlockMeta {
	if q.opts.Meta == nil {
		q.opts.Meta = &cache.BlockMeta{}
	}
	return q.opts.Meta
}

// tokens reads token_ids (a list of i32): at most proxy.MaxBlockTokens of
// them, a longer list is read past and fails the request.
func (q *putRequest) tokens(d *thriftstream.Decoder) error {
	et, err := d.Byte()
	if err != nil {
		return err
	}
	n, err := d.I32()
	if err != nil {
		return err
	}
	if n < 0 {
		return d.Errorf("token_ids of %d items", n)
	}
	if thrift.TType(et) != thrift.I32 || n > proxy.MaxBlockTokens {
		q.fail(fmt.Errorf("%w: token_ids: %d items of type %d (at most %d i32)", proxy.ErrInvalidArgument, n, et, proxy.MaxBlockTokens))
		for range n {
			if err := d.Skip(thrift.TType(et), 0); err != nil {
				return err
			}
		}
		return nil
	}
	m := q.meta()
	m.Tokens = make([]uint32, 0, n)
	for range n {
		v, err := d.I32()
		if err != nil {
			return err
		}
		m.Tokens = append(m.Tokens, uint32(v))
	}
	return nil
}

// str reads a string field of at most limit bytes; a longer one is read
// past and fails the request.
func (q *putRequest) str(d *thriftstream.Decoder, dst *[]byte, what string, limit int64, id uint) error {
	n, err := d.I32()
	if err != nil {
		return err
	}
	if n < 0 {
		return d.Errorf("%s of %d bytes", what, n)
	}
	q.seen |= 1 << id
	if int64(n) > limit {
		q.fail(fmt.Errorf("%w: %s is %d bytes, limit %d", proxy.ErrInvalidArgument, what, n, limit))
		return d.Discard(int(n))
	}
	*dst, err = d.AppendN((*dst)[:0], int(n))
	return err
}

// fail records the request's first error.
func (q *putRequest) fail(err error) {
	if q.err == nil {
		q.err = err
	}
}

// readValue reads the value: into its arena slot when everything the
// reservation needs came first, else whole.
func (q *putRequest) readValue(d *thriftstream.Decoder, limit int64) error {
	n, err := d.I32()
	if err != nil {
		return err
	}
	if n < 0 {
		return d.Errorf("value of %d bytes", n)
	}
	if q.hasValue {
		q.fail(fmt.Errorf("%w: the request carries its value twice", proxy.ErrInvalidArgument))
	}
	q.hasValue = true
	if int64(n) > limit {
		// Answered at once, before the claimed bytes, which are then
		// read past (up to max_request_size) to keep the stream.
		q.fail(fmt.Errorf("%w: value is %d bytes, limit %d", cache.ErrTooLarge, n, limit))
		if !q.answered {
			q.answered = true
			q.answerNow(q.err)
		}
		return d.Discard(int(n))
	}
	if q.err != nil {
		return d.Discard(int(n))
	}
	if q.seen&inPlaceFields == inPlaceFields && q.s.takeAhead(int64(n)) {
		pp, existed, err := q.s.p.ReservePut(q.ctx(), string(q.ns), q.key, int64(n), q.opts)
		switch {
		case err == nil && existed:
			q.s.ahead.Add(-int64(n))
			q.existed = true
			return d.Discard(int(n))
		case err == nil:
			q.pending = pp
			margin := min(putSlotMargin, time.Until(pp.Deadline())/4)
			q.slotDeadline(pp.Deadline().Add(-margin))
			err := q.fill(d, pp.Bytes())
			q.s.ahead.Add(-int64(n)) // arrived, or the request ends
			return err
		case !errors.Is(err, proxy.ErrNoStream):
			q.s.ahead.Add(-int64(n))
			q.fail(err)
			return d.Discard(int(n))
		}
		q.s.ahead.Add(-int64(n))
	}
	q.value, err = d.AppendN(q.value[:0], int(n))
	return err
}

// takeAhead counts n bytes of a slot reserved ahead of its value's bytes,
// unless that would pass maxAhead; the caller gives them back once the
// value has arrived (or not). Refused, the value is read whole first and
// takes room only as its bytes arrive.
func (s *putServer) takeAhead(n int64) bool {
	if s.ahead.Add(n) > s.maxAhead {
		s.ahead.Add(-n)
		return false
	}
	return true
}

// fill reads the value into dst a chunk at a time, checksumming each chunk
// as it lands.
func (q *putRequest) fill(d *thriftstream.Decoder, dst []byte) error {
	var crc uint32
	for off := 0; off < len(dst); {
		end := min(off+putChunk, len(dst))
		if err := d.ReadFull(dst[off:end]); err != nil {
			return err
		}
		crc = crc32c.Update(crc, dst[off:end])
		off = end
	}
	q.crc = crc
	return nil
}

// ctx is the call's context.
func (q *putRequest) ctx() context.Context { return context.Background() }

// abort drops a value written in place for a request that did not end.
func (q *putRequest) abort() {
	if q.pending != nil {
		q.pending.Abort()
		q.pending = nil
	}
}

// finish stores the request's block once all of it has arrived.
func (q *putRequest) finish() (existed bool, err error) {
	if q.err != nil {
		q.abort()
		return false, q.err
	}
	if q.pending != nil {
		pp := q.pending
		q.pending = nil
		if q.opts.Meta != nil {
			// The description came after the value (the generated
			// encoders' field order).
			if err := pp.Describe(q.opts.Meta); err != nil {
				pp.Abort()
				return false, err
			}
		}
		return pp.Commit(q.ctx(), q.crc)
	}
	if q.existed {
		return true, nil
	}
	return q.s.p.Put(q.ctx(), string(q.ns), q.key, q.value, q.opts)
}
