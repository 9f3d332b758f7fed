package ssd

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
)

// entryOf returns a copy of the index entry of (ns, k).
func entryOf(t *testing.T, tr *Tier, ns string, k []byte) entry {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	e := tr.index[string(encodeKey(ns, k))]
	if e == nil {
		t.Fatalf("%s/%s not indexed", ns, k)
	}
	return *e
}

func segFiles(dir string) []string {
	files, _ := filepath.Glob(filepath.Join(dir, valuesDir, "*.seg"))
	return files
}

// TestValueLogPlacement: blocks of ValueLogMin and up go to the value log
// (any length, aligned or not), smaller ones to RocksDB; both are read back
// after a reopen, also with the value log turned off for new blocks.
func TestValueLogPlacement(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.ValueLogMin = 64 << 10
	tr := newTier(t, cfg)
	sizes := []int{1, 4 << 10, 64<<10 - 1, 64 << 10, 100_001, mib, 3*mib + 17}
	for i, n := range sizes {
		mustPut(t, tr, "pl", key(i), value(uint64(i), n), cache.PutOptions{Depth: int32(i)})
		e := entryOf(t, tr, "pl", key(i))
		if inLog := e.seg != 0; inLog != (int64(n) >= cfg.ValueLogMin) {
			t.Fatalf("block of %d bytes: segment %d", n, e.seg)
		}
		if e.off%dioAlign != 0 {
			t.Fatalf("block of %d bytes at offset %d", n, e.off)
		}
		mustGet(t, tr, "pl", key(i), value(uint64(i), n))
	}
	h := tr.Health()
	if h.ValueLogSegments != 1 || h.ValueLogLiveBytes != aligned(64<<10)+aligned(100_001)+aligned(mib)+aligned(3*mib+17) {
		t.Fatalf("health %+v", h)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.ValueLogMin = -1
	tr2 := newTier(t, cfg)
	for i, n := range sizes {
		mustGet(t, tr2, "pl", key(i), value(uint64(i), n))
	}
	mustPut(t, tr2, "pl", key(100), value(100, mib), cache.PutOptions{})
	if e := entryOf(t, tr2, "pl", key(100)); e.seg != 0 {
		t.Fatalf("value log off, block in segment %d", e.seg)
	}
	if h := tr2.Health(); h.ValueLogLiveBytes != aligned(64<<10)+aligned(100_001)+aligned(mib)+aligned(3*mib+17) {
		t.Fatalf("after reopen: health %+v", h)
	}
}

// TestValueLogSegmentsDeleted: a segment's file goes once nothing lives in
// it, and comes back with no id reused.
func TestValueLogSegmentsDeleted(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.ValueLogSegmentSize = mib
	tr := newTier(t, cfg)
	ctx := context.Background()
	const n, size = 20, 256 << 10 // 4 per segment: 5 segments
	putBlocks(t, tr, "sd", n, size)
	if got := len(segFiles(dir)); got != 5 {
		t.Fatalf("%d segment files, want 5", got)
	}
	last := entryOf(t, tr, "sd", key(n-1)).seg
	for i := range n - 4 { // all but the last segment's blocks
		if ok, err := tr.Delete(ctx, "sd", key(i)); !ok || err != nil {
			t.Fatalf("Delete %d: %v %v", i, ok, err)
		}
	}
	if got := segFiles(dir); len(got) != 1 || filepath.Base(got[0]) != segName(last) {
		t.Fatalf("segment files %v, want only %s", got, segName(last))
	}
	if h := tr.Health(); h.ValueLogLiveBytes != 4*size || h.ValueLogSegments != 1 {
		t.Fatalf("health %+v", h)
	}
	// The active segment stays while empty, then goes when sealed.
	if n, err := tr.Clear(ctx, "sd"); n != 4 || err != nil {
		t.Fatalf("Clear: %d %v", n, err)
	}
	mustPut(t, tr, "sd", key(100), value(100, mib), cache.PutOptions{})
	if e := entryOf(t, tr, "sd", key(100)); e.seg <= last {
		t.Fatalf("new segment %d after %d", e.seg, last)
	}
	if got := len(segFiles(dir)); got != 1 {
		t.Fatalf("%d segment files, want 1", got)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	tr2 := newTier(t, cfg)
	mustGet(t, tr2, "sd", key(100), value(100, mib))
	for i := range n {
		if _, _, err := tr2.Get(ctx, "sd", key(i), nil); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("deleted block %d: %v", i, err)
		}
	}
}

// TestValueLogLostSegment: a segment file that disappeared while the tier
// was closed costs its blocks (plain misses, records deleted), nothing
// else, and its id is not reused.
func TestValueLogLostSegment(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.ValueLogSegmentSize = mib
	tr := newTier(t, cfg)
	const n, size = 12, 256 << 10
	putBlocks(t, tr, "ls", n, size)
	lost := entryOf(t, tr, "ls", key(n-1)).seg // the newest: its id would be next otherwise
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, valuesDir, segName(lost))); err != nil {
		t.Fatal(err)
	}
	tr2 := newTier(t, cfg)
	good, bad, missing := readSome(t, tr2, "ls", n, size)
	if good != n-4 || bad != 0 || missing != 4 {
		t.Fatalf("good %d bad %d missing %d", good, bad, missing)
	}
	if blocks, _, _ := tr2.Recovered(); blocks != n-4 {
		t.Fatalf("recovered %d blocks", blocks)
	}
	mustPut(t, tr2, "ls", key(100), value(100, size), cache.PutOptions{})
	if e := entryOf(t, tr2, "ls", key(100)); e.seg <= lost {
		t.Fatalf("segment id %d reused (lost %d)", e.seg, lost)
	}
	if h := tr2.Health(); h.ChecksumFailures != 0 {
		t.Fatalf("health %+v", h)
	}
}

// waitRelocated waits until no relocation runs and at least want blocks
// were moved.
func waitRelocated(t *testing.T, tr *Tier, want int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for tr.relocating.Load() || tr.Health().Relocations < want {
		if time.Now().After(deadline) {
			t.Fatalf("relocation: %+v", tr.Health())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestValueLogRelocation: once most of the value log is dead, the live
// blocks of sparse segments move to the newest one and the sparse
// segments' files go; every block reads right before and after a reopen.
func TestValueLogRelocation(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.ValueLogSegmentSize = mib
	cfg.Capacity = 16 * mib // relocation once 2 MiB are dead
	cfg.CompactAfter = -1
	tr := newTier(t, cfg)
	ctx := context.Background()
	const n, size = 64, 128 << 10 // 8 per segment: 8 segments
	putBlocks(t, tr, "rl", n, size)
	kept := map[int]bool{}
	for i := range n {
		if i%8 == 3 || i%8 == 6 {
			kept[i] = true
			continue
		}
		if ok, err := tr.Delete(ctx, "rl", key(i)); !ok || err != nil {
			t.Fatalf("Delete %d: %v %v", i, ok, err)
		}
	}
	waitRelocated(t, tr, 1)
	h := tr.Health()
	t.Logf("after deletes: %+v", h)
	if h.ValueLogLiveBytes != int64(len(kept))*size || h.ValueLogBytes > 2*h.ValueLogLiveBytes+2*mib {
		t.Fatalf("value log %d bytes for %d live", h.ValueLogBytes, h.ValueLogLiveBytes)
	}
	check := func(tr *Tier) {
		t.Helper()
		for i := range n {
			got, _, err := tr.Get(ctx, "rl", key(i), nil)
			switch {
			case kept[i] && err != nil:
				t.Fatalf("kept block %d: %v", i, err)
			case kept[i] && !bytes.Equal(got, value(uint64(i), size)):
				t.Fatalf("kept block %d: WRONG BYTES", i)
			case !kept[i] && !errors.Is(err, cache.ErrNotFound):
				t.Fatalf("deleted block %d: %v", i, err)
			}
		}
	}
	check(tr)
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	tr2 := newTier(t, cfg)
	check(tr2)
	if h2 := tr2.Health(); h2.ValueLogLiveBytes != h.ValueLogLiveBytes || h2.ChecksumFailures != 0 || h2.StaleEntries != 0 {
		t.Fatalf("after reopen: %+v", h2)
	}
}

// TestValueLogRelocationUnderReads reads the surviving blocks without a
// pause while deletes make their segments sparse and relocation moves
// them: every read returns the right bytes, none misses.
func TestValueLogRelocationUnderReads(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.ValueLogSegmentSize = mib
	cfg.Capacity = 64 * mib // relocation past 2 MiB dead, evictions past 4 MiB (never reached)
	cfg.CompactAfter = -1
	tr := newTier(t, cfg)
	ctx := context.Background()
	const rounds, per, size = 6, 32, 128 << 10
	var stop atomic.Bool
	var wg sync.WaitGroup
	var kept sync.Map // key index -> true, once written
	var reads atomic.Int64
	errc := make(chan error, 4)
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 0, size)
			for i := r; !stop.Load(); i++ {
				var ks []int
				kept.Range(func(k, _ any) bool { ks = append(ks, k.(int)); return true })
				if len(ks) == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				k := ks[i%len(ks)]
				got, _, err := tr.Get(ctx, "ur", key(k), buf)
				if err != nil {
					errc <- err
					return
				}
				if !bytes.Equal(got, value(uint64(k), size)) {
					errc <- errors.New("WRONG BYTES")
					return
				}
				reads.Add(1)
			}
		}()
	}
	for r := range rounds {
		for j := range per {
			i := r*per + j
			mustPut(t, tr, "ur", key(i), value(uint64(i), size), cache.PutOptions{})
			if j%4 == 0 {
				kept.Store(i, true)
			}
		}
		for j := range per {
			if i := r*per + j; j%4 != 0 {
				if _, err := tr.Delete(ctx, "ur", key(i)); err != nil {
					t.Fatal(err)
				}
			}
		}
		waitRelocated(t, tr, 0)
	}
	waitRelocated(t, tr, 1)
	stop.Store(true)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatalf("read during relocation: %v", err)
	}
	h := tr.Health()
	t.Logf("%d reads; %+v", reads.Load(), h)
	if h.ChecksumFailures != 0 || h.StaleEntries != 0 || h.SpaceEvictions != 0 {
		t.Fatalf("health %+v", h)
	}
}

// TestValueLogDiskBound churns a small tier (ten times its capacity, reads
// of random older blocks scrambling the LRU order, so evictions leave
// holes everywhere): the value log's files never hold more than the
// capacity, the dead-space limit and two segments, and every block still
// indexed reads right.
func TestValueLogDiskBound(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.Capacity = 32 * mib
	cfg.CompactAfter = -1
	tr := newTier(t, cfg)
	ctx := context.Background()
	seg := tr.segmentSize()
	_, hard := tr.deadLimits()
	bound := cfg.Capacity + hard + 2*seg
	const size = 128 << 10
	n := int(10 * cfg.Capacity / size)
	rng := rand.New(rand.NewPCG(1, 2))
	var peak int64
	for i := range n {
		mustPut(t, tr, "db", key(i), value(uint64(i), size), cache.PutOptions{})
		for range 2 {
			if j := rng.IntN(i + 1); j != i {
				_, _, _ = tr.Get(ctx, "db", key(j), nil)
			}
		}
		if i%64 == 63 {
			waitRelocated(t, tr, 0)
			peak = max(peak, tr.Health().ValueLogBytes)
		}
	}
	waitRelocated(t, tr, 0)
	h := tr.Health()
	t.Logf("segment %d, bound %d, peak %d; %+v", seg, bound, peak, h)
	if peak > bound || h.ValueLogBytes > bound {
		t.Fatalf("value log files %d (peak %d) over %d", h.ValueLogBytes, peak, bound)
	}
	if h.Relocations == 0 {
		t.Fatal("nothing relocated")
	}
	good, bad, _ := readSome(t, tr, "db", n, size)
	if bad != 0 || int64(good) != tierStats(tr).Blocks {
		t.Fatalf("good %d bad %d of %d indexed", good, bad, tierStats(tr).Blocks)
	}
}
