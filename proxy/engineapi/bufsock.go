package engineapi

// The buffer socket: a third Unix socket beside the engine socket through
// which an engine shares memory of its own with the sidecar (a sealed
// memfd, passed as SCM_RIGHTS) and then reads blocks into it and puts
// blocks from it. A block in this node's tiers is copied there by the
// sidecar; a block another node holds lands there from the network
// (proxy.GetInto), so a remote read costs no copy into this node's arenas
// and none by the client — what Mooncake's registered buffers give its
// clients. A put is copied into its arena slot and checksummed in the
// same pass (proxy.PutFrom).
//
// Registrations belong to the connection that made them and end with it.
// One call at a time per connection. The wire (docs/zerocopy.md,
// "Registered buffers"); integers big-endian:
//
//	request: u8 op, u8 version (1), u16 zero, u32 body length, body
//	  REGISTER (1):   u64 size; one descriptor with the request's first byte
//	  GET (2):        u64 buffer id, u64 offset, u64 length, u8 scope,
//	                  u16 + namespace, u16 + key
//	  UNREGISTER (3): u64 buffer id
//	  PUT (4):        u64 buffer id, u64 offset, u64 length, i32 depth,
//	                  u8 flags, i32 sync_replicas, u32 checksum,
//	                  u16 + namespace, u16 + key
//	  BATCH_GET (5):  u64 buffer id, u8 scope, u16 + namespace, u16 count,
//	                  count × (u64 offset, u64 length, u16 + key)
//	  BATCH_PUT (6):  u64 buffer id, u8 flags, i32 sync_replicas,
//	                  u16 + namespace, u16 count, count × (u64 offset,
//	                  u64 length, i32 depth, u8 has checksum, u32 checksum,
//	                  u16 + key)
//	answer: u16 code, u16 message length, u32 checksum, u64 value, message;
//	  a batch answered OK: value items of (u16 code, u32 checksum, u64 value)
//
// A registered file must be sealed against shrinking (F_SEAL_SHRINK) and
// fully allocated: a write into a mapping whose file shrank, or into a
// hole the file system cannot fill, would fault this process. Faults in
// the calls' own goroutines are turned into errors all the same
// (debug.SetPanicOnFault), and the connection is dropped with its
// buffers.

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/fdlimit"
	"github.com/tidepool-kv/tidepool/internal/memfd"
	"github.com/tidepool-kv/tidepool/internal/wire"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/wirecode"
)

// FeatureBufferSocket, listed in HelloResponse.features: the file named
// as the engine socket plus BufferSocketSuffix serves registered buffers.
const FeatureBufferSocket = "buffer_socket"

// BufferSocketSuffix names the buffer socket after the engine socket.
const BufferSocketSuffix = ".buf"

// Buffer socket ops and bounds.
const (
	bufOpRegister   = 1
	bufOpGet        = 2
	bufOpUnregister = 3
	bufOpPut        = 4
	bufOpBatchGet   = 5
	bufOpBatchPut   = 6
	bufVersion      = 1
	bufHeader       = 8
	bufAnswerHead   = 16
	// bufMaxBody bounds a request's body (a batch of keys); a body is
	// read bufBodyChunk at a time, its buffer growing as bytes arrive.
	bufMaxBody   = 1 << 20
	bufBodyChunk = 64 << 10
	// Put flags.
	bufDurable  = 1 << 0
	bufChecksum = 1 << 1
	// bufMaxMsg bounds an answer's message.
	bufMaxMsg = 1024
	// MaxBufferBytes bounds one registered buffer.
	MaxBufferBytes = 64 << 30
	// bufCallTimeout bounds one call once its first byte arrived (the
	// whole batch, every read into the buffer included), and
	// bufAnswerTimeout the write of its answer after that.
	bufCallTimeout   = time.Minute
	bufAnswerTimeout = 10 * time.Second
)

// bufServer serves the buffer socket.
type bufServer struct {
	sockConns
	p          *proxy.Proxy
	obs        Observer
	guard      *fdlimit.Guard
	maxConns   int
	maxPerConn int // Config.MaxBuffersPerConn
	maxBufs    int // Config.MaxBuffers
	refused    atomic.Uint64
	registered atomic.Int64  // buffers mapped now, all connections
	fdsRefused atomic.Uint64 // descriptors closed on arrival
}

// bufConn is one connection and the buffers it registered.
type bufConn struct {
	sockConn
	uc   *net.UnixConn
	bufs map[uint64][]byte
	// fd is the descriptor that came with this request's first byte (-1:
	// none), until a REGISTER claims it or the request ends.
	fd int
	// fdErr, once set, refuses the request: a descriptor came where the
	// protocol has none, or would have entered the process's reserve.
	// Such descriptors are closed as they arrive.
	fdErr error
}

func newBufServer(ln net.Listener, p *proxy.Proxy, cfg Config, lg *zap.Logger) *bufServer {
	return &bufServer{sockConns: newSockConns(ln, lg, "buffer socket", cfg.DrainTimeout, cfg.FDGuard), p: p, obs: cfg.Observer,
		guard: cfg.FDGuard, maxConns: cfg.MaxConnections, maxPerConn: cfg.MaxBuffersPerConn, maxBufs: cfg.MaxBuffers}
}

// BufferStats counts the buffer socket's registered buffers and the
// descriptors it refused.
type BufferStats struct {
	// Registered is buffers mapped now, all connections together.
	Registered int64
	// DescriptorsRefused counts descriptors closed as they arrived: more
	// than one with a request, one with a byte other than a request's
	// first or with a request other than REGISTER, or one that would
	// have entered the descriptor reserve.
	DescriptorsRefused uint64
}

func (s *bufServer) start() { s.sockConns.start(s.admit) }

// admit starts serving a connection accepted on the buffer socket, unless
// MaxConnections of them are open.
func (s *bufServer) admit(conn net.Conn) {
	uc, ok := conn.(*net.UnixConn)
	if !ok || s.open() >= s.maxConns {
		s.refused.Add(1)
		conn.Close()
		return
	}
	bc := &bufConn{sockConn: sockConn{conn: conn}, uc: uc, bufs: make(map[uint64][]byte), fd: -1}
	if !s.add(&bc.sockConn) {
		conn.Close()
		return
	}
	go s.serve(bc)
}

// serve answers bc's calls until it closes, sends what does not parse, or
// the server closes; then its buffers are unmapped.
func (s *bufServer) serve(bc *bufConn) {
	// A fault in a registered mapping (a file that shrank after all)
	// panics here instead of killing the process; call recovers it.
	debug.SetPanicOnFault(true)
	defer func() {
		bc.conn.Close()
		bc.closeFD()
		for id := range bc.bufs {
			s.drop(bc, id)
		}
		s.done(&bc.sockConn)
	}()
	head := make([]byte, bufHeader)
	body := make([]byte, 0, 256)
	for {
		// Idle until a request's first byte: no deadline (the connection
		// holds the registrations); close wakes it.
		if !s.idle(&bc.sockConn) {
			return
		}
		// A descriptor may come with this byte only.
		if err := s.read(bc, head[:1], true); err != nil {
			return
		}
		if !s.begin(&bc.sockConn) {
			return
		}
		// The call, from its first byte, has bufCallTimeout; its answer
		// then has bufAnswerTimeout more to be written.
		callDeadline := time.Now().Add(bufCallTimeout)
		_ = bc.conn.SetDeadline(callDeadline.Add(bufAnswerTimeout))
		if err := s.read(bc, head[1:], false); err != nil {
			return
		}
		op, n := head[0], binary.BigEndian.Uint32(head[4:])
		if bc.fd >= 0 && op != bufOpRegister {
			s.refuseFD(bc, bc.fd, fmt.Errorf("%w: a descriptor came with op %d; only REGISTER carries one", proxy.ErrInvalidArgument, op))
			bc.fd = -1
		}
		var ans []byte
		ok := true
		switch {
		case head[1] != bufVersion || head[2] != 0 || head[3] != 0:
			ans, ok = bufAnswer(tp.ErrorCode_INVALID_ARGUMENT, fmt.Sprintf("buffer socket: version %d (this server speaks %d)", head[1], bufVersion), 0, 0, nil), false
		case n > bufMaxBody:
			ans, ok = bufAnswer(tp.ErrorCode_INVALID_ARGUMENT, fmt.Sprintf("buffer socket: body of %d bytes (max %d)", n, bufMaxBody), 0, 0, nil), false
		default:
			var err error
			if body, err = s.readBody(bc, body[:0], int(n)); err != nil {
				return
			}
			if bc.fdErr != nil {
				// Refused whole, its descriptors closed already; the
				// body was read, so the connection may go on.
				ans = bufAnswer(wirecode.Code(bc.fdErr), "buffer socket: "+bc.fdErr.Error(), 0, 0, nil)
				break
			}
			ctx, cancel := context.WithDeadline(context.Background(), callDeadline)
			ans, ok = s.call(ctx, bc, op, body)
			cancel()
		}
		bc.closeFD() // a descriptor no REGISTER claimed
		bc.fdErr = nil
		if _, err := bc.conn.Write(ans); err != nil {
			return
		}
		if closing := s.end(&bc.sockConn); !ok || closing {
			return
		}
	}
}

// bufItem is one item of a batch answer.
type bufItem struct {
	code  tp.ErrorCode
	sum   uint32
	value uint64
}

// call serves one request. ok is false when it did not parse: the
// connection then closes after the answer.
func (s *bufServer) call(ctx context.Context, bc *bufConn, op byte, body []byte) (ans []byte, ok bool) {
	start := time.Now()
	method := "unknown"
	var (
		code  = tp.ErrorCode_OK
		msg   string
		sum   uint32
		value uint64
		items []bufItem // a batch's answers
		err   error
	)
	defer func() {
		if r := recover(); r != nil {
			// A fault in a registered mapping: its file shrank or could
			// not be filled. The connection and its buffers are dropped.
			code, msg, sum, value, items, ok = tp.ErrorCode_INTERNAL, fmt.Sprintf("buffer socket: fault in a registered buffer: %v", r), 0, 0, nil, false
			s.lg.Warn("buffer socket: fault in a registered buffer; closing the connection", zap.Any("fault", r))
		}
		if s.obs != nil {
			s.obs(method, time.Since(start), code.String())
		}
		ans = bufAnswer(code, msg, sum, value, items)
	}()
	req, derr := decodeBufRequest(op, body)
	method = req.method
	if derr != nil {
		code, msg = tp.ErrorCode_INVALID_ARGUMENT, derr.Error()
		return nil, false
	}
	switch op {
	case bufOpRegister:
		value, err = s.register(bc, req.size)
	case bufOpUnregister:
		if _, held := bc.bufs[req.id]; !held {
			err = fmt.Errorf("%w: no buffer %d on this connection", proxy.ErrInvalidArgument, req.id)
		} else {
			s.drop(bc, req.id)
		}
	case bufOpGet:
		var got int64
		if got, sum, err = s.get(ctx, bc, req.id, req.off, req.n, req.scope, string(req.ns), req.key); err == nil {
			value = uint64(got)
		}
	case bufOpPut:
		var existed bool
		existed, err = s.put(ctx, bc, req.id, req.off, req.n, string(req.ns), req.key, req.opts, req.syncReplicas, req.sum)
		value = b2u(existed)
	case bufOpBatchGet:
		if err = s.checkBatch(len(req.items)); err != nil {
			break
		}
		items = make([]bufItem, len(req.items))
		for i, g := range req.items {
			got, crc, err := s.get(ctx, bc, req.id, g.off, g.n, req.scope, string(req.ns), g.key)
			items[i] = bufItem{code: wirecode.Code(err), sum: crc, value: uint64(got)}
			if err != nil {
				items[i].sum, items[i].value = 0, 0
			}
		}
	case bufOpBatchPut:
		if err = s.checkBatch(len(req.items)); err != nil {
			break
		}
		items = make([]bufItem, len(req.items))
		for i, it := range req.items {
			opts := cache.PutOptions{Depth: it.depth, Durable: req.opts.Durable}
			if i > 0 && it.depth > 0 && it.depth == req.items[i-1].depth+1 {
				opts.Parent = req.items[i-1].key // the chain rule, as BatchPut (proxy.BatchPut)
			}
			existed, err := s.put(ctx, bc, req.id, it.off, it.n, string(req.ns), it.key, opts, req.syncReplicas, it.sum)
			items[i] = bufItem{code: wirecode.Code(err), value: b2u(existed && err == nil)}
		}
	}
	if err != nil {
		code, msg = wirecode.Code(err), err.Error()
		sum, value, items = 0, 0, nil
	}
	return nil, true
}

// bufRequest is a request's body, decoded: the fields its op has.
type bufRequest struct {
	method       string // the op's name in metrics ("unknown" for none)
	size         uint64 // REGISTER
	id           uint64 // the buffer: every op but REGISTER
	off, n       uint64 // GET, PUT: the span of the buffer
	scope        tp.Scope
	ns, key      []byte // key: GET, PUT
	opts         cache.PutOptions
	syncReplicas int32
	sum          *uint32      // PUT: the checksum sent, if any
	items        []bufReqItem // BATCH_GET, BATCH_PUT
}

// bufReqItem is one item of a batch (depth and sum: BATCH_PUT only).
type bufReqItem struct {
	off, n uint64
	depth  int32
	sum    *uint32
	key    []byte
}

// decodeBufRequest decodes the body of a request of op. The error (an
// unknown op, a body that does not parse) is the answer's message; the
// connection then closes. The slices share body's memory; a batch's item
// slice grows by the items actually present, never by the count claimed.
func decodeBufRequest(op byte, body []byte) (bufRequest, error) {
	req := bufRequest{method: "unknown"}
	d := wire.Reader{B: body}
	switch op {
	case bufOpRegister:
		req.method = "RegisterBuffer"
		req.size = d.U64()
	case bufOpUnregister:
		req.method = "UnregisterBuffer"
		req.id = d.U64()
	case bufOpGet:
		req.method = "GetIntoBuffer"
		req.id, req.off, req.n, req.scope = d.U64(), d.U64(), d.U64(), tp.Scope(d.U8())
		req.ns, req.key = d.Str16(), d.Str16()
	case bufOpPut:
		req.method = "PutFromBuffer"
		req.id, req.off, req.n = d.U64(), d.U64(), d.U64()
		req.opts, req.syncReplicas, req.sum = putOpts(&d)
		req.ns, req.key = d.Str16(), d.Str16()
	case bufOpBatchGet:
		req.method = "BatchGetIntoBuffer"
		req.id, req.scope, req.ns = d.U64(), tp.Scope(d.U8()), d.Str16()
		count := d.U16()
		req.items = make([]bufReqItem, 0, min(int(count), len(d.B)/18))
		for range count {
			req.items = append(req.items, bufReqItem{off: d.U64(), n: d.U64(), key: d.Str16()})
			if d.Bad {
				break
			}
		}
	case bufOpBatchPut:
		req.method = "BatchPutFromBuffer"
		id, flags, syncReplicas := d.U64(), d.U8(), int32(d.U32())
		req.id, req.syncReplicas, req.opts.Durable = id, syncReplicas, flags&bufDurable != 0
		req.ns = d.Str16()
		count := d.U16()
		if flags&^bufDurable != 0 {
			d.Bad = true
		}
		req.items = make([]bufReqItem, 0, min(int(count), len(d.B)/27))
		for range count {
			it := bufReqItem{off: d.U64(), n: d.U64(), depth: int32(d.U32())}
			has, crc := d.U8(), d.U32()
			switch has {
			case 0:
			case 1:
				it.sum = &crc
			default:
				d.Bad = true
			}
			it.key = d.Str16()
			req.items = append(req.items, it)
			if d.Bad {
				break
			}
		}
	default:
		return req, fmt.Errorf("buffer socket: unknown op %d", op)
	}
	if !d.Done() {
		return req, fmt.Errorf("buffer socket: malformed %s request", req.method)
	}
	return req, nil
}

// checkBatch refuses a batch over max_batch, as the engine socket does.
func (s *bufServer) checkBatch(n int) error {
	if max := s.p.Config().MaxBatch; n > max {
		return fmt.Errorf("%w: %d items, limit %d", proxy.ErrBatchTooLarge, n, max)
	}
	return nil
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// span returns [off, off+n) of buffer id.
func (bc *bufConn) span(id, off, n uint64) ([]byte, error) {
	mem, ok := bc.bufs[id]
	if !ok {
		return nil, fmt.Errorf("%w: no buffer %d on this connection", proxy.ErrInvalidArgument, id)
	}
	if off > uint64(len(mem)) || n > uint64(len(mem))-off {
		return nil, fmt.Errorf("%w: %d bytes at %d outside a buffer of %d", proxy.ErrInvalidArgument, n, off, len(mem))
	}
	return mem[off : off+n : off+n], nil
}

// get reads (ns, key) into [off, off+n) of buffer id.
func (s *bufServer) get(ctx context.Context, bc *bufConn, id, off, n uint64, sc tp.Scope, ns string, key []byte) (int64, uint32, error) {
	dst, err := bc.span(id, off, n)
	if err != nil {
		return 0, 0, err
	}
	switch sc {
	case tp.Scope_DEFAULT, tp.Scope_LOCAL, tp.Scope_CLUSTER:
	default:
		return 0, 0, fmt.Errorf("%w: scope %d", proxy.ErrInvalidArgument, sc)
	}
	got, info, err := s.p.GetInto(ctx, ns, key, dst, scope(sc))
	return got, info.Checksum, err
}

// put stores [off, off+n) of buffer id as (ns, key).
func (s *bufServer) put(ctx context.Context, bc *bufConn, id, off, n uint64, ns string, key []byte, opts cache.PutOptions, syncReplicas int32, sum *uint32) (bool, error) {
	src, err := bc.span(id, off, n)
	if err != nil {
		return false, err
	}
	opts.SyncReplicas = int(syncReplicas)
	return s.p.PutFrom(ctx, ns, key, src, opts, sum)
}

// register maps the descriptor that came with the request as a buffer of
// size bytes and returns its id.
func (s *bufServer) register(bc *bufConn, size uint64) (uint64, error) {
	if bc.fd < 0 {
		return 0, fmt.Errorf("%w: REGISTER carries no descriptor (SCM_RIGHTS with the request's first byte)", proxy.ErrInvalidArgument)
	}
	fd := bc.fd
	bc.fd = -1
	defer syscall.Close(fd) // the mapping keeps the file
	switch {
	case size == 0 || size > MaxBufferBytes:
		return 0, fmt.Errorf("%w: buffer of %d bytes (1 to %d)", proxy.ErrInvalidArgument, size, uint64(MaxBufferBytes))
	case len(bc.bufs) >= s.maxPerConn:
		return 0, fmt.Errorf("%w: %d buffers on this connection already (buffer_socket_max_buffers_per_conn %d)", proxy.ErrInvalidArgument, len(bc.bufs), s.maxPerConn)
	}
	if n := s.registered.Add(1); n > int64(s.maxBufs) {
		s.registered.Add(-1)
		return 0, fmt.Errorf("%w: %d buffers registered on this node already (buffer_socket_max_buffers %d)", cache.ErrNoSpace, n-1, s.maxBufs)
	}
	mem, err := memfd.Map(fd, int(size))
	if err != nil {
		s.registered.Add(-1)
		return 0, fmt.Errorf("%w: %w", proxy.ErrInvalidArgument, err)
	}
	for {
		var b [8]byte
		_, _ = crand.Read(b[:])
		id := binary.BigEndian.Uint64(b[:])
		if _, taken := bc.bufs[id]; id != 0 && !taken {
			bc.bufs[id] = mem
			return id, nil
		}
	}
}

// drop unmaps buffer id of bc.
func (s *bufServer) drop(bc *bufConn, id uint64) {
	if mem, ok := bc.bufs[id]; ok {
		delete(bc.bufs, id)
		s.registered.Add(-1)
		_ = memfd.Unmap(mem)
	}
}

// stats returns the counters.
func (s *bufServer) stats() BufferStats {
	return BufferStats{Registered: s.registered.Load(), DescriptorsRefused: s.fdsRefused.Load()}
}

// read fills b from the connection. A descriptor is taken only where
// first is set (a request's first byte), and one at most: the control
// buffer is that small, so the kernel closes most of the rest (MSG_CTRUNC) before
// this process holds them, and every descriptor that comes elsewhere is
// closed at once and refuses the request (refuseFD). Clients thus cannot
// make the process hold more than one descriptor per connection.
func (s *bufServer) read(bc *bufConn, b []byte, first bool) error {
	oob := make([]byte, syscall.CmsgSpace(4)) // room for one descriptor (two where alignment pads it)
	for len(b) > 0 {
		n, oobn, flags, _, err := bc.uc.ReadMsgUnix(b, oob)
		if oobn > 0 || flags&syscall.MSG_CTRUNC != 0 {
			s.takeFD(bc, oob[:oobn], first, flags&syscall.MSG_CTRUNC != 0)
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		b = b[n:]
		first = false
	}
	return nil
}

// readBody appends n bytes from the connection to body, growing it by
// at most bufBodyChunk ahead of the bytes that arrived.
func (s *bufServer) readBody(bc *bufConn, body []byte, n int) ([]byte, error) {
	for len(body) < n {
		k := min(n-len(body), bufBodyChunk)
		body = slices.Grow(body, k)
		if err := s.read(bc, body[len(body):len(body)+k], false); err != nil {
			return body, err
		}
		body = body[:len(body)+k]
	}
	return body, nil
}

// takeFD keeps the one descriptor that came with a request's first byte
// (first) and closes every other at once, refusing the request.
// truncated: the kernel dropped descriptors that did not fit.
func (s *bufServer) takeFD(bc *bufConn, oob []byte, first, truncated bool) {
	var fds []int
	if msgs, err := syscall.ParseSocketControlMessage(oob); err == nil {
		for _, m := range msgs {
			if got, err := syscall.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	bad := error(nil)
	switch {
	case truncated || len(fds) > 1:
		bad = fmt.Errorf("%w: more than one descriptor with a request", proxy.ErrInvalidArgument)
	case !first:
		bad = fmt.Errorf("%w: a descriptor after a request's first byte", proxy.ErrInvalidArgument)
	case len(fds) == 1 && !s.guard.Admit(fds[0]):
		bad = fmt.Errorf("%w: this node is near its descriptor limit; try again later", cache.ErrUnavailable)
	}
	if bad == nil {
		bc.fd = fds[0]
		return
	}
	for _, fd := range fds {
		s.refuseFD(bc, fd, bad)
	}
	if len(fds) == 0 {
		s.refuseFD(bc, -1, bad)
	}
}

// refuseFD closes fd (-1: none) and refuses bc's request with err, unless
// an earlier error refuses it already.
func (s *bufServer) refuseFD(bc *bufConn, fd int, err error) {
	if fd >= 0 {
		_ = syscall.Close(fd)
		if s.fdsRefused.Add(1) == 1 {
			s.lg.Warn("buffer socket: refusing descriptors", zap.Error(err))
		}
	}
	if bc.fdErr == nil {
		bc.fdErr = err
	}
}

// closeFD closes the request's descriptor if no REGISTER claimed it.
func (bc *bufConn) closeFD() {
	if bc.fd >= 0 {
		_ = syscall.Close(bc.fd)
		bc.fd = -1
	}
}

// bufAnswer encodes an answer; a batch's items follow the message.
func bufAnswer(code tp.ErrorCode, msg string, sum uint32, value uint64, items []bufItem) []byte {
	if items != nil {
		value = uint64(len(items))
	}
	if len(msg) > bufMaxMsg {
		msg = msg[:bufMaxMsg]
		for !utf8.ValidString(msg) {
			msg = msg[:len(msg)-1]
		}
	}
	b := make([]byte, 0, bufAnswerHead+len(msg))
	b = binary.BigEndian.AppendUint16(b, uint16(code))
	b = binary.BigEndian.AppendUint16(b, uint16(len(msg)))
	b = binary.BigEndian.AppendUint32(b, sum)
	b = binary.BigEndian.AppendUint64(b, value)
	b = append(b, msg...)
	for _, it := range items {
		b = binary.BigEndian.AppendUint16(b, uint16(it.code))
		b = binary.BigEndian.AppendUint32(b, it.sum)
		b = binary.BigEndian.AppendUint64(b, it.value)
	}
	return b
}

// putOpts reads a put's i32 depth, u8 flags (bufDurable, bufChecksum),
// i32 sync_replicas and u32 checksum (meant only with bufChecksum).
func putOpts(d *wire.Reader) (cache.PutOptions, int32, *uint32) {
	opts := cache.PutOptions{Depth: int32(d.U32())}
	flags := d.U8()
	syncReplicas, crc := int32(d.U32()), d.U32()
	if flags&^(bufDurable|bufChecksum) != 0 {
		d.Bad = true
	}
	opts.Durable = flags&bufDurable != 0
	if flags&bufChecksum == 0 {
		return opts, syncReplicas, nil
	}
	return opts, syncReplicas, &crc
}
