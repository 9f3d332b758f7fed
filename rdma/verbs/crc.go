package verbs

// CRC-32C of a transfer cut into parts: each part's sum is computed as its
// work requests complete, and the parts' sums are combined (zlib's
// crc32_combine, for the Castagnoli polynomial) instead of reading the
// whole block again once it landed.

// castagnoliRev is the reflected CRC-32C polynomial.
const castagnoliRev = 0x82f63b78

// crcCombine returns the CRC-32C of a||b from crc(a), crc(b) and len(b).
//
//lint:ignore U1000 used by the verbs build (transfer.go)
func crcCombine(crcA, crcB uint32, lenB uint64) uint32 {
	if lenB == 0 {
		return crcA
	}
	var even, odd [32]uint32
	odd[0] = castagnoliRev // the operator for one zero bit
	row := uint32(1)
	for n := 1; n < 32; n++ {
		odd[n] = row
		row <<= 1
	}
	gf2Square(&even, &odd) // two zero bits
	gf2Square(&odd, &even) // four zero bits
	// Apply len(b) zero bytes to crc(a), squaring the operator each step.
	for {
		gf2Square(&even, &odd)
		if lenB&1 != 0 {
			crcA = gf2Times(&even, crcA)
		}
		lenB >>= 1
		if lenB == 0 {
			break
		}
		gf2Square(&odd, &even)
		if lenB&1 != 0 {
			crcA = gf2Times(&odd, crcA)
		}
		lenB >>= 1
		if lenB == 0 {
			break
		}
	}
	return crcA ^ crcB
}

func gf2Times(mat *[32]uint32, vec uint32) uint32 {
	var sum uint32
	for i := 0; vec != 0; i, vec = i+1, vec>>1 {
		if vec&1 != 0 {
			sum ^= mat[i]
		}
	}
	return sum
}

func gf2Square(square, mat *[32]uint32) {
	for n := range mat {
		square[n] = gf2Times(mat, mat[n])
	}
}
