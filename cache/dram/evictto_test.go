package dram

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
)

func TestEvictTo(t *testing.T) {
	ctx := context.Background()
	cfg, _ := testConfig(t, 8<<20)
	var mu sync.Mutex
	evicted := map[string]bool{}
	cfg.OnEvict = func(ns string, key, value []byte, info cache.Info) {
		mu.Lock()
		evicted[string(key)] = true
		mu.Unlock()
	}
	tr := newTier(t, cfg)
	for i := 0; i < 8; i++ {
		if _, err := tr.Put(ctx, "ns", []byte(fmt.Sprint(i)), pattern(fmt.Sprint(i), 1<<20), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Pin one block: EvictTo passes over it.
	l, err := tr.Acquire(ctx, "ns", []byte("0"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	n := tr.EvictTo(3 << 20)
	used := tr.Stats().Tiers[0].UsedBytes
	if used > 3<<20 || n != 5 {
		t.Fatalf("EvictTo(3MiB): evicted %d, used %d", n, used)
	}
	if evicted["0"] || len(evicted) != 5 {
		t.Fatalf("evicted %v (the pinned block must stay)", evicted)
	}
	if n := tr.EvictTo(0); n != 2 {
		t.Fatalf("EvictTo(0) evicted %d, want 2 (one block is pinned)", n)
	}
	if _, ok := tr.Stat(ctx, "ns", []byte("0")); !ok {
		t.Fatal("pinned block evicted")
	}
	tr.Close()
	if n := tr.EvictTo(0); n != 0 {
		t.Fatal("EvictTo after Close")
	}
}
