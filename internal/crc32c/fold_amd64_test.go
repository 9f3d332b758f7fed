package crc32c

import (
	"fmt"
	"hash/crc32"
	"testing"
)

// withKernel runs f with the folding kernel on or off, and restores it.
func withKernel(t testing.TB, folded bool, f func()) {
	if folded && !useFold {
		t.Skip("this CPU has no VPCLMULQDQ on AVX2 registers")
	}
	saved := useFold
	useFold = folded
	defer func() { useFold = saved }()
	f()
}

// TestFoldEveryLength checks Copy with the folding kernel against copy and
// hash/crc32 on every length around the kernel's step, minimum and chunk,
// at several alignments (and Checksum and Update from a CRC, which the
// kernel must not change); its constants are derived in TestFoldConstants.
func TestFoldEveryLength(t *testing.T) {
	withKernel(t, true, func() {
		src := randomBytes(3*foldChunk+512, 5)
		var lengths []int
		for n := foldMin - 130; n <= 4*foldMin; n++ {
			lengths = append(lengths, n)
		}
		for k := 1; k <= 3; k++ {
			for d := -130; d <= 130; d += 3 {
				lengths = append(lengths, k*foldChunk+d)
			}
		}
		checkCopies(t, src, lengths)
	})
}

// TestFoldConstants derives the constants in fold_amd64.s: for a fold of D
// bits, reflect(x^(D+32) mod P) << 1 for the low quadword and
// reflect(x^(D-32) mod P) << 1 for the high one.
func TestFoldConstants(t *testing.T) {
	const p = 0x11EDC6F41 // CRC-32C's polynomial, x^32 included
	xpow := func(e int) uint64 {
		r := uint64(1)
		for range e {
			if r <<= 1; r&(1<<32) != 0 {
				r ^= p
			}
		}
		return r
	}
	k := func(e int) uint64 {
		var r uint64
		v := xpow(e)
		for i := range 32 {
			r |= (v >> i & 1) << (31 - i)
		}
		return r << 1
	}
	for _, c := range []struct {
		d      int
		lo, hi uint64
	}{
		{1024, 0x6992cea2, 0x0d3b6092},
		{256, 0x1384aa63a, 0xba4fc28e},
		{128, 0xf20c0dfe, 0x14cd00bd6},
	} {
		if lo, hi := k(c.d+32), k(c.d-32); lo != c.lo || hi != c.hi {
			t.Errorf("fold of %d bits: constants %#x, %#x; fold_amd64.s has %#x, %#x", c.d, lo, hi, c.lo, c.hi)
		}
	}
}

// BenchmarkKernels compares Copy with the folding kernel and with the
// three-stream crc32 kernel, and a copy followed by hash/crc32, on 1 MiB
// blocks from cache (hot: one block), from the last-level cache (l3: 12)
// and from memory (cold: 64), and a plain copy from memory, for scale
// (BenchmarkChecksum has the checksum alone):
//
//	go test -run '^$' -bench 'Kernels|Checksum' ./internal/crc32c/
func BenchmarkKernels(b *testing.B) {
	bufs, dsts := benchBlocks(), benchBlocks()
	for _, kernel := range []string{"fold", "crc3", "hash-crc32"} {
		for _, set := range []struct {
			name string
			n    int
		}{{"hot", 1}, {"l3", 12}, {"cold", 64}} {
			b.Run(fmt.Sprintf("copy/%s/%s", kernel, set.name), func(b *testing.B) {
				withKernel(b, kernel == "fold", func() {
					b.SetBytes(1 << 20)
					for i := 0; i < b.N; i++ {
						src, dst := bufs[i%set.n], dsts[(i+7)%set.n]
						if kernel == "hash-crc32" {
							copy(dst, src)
							crc32.Checksum(src, table)
						} else {
							Copy(dst, src)
						}
					}
				})
			})
		}
	}
	b.Run("copy-only/cold", func(b *testing.B) {
		b.SetBytes(1 << 20)
		for i := 0; i < b.N; i++ {
			copy(dsts[(i+7)%64], bufs[i%64])
		}
	})
}
