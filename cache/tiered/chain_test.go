package tiered

import (
	"errors"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
)

// TestChainRuleFollowsTheSSD: the DRAM tier's chain rule applies while a
// DRAM eviction loses its block. A 24-block chain (1 MiB blocks, each
// naming its parent, as BatchPut's items do) into 16 MiB of DRAM keeps a
// contiguous head and is refused the rest with NO_SPACE when there is no
// SSD tier or the SSD tier takes no writes (a disk below its free-space
// floor); with an SSD tier that takes writes, every block is stored and
// the whole chain stays reachable (evictions are demotions).
func TestChainRuleFollowsTheSSD(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ssd       bool
		degraded  bool
		wantWhole bool
	}{
		{"no ssd", false, false, false},
		{"ssd takes writes", true, false, true},
		{"ssd takes no writes", true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := ""
			if tc.ssd {
				dir = t.TempDir()
			}
			cfg := testConfig(t, 16*mib, dir)
			if tc.degraded {
				cfg.SSD.MinFreeBytes = 1 << 60 // more than any disk has free
			}
			s := newStore(t, cfg)
			const n = 24
			keys := make([][]byte, n)
			errs := make([]error, n)
			for i := range n {
				keys[i] = key(i)
				opts := cache.PutOptions{Depth: int32(i)}
				if i > 0 {
					opts.Parent = keys[i-1]
				}
				_, errs[i] = s.Put(ctx, "ns", keys[i], value(uint64(i), mib), opts)
			}
			head := 0
			for head < n && errs[head] == nil {
				head++
			}
			if tc.wantWhole {
				if head != n {
					t.Fatalf("stored a head of %d of %d: %v", head, n, errs[head])
				}
				waitIdle(t, s)
			} else {
				if head == 0 || head > 16 {
					t.Fatalf("stored a head of %d blocks into 16 MiB", head)
				}
				for i := head; i < n; i++ {
					if !errors.Is(errs[i], cache.ErrNoSpace) || !errors.Is(errs[i], dram.ErrChainRule) {
						t.Errorf("block %d after the head of %d: %v, want the chain rule's NO_SPACE", i, head, errs[i])
					}
				}
			}
			if got := s.Present(ctx, "ns", keys, nil); got != head {
				t.Errorf("present prefix %d, stored a head of %d", got, head)
			}
			for i := head; i < n; i++ {
				if _, ok := s.Stat(ctx, "ns", keys[i]); ok {
					t.Errorf("block %d held past the head of %d", i, head)
				}
			}
		})
	}
}
