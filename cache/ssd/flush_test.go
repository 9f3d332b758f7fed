package ssd

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
	cfg.ValueLogMin = -1 // the blocks fill RocksDB's memtables
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

// optionsBlobGC reads enable_blob_garbage_collection of the data family
// from the newest OPTIONS file RocksDB wrote in dir (it writes one at open
// and at every option change).
func optionsBlobGC(t *testing.T, dir string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "OPTIONS-*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no OPTIONS file in %s: %v", dir, err)
	}
	newest, num := "", -1
	for _, f := range files {
		n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(f), "OPTIONS-"))
		if err == nil && n > num {
			newest, num = f, n
		}
	}
	b, err := os.ReadFile(newest)
	if err != nil {
		t.Fatal(err)
	}
	_, data, ok := strings.Cut(string(b), `[CFOptions "`+cfDataName+`"]`)
	if !ok {
		t.Fatalf("%s has no data family", newest)
	}
	data, _, _ = strings.Cut(data, "\n[")
	for _, l := range strings.Split(data, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), blobGCOption+"="); ok {
			return v
		}
	}
	t.Fatalf("%s: no %s", newest, blobGCOption)
	return ""
}

// TestBlobGCOnlyInTierCompaction: RocksDB's own compactions do not
// relocate live blobs (blob GC off, so spilled blocks are written once);
// the tier's compaction after dropped blocks turns it on for its run and
// off again.
func TestBlobGCOnlyInTierCompaction(t *testing.T) {
	dir := t.TempDir()
	tr := newTier(t, testConfig(dir))
	if v := optionsBlobGC(t, dir); v != "false" {
		t.Fatalf("blob GC at open: %s, want false", v)
	}
	tr.dbMu.RLock()
	tr.st.setBlobGC(true)
	tr.dbMu.RUnlock()
	if v := optionsBlobGC(t, dir); v != "true" {
		t.Fatalf("blob GC after setBlobGC(true): %s", v)
	}
	tr.dbMu.RLock()
	tr.st.compactData()
	tr.dbMu.RUnlock()
	if v := optionsBlobGC(t, dir); v != "false" {
		t.Fatalf("blob GC after the tier's compaction: %s, want false", v)
	}
}

// TestFlushBesideCompaction calls Flush while the tier's own compaction
// starts: its CompactRange queues an atomic flush of both families, and
// store.flush's flush of one family queued beside it gave that flush two
// different reasons, which librocksdb 7.8 (built with assertions) turns
// into an abort of the process (seen in CI as TestBackgroundPriority's
// child dying of SIGABRT). Flush now waits for a running compaction. A
// regression shows up as the test binary aborting.
func TestFlushBesideCompaction(t *testing.T) {
	if testing.Short() {
		t.Skip("120 rounds of flushes and compactions: not in -short")
	}
	cfg := testConfig(t.TempDir())
	cfg.ValueLogMin = -1 // deleted blocks are garbage in RocksDB: compactions
	cfg.WriteBufferSize = 2 * mib
	cfg.CompactAfter = 1 * mib
	tr := newTier(t, cfg)
	ctx := context.Background()
	const rounds, per = 120, 6
	for r := range rounds {
		for i := range per {
			k := key(r*per + i)
			if _, err := tr.Put(ctx, "ns", k, value(uint64(r*per+i), 512<<10), cache.PutOptions{}); err != nil {
				t.Fatalf("Put: %v", err)
			}
			if i%2 == 1 { // 1.5 MiB dropped per round: a compaction each round
				if _, err := tr.Delete(ctx, "ns", k); err != nil {
					t.Fatalf("Delete: %v", err)
				}
			}
		}
		if err := tr.Flush(ctx); err != nil {
			t.Fatalf("Flush in round %d: %v", r, err)
		}
	}
	if n := tr.compactions.Load(); n == 0 {
		t.Fatalf("no compaction ran")
	}
	for r := range rounds {
		for i := 0; i < per; i += 2 {
			got, _, err := tr.Get(ctx, "ns", key(r*per+i), nil)
			if err != nil || !bytes.Equal(got, value(uint64(r*per+i), 512<<10)) {
				t.Fatalf("Get %d: %d bytes, %v", r*per+i, len(got), err)
			}
		}
	}
}
