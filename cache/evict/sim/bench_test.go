package sim

import (
	"errors"
	"testing"

	"github.com/tidepool-kv/tidepool/cache/evict"
)

// BenchmarkRun replays the conversation trace through one node of 3M tokens
// and reports the hit rate and the cost per request.
func BenchmarkRun(b *testing.B) {
	reqs, err := LoadTrace(ConversationTrace)
	if errors.Is(err, ErrNoTrace) {
		b.Skip(err)
	}
	if err != nil {
		b.Fatal(err)
	}
	cfg := Config{CapacityBlocks: TokensToBlocks(3_000_000), Nodes: 1}
	for _, p := range []struct {
		name string
		f    evict.Factory
	}{{"lru", evict.NewLRU}, {"prefix", evict.NewPrefix}} {
		b.Run(p.name, func(b *testing.B) {
			var res Result
			for b.Loop() {
				res, err = Run(reqs, cfg, p.f)
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(res.HitRate(), "hit-rate")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(reqs)), "ns/request")
		})
	}
}
