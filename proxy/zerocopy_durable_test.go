package proxy_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/cache/ssd"
	"github.com/tidepool-kv/tidepool/cache/tiered"
	"github.com/tidepool-kv/tidepool/proxy"
)

// TestDurableCommit: a durable reservation is on the SSD tier when Commit
// answers, as a durable Put is; a plain one is not (it spills later).
func TestDurableCommit(t *testing.T) {
	ctx := context.Background()
	cfg := tiered.DefaultConfig()
	cfg.DRAM = dram.DefaultConfig()
	cfg.DRAM.Dir, cfg.DRAM.Capacity, cfg.DRAM.ArenaSize, cfg.DRAM.LazyFault = t.TempDir(), 16<<20, 16<<20, true
	sc := ssd.DefaultConfig()
	sc.Dir, sc.Capacity, sc.MinFreeBytes, sc.WriteBufferSize = t.TempDir(), 256<<20, -1, 8<<20
	cfg.SSD = &sc
	store, err := tiered.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	p, err := proxy.New(proxy.DefaultConfig(), proxy.Deps{Store: store, ZeroCopy: store}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, durable := range []bool{true, false} {
		key := []byte{'k', map[bool]byte{true: 'd', false: 'p'}[durable]}
		val := bytes.Repeat([]byte{7, 1, 3}, 100000)
		res, err := p.Reserve(ctx, "ns", []proxy.ReserveItem{{Key: key, Size: int64(len(val))}}, 0, durable)
		if err != nil || res[0].Err != nil {
			t.Fatalf("reserve: %v %v", err, res)
		}
		sl := res[0].Slot
		copy(store.DRAM().ArenaMem(sl.Arena)[sl.Offset:sl.Offset+sl.Length], val)
		errs, err := p.Commit(ctx, []proxy.CommitItem{{Token: res[0].Token, Checksum: cache.Checksum(val), HasChecksum: true}})
		if err != nil || errs[0] != nil {
			t.Fatalf("commit: %v %v", err, errs)
		}
		_, inSSD := store.SSD().Stat(ctx, "ns", key)
		if inSSD != durable {
			t.Fatalf("durable=%v: in SSD after Commit = %v", durable, inSSD)
		}
		got, _, err := store.SSD().Get(ctx, "ns", key, nil)
		if durable && (err != nil || !bytes.Equal(got, val)) {
			t.Fatalf("durable block in SSD: %v, equal %v", err, bytes.Equal(got, val))
		}
	}
}
