package dram

import (
	"fmt"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
)

func TestScan(t *testing.T) {
	cfg, _ := testConfig(t, 16<<20)
	tr := newTier(t, cfg)
	want := map[string]BlockRef{}
	for i := 0; i < 40; i++ {
		ns := fmt.Sprintf("ns%d", i%3)
		key := fmt.Sprintf("k%02d", i)
		opts := cache.PutOptions{Depth: int32(i), LowPriority: i%4 == 0}
		if _, err := tr.Put(ctx, ns, []byte(key), pattern(key, 100+i), opts); err != nil {
			t.Fatal(err)
		}
		want[ns+"/"+key] = BlockRef{Namespace: ns, Key: []byte(key), Size: int64(100 + i), Depth: int32(i), LowPriority: opts.LowPriority}
	}
	if _, err := tr.Delete(ctx, "ns0", []byte("k00")); err != nil {
		t.Fatal(err)
	}
	delete(want, "ns0/k00")
	hits := tr.Stats().Tiers[0].Hits

	tests := []struct {
		name  string
		stop  int // fn returns false after this many calls (0: never)
		count int
	}{
		{"all", 0, len(want)},
		{"stop early", 5, 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			seen := map[string]bool{}
			tr.Scan(func(r BlockRef) bool {
				id := r.Namespace + "/" + string(r.Key)
				w, ok := want[id]
				if !ok || seen[id] {
					t.Errorf("unexpected or repeated block %s", id)
				}
				if r.Size != w.Size || r.Depth != w.Depth || r.LowPriority != w.LowPriority {
					t.Errorf("%s: got %+v, want %+v", id, r, w)
				}
				seen[id] = true
				// fn may use the tier.
				if _, ok := tr.Stat(ctx, r.Namespace, r.Key); !ok {
					t.Errorf("%s: not present during the scan", id)
				}
				return tc.stop == 0 || len(seen) < tc.stop
			})
			if len(seen) != tc.count {
				t.Fatalf("saw %d blocks, want %d", len(seen), tc.count)
			}
		})
	}
	if got := tr.Stats().Tiers[0].Hits; got != hits {
		t.Fatalf("scan counted %d reads", got-hits)
	}
}
