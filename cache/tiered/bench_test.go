package tiered

import (
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
)

// BenchmarkPutSpill: 1 MiB puts through a 16 MiB DRAM tier, every
// eviction demoted to SSD (the time includes draining the queue).
func BenchmarkPutSpill(b *testing.B) {
	s := newStore(b, testConfig(b, 16*mib, b.TempDir()))
	v := value(1, mib)
	b.SetBytes(mib)
	b.ResetTimer()
	for i := range b.N {
		if _, err := s.Put(ctx, "ns", key(i), v, cache.PutOptions{}); err != nil {
			b.Fatal(err)
		}
		if i%16 == 15 {
			waitIdle(b, s)
		}
	}
	waitIdle(b, s)
	b.ReportMetric(float64(s.Movement().DemotionsDropped), "dropped")
}

// BenchmarkGetPromote: 1 MiB reads that miss DRAM, are read from SSD and
// promoted.
func BenchmarkGetPromote(b *testing.B) {
	s := newStore(b, testConfig(b, 16*mib, b.TempDir()))
	const n = 32
	for i := range n {
		if _, err := s.Put(ctx, "ns", key(i), value(uint64(i), mib), cache.PutOptions{Durable: true}); err != nil {
			b.Fatal(err)
		}
		s.dram.Delete(ctx, "ns", key(i))
	}
	var buf []byte
	b.SetBytes(mib)
	b.ResetTimer()
	for i := range b.N {
		k := key(i % n)
		v, _, err := s.Get(ctx, "ns", k, buf)
		if err != nil {
			b.Fatal(err)
		}
		buf = v
		b.StopTimer()
		s.dram.Delete(ctx, "ns", k)
		b.StartTimer()
	}
}
