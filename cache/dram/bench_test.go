//go:build linux

package dram

import (
	"encoding/binary"
	"os"
	"sync/atomic"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
)

// benchTier makes a 64 MiB tier, in /dev/shm when it is there (as in
// production, where Dir is a tmpfs volume), else in the test's temp dir,
// and writes it full once so that timings do not include first-touch page
// faults (costly on a VM).
func benchTier(b *testing.B) *Tier {
	b.Helper()
	cfg, _ := testConfig(b, 64<<20)
	cfg.ArenaSize = 16 << 20
	cfg.MaxValueSize = 16 << 20
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		dir, err := os.MkdirTemp("/dev/shm", "tidepool-bench-")
		if err == nil {
			b.Cleanup(func() { os.RemoveAll(dir) })
			cfg.Dir = dir
		}
	}
	tr := newTier(b, cfg)
	for _, a := range tr.arenas {
		for i := range a.mem {
			a.mem[i] = 0
		}
	}
	return tr
}

var benchSizes = []int64{4 << 10, 64 << 10, 1 << 20}

// BenchmarkPut stores new keys; once the tier is full every put evicts.
func BenchmarkPut(b *testing.B) {
	for _, size := range benchSizes {
		val := pattern("v", int(size))
		b.Run(sizeName(size), func(b *testing.B) {
			tr := benchTier(b)
			var key [8]byte
			b.SetBytes(size)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				binary.LittleEndian.PutUint64(key[:], uint64(i))
				if _, err := tr.Put(ctx, "bench", key[:], val, cache.PutOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(sizeName(size)+"/parallel", func(b *testing.B) {
			tr := benchTier(b)
			var next atomic.Uint64
			b.SetBytes(size)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var key [8]byte
				for pb.Next() {
					binary.LittleEndian.PutUint64(key[:], next.Add(1))
					if _, err := tr.Put(ctx, "bench", key[:], val, cache.PutOptions{}); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkGet reads present keys round robin into a reused buffer: a
// memmove plus a CRC-32C of the copy per read.
func BenchmarkGet(b *testing.B) {
	for _, size := range benchSizes {
		val := pattern("v", int(size))
		setup := func(b *testing.B) (*Tier, int) {
			tr := benchTier(b)
			n := int(min(48<<20/size, 4096))
			for i := 0; i < n; i++ {
				var key [8]byte
				binary.LittleEndian.PutUint64(key[:], uint64(i))
				if _, err := tr.Put(ctx, "bench", key[:], val, cache.PutOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			return tr, n
		}
		b.Run(sizeName(size), func(b *testing.B) {
			tr, n := setup(b)
			dst := make([]byte, size)
			var key [8]byte
			b.SetBytes(size)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				binary.LittleEndian.PutUint64(key[:], uint64(i%n))
				if _, _, err := tr.Get(ctx, "bench", key[:], dst); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(sizeName(size)+"/parallel", func(b *testing.B) {
			tr, n := setup(b)
			var next atomic.Uint64
			b.SetBytes(size)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				dst := make([]byte, size)
				var key [8]byte
				for pb.Next() {
					binary.LittleEndian.PutUint64(key[:], next.Add(1)%uint64(n))
					if _, _, err := tr.Get(ctx, "bench", key[:], dst); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
