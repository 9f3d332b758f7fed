package tcp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/protocol/frame"
	"github.com/tidepool-kv/tidepool/rdma"
	"github.com/tidepool-kv/tidepool/rdma/internal/region"
)

// ---- owner side: serving one-sided transfers into and out of regions ----

func (t *Transport) acceptLoop() {
	defer t.wg.Done()
	for {
		// The guarded listener survives accept errors (EMFILE, ...) with
		// back-off, caps the connections and hands out only authenticated
		// ones; its only error is that it was closed.
		nc, err := t.ln.Accept()
		if err != nil {
			return
		}
		t.mu.Lock()
		if t.closed.Load() {
			t.mu.Unlock()
			_ = nc.Close()
			return
		}
		t.inbound[nc] = struct{}{}
		t.wg.Add(1)
		t.mu.Unlock()
		t.serve.Conn(1)
		go t.serveConn(nc)
	}
}

func (t *Transport) serveConn(nc net.Conn) {
	defer t.wg.Done()
	defer func() {
		_ = nc.Close()
		t.mu.Lock()
		delete(t.inbound, nc)
		t.mu.Unlock()
		t.serve.Conn(-1)
	}()
	s := &server{t: t, nc: nc, w: nc, br: bufio.NewReaderSize(nc, 64<<10)}
	if r, ok := nc.(interface{ Raw() net.Conn }); ok {
		s.w = r.Raw() // writev (net.Buffers) needs the *net.TCPConn
	}
	// loop returns only on an error.
	if err := s.loop(); !t.closed.Load() && !errors.Is(err, io.EOF) {
		t.lg.Debug("served connection ended", zap.Stringer("remote", nc.RemoteAddr()), zap.Error(err))
	}
}

type server struct {
	t  *Transport
	nc net.Conn
	w  net.Conn // nc, unwrapped for writes
	// keyFails counts this connection's requests for an unknown region or
	// with a wrong key (throttled, then cut off).
	keyFails int
	br       *bufio.Reader
	// scratch holds a write chunk until its checksum is verified; kept per
	// connection (up to 2*ChunkSize) so that the hot path allocates nothing.
	scratch []byte
	// req holds a named read's request (rdma.MaxFetchRequest bytes, made
	// on the connection's first one).
	req  []byte
	rhdr [frame.HeaderSize]byte
	whdr [frame.HeaderSize]byte
}

func (s *server) loop() error {
	_ = s.nc.SetReadDeadline(time.Now().Add(s.t.cfg.DialTimeout))
	h, err := frame.ReadHeader(s.br, &s.rhdr)
	if err != nil {
		return err
	}
	if h.Op != frame.OpHello {
		return fmt.Errorf("first frame is %s, want hello", h.Op)
	}
	if err := s.respond(frame.Header{Op: frame.OpHelloAck, RequestID: h.RequestID}, nil); err != nil {
		return err
	}
	// A write request spans several frames; werr remembers why it is being
	// refused while its remaining chunks are read and dropped.
	var (
		inWrite bool
		wid     uint64
		werr    error
		w       writeSum // of a summed write request
	)
	for {
		timeout := s.t.cfg.IdleTimeout
		if inWrite {
			timeout = s.t.cfg.IOTimeout
		}
		_ = s.nc.SetReadDeadline(time.Now().Add(timeout))
		h, err := frame.ReadHeader(s.br, &s.rhdr)
		if err != nil {
			return err
		}
		switch {
		case h.Op == frame.OpWrite:
			if !inWrite {
				inWrite, wid, werr = true, h.RequestID, nil
				w = writeSum{summed: h.Summed()}
			} else if h.RequestID != wid {
				return fmt.Errorf("write chunk for request %d inside request %d", h.RequestID, wid)
			} else if h.Summed() != w.summed {
				return fmt.Errorf("write request %d mixes summed and unsummed chunks", wid)
			}
			if err := s.writeChunk(h, &werr, &w); err != nil {
				return err
			}
			if !h.Last() {
				continue
			}
			inWrite = false
			if werr != nil {
				s.t.serve.Error()
				if err := s.refuse(h.RequestID, werr); err != nil {
					return err
				}
				continue
			}
			if err := s.respond(frame.Header{Op: frame.OpWriteAck, RequestID: h.RequestID}, nil); err != nil {
				return err
			}
		case inWrite:
			return fmt.Errorf("%s inside write request %d", h.Op, wid)
		case h.Op == frame.OpRead:
			if err := s.read(h); err != nil {
				return err
			}
		case h.Op == frame.OpFetch:
			if err := s.fetch(h); err != nil {
				return err
			}
		case h.Op == frame.OpHello:
			if err := s.respond(frame.Header{Op: frame.OpHelloAck, RequestID: h.RequestID}, nil); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unexpected %s from initiator", h.Op)
		}
	}
}

// writeSum is the state of a summed write request (frame.FlagSummed): its
// chunks land in the region as they come, and the CRC-32C of the whole
// write is checked against the one on its last chunk.
type writeSum struct {
	summed bool
	crc    uint32
}

// writeChunk reads one write payload, verifies it and applies it unless the
// request already failed (*werr). A summed chunk is read straight into the
// region and checked with the whole write at its last chunk.
func (s *server) writeChunk(h frame.Header, werr *error, w *writeSum) error {
	_ = s.nc.SetReadDeadline(time.Now().Add(s.t.cfg.IOTimeout))
	if w.summed && *werr == nil {
		span, err := s.t.table.Acquire(rdma.RegionID(h.Region), h.Key, true, h.Offset, uint64(h.Length))
		if err == nil {
			return s.writeSummed(h, span, werr, w)
		}
		*werr = err // the payload is read and dropped below
	}
	var buf []byte
	switch {
	case int(h.Length) <= cap(s.scratch):
		buf = s.scratch[:h.Length]
	case int(h.Length) <= 2*s.t.cfg.ChunkSize:
		s.scratch = make([]byte, h.Length)
		buf = s.scratch
	default: // a peer with bigger chunks: do not keep that much per connection
		buf = make([]byte, h.Length)
	}
	if _, err := io.ReadFull(s.br, buf); err != nil {
		return err
	}
	if *werr != nil || w.summed {
		return nil
	}
	if frame.Checksum(buf) != h.CRC {
		*werr = fmt.Errorf("%w: write chunk at %d len %d", rdma.ErrChecksum, h.Offset, h.Length)
		return nil
	}
	span, err := s.t.table.Acquire(rdma.RegionID(h.Region), h.Key, true, h.Offset, uint64(h.Length))
	if err != nil {
		*werr = err
		return nil
	}
	copy(span.B, buf)
	span.Release()
	s.t.serve.Applied(uint64(h.Length), h.Last())
	return nil
}

// writeSummed reads a summed write chunk straight into its region span and,
// at the last chunk, checks the CRC-32C of the whole write.
func (s *server) writeSummed(h frame.Header, span region.Span, werr *error, w *writeSum) error {
	_, err := io.ReadFull(s.br, span.B)
	if err == nil {
		w.crc = frame.UpdateChecksum(w.crc, span.B)
	}
	span.Release()
	if err != nil {
		return err
	}
	if h.Last() && w.crc != h.CRC {
		*werr = fmt.Errorf("%w: write ending at offset %d: crc %08x, want %08x",
			rdma.ErrChecksum, h.Offset+uint64(h.Length), w.crc, h.CRC)
		return nil
	}
	s.t.serve.Applied(uint64(h.Length), h.Last())
	return nil
}

// read answers an OpRead with data chunks sent straight from the region.
func (s *server) read(h frame.Header) error {
	if err := s.t.table.Check(rdma.RegionID(h.Region), h.Key, true, h.Offset, uint64(h.Length)); err != nil {
		s.t.serve.Error()
		return s.refuse(h.RequestID, err)
	}
	chunk := uint32(s.t.cfg.ChunkSize)
	for done := uint32(0); ; {
		m := min(chunk, h.Length-done)
		off := h.Offset + uint64(done)
		span, err := s.t.table.Acquire(rdma.RegionID(h.Region), h.Key, true, off, uint64(m))
		if err != nil { // deregistered mid-read
			s.t.serve.Error()
			return s.refuse(h.RequestID, err)
		}
		last := done+m == h.Length
		r := frame.Header{Op: frame.OpReadData, RequestID: h.RequestID, Region: h.Region, Key: h.Key,
			Offset: off, Length: m}
		if h.Summed() {
			r.Flags = frame.FlagSummed // the initiator checks the whole read
		} else {
			r.CRC = frame.Checksum(span.B)
		}
		if last {
			r.Flags |= frame.FlagLast
		}
		err = s.respond(r, span.B)
		span.Release()
		if err != nil {
			return err
		}
		s.t.serve.Sent(uint64(m), last)
		done += m
		if last {
			return nil
		}
	}
}

func (s *server) refuse(id uint64, cause error) error {
	if errors.Is(cause, rdma.ErrUnknownRegion) || errors.Is(cause, rdma.ErrOutOfRange) {
		// A member never sends either (it checks ranges before sending):
		// this is a guess at a region's name or address.
		if err := s.keyFailure(); err != nil {
			return err
		}
	}
	msg := []byte(cause.Error())
	if len(msg) > maxErrMsg {
		msg = msg[:maxErrMsg]
	}
	h := frame.Header{Op: frame.OpError, Status: errStatus(cause), RequestID: id,
		Length: uint32(len(msg)), CRC: frame.Checksum(msg)}
	return s.respond(h, msg)
}

func (s *server) respond(h frame.Header, payload []byte) error {
	_ = s.w.SetWriteDeadline(time.Now().Add(s.t.cfg.IOTimeout))
	if len(payload) == 0 {
		_, err := s.w.Write(frame.Encode(s.whdr[:], h))
		return err
	}
	bufs := net.Buffers{frame.Encode(s.whdr[:], h), payload}
	_, err := bufs.WriteTo(s.w)
	return err
}

// errKeyCutoff ends a served connection that named too many regions it
// does not know (or with the wrong key).
var errKeyCutoff = errors.New("tcp: too many requests for unknown regions or with wrong keys")

// keyFailure throttles a request that named an unknown region or a wrong
// key (a delay growing with the connection's failures) and cuts the
// connection off at MaxKeyFailures.
func (s *server) keyFailure() error {
	s.keyFails++
	s.t.keyFails.Add(1)
	if s.keyFails >= s.t.cfg.MaxKeyFailures {
		s.t.keyCutoffs.Add(1)
		s.t.lg.Warn("connection cut off: too many unknown regions or wrong keys",
			zap.Stringer("remote", s.nc.RemoteAddr()), zap.Int("failures", s.keyFails))
		return errKeyCutoff
	}
	t := time.NewTimer(time.Duration(s.keyFails) * s.t.cfg.KeyFailureDelay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-s.t.done:
		return rdma.ErrClosed
	}
}
