package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/proxy"
)

// TestStoreDepsTurnEveryFeatureOn: serve's store gives the proxy every
// dependency of proxy/store.go, so that no feature is off by a slip of the
// wiring: in-place reads (Pin), the zero-copy arenas, Prefetch from SSD and
// the rebalancer's scan of DRAM.
func TestStoreDepsTurnEveryFeatureOn(t *testing.T) {
	ctx := context.Background()
	cfg := DefaultConfig()
	cfg.ArenaDir = t.TempDir()
	cfg.DataDir = t.TempDir()
	cfg.DRAMCapacity = 8 << 20
	cfg.MaxValueSize = 1 << 20
	cfg.SSDCapacity = 64 << 20
	cfg.SSDMinFree = 0
	s, err := openStore(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	deps := storeDeps(s)
	if deps.Store == nil || deps.ZeroCopy == nil || deps.Prefetch == nil || deps.Scan == nil {
		t.Fatalf("storeDeps left a feature off: %+v", deps)
	}
	p, err := proxy.New(proxy.DefaultConfig(), deps, nil)
	if err != nil {
		t.Fatal(err)
	}

	val := bytes.Repeat([]byte("v"), 4096)
	if _, err := p.Put(ctx, "ns", []byte("dram"), val, cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if a, _ := p.Arenas(); len(a) == 0 {
		t.Fatal("no arenas: zero-copy off")
	}
	var pins proxy.Pins
	if v, _, err := p.GetPinned(ctx, "ns", []byte("dram"), proxy.ScopeLocal, &pins); err != nil || !bytes.Equal(v, val) || pins.Len() != 1 {
		t.Fatalf("GetPinned: %v, %d pins: not read in place", err, pins.Len())
	}
	pins.Release()
	var scanned int
	deps.Scan.Scan(func(r cache.BlockRef) bool {
		if r.Namespace == "ns" && string(r.Key) == "dram" {
			scanned++
		}
		return true
	})
	if scanned != 1 {
		t.Fatalf("the scan saw the DRAM block %d times", scanned)
	}
	// On SSD only: Prefetch queues it.
	if _, err := s.SSD().Put(ctx, "ns", []byte("ssd"), val, cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if n, err := p.Prefetch(ctx, "ns", [][]byte{[]byte("ssd")}, proxy.ScopeLocal); err != nil || n != 1 {
		t.Fatalf("Prefetch = %d, %v; want 1 queued", n, err)
	}
}
