package client

// Registered buffers: memory of this process that the sidecar maps too
// (the buffer socket, the engine socket's path plus ".buf";
// docs/zerocopy.md, "Registered buffers"). A Get into one has the sidecar
// write the block there itself — for a block another node holds, straight
// from the network — and a Put from one has it copy the value into its
// arena slot and checksum it in the same pass: one round trip each, no
// lease, no slot written or checked by the client.
//
// Each Buffer has a connection of its own to the buffer socket, on which
// it is registered: closing the Buffer (or this process dying) closes the
// connection, and the sidecar unmaps it. One call at a time per Buffer
// (calls on one Buffer are serialized); give each concurrent caller its
// own.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/tidepool-kv/tidepool/internal/memfd"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
)

// FeatureBufferSocket, in HelloResponse.Features: the sidecar serves the
// buffer socket.
const FeatureBufferSocket = "buffer_socket"

// The buffer socket's ops and answer head (proxy/engineapi/bufsock.go).
const (
	bufRegister = 1
	bufGet      = 2
	bufPut      = 4
	bufVersion  = 1
	bufHead     = 16
	bufMaxMsg   = 1024
)

// Buffer is registered memory: Bytes is this process's mapping of it.
type Buffer struct {
	mem     []byte
	id      uint64
	timeout time.Duration

	mu     sync.Mutex
	conn   *net.UnixConn
	w      []byte
	closed bool
}

// RegisterBuffer makes size bytes of shared memory (a memfd, allocated at
// once and sealed against shrinking and growing, so that the sidecar's
// writes into it can never fault) and registers it with the sidecar.
// The memory is this process's: it counts toward this process's memory
// and is freed by Close. An *Error with code UNAVAILABLE when the sidecar
// does not serve the buffer socket.
func (c *Client) RegisterBuffer(ctx context.Context, size int) (*Buffer, error) {
	if size <= 0 {
		return nil, &Error{Code: tp.ErrorCode_INVALID_ARGUMENT, Message: fmt.Sprintf("a buffer of %d bytes", size)}
	}
	fd, mem, err := memfd.Create("tidepool-buffer", size)
	if err != nil {
		return nil, fmt.Errorf("tidepool: %w", err)
	}
	defer syscall.Close(fd) // the mappings keep the file
	b := &Buffer{mem: mem, timeout: c.raw.timeout}
	fail := func(err error) (*Buffer, error) {
		b.Close()
		return nil, err
	}
	d := net.Dialer{Timeout: c.raw.dialTimeout}
	conn, err := d.DialContext(ctx, "unix", c.raw.socket+".buf")
	if err != nil {
		return fail(&Error{Code: tp.ErrorCode_UNAVAILABLE, Message: fmt.Sprintf("the buffer socket: %v", err)})
	}
	b.conn = conn.(*net.UnixConn)
	a, err := b.call(ctx, bufRegister, binary.BigEndian.AppendUint64(nil, uint64(size)), syscall.UnixRights(fd))
	if err != nil {
		return fail(err)
	}
	b.id = a.value
	return b, nil
}

// Bytes is the buffer's memory, valid until Close (and only then: it is
// unmapped by Close).
func (b *Buffer) Bytes() []byte { return b.mem }

// Get reads the block of (ns, key) into Bytes()[off:off+n] and returns its
// size; found is false on a miss (nothing written). A block larger than n
// is an *Error TOO_LARGE, nothing written.
func (b *Buffer) Get(ctx context.Context, ns string, key []byte, off, n int, scope Scope) (size int, found bool, err error) {
	if err := b.check(off, n); err != nil {
		return 0, false, err
	}
	w := binary.BigEndian.AppendUint64(nil, b.id)
	w = binary.BigEndian.AppendUint64(w, uint64(off))
	w = binary.BigEndian.AppendUint64(w, uint64(n))
	w = append(w, byte(scope))
	w = appendStr16(w, []byte(ns))
	w = appendStr16(w, key)
	a, err := b.call(ctx, bufGet, w, nil)
	if CodeOf(err) == tp.ErrorCode_NOT_FOUND {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return int(a.value), true, nil
}

// Put stores Bytes()[off:off+n] as the block of (ns, key): the sidecar
// copies it into its arena slot, checksumming it as it copies. existed
// reports a present key (nothing written). The bytes must not change
// until Put returns.
func (b *Buffer) Put(ctx context.Context, ns string, key []byte, off, n int, depth int32) (existed bool, err error) {
	if err := b.check(off, n); err != nil {
		return false, err
	}
	w := binary.BigEndian.AppendUint64(nil, b.id)
	w = binary.BigEndian.AppendUint64(w, uint64(off))
	w = binary.BigEndian.AppendUint64(w, uint64(n))
	w = binary.BigEndian.AppendUint32(w, uint32(depth))
	w = append(w, 0)                        // flags: not durable, no checksum sent
	w = binary.BigEndian.AppendUint32(w, 0) // sync_replicas: the server's default
	w = binary.BigEndian.AppendUint32(w, 0) // checksum
	w = appendStr16(w, []byte(ns))
	w = appendStr16(w, key)
	a, err := b.call(ctx, bufPut, w, nil)
	return err == nil && a.value == 1, err
}

func (b *Buffer) check(off, n int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.conn == nil {
		return errBufferClosed
	}
	if off < 0 || n < 0 || off > len(b.mem) || n > len(b.mem)-off {
		return &Error{Code: tp.ErrorCode_INVALID_ARGUMENT, Message: fmt.Sprintf("%d bytes at %d outside a buffer of %d", n, off, len(b.mem))}
	}
	return nil
}

// Close ends the registration (the sidecar unmaps the buffer when its
// connection closes) and unmaps it here. Safe to call twice.
func (b *Buffer) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	var errs []error
	if b.conn != nil {
		errs = append(errs, b.conn.Close())
	}
	errs = append(errs, memfd.Unmap(b.mem))
	b.mem = nil
	return errors.Join(errs...)
}

// bufAnswer is an answer's head.
type bufAnswer struct {
	sum   uint32
	value uint64
}

// errBufferClosed: a call on a closed Buffer, or one whose connection
// failed (its registration is gone with it).
var errBufferClosed = &Error{Code: tp.ErrorCode_UNAVAILABLE, Message: "the buffer is closed or its connection failed; register a new one"}

// call sends one request (oob: the descriptors sent with it) and reads
// the answer; an answer other than OK is an *Error. A connection that
// fails is closed: the buffer's registration ended with it.
func (b *Buffer) call(ctx context.Context, op byte, body, oob []byte) (bufAnswer, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.conn == nil {
		return bufAnswer{}, errBufferClosed
	}
	deadline := time.Now().Add(b.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	a, code, msg, err := b.exchange(deadline, op, body, oob)
	if err != nil {
		b.conn.Close()
		b.conn = nil
		return bufAnswer{}, fmt.Errorf("tidepool: buffer socket: %w", err)
	}
	if code != tp.ErrorCode_OK {
		return bufAnswer{}, &Error{Code: code, Message: msg}
	}
	return a, nil
}

func (b *Buffer) exchange(deadline time.Time, op byte, body, oob []byte) (bufAnswer, tp.ErrorCode, string, error) {
	if err := b.conn.SetDeadline(deadline); err != nil {
		return bufAnswer{}, 0, "", err
	}
	w := append(b.w[:0], op, bufVersion, 0, 0)
	w = binary.BigEndian.AppendUint32(w, uint32(len(body)))
	w = append(w, body...)
	b.w = w
	if _, _, err := b.conn.WriteMsgUnix(w, oob, nil); err != nil {
		return bufAnswer{}, 0, "", err
	}
	var head [bufHead]byte
	if _, err := io.ReadFull(b.conn, head[:]); err != nil {
		return bufAnswer{}, 0, "", err
	}
	n := binary.BigEndian.Uint16(head[2:])
	if n > bufMaxMsg {
		return bufAnswer{}, 0, "", fmt.Errorf("an answer with a message of %d bytes", n)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(b.conn, msg); err != nil {
		return bufAnswer{}, 0, "", err
	}
	return bufAnswer{sum: binary.BigEndian.Uint32(head[4:]), value: binary.BigEndian.Uint64(head[8:])},
		tp.ErrorCode(binary.BigEndian.Uint16(head[:])), string(msg), nil
}

func appendStr16(w, s []byte) []byte {
	w = binary.BigEndian.AppendUint16(w, uint16(len(s)))
	return append(w, s...)
}
