// Package crc32c computes CRC-32C (Castagnoli), the checksum tidepool stores
// with every block, faster than hash/crc32 on buffers that are not in cache.
//
// hash/crc32 (amd64) interleaves three streams a few hundred bytes apart;
// its loads outrun neither the crc32 instruction nor, on a buffer in main
// memory, the hardware prefetcher: on the dev VM it checksums a cached
// 1 MiB at ~22 GB/s but one read from memory at ~5–6 GB/s, slower than a
// copy of it (~14 GB/s). Here each 12 KiB piece is three 4 KiB streams, one
// per page, with software prefetches two pieces ahead (crc32c_amd64.s):
// ~26 GB/s cached, ~16 GB/s from memory (BenchmarkChecksum). The sidecar
// checksums committed slots right after another process wrote them, and
// scrubs blocks nobody read for a while: both mostly miss the cache.
//
// Where the CPU has VPCLMULQDQ on AVX2 registers, Copy of foldMin bytes or
// more folds instead (fold_amd64.s): four 256-bit accumulators of
// carry-less products, 128 bytes per step, each step's loads stored and
// folded. On the dev VM a copy and CRC of a cached 1 MiB runs at ~23 GB/s
// that way against ~11 GB/s for the three-stream kernel, whose stores and
// crc32 instructions contend (BenchmarkKernels). Checksum keeps the crc32
// kernel: folding alone ran no faster (19–25 GB/s cached, 15–16 GB/s from
// memory against 17–20).
package crc32c

import "hash/crc32"

var table = crc32.MakeTable(crc32.Castagnoli)

// streamLen is the length of each of the kernel's three streams; pieceLen
// is what one kernel call checksums.
const (
	streamLen = 4096
	pieceLen  = 3 * streamLen
)

// The folding copy takes multiples of foldStep bytes, at most foldChunk per
// call (so that a call is short), and only buffers of at least foldMin
// bytes, below which its setup and final reduction cost more than they
// save.
const (
	foldStep  = 128
	foldChunk = 64 << 10
	foldMin   = 512
)

// Checksum returns the CRC-32C of b (the value crc32.Checksum(b,
// crc32.MakeTable(crc32.Castagnoli)) returns).
func Checksum(b []byte) uint32 { return Update(0, b) }

// Update returns the CRC-32C of the bytes checksummed into crc followed by
// b (as crc32.Update with the Castagnoli table).
func Update(crc uint32, b []byte) uint32 {
	if useKernel && len(b) >= pieceLen {
		crc, b = updatePieces(crc, b)
	}
	return crc32.Update(crc, table, b)
}

// Copy copies src into dst, which must be at least as long, and returns
// the CRC-32C of src: one pass over the bytes where the kernel is
// available (1 MiB from memory to memory on the dev VM, best of 40: 115 µs,
// against 159 µs for a copy of each 32 KiB followed by its checksum, and
// 69 µs for the copy alone).
func Copy(dst, src []byte) uint32 {
	dst = dst[:len(src)]
	var crc uint32
	if useFold && len(src) >= foldMin {
		crc, dst, src = copyFolded(crc, dst, src)
	} else if useKernel && len(src) >= pieceLen {
		crc, dst, src = copyPieces(crc, dst, src)
	}
	copy(dst, src)
	return crc32.Update(crc, table, src)
}
