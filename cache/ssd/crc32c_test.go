package ssd

import (
	"context"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
)

// TestRocksCRCExtend checks the CRC-32C handed to librocksdb against Go's
// on every length up to past two long three-stream rounds, at every
// alignment of 8 and from several starting CRCs.
func TestRocksCRCExtend(t *testing.T) {
	buf := make([]byte, 3*4096*2+3*256+40)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	lengths := []int{}
	for n := 0; n <= 3*256*2+17; n++ {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 3*4096-1, 3*4096, 3*4096+1, 3*4096+3*256+9, 2*3*4096, len(buf)-8)
	for _, init := range []uint32{0, 0xffffffff, 0x1234abcd} {
		for off := 0; off < 8; off++ {
			for _, n := range lengths {
				p := buf[off : off+n]
				if got, want := rocksCRCExtend(init, p), cache.UpdateChecksum(init, p); got != want {
					t.Fatalf("init %08x, offset %d, %d bytes: %08x, want %08x", init, off, n, got, want)
				}
			}
		}
	}
	// The RocksDB unit test's vector: 32 bytes of zeros.
	if got := rocksCRCExtend(0, make([]byte, 32)); got != 0x8a9136aa {
		t.Fatalf("32 zero bytes: %08x, want 8a9136aa", got)
	}
}

// TestRocksCRCInterposed checks that librocksdb's own checksums go through
// the replacement: block writes and a flush must call it.
func TestRocksCRCInterposed(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skip("the replacement is built on linux/amd64 only")
	}
	tr := newTier(t, testConfig(t.TempDir()))
	before := rocksCRCCalls()
	for i := range 8 {
		mustPut(t, tr, "ns", key(i), value(uint64(i), 256<<10), cache.PutOptions{})
	}
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		mustGet(t, tr, "ns", key(i), value(uint64(i), 256<<10))
	}
	if after := rocksCRCCalls(); after <= before {
		t.Fatalf("librocksdb made no call to the replacement CRC-32C (%d before, %d after)", before, after)
	}
}

func BenchmarkRocksCRC(b *testing.B) {
	p := make([]byte, 1<<20)
	b.Run("replacement", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			rocksCRCExtend(0, p)
		}
	})
	b.Run("go", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			cache.Checksum(p)
		}
	})
}
