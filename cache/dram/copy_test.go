package dram

import (
	"bytes"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
)

func TestCopyChecksum(t *testing.T) {
	for _, n := range []int{0, 1, copyChunk - 1, copyChunk, copyChunk + 1, 3*copyChunk + 17} {
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(i*31 + i>>8)
		}
		for _, ofDst := range []bool{false, true} {
			dst := make([]byte, n)
			if got, want := copyChecksum(dst, src, ofDst), cache.Checksum(src); got != want {
				t.Errorf("n=%d ofDst=%v: crc %08x, want %08x", n, ofDst, got, want)
			}
			if !bytes.Equal(dst, src) {
				t.Errorf("n=%d: copy differs", n)
			}
		}
	}
}
