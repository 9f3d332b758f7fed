package crc32c

import (
	"hash/crc32"
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:noescape
func crc3(src *byte, crc uint32) (a, b, c uint32)

//go:noescape
func copy3(dst, src *byte, crc uint32) (a, b, c uint32)

var (
	useKernel = cpu.X86.HasSSE42
	// shiftTab[k][v] is the raw CRC-32C register after streamLen zero
	// bytes from the register v<<8k: the register after one stream,
	// moved past the next stream's length (the map is linear, so four byte
	// tables hold it).
	shiftTab = makeShiftTab()
)

func makeShiftTab() *[4][256]uint32 {
	zeros := make([]byte, streamLen)
	var basis [32]uint32
	for i := range basis {
		// crc32.Update inverts the register before and after.
		basis[i] = ^crc32.Update(^(uint32(1) << i), table, zeros)
	}
	t := new([4][256]uint32)
	for k := range 4 {
		for v := range 256 {
			var r uint32
			for j := range 8 {
				if v&(1<<j) != 0 {
					r ^= basis[8*k+j]
				}
			}
			t[k][v] = r
		}
	}
	return t
}

func shiftStream(r uint32) uint32 {
	t := shiftTab
	return t[0][r&0xff] ^ t[1][r>>8&0xff] ^ t[2][r>>16&0xff] ^ t[3][r>>24]
}

// updatePieces checksums the whole pieces of b into crc and returns the
// rest of b.
func updatePieces(crc uint32, b []byte) (uint32, []byte) {
	r := ^crc
	for len(b) >= pieceLen {
		x, y, z := crc3(unsafe.SliceData(b), r)
		r = shiftStream(shiftStream(x)^y) ^ z
		b = b[pieceLen:]
	}
	return ^r, b
}

// copyPieces copies the whole pieces of src into dst, checksumming them
// into crc, and returns the rest of both.
func copyPieces(crc uint32, dst, src []byte) (uint32, []byte, []byte) {
	r := ^crc
	for len(src) >= pieceLen {
		x, y, z := copy3(unsafe.SliceData(dst), unsafe.SliceData(src), r)
		r = shiftStream(shiftStream(x)^y) ^ z
		dst, src = dst[pieceLen:], src[pieceLen:]
	}
	return ^r, dst, src
}
