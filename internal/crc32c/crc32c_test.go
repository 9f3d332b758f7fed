package crc32c

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

func TestChecksumMatchesHashCRC32(t *testing.T) {
	buf := randomBytes(3<<20, 1)
	for _, tc := range []struct {
		name     string
		off, len int
	}{
		{"empty", 0, 0},
		{"one byte", 0, 1},
		{"under a piece", 3, pieceLen - 1},
		{"one piece", 0, pieceLen},
		{"piece and a byte, unaligned", 5, pieceLen + 1},
		{"1 MiB", 0, 1 << 20},
		{"1 MiB unaligned, odd tail", 7, 1<<20 + 77},
		{"3 MiB", 0, 3 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := buf[tc.off : tc.off+tc.len]
			if got, want := Checksum(b), crc32.Checksum(b, table); got != want {
				t.Fatalf("Checksum = %08x, want %08x", got, want)
			}
			dst := make([]byte, tc.len+3)
			if got, want := Copy(dst, b), crc32.Checksum(b, table); got != want || !bytes.Equal(dst[:tc.len], b) {
				t.Fatalf("Copy = %08x, want %08x (bytes equal: %v)", got, want, bytes.Equal(dst[:tc.len], b))
			}
			// Continued from a prefix, split at awkward points.
			for _, cut := range []int{0, 1, tc.len / 3, tc.len - 1} {
				if cut < 0 || cut > tc.len {
					continue
				}
				if got, want := Update(Checksum(b[:cut]), b[cut:]), crc32.Checksum(b, table); got != want {
					t.Fatalf("split at %d: %08x, want %08x", cut, got, want)
				}
			}
		})
	}
}

// TestCopyEveryLength checks Copy and Checksum against copy + hash/crc32 on
// every length up to 400 bytes and around one to four pieces, at several
// alignments of source and destination.
func TestCopyEveryLength(t *testing.T) {
	const max = 4*pieceLen + 64
	src := randomBytes(max+8, 3)
	var lengths []int
	for n := 0; n <= 400; n++ {
		lengths = append(lengths, n)
	}
	for k := 1; k <= 4; k++ {
		for d := -17; d <= 17; d++ {
			lengths = append(lengths, k*pieceLen+d)
		}
	}
	checkCopies(t, src, lengths)
}

// randomBytes returns n bytes drawn from a generator seeded with seed.
func randomBytes(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// checkCopies checks Copy, Checksum and Update (from a CRC) of src's first
// n bytes, for each n of lengths, against copy and hash/crc32, at several
// alignments of source and destination; src must be 7 bytes longer than
// the longest.
func checkCopies(t *testing.T, src []byte, lengths []int) {
	t.Helper()
	dst := make([]byte, len(src)+16)
	for _, n := range lengths {
		for _, al := range [][2]int{{0, 0}, {1, 0}, {0, 3}, {5, 7}, {7, 1}} {
			s := src[al[0] : al[0]+n]
			d := dst[al[1] : al[1]+n]
			clear(dst)
			want := crc32.Checksum(s, table)
			if got := Copy(d, s); got != want || !bytes.Equal(d, s) {
				t.Fatalf("Copy of %d bytes at alignment %v: %08x, want %08x (bytes equal: %v)", n, al, got, want, bytes.Equal(d, s))
			}
			if got := Checksum(s); got != want {
				t.Fatalf("Checksum of %d bytes at alignment %d: %08x, want %08x", n, al[0], got, want)
			}
			prefix := uint32(n) * 2654435761
			if got, want := Update(prefix, s), crc32.Update(prefix, table, s); got != want {
				t.Fatalf("Update from %08x of %d bytes: %08x, want %08x", prefix, n, got, want)
			}
		}
	}
}

func FuzzCopy(f *testing.F) {
	f.Add([]byte{}, uint8(0))
	f.Add(bytes.Repeat([]byte{0xa5}, pieceLen+17), uint8(3))
	f.Add(bytes.Repeat([]byte("tidepool"), 2*pieceLen/8), uint8(0))
	f.Fuzz(func(t *testing.T, src []byte, off uint8) {
		dst := make([]byte, len(src)+int(off%8))
		got := Copy(dst[off%8:], src)
		if want := crc32.Checksum(src, table); got != want {
			t.Fatalf("%d bytes: CRC %08x, want %08x", len(src), got, want)
		}
		if !bytes.Equal(dst[off%8:], src) {
			t.Fatalf("%d bytes: copy differs", len(src))
		}
		if got, want := Checksum(src), crc32.Checksum(src, table); got != want {
			t.Fatalf("%d bytes: Checksum %08x, want %08x", len(src), got, want)
		}
	})
}

// benchBlocks returns the benchmarks' 64 blocks of 1 MiB.
func benchBlocks() [][]byte {
	bufs := make([][]byte, 64)
	for i := range bufs {
		bufs[i] = make([]byte, 1<<20)
		for j := range bufs[i] {
			bufs[i][j] = byte(i*31 + j*7)
		}
	}
	return bufs
}

// BenchmarkChecksum checksums 1 MiB blocks from cache (hot: one block),
// from the last-level cache (l3: 12 blocks) and from memory (cold: 64
// blocks), against hash/crc32 on the same blocks:
//
//	go test -run '^$' -bench Checksum ./internal/crc32c/
func BenchmarkChecksum(b *testing.B) {
	bufs := benchBlocks()
	for _, impl := range []struct {
		name string
		f    func([]byte) uint32
	}{{"crc32c", Checksum}, {"hash-crc32", func(b []byte) uint32 { return crc32.Checksum(b, table) }}} {
		for _, set := range []struct {
			name string
			n    int
		}{{"hot", 1}, {"l3", 12}, {"cold", 64}} {
			b.Run(fmt.Sprintf("%s/%s", impl.name, set.name), func(b *testing.B) {
				b.SetBytes(1 << 20)
				for i := 0; i < b.N; i++ {
					impl.f(bufs[i%set.n])
				}
			})
		}
	}
}
