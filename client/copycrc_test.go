package client

import (
	"bytes"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestCopyCRC checks copyCRC (one pass on amd64) against copy and
// hash/crc32: every length up to 400 bytes, lengths around the
// 3*streamLen blocks, at several alignments of source and destination.
func TestCopyCRC(t *testing.T) {
	const max = 4*3*streamLen + 64
	r := rand.New(rand.NewPCG(3, 4))
	src := make([]byte, max+8)
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	var lengths []int
	for n := 0; n <= 400; n++ {
		lengths = append(lengths, n)
	}
	for _, blocks := range []int{1, 2, 3, 4} {
		for _, d := range []int{-9, -8, -1, 0, 1, 7, 8, 63} {
			lengths = append(lengths, blocks*3*streamLen+d)
		}
	}
	dst := make([]byte, max+8)
	for _, so := range []int{0, 1, 5} {
		for _, do := range []int{0, 3, 8} {
			for _, n := range lengths {
				s := src[so : so+n]
				clear(dst)
				got := copyCRC(dst[do:], s)
				if want := crc32.Checksum(s, castagnoli); got != want {
					t.Fatalf("src+%d dst+%d, %d bytes: CRC %08x, want %08x", so, do, n, got, want)
				}
				if !bytes.Equal(dst[do:do+n], s) {
					t.Fatalf("src+%d dst+%d, %d bytes: copy differs", so, do, n)
				}
				if dst[do+n] != 0 || (do > 0 && dst[do-1] != 0) {
					t.Fatalf("src+%d dst+%d, %d bytes: wrote outside the copy", so, do, n)
				}
			}
		}
	}
}

func FuzzCopyCRC(f *testing.F) {
	f.Add([]byte{}, uint8(0))
	f.Add(bytes.Repeat([]byte{0xa5}, 3*streamLen+17), uint8(3))
	f.Add(bytes.Repeat([]byte("tidepool"), 2*3*streamLen/8), uint8(0))
	f.Fuzz(func(t *testing.T, src []byte, off uint8) {
		dst := make([]byte, len(src)+int(off%8))
		got := copyCRC(dst[off%8:], src)
		if want := crc32.Checksum(src, castagnoli); got != want {
			t.Fatalf("%d bytes: CRC %08x, want %08x", len(src), got, want)
		}
		if !bytes.Equal(dst[off%8:], src) {
			t.Fatalf("%d bytes: copy differs", len(src))
		}
	})
}

// BenchmarkCopyCRC: a 1 MiB copy with its CRC-32C, chunked (copy, then
// checksum the chunk) against copyCRC, and a plain copy for reference;
// "hot" copies one buffer over and over (all in cache), "cold" cycles
// through 64 sources and 64 destinations (64 MiB each, beyond the last-
// level cache), as PutFrom's copy into the arena and GetInto's out of it.
//
//	go test -run '^$' -bench CopyCRC ./client/
func BenchmarkCopyCRC(b *testing.B) {
	for _, set := range []struct {
		name string
		n    int
	}{{"hot", 1}, {"cold", 64}} {
		srcs, dsts := make([][]byte, set.n), make([][]byte, set.n)
		for k := range srcs {
			srcs[k], dsts[k] = make([]byte, 1<<20), make([]byte, 1<<20)
			for i := range srcs[k] {
				srcs[k][i] = byte(i*7 + k)
			}
		}
		for _, f := range []struct {
			name string
			f    func(dst, src []byte)
		}{
			{"copy", func(dst, src []byte) { copy(dst, src) }},
			{"chunked", func(dst, src []byte) { copyCRCChunked(0, dst, src) }},
			{"copyCRC", func(dst, src []byte) { copyCRC(dst, src) }},
		} {
			b.Run(set.name+"/"+f.name, func(b *testing.B) {
				b.SetBytes(1 << 20)
				i := 0
				for b.Loop() {
					f.f(dsts[(i+7)%set.n], srcs[i%set.n])
					i++
				}
			})
		}
	}
}
