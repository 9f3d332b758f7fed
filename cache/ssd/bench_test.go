package ssd

import (
	"context"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/clock"
)

// BenchmarkSSD measures the tier with 1 MiB blocks, one goroutine, like
// fio's sequential psync jobs in scripts/bench-ssd.sh, which runs it with
// -benchtime=1024x.
//
//   - write: b.N puts of distinct keys, then Flush, all timed: the figure is
//     what reaches the disk (blob and SST files synced), not memtable speed.
//   - read: b.N gets over min(b.N, 1024) blocks written and flushed first.
//     With TIDEPOOL_SSD_BENCH_DIRECT=1 reads bypass the page cache
//     (O_DIRECT), comparable with fio --direct=1; otherwise blocks written
//     a moment ago are usually served from the page cache.
//
// TIDEPOOL_SSD_BENCH_DIR puts the database on a chosen filesystem (default:
// a temporary directory). TIDEPOOL_SSD_BENCH_STORE=rocksdb keeps the
// blocks in RocksDB's blob files (Config.ValueLogMin -1) instead of the
// value log. Each run also reports the process's CPU time (user + system,
// RocksDB's threads included) per GiB moved, "cpu-s/GiB".
func BenchmarkSSD(b *testing.B) {
	const size = 1 << 20
	vals := make([][]byte, 16)
	for i := range vals {
		vals[i] = value(uint64(i), size)
	}
	open := func(b *testing.B) *Tier {
		dir := b.TempDir()
		if d := os.Getenv("TIDEPOOL_SSD_BENCH_DIR"); d != "" {
			var err error
			if dir, err = os.MkdirTemp(d, "bench"); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = os.RemoveAll(dir) })
		}
		cfg := DefaultConfig()
		cfg.Dir = dir
		cfg.Capacity = 1 << 40
		cfg.MinFreeBytes = -1 // no free-space floor
		cfg.DirectReads = os.Getenv("TIDEPOOL_SSD_BENCH_DIRECT") == "1"
		if os.Getenv("TIDEPOOL_SSD_BENCH_STORE") == "rocksdb" {
			cfg.ValueLogMin = -1
		}
		cfg.Clock = clock.Real{}
		tr, err := New(cfg, zap.NewNop())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = tr.Close() })
		return tr
	}
	ctx := context.Background()
	put := func(b *testing.B, tr *Tier, i int) {
		if _, err := tr.Put(ctx, "bench", key(i), vals[i%len(vals)], cache.PutOptions{}); err != nil {
			b.Fatal(err)
		}
	}

	b.Run("write", func(b *testing.B) {
		tr := open(b)
		b.SetBytes(size)
		b.ResetTimer()
		cpu := cpuTime()
		for i := range b.N {
			put(b, tr, i)
		}
		if err := tr.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		reportCPU(b, cpu, size)
	})

	b.Run("read", func(b *testing.B) {
		tr := open(b)
		n := min(b.N, 1024)
		for i := range n {
			put(b, tr, i)
		}
		if err := tr.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		dst := make([]byte, 0, size)
		b.SetBytes(size)
		b.ResetTimer()
		cpu := cpuTime()
		for i := range b.N {
			got, _, err := tr.Get(ctx, "bench", key(i%n), dst)
			if err != nil || len(got) != size {
				b.Fatalf("Get %d: %d bytes, %v", i%n, len(got), err)
			}
		}
		b.StopTimer()
		reportCPU(b, cpu, size)
		if h := tr.Health(); h.ChecksumFailures != 0 {
			b.Fatalf("health %+v", h)
		}
	})
}

// cpuTime returns the process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the CPU time since start per GiB of b.N blocks of size
// bytes.
func reportCPU(b *testing.B, start time.Duration, size int) {
	gib := float64(b.N) * float64(size) / (1 << 30)
	b.ReportMetric((cpuTime()-start).Seconds()/gib, "cpu-s/GiB")
}
