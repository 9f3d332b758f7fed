package verbs

import (
	"math/rand/v2"
	"testing"

	"github.com/tidepool-kv/tidepool/protocol/frame"
)

// TestCRCCombine: the sums of consecutive parts combine to the sum of the
// whole, for part boundaries at 0, 1, odd sizes, 4 KiB multiples and the
// end (the verbs read checks a block this way, part by part as its work
// requests complete).
func TestCRCCombine(t *testing.T) {
	b := make([]byte, 1<<20+37)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	whole := frame.Checksum(b)
	for _, cuts := range [][]int{
		{0}, {1}, {len(b)}, {4096}, {1 << 18, 1 << 19, 3 << 18}, {7, 8, 4099, 65536, len(b) - 1},
	} {
		var crc uint32
		prev := 0
		for _, c := range append(cuts, len(b)) {
			crc = crcCombine(crc, frame.Checksum(b[prev:c]), uint64(c-prev))
			prev = c
		}
		if crc != whole {
			t.Errorf("cuts %v: combined %08x, whole %08x", cuts, crc, whole)
		}
	}
	if got := crcCombine(whole, frame.Checksum(nil), 0); got != whole {
		t.Errorf("combine with empty: %08x, want %08x", got, whole)
	}
}
