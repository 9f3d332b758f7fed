package frame

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"testing"
)

func sample() Header {
	return Header{Op: OpWrite, Flags: FlagLast, RequestID: 42, Region: 7, Key: 0xdeadbeef,
		Offset: 1 << 33, Length: 4096, CRC: Checksum([]byte("x"))}
}

func TestRoundTrip(t *testing.T) {
	for _, h := range []Header{
		sample(),
		{Op: OpHello},
		{Op: OpError, Status: StatusOutOfRange, RequestID: ^uint64(0), Length: 12},
		{Op: OpRead, Region: ^uint64(0), Offset: ^uint64(0), Length: MaxLength},
		{Op: OpFetch, RequestID: 9, Length: 4096, CRC: 1},
		{Op: OpFetchMeta, RequestID: 9, Key: 0xfeedf00d, Offset: 1 << 20, Length: 12, CRC: 2},
	} {
		var buf [HeaderSize]byte
		got, err := Decode(Encode(buf[:], h))
		if err != nil {
			t.Fatalf("Decode(Encode(%+v)): %v", h, err)
		}
		if got != h {
			t.Fatalf("round trip: got %+v want %+v", got, h)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	good := func() []byte { var b [HeaderSize]byte; return Encode(b[:], sample()) }
	refix := func(b []byte) []byte { // recompute the header CRC after a field edit
		h := b[:44]
		var out [HeaderSize]byte
		copy(out[:], h)
		c := Checksum(h)
		out[44], out[45], out[46], out[47] = byte(c>>24), byte(c>>16), byte(c>>8), byte(c)
		return out[:]
	}
	tests := []struct {
		name string
		in   func() []byte
		want error
	}{
		{"short", func() []byte { return good()[:HeaderSize-1] }, ErrShort},
		{"magic", func() []byte { b := good(); b[0] = 'X'; return b }, ErrMagic},
		{"version", func() []byte { b := good(); b[4] = 2; return refix(b) }, ErrVersion},
		{"header crc", func() []byte { b := good(); b[20] ^= 1; return b }, ErrHeaderCRC},
		{"op zero", func() []byte { b := good(); b[5] = 0; return refix(b) }, ErrOp},
		{"op unknown", func() []byte { b := good(); b[5] = 99; return refix(b) }, ErrOp},
		{"flags", func() []byte { b := good(); b[6] = 0x80; return refix(b) }, ErrFlags},
		{"status", func() []byte { b := good(); b[7] = 200; return refix(b) }, ErrStatus},
		{"length", func() []byte { b := good(); b[36] = 0xff; return refix(b) }, ErrLength},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Decode(tt.in()); !errors.Is(err, tt.want) {
				t.Fatalf("Decode: got %v, want %v", err, tt.want)
			}
		})
	}
}

func TestReadHeaderEOF(t *testing.T) {
	var buf [HeaderSize]byte
	if _, err := ReadHeader(bytes.NewReader(nil), &buf); err != io.EOF {
		t.Fatalf("empty stream: %v", err)
	}
	var enc [HeaderSize]byte
	Encode(enc[:], sample())
	if _, err := ReadHeader(bytes.NewReader(enc[:10]), &buf); err != io.ErrUnexpectedEOF {
		t.Fatalf("truncated stream: %v", err)
	}
}

// splitReader returns its data in pieces cut at the given points, the way a
// TCP stream may deliver a frame.
type splitReader struct {
	data []byte
	cuts []int
}

func (s *splitReader) Read(p []byte) (int, error) {
	if len(s.data) == 0 {
		return 0, io.EOF
	}
	n := len(s.data)
	if len(s.cuts) > 0 {
		n = max(1, min(n, s.cuts[0]))
		s.cuts = s.cuts[1:]
	}
	n = min(n, len(p))
	copy(p, s.data[:n])
	s.data = s.data[n:]
	return n, nil
}

// parseStream reads consecutive frames (header, then Length payload bytes
// unless the op carries none) until an error, returning what it saw.
func parseStream(r io.Reader) ([]Header, [][]byte, error) {
	var hs []Header
	var ps [][]byte
	var buf [HeaderSize]byte
	for {
		h, err := ReadHeader(r, &buf)
		if err != nil {
			return hs, ps, err
		}
		var p []byte
		if h.Op != OpRead && h.Length > 0 {
			if h.Length > 1<<16 { // the fuzz inputs are small; do not allocate big
				return hs, ps, ErrLength
			}
			p = make([]byte, h.Length)
			if _, err := io.ReadFull(r, p); err != nil {
				return hs, ps, err
			}
		}
		hs = append(hs, h)
		ps = append(ps, p)
	}
}

func FuzzDecodeHeader(f *testing.F) {
	var b [HeaderSize]byte
	h := sample()
	h.Length = 3
	f.Add(append(Encode(b[:], h), 'a', 'b', 'c'), uint8(1), uint8(47))
	f.Add(Encode(b[:], Header{Op: OpRead, Length: 1 << 20}), uint8(5), uint8(0))
	f.Add([]byte("TPXF"), uint8(2), uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, c1, c2 uint8) {
		h, err := Decode(data)
		if err == nil {
			var out [HeaderSize]byte
			if !bytes.Equal(Encode(out[:], h), data[:HeaderSize]) {
				t.Fatalf("Encode(Decode(x)) != x for %x", data[:HeaderSize])
			}
			if h.Length > MaxLength || h.Op == 0 || h.Op >= opSentinel {
				t.Fatalf("Decode accepted an invalid header %+v", h)
			}
		}
		// The same bytes fed whole and split at arbitrary points parse alike.
		wh, wp, werr := parseStream(bytes.NewReader(data))
		sh, sp, serr := parseStream(&splitReader{data: data, cuts: []int{int(c1), int(c2), 1, 3}})
		if len(wh) != len(sh) || (werr == nil) != (serr == nil) {
			t.Fatalf("whole: %d frames, %v; split: %d frames, %v", len(wh), werr, len(sh), serr)
		}
		for i := range wh {
			if wh[i] != sh[i] || !bytes.Equal(wp[i], sp[i]) {
				t.Fatalf("frame %d differs: %+v vs %+v", i, wh[i], sh[i])
			}
		}
		if werr != nil && serr != nil && werr.Error() != serr.Error() {
			t.Fatalf("errors differ: %v vs %v", werr, serr)
		}
	})
}

// TestGolden: a header as it crosses the wire, its bytes made from the
// layout above with Python's struct and an independent CRC-32C
// (clients/python/tidepool/checksum.py): decoded to its fields and
// written back byte for byte, so that a change that breaks older peers
// fails here.
func TestGolden(t *testing.T) {
	t.Parallel()
	const golden = "5450584601030100000000000000002a0000000000000007deadbeef000000020000000000001000a93c5f934428d612"
	b, err := hex.DecodeString(golden)
	if err != nil {
		t.Fatal(err)
	}
	if h, err := Decode(b); err != nil || h != sample() {
		t.Fatalf("decoded %+v, %v; want %+v", h, err, sample())
	}
	var buf [HeaderSize]byte
	if got := Encode(buf[:], sample()); !bytes.Equal(got, b) {
		t.Fatalf("encoded %x, want %x", got, b)
	}
}
