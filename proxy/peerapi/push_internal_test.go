package peerapi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"testing"

	"github.com/cloudwego/gopkg/bufiox"
)

func TestPushCalls(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sizes  []int
		base   int
		budget int
		want   [][2]int
	}{
		{"none", nil, 10, 100, nil},
		{"all in one", []int{10, 20, 30}, 10, 100, [][2]int{{0, 3}}},
		{"exactly the budget", []int{30, 30, 30}, 10, 100, [][2]int{{0, 3}}},
		{"one byte over", []int{30, 30, 31}, 10, 100, [][2]int{{0, 2}, {2, 3}}},
		{"even cuts", []int{40, 40, 40, 40, 40}, 10, 100, [][2]int{{0, 2}, {2, 4}, {4, 5}}},
		{"a large one alone", []int{10, 500, 10, 10}, 10, 100, [][2]int{{0, 1}, {1, 2}, {2, 4}}},
		{"large ones first and last", []int{500, 10, 500}, 10, 100, [][2]int{{0, 1}, {1, 2}, {2, 3}}},
		{"each alone", []int{60, 60, 60}, 10, 100, [][2]int{{0, 1}, {1, 2}, {2, 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := pushCalls(tc.sizes, tc.base, tc.budget)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("pushCalls(%v, %d, %d) = %v, want %v", tc.sizes, tc.base, tc.budget, got, tc.want)
			}
			// Every item in exactly one call, in order; a call of more than
			// one item within the budget.
			next := 0
			for _, c := range got {
				if c[0] != next || c[1] <= c[0] {
					t.Fatalf("call %v after item %d", c, next)
				}
				n := tc.base
				for _, sz := range tc.sizes[c[0]:c[1]] {
					n += sz
				}
				if c[1]-c[0] > 1 && n > tc.budget {
					t.Fatalf("call %v of %d bytes exceeds %d", c, n, tc.budget)
				}
				next = c[1]
			}
			if next != len(tc.sizes) {
				t.Fatalf("calls cover %d of %d items", next, len(tc.sizes))
			}
		})
	}
}

// trickle hands out at most n bytes per Read, as an encrypted connection
// (one record a read) or a slow network does.
type trickle struct {
	r io.Reader
	n int
}

func (t *trickle) Read(p []byte) (int, error) { return t.r.Read(p[:min(len(p), t.n)]) }

// pastEnd fails a read: the frame reader must not read past a frame's end.
type pastEnd struct{}

func (pastEnd) Read([]byte) (int, error) { return 0, errors.New("read past the frame") }

func frame(body []byte) []byte {
	f := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	return append(f, body...)
}

// TestFrameReader: Kitex's reader (bufiox.DefaultReader) gives up on a
// Next(n) that takes more than 100 reads; through a frameReader a frame of
// 4 MiB, trickled 16 KiB a read, is read whole by one Next, without a
// read past the frame (the sender would not send more before the reply).
func TestFrameReader(t *testing.T) {
	body := bytes.Repeat([]byte("tidepool"), 512<<10) // 4 MiB
	src := func() io.Reader {
		return &trickle{r: io.MultiReader(bytes.NewReader(frame(body)), pastEnd{}), n: 16 << 10}
	}

	// Kitex's reader alone: nothing, and no error.
	r := bufiox.NewDefaultReader(src())
	if _, err := r.Next(4); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Next(len(body)); err != nil || len(got) != 0 {
		t.Fatalf("without the frame reader: %d bytes, %v; want the failure this guards against (none, nil)", len(got), err)
	}

	r = bufiox.NewDefaultReader(&frameReader{r: src()})
	hdr, err := r.Next(4)
	if err != nil || binary.BigEndian.Uint32(hdr) != uint32(len(body)) {
		t.Fatalf("header %x, %v", hdr, err)
	}
	got, err := r.Next(len(body))
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("through the frame reader: %d bytes, %v", len(got), err)
	}
}

func TestFrameReaderStream(t *testing.T) {
	frames := [][]byte{[]byte("one"), {}, bytes.Repeat([]byte{7}, 100000), []byte("last")}
	var stream []byte
	for _, f := range frames {
		stream = append(stream, frame(f)...)
	}
	for _, tc := range []struct {
		name       string
		chunk, buf int
	}{{"one byte a read, small buffer", 1, 3}, {"large reads", 1 << 20, 1 << 20}, {"odd", 7, 5000}} {
		t.Run(tc.name, func(t *testing.T) {
			fr := &frameReader{r: &trickle{r: bytes.NewReader(stream), n: tc.chunk}}
			var out []byte
			p := make([]byte, tc.buf)
			sizes := map[int]bool{}
			for {
				n, err := fr.Read(p)
				out = append(out, p[:n]...)
				sizes[len(out)] = true
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(out, stream) {
				t.Fatalf("read %d bytes, want the %d of the stream", len(out), len(stream))
			}
			// No read crosses a frame's end.
			end := 0
			for _, f := range frames {
				end += 4 + len(f)
				if end < len(stream) && !sizes[end] {
					t.Fatalf("a read crossed the frame end at %d", end)
				}
			}
		})
	}
}

// TestFrameReaderUnframed: a stream that does not start with a frame
// length (unframed Thrift: its first word is the protocol version, top
// bit set) passes through as it comes.
func TestFrameReaderUnframed(t *testing.T) {
	stream := append([]byte{0x80, 0x01, 0x00, 0x01}, bytes.Repeat([]byte{1}, 1000)...)
	fr := &frameReader{r: &trickle{r: bytes.NewReader(stream), n: 100}}
	got, err := io.ReadAll(fr)
	if err != nil || !bytes.Equal(got, stream) {
		t.Fatalf("%d bytes, %v", len(got), err)
	}
	// Reads after the first word are the source's own.
	fr = &frameReader{r: &trickle{r: bytes.NewReader(stream), n: 100}}
	p := make([]byte, 4096)
	if n, _ := fr.Read(p); n != 4 {
		t.Fatalf("first read %d bytes, want the 4 of the first word", n)
	}
	if n, _ := fr.Read(p); n != 100 {
		t.Fatalf("second read %d bytes, want the source's 100", n)
	}
}
