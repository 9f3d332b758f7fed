package tcp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/tidepool-kv/tidepool/protocol/frame"
	"github.com/tidepool-kv/tidepool/rdma"
)

// fetchOwner is a transport serving named reads of "name" → the bytes at
// [off, off+n) of one registered region, with the sum it is told to
// announce; it counts the pins its handler took and gave back.
type fetchOwner struct {
	tr     *Transport
	region rdma.RegionDesc
	buf    []byte
	pinned atomic.Int64
	calls  atomic.Int64
}

func newFetchOwner(t *testing.T, mod func(*Config), data []byte) *fetchOwner {
	t.Helper()
	o := &fetchOwner{tr: newLocal(t, mod), buf: data}
	var err error
	if o.region, err = o.tr.Register(o.buf); err != nil {
		t.Fatal(err)
	}
	o.tr.HandleFetch(func(_ context.Context, req []byte) rdma.FetchAnswer {
		o.calls.Add(1)
		switch string(req) {
		case "missing":
			return rdma.FetchAnswer{Meta: []byte("not found")}
		case "huge meta":
			o.pinned.Add(1)
			return rdma.FetchAnswer{Meta: make([]byte, rdma.MaxFetchMeta+1), Done: func() { o.pinned.Add(-1) }}
		case "bad sum":
			o.pinned.Add(1)
			return rdma.FetchAnswer{Meta: []byte("ok"), Region: o.region.ID, Len: uint64(len(o.buf)),
				Sum: frame.Checksum(o.buf) ^ 1, Done: func() { o.pinned.Add(-1) }}
		case "empty":
			return rdma.FetchAnswer{Meta: []byte("ok"), Region: o.region.ID}
		}
		o.pinned.Add(1)
		return rdma.FetchAnswer{Meta: []byte("ok"), Region: o.region.ID, Offset: 16, Len: uint64(len(o.buf) - 16),
			Sum: frame.Checksum(o.buf[16:]), Done: func() { o.pinned.Add(-1) }}
	})
	return o
}

// into is a Lander that places the bytes at off of local, and records what
// it was told.
type into struct {
	local rdma.RegionDesc
	off   uint64
	err   error
	calls int
	n     uint64
	sum   uint32
	meta  string
}

func (l *into) land(meta []byte, n uint64, sum uint32) (rdma.RegionID, uint64, error) {
	l.calls++
	l.n, l.sum, l.meta = n, sum, string(meta)
	return l.local.ID, l.off, l.err
}

func TestFetch(t *testing.T) {
	for _, tc := range []struct {
		name  string
		chunk int
	}{{"one chunk", 0}, {"several chunks", 64 << 10}} {
		t.Run(tc.name, func(t *testing.T) {
			data := bytes.Repeat([]byte("tidepool fetches in one exchange"), (300<<10)/32)
			mod := func(c *Config) {
				if tc.chunk > 0 {
					c.ChunkSize = tc.chunk
				}
			}
			o := newFetchOwner(t, mod, data)
			a := newLocal(t, mod)
			buf := make([]byte, len(data)+100)
			ld, _ := a.Register(buf)
			p, err := a.Connect(context.Background(), o.tr.Addr())
			if err != nil {
				t.Fatal(err)
			}
			f := p.(rdma.Fetcher)
			l := &into{local: ld, off: 50}
			meta, err := f.Fetch(context.Background(), []byte("block"), l.land)
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			want := data[16:]
			if string(meta) != "ok" || l.calls != 1 || l.n != uint64(len(want)) || l.sum != frame.Checksum(want) {
				t.Fatalf("meta %q, land called %d times with n %d sum %08x", meta, l.calls, l.n, l.sum)
			}
			if !bytes.Equal(buf[50:50+len(want)], want) || !bytes.Equal(buf[:50], make([]byte, 50)) {
				t.Fatal("fetched bytes differ, or landed outside their range")
			}
			// Metadata only: land is not called.
			l2 := &into{local: ld}
			if meta, err := f.Fetch(context.Background(), []byte("missing"), l2.land); err != nil || string(meta) != "not found" || l2.calls != 0 {
				t.Fatalf("metadata-only answer: %q %v, land called %d times", meta, err, l2.calls)
			}
			if meta, err := f.Fetch(context.Background(), []byte("empty"), l2.land); err != nil || string(meta) != "ok" || l2.calls != 0 {
				t.Fatalf("empty answer: %q %v, land called %d times", meta, err, l2.calls)
			}
			o.waitUnpinned(t)
			st := p.Stats()
			if st.Reads != 3 || st.BytesIn != uint64(len(want)) {
				t.Fatalf("peer stats %+v", st)
			}
		})
	}
}

func TestFetchRefusals(t *testing.T) {
	data := bytes.Repeat([]byte{7}, 100<<10)
	o := newFetchOwner(t, nil, data)
	a := newLocal(t, nil)
	buf := make([]byte, len(data))
	ld, _ := a.Register(buf)
	p, err := a.Connect(context.Background(), o.tr.Addr())
	if err != nil {
		t.Fatal(err)
	}
	f := p.(rdma.Fetcher)
	ctx := context.Background()
	ok := func() {
		t.Helper()
		l := &into{local: ld}
		if _, err := f.Fetch(ctx, []byte("block"), l.land); err != nil {
			t.Fatalf("fetch after a refusal: %v", err)
		}
	}

	// Bytes that do not match the owner's sum: ErrChecksum, pin given back.
	if _, err := f.Fetch(ctx, []byte("bad sum"), (&into{local: ld}).land); !errors.Is(err, rdma.ErrChecksum) {
		t.Fatalf("bad sum: %v, want ErrChecksum", err)
	}
	ok()
	// The lander refuses: its error, nothing landed, the pin given back.
	errNo := errors.New("no slot")
	clear(buf)
	if _, err := f.Fetch(ctx, []byte("block"), (&into{local: ld, err: errNo}).land); !errors.Is(err, errNo) {
		t.Fatalf("lander refused: %v", err)
	}
	// A lander that names a range outside its region.
	if _, err := f.Fetch(ctx, []byte("block"), (&into{local: ld, off: 1 << 20}).land); !errors.Is(err, rdma.ErrOutOfRange) {
		t.Fatalf("lander out of range: %v, want ErrOutOfRange", err)
	}
	ok()
	// An answer the owner cannot send (metadata too large): refused there.
	if _, err := f.Fetch(ctx, []byte("huge meta"), (&into{local: ld}).land); err == nil {
		t.Fatal("an answer with oversized metadata was accepted")
	}
	ok()
	// A request too large is refused before it is sent.
	calls := o.calls.Load()
	if _, err := f.Fetch(ctx, make([]byte, rdma.MaxFetchRequest+1), (&into{local: ld}).land); !errors.Is(err, rdma.ErrTooLarge) {
		t.Fatalf("oversized request: %v, want ErrTooLarge", err)
	}
	if o.calls.Load() != calls {
		t.Fatal("an oversized request reached the handler")
	}
	// Named reads no longer served: ErrUnsupported, and the connection
	// still serves one-sided reads.
	o.tr.HandleFetch(nil)
	if _, err := f.Fetch(ctx, []byte("block"), (&into{local: ld}).land); !errors.Is(err, rdma.ErrUnsupported) {
		t.Fatalf("no handler: %v, want ErrUnsupported", err)
	}
	if err := p.Read(ctx, rdma.Op{Local: ld.ID, Remote: o.region, Len: uint64(len(data))}); err != nil {
		t.Fatalf("read after a refused fetch: %v", err)
	}
	o.waitUnpinned(t)
}

// TestFetchCorruptedOnTheWay: a bit flipped in the fetched bytes on the
// wire fails the fetch with ErrChecksum.
func TestFetchCorruptedOnTheWay(t *testing.T) {
	data := bytes.Repeat([]byte("tidepool"), (256<<10)/8)
	o := newFetchOwner(t, nil, data)
	// Past the hello-ack, the meta header, the 2 metadata bytes and the
	// first data header: inside the data.
	a := newLocal(t, func(c *Config) { c.Dial = flipDialer(false, 3*frame.HeaderSize+2+1000) })
	buf := make([]byte, len(data))
	ld, _ := a.Register(buf)
	p, err := a.Connect(context.Background(), o.tr.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.(rdma.Fetcher).Fetch(context.Background(), []byte("block"), (&into{local: ld}).land); !errors.Is(err, rdma.ErrChecksum) {
		t.Fatalf("corrupted on the way: %v, want ErrChecksum", err)
	}
}

// TestFetchOversizedRequestOnTheWire: a peer that announces a request
// longer than MaxFetchRequest is refused and cut off before the server
// reads or allocates it.
func TestFetchOversizedRequestOnTheWire(t *testing.T) {
	o := newFetchOwner(t, nil, make([]byte, 4096))
	c, err := net.Dial("tcp", o.tr.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var hb [frame.HeaderSize]byte
	if _, err := c.Write(frame.Encode(hb[:], frame.Header{Op: frame.OpHello, RequestID: 1})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(frame.Encode(hb[:], frame.Header{Op: frame.OpFetch, RequestID: 2, Length: frame.MaxLength})); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(c) // the server closes the connection
	if len(rest) < 2*frame.HeaderSize {
		t.Fatalf("got %d bytes, want hello-ack and an error", len(rest))
	}
	h, err := frame.Decode(rest[frame.HeaderSize:])
	if err != nil || h.Op != frame.OpError || h.Status != frame.StatusTooLarge {
		t.Fatalf("answer %+v %v, want a too-large error", h, err)
	}
	if o.calls.Load() != 0 {
		t.Fatal("the handler ran")
	}
}

// TestFetchMem: a named read lands in plain memory the lander returns
// (never registered), checked against its sum as it lands; a lander that
// refuses, or returns the wrong length, gets nothing written.
func TestFetchMem(t *testing.T) {
	data := bytes.Repeat([]byte("into memory of the caller's own "), (300<<10)/32)
	o := newFetchOwner(t, func(c *Config) { c.ChunkSize = 64 << 10 }, data)
	a := newLocal(t, nil)
	p, err := a.Connect(context.Background(), o.tr.Addr())
	if err != nil {
		t.Fatal(err)
	}
	f := p.(rdma.MemFetcher)
	ctx := context.Background()
	want := data[16:]
	mem := bytes.Repeat([]byte{0xEE}, len(data)+64)
	var calls int
	meta, err := f.FetchMem(ctx, []byte("block"), func(meta []byte, n uint64, sum uint32) ([]byte, error) {
		calls++
		if string(meta) != "ok" || n != uint64(len(want)) || sum != frame.Checksum(want) {
			t.Errorf("land(%q, %d, %08x)", meta, n, sum)
		}
		return mem[32 : 32+n], nil
	})
	if err != nil || string(meta) != "ok" || calls != 1 {
		t.Fatalf("FetchMem: %q, %v, land called %d times", meta, err, calls)
	}
	if !bytes.Equal(mem[32:32+len(want)], want) || !bytes.Equal(mem[:32], bytes.Repeat([]byte{0xEE}, 32)) ||
		!bytes.Equal(mem[32+len(want):], bytes.Repeat([]byte{0xEE}, len(mem)-32-len(want))) {
		t.Fatal("bytes differ, or landed outside their range")
	}
	clean := bytes.Repeat([]byte{0xEE}, len(mem))
	for name, land := range map[string]rdma.MemLander{
		"refused":      func([]byte, uint64, uint32) ([]byte, error) { return nil, errors.New("no room") },
		"short memory": func(_ []byte, n uint64, _ uint32) ([]byte, error) { return mem[:n-1], nil },
	} {
		copy(mem, clean)
		if _, err := f.FetchMem(ctx, []byte("block"), land); err == nil {
			t.Fatalf("%s: no error", name)
		}
		if !bytes.Equal(mem, clean) {
			t.Fatalf("%s: bytes written", name)
		}
	}
	if _, err := f.FetchMem(ctx, []byte("bad sum"), func(_ []byte, n uint64, _ uint32) ([]byte, error) { return mem[:n], nil }); !errors.Is(err, rdma.ErrChecksum) {
		t.Fatalf("bad sum: %v, want ErrChecksum", err)
	}
	o.waitUnpinned(t)
}

// waitUnpinned fails t unless every pin the owner handed out is given back
// within 5 s: the owner unpins once its writev returned, which may be a
// moment after the last byte landed at the fetcher (CI saw "1 pins not
// given back" when this was checked at once).
func (o *fetchOwner) waitUnpinned(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); o.pinned.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d pins not given back", o.pinned.Load())
		}
	}
}

// TestReadSummed: the checksum taken piece by piece as the bytes arrive is
// the checksum of the whole, however the reads are cut; a stream that ends
// early is an error, never a short success.
func TestReadSummed(t *testing.T) {
	src := make([]byte, 300<<10+7)
	for i := range src {
		src[i] = byte(i*7 + i>>9)
	}
	want := frame.UpdateChecksum(frame.UpdateChecksum(0, []byte("head")), src)
	for name, r := range map[string]io.Reader{
		"whole":    bytes.NewReader(src),
		"one byte": iotest.OneByteReader(bytes.NewReader(src)),
		"halves":   iotest.HalfReader(bytes.NewReader(src)),
		"data+EOF": iotest.DataErrReader(bytes.NewReader(src)),
	} {
		dst := make([]byte, len(src))
		sum, err := readSummed(r, dst, frame.UpdateChecksum(0, []byte("head")))
		if err != nil || sum != want || !bytes.Equal(dst, src) {
			t.Errorf("%s: sum %08x err %v (want %08x), bytes equal %v", name, sum, err, want, bytes.Equal(dst, src))
		}
	}
	dst := make([]byte, len(src)+1)
	if _, err := readSummed(iotest.HalfReader(bytes.NewReader(src)), dst, 0); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("short stream: %v, want io.ErrUnexpectedEOF", err)
	}
	boom := errors.New("boom")
	if _, err := readSummed(io.MultiReader(bytes.NewReader(src[:10]), iotest.ErrReader(boom)), make([]byte, 20), 0); !errors.Is(err, boom) {
		t.Errorf("reader error: %v, want boom", err)
	}
}
