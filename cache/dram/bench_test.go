//go:build linux

package dram

import (
	"encoding/binary"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/clock"
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

// BenchmarkScrubOneCore measures what one core checksums when scrubbing
// unthrottled: full passes over a 64 MiB tier of 1 MiB blocks (more than
// the last-level cache of the dev VM, so the bytes come from memory). It
// sizes DefaultScrubRate (about 5 % of this):
//
//	go test -run '^$' -bench ScrubOneCore -benchtime 20x ./cache/dram/
func BenchmarkScrubOneCore(b *testing.B) {
	tr := benchTier(b)
	fc := tr.clk.(*clock.Fake)
	val := make([]byte, 1<<20)
	for i := 0; ; i++ {
		binary.LittleEndian.PutUint64(val, uint64(i))
		if _, err := tr.Put(ctx, "ns", binary.LittleEndian.AppendUint64(nil, uint64(i)), val, cache.PutOptions{}); err != nil || tr.Stats().Tiers[0].Evictions > 0 {
			break
		}
	}
	s, err := NewScrubber(tr, ScrubConfig{Rate: 1 << 50, Tick: time.Hour}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	fc.Advance(time.Hour)
	s.step() // one pass to warm up
	// CPU time of this thread, not wall time: the machine is shared, and
	// the question is what one core does while it runs.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu := func() time.Duration {
		var ru unix.Rusage
		if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before, cpu0, start := s.Stats().Bytes, cpu(), time.Now()
	for range b.N {
		fc.Advance(time.Hour)
		s.step()
	}
	took, used := time.Since(start), cpu()-cpu0
	n := s.Stats().Bytes - before
	b.ReportMetric(float64(n)/used.Seconds()/1e9, "GB/cpu-s")
	b.ReportMetric(float64(n)/took.Seconds()/1e9, "GB/s")
	b.ReportMetric(float64(n)/float64(b.N)/(1<<20), "MiB/pass")
}
