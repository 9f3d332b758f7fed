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

// BenchmarkCopyCRC: one 1 MiB copy with its CRC-32C, chunked (copy, then
// checksum the chunk) against copyCRC, and a plain copy for reference.
//
//	go test -run '^$' -bench CopyCRC ./client/
func BenchmarkCopyCRC(b *testing.B) {
	src := make([]byte, 1<<20)
	for i := range src {
		src[i] = byte(i * 7)
	}
	dst := make([]byte, len(src))
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			copy(dst, src)
		}
	})
	b.Run("chunked", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			copyCRCChunked(0, dst, src)
		}
	})
	b.Run("copyCRC", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			copyCRC(dst, src)
		}
	})
}
