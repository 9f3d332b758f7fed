package ssd

import (
	"bytes"
	"context"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
)

// TestFlushBesideBackgroundFlushes calls Flush while RocksDB has automatic
// flushes of full memtables queued and running (tiny memtables, two flush
// threads). librocksdb 7.8 keeps one flush reason per column family: a
// manual flush of one family queued beside an automatic flush of both made
// RocksDB abort the process on an assertion ("cfd->GetFlushReason() ==
// cfds[0]->GetFlushReason()"); store.flush now waits for the queue first.
// A regression shows up as the test binary aborting.
func TestFlushBesideBackgroundFlushes(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.WriteBufferSize = 2 * mib
	cfg.MaxWriteBuffers = 6
	cfg.BackgroundJobs = 2 // one flush thread: automatic flushes queue up
	tr := newTier(t, cfg)
	ctx := context.Background()
	const n = 128
	for i := range n {
		if _, err := tr.Put(ctx, "ns", key(i), value(uint64(i), 512<<10), cache.PutOptions{}); err != nil {
			t.Fatalf("Put %d: %v", i, err)
		}
		if i%16 == 15 {
			if err := tr.Flush(ctx); err != nil {
				t.Fatalf("Flush after %d: %v", i, err)
			}
		}
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	tr = newTier(t, cfg)
	defer tr.Close()
	for i := range n {
		got, _, err := tr.Get(ctx, "ns", key(i), nil)
		if err != nil || !bytes.Equal(got, value(uint64(i), 512<<10)) {
			t.Fatalf("Get %d after reopen: %d bytes, %v", i, len(got), err)
		}
	}
}
