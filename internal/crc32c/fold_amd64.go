package crc32c

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// foldCopy (fold_amd64.s) copies and checksums by folding with carry-less
// multiplies 256 bits wide (VPCLMULQDQ on YMM registers, AVX2).

//go:noescape
func foldCopy(dst, src *byte, n int, crc uint32) uint32

func cpuidVPCLMULQDQ() bool

// useFold is a variable so that tests and benchmarks can compare the two
// kernels on one machine.
var useFold = useKernel && cpu.X86.HasAVX2 && cpu.X86.HasPCLMULQDQ && cpuidVPCLMULQDQ()

// copyFolded copies the whole foldSteps of src into dst, checksumming them
// into crc, and returns the rest of both.
func copyFolded(crc uint32, dst, src []byte) (uint32, []byte, []byte) {
	r := ^crc
	for len(src) >= foldStep {
		n := min(len(src), foldChunk) &^ (foldStep - 1)
		r = foldCopy(unsafe.SliceData(dst), unsafe.SliceData(src), n, r)
		dst, src = dst[n:], src[n:]
	}
	return ^r, dst, src
}
