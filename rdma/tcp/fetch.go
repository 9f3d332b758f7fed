package tcp

// Named reads (rdma.Fetcher, rdma.FetchServer): the one two-sided
// operation. The initiator sends one OpFetch whose payload names what it
// wants; the owner's handler resolves and pins the bytes, and the owner
// answers, in one writev, an OpFetchMeta (the handler's metadata, the byte
// count and their CRC-32C) followed by the bytes as summed OpReadData
// chunks. The initiator asks its Lander where the bytes go once it knows
// how many there are, reads them straight there and checks their CRC-32C
// as they land. One round trip instead of the two of "ask where, then
// Read".

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/tidepool-kv/tidepool/protocol/frame"
	"github.com/tidepool-kv/tidepool/rdma"
	"github.com/tidepool-kv/tidepool/rdma/internal/region"
)

// ---- owner side ----

// fetch answers an OpFetch: the handler resolves the request and pins the
// bytes; the answer's metadata and the bytes go back in one writev.
func (s *server) fetch(h frame.Header) error {
	if h.Length > rdma.MaxFetchRequest {
		// The payload is not read, so the stream cannot be resynchronised:
		// refuse, then close.
		s.t.serve.Error()
		_ = s.refuse(h.RequestID, fmt.Errorf("%w: fetch request of %d bytes (max %d)", rdma.ErrTooLarge, h.Length, rdma.MaxFetchRequest))
		return fmt.Errorf("fetch request of %d bytes", h.Length)
	}
	_ = s.nc.SetReadDeadline(time.Now().Add(s.t.cfg.IOTimeout))
	if s.req == nil {
		s.req = make([]byte, rdma.MaxFetchRequest)
	}
	req := s.req[:h.Length]
	if _, err := io.ReadFull(s.br, req); err != nil {
		return err
	}
	if frame.Checksum(req) != h.CRC {
		s.t.serve.Error()
		return s.refuse(h.RequestID, fmt.Errorf("%w: fetch request", rdma.ErrChecksum))
	}
	hp := s.t.fetch.Load()
	if hp == nil {
		s.t.serve.Error()
		return s.refuse(h.RequestID, fmt.Errorf("%w: named reads are not served here", rdma.ErrUnsupported))
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.t.cfg.IOTimeout)
	a := (*hp)(ctx, req)
	cancel()
	if a.Done != nil {
		defer a.Done()
	}
	var span region.Span
	var err error
	switch {
	case len(a.Meta) > rdma.MaxFetchMeta:
		err = fmt.Errorf("fetch answer: %d bytes of metadata (max %d)", len(a.Meta), rdma.MaxFetchMeta)
	case a.Len > s.t.cfg.MaxTransfer:
		err = fmt.Errorf("%w: fetch answer of %d bytes (max %d)", rdma.ErrTooLarge, a.Len, s.t.cfg.MaxTransfer)
	case a.Len > 0:
		// The handler's own region: an error here is ours, not a guess
		// by the peer (no key failure is counted: %v, not %w).
		if span, err = s.t.table.Acquire(a.Region, 0, false, a.Offset, a.Len); err != nil {
			err = fmt.Errorf("fetch answer: %v", err)
		} else {
			defer span.Release()
		}
	}
	if err != nil {
		s.t.serve.Error()
		return s.refuse(h.RequestID, err)
	}
	chunk := uint64(s.t.cfg.ChunkSize)
	chunks := (a.Len + chunk - 1) / chunk
	hdrs := make([]byte, (1+chunks)*frame.HeaderSize)
	bufs := make(net.Buffers, 0, 2+2*chunks)
	m := frame.Header{Op: frame.OpFetchMeta, RequestID: h.RequestID, Key: a.Sum, Offset: a.Len,
		Length: uint32(len(a.Meta)), CRC: frame.Checksum(a.Meta)}
	bufs = append(bufs, frame.Encode(hdrs, m))
	if len(a.Meta) > 0 {
		bufs = append(bufs, a.Meta)
	}
	for i, done := uint64(1), uint64(0); done < a.Len; i++ {
		n := min(chunk, a.Len-done)
		r := frame.Header{Op: frame.OpReadData, Flags: frame.FlagSummed, RequestID: h.RequestID,
			Offset: done, Length: uint32(n)}
		if done+n == a.Len {
			r.Flags |= frame.FlagLast
		}
		bufs = append(bufs, frame.Encode(hdrs[i*frame.HeaderSize:], r), span.B[done:done+n])
		done += n
	}
	_ = s.w.SetWriteDeadline(time.Now().Add(s.t.cfg.IOTimeout))
	if _, err := bufs.WriteTo(s.w); err != nil {
		return err
	}
	if a.Len > 0 {
		s.t.serve.Sent(a.Len, true)
	}
	return nil
}

// ---- initiator side ----

// Fetch implements rdma.Fetcher: the bytes land in a registered region.
func (p *peer) Fetch(ctx context.Context, req []byte, land rdma.Lander) ([]byte, error) {
	return p.fetchTimed(ctx, req, func(meta []byte, n uint64, sum uint32) ([]byte, func(), error) {
		id, off, err := land(meta, n, sum)
		if err != nil {
			return nil, nil, err
		}
		span, err := p.t.table.Acquire(id, 0, false, off, n)
		if err != nil {
			return nil, nil, fmt.Errorf("local: %w", err)
		}
		return span.B, span.Release, nil
	})
}

// FetchMem implements rdma.MemFetcher: the bytes land in the caller's
// memory.
func (p *peer) FetchMem(ctx context.Context, req []byte, land rdma.MemLander) ([]byte, error) {
	return p.fetchTimed(ctx, req, func(meta []byte, n uint64, sum uint32) ([]byte, func(), error) {
		dst, err := land(meta, n, sum)
		if err == nil && uint64(len(dst)) != n {
			err = fmt.Errorf("local: %d bytes of memory for %d", len(dst), n)
		}
		return dst, nil, err
	})
}

func (p *peer) fetchTimed(ctx context.Context, req []byte, land memLander) ([]byte, error) {
	start := time.Now()
	meta, n, err := p.fetch(ctx, req, land)
	p.c.Done(false, n, time.Since(start), err)
	if err != nil {
		return meta, fmt.Errorf("tcp fetch %s: %w", p.addr, err)
	}
	return meta, nil
}

// memLander says where a named read's bytes go: n bytes of memory, and
// what to call once nothing reads into them any more (nil: nothing).
type memLander func(meta []byte, n uint64, sum uint32) (dst []byte, release func(), err error)

func (p *peer) fetch(ctx context.Context, req []byte, land memLander) ([]byte, uint64, error) {
	if p.t.closed.Load() || p.isClosed() {
		return nil, 0, rdma.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	if len(req) > rdma.MaxFetchRequest {
		return nil, 0, fmt.Errorf("%w: fetch request of %d bytes (max %d)", rdma.ErrTooLarge, len(req), rdma.MaxFetchRequest)
	}
	f := fetchCall{req: req, land: land, t: p.t}
	err := p.exchange(ctx, func() bool { return !f.landed }, func(c *conn, id uint64) (bool, error) {
		f = fetchCall{id: id, req: req, land: land, t: p.t}
		return c.fetch(&f)
	})
	return f.meta, f.n, err
}

// fetchCall is the state of one named read on a connection.
type fetchCall struct {
	id     uint64
	req    []byte
	land   memLander
	t      *Transport
	landed bool   // land was called
	meta   []byte // the answer's metadata
	n      uint64 // bytes landed
}

// fetch sends the request and reads the answer. clean reports whether the
// stream is still in sync.
func (c *conn) fetch(f *fetchCall) (bool, error) {
	h := frame.Header{Op: frame.OpFetch, RequestID: f.id, Length: uint32(len(f.req)), CRC: frame.Checksum(f.req)}
	bufs := net.Buffers{frame.Encode(c.hdr[:], h), f.req}
	if _, err := bufs.WriteTo(c.nc); err != nil {
		return false, lost(err)
	}
	r, err := c.response(f.id)
	if err != nil {
		return false, err
	}
	switch r.Op {
	case frame.OpError:
		return c.remoteError(r)
	case frame.OpFetchMeta:
	default:
		return false, fmt.Errorf("%w: unexpected %s in answer to fetch", rdma.ErrProtocol, r.Op)
	}
	if r.Length > rdma.MaxFetchMeta {
		return false, fmt.Errorf("%w: fetch answer with %d bytes of metadata", rdma.ErrProtocol, r.Length)
	}
	if r.Offset > f.t.cfg.MaxTransfer {
		return false, fmt.Errorf("%w: fetch answer of %d bytes (max %d)", rdma.ErrTooLarge, r.Offset, f.t.cfg.MaxTransfer)
	}
	meta := make([]byte, r.Length)
	if _, err := io.ReadFull(c.br, meta); err != nil {
		return false, lost(err)
	}
	if frame.Checksum(meta) != r.CRC {
		return false, fmt.Errorf("%w: fetch answer metadata", rdma.ErrChecksum)
	}
	f.meta = meta
	n, want := r.Offset, r.Key
	if n == 0 {
		return true, nil
	}
	f.landed = true
	mem, release, err := f.land(meta, n, want)
	if err != nil {
		return false, err // the bytes are not read: the connection is done
	}
	if release != nil {
		defer release()
	}
	var sum uint32
	for got := uint64(0); got < n; {
		d, err := c.response(f.id)
		if err != nil {
			return false, err
		}
		if d.Op != frame.OpReadData || !d.Summed() || d.Offset != got || d.Length == 0 || uint64(d.Length) > n-got {
			return false, fmt.Errorf("%w: unexpected %s at %d len %d in a fetch of %d bytes", rdma.ErrProtocol, d.Op, d.Offset, d.Length, n)
		}
		if sum, err = readSummed(c.br, mem[got:got+uint64(d.Length)], sum); err != nil {
			return false, lost(err)
		}
		got += uint64(d.Length)
		if d.Last() != (got == n) {
			return false, fmt.Errorf("%w: fetch data ended at %d of %d bytes", rdma.ErrProtocol, got, n)
		}
	}
	if sum != want {
		return true, fmt.Errorf("%w: fetch of %d bytes: crc %08x, want %08x", rdma.ErrChecksum, n, sum, want)
	}
	f.n = n
	return true, nil
}

// readSummed fills dst from r and extends sum over it piece by piece, as
// the bytes arrive: each piece is checksummed while it is still in the
// cache and while the owner goes on sending, so that only the last piece's
// checksum is left once the last byte has landed.
func readSummed(r io.Reader, dst []byte, sum uint32) (uint32, error) {
	for off := 0; off < len(dst); {
		n, err := r.Read(dst[off:])
		sum = frame.UpdateChecksum(sum, dst[off:off+n])
		off += n
		if err != nil && off < len(dst) {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return sum, err
		}
	}
	return sum, nil
}
