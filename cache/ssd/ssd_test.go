package ssd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/clock"
)

// blockTier is the method set shared with the DRAM tier (cache/dram), so
// that a store can stack the two.
type blockTier interface {
	Put(ctx context.Context, ns string, key, value []byte, opts cache.PutOptions) (existed bool, err error)
	Get(ctx context.Context, ns string, key []byte, dst []byte) ([]byte, cache.Info, error)
	Stat(ctx context.Context, ns string, key []byte) (cache.Info, bool)
	Delete(ctx context.Context, ns string, key []byte) (bool, error)
	Clear(ctx context.Context, ns string) (int64, error)
	Stats() cache.Stats
	Close() error
}

var _ blockTier = (*Tier)(nil)

const mib = 1 << 20

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// testConfig is DefaultConfig shrunk for tests.
func testConfig(dir string) Config {
	cfg := DefaultConfig()
	cfg.Dir = dir
	cfg.Capacity = 1 << 30
	cfg.WriteBufferSize = 8 * mib
	cfg.MaxWriteBuffers = 3
	cfg.BlobFileSize = 16 * mib
	cfg.BackgroundJobs = 2
	cfg.MinFreeBytes = -1 // no free-space floor
	cfg.MaxValueSize = 4 * mib
	cfg.Clock = clock.NewFake(t0)
	return cfg
}

func newTier(t testing.TB, cfg Config) *Tier {
	t.Helper()
	tr, err := New(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// value returns n deterministic pseudo-random bytes for seed.
func value(seed uint64, n int) []byte {
	b := make([]byte, n)
	var s [32]byte
	for i := range 4 {
		for j := range 8 {
			s[i*8+j] = byte((seed + uint64(i)) >> (8 * j))
		}
	}
	r := rand.NewChaCha8(s)
	_, _ = r.Read(b)
	return b
}

func key(i int) []byte { return []byte(fmt.Sprintf("block-%06d", i)) }

func mustPut(t testing.TB, tr *Tier, ns string, k, v []byte, opts cache.PutOptions) {
	t.Helper()
	if existed, err := tr.Put(context.Background(), ns, k, v, opts); err != nil || existed {
		t.Fatalf("Put(%s/%s): existed=%v err=%v", ns, k, existed, err)
	}
}

func mustGet(t testing.TB, tr *Tier, ns string, k, want []byte) {
	t.Helper()
	got, info, err := tr.Get(context.Background(), ns, k, nil)
	if err != nil {
		t.Fatalf("Get(%s/%s): %v", ns, k, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Get(%s/%s): %d bytes differ from the %d put", ns, k, len(got), len(want))
	}
	if info.Size != int64(len(want)) || info.Checksum != cache.Checksum(want) || info.Tier != TierName {
		t.Fatalf("Get(%s/%s): info %+v", ns, k, info)
	}
}

func tierStats(tr *Tier) cache.TierStats { return tr.Stats().Tiers[0] }

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(*Config)
		wants []string // substrings of the error; none = valid
	}{
		{"defaults with dir", func(c *Config) {}, nil},
		{"no dir", func(c *Config) { c.Dir = "" }, []string{"Dir is required"}},
		{"every problem at once", func(c *Config) {
			c.Capacity = -1
			c.MaxKeySize = -1
			c.WriteBufferSize = 10
			c.BlobGCAgeCutoff = 2
			c.ProbeInterval = -1
			c.MaxNamespaceSize = -1
		}, []string{"Capacity", "MaxKeySize", "WriteBufferSize", "BlobGCAgeCutoff", "ProbeInterval", "MaxNamespaceSize"}},
		{"zero fields take the defaults", func(c *Config) { *c = Config{Dir: c.Dir} }, nil},
		{"free-space floor off", func(c *Config) { c.MinFreeBytes = -1 }, nil},
		{"background threads at normal priority", func(c *Config) { c.BackgroundPriority = PriorityNormal }, nil},
		{"unknown background priority", func(c *Config) { c.BackgroundPriority = "idle" }, []string{`BackgroundPriority must be "low" or "normal", got "idle"`}},
		{"value larger than capacity", func(c *Config) { c.Capacity = mib; c.MaxValueSize = 2 * mib }, []string{"exceeds Capacity"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Dir = "/nonexistent"
			tc.edit(&cfg)
			err := cfg.Validate()
			if len(tc.wants) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate: want error")
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestOperations(t *testing.T) {
	tr := newTier(t, testConfig(t.TempDir()))
	ctx := context.Background()
	v1, v2 := value(1, 300<<10), value(2, 100) // blob and inline
	mustPut(t, tr, "a", []byte("k1"), v1, cache.PutOptions{Depth: 3})
	mustPut(t, tr, "a", []byte("k2"), v2, cache.PutOptions{})
	mustPut(t, tr, "b", []byte("k1"), v2, cache.PutOptions{Durable: true})

	tests := []struct {
		name    string
		op      func() error
		wantErr error
	}{
		{"put existing reports exists", func() error {
			existed, err := tr.Put(ctx, "a", []byte("k1"), v2, cache.PutOptions{})
			if err == nil && !existed {
				return errors.New("existed = false")
			}
			return err
		}, nil},
		{"existing value unchanged", func() error { mustGet(t, tr, "a", []byte("k1"), v1); return nil }, nil},
		{"namespaces are separate", func() error { mustGet(t, tr, "b", []byte("k1"), v2); return nil }, nil},
		{"miss", func() error { _, _, err := tr.Get(ctx, "a", []byte("nope"), nil); return err }, cache.ErrNotFound},
		{"empty key", func() error { _, err := tr.Put(ctx, "a", nil, v2, cache.PutOptions{}); return err }, cache.ErrInvalidKey},
		{"long key", func() error {
			_, err := tr.Put(ctx, "a", make([]byte, 129), v2, cache.PutOptions{})
			return err
		}, cache.ErrInvalidKey},
		{"too large", func() error {
			_, err := tr.Put(ctx, "a", []byte("big"), make([]byte, 5*mib), cache.PutOptions{})
			return err
		}, cache.ErrTooLarge},
		{"stat", func() error {
			info, ok := tr.Stat(ctx, "a", []byte("k1"))
			if !ok || info.Size != int64(len(v1)) || info.Depth != 3 || info.Checksum != cache.Checksum(v1) {
				return fmt.Errorf("Stat = %+v, %v", info, ok)
			}
			return nil
		}, nil},
		{"get reuses dst", func() error {
			dst := make([]byte, 0, len(v1))
			got, _, err := tr.Get(ctx, "a", []byte("k1"), dst)
			if err == nil && &got[0] != &dst[:1][0] {
				return errors.New("dst not reused")
			}
			return err
		}, nil},
		{"delete", func() error {
			ok, err := tr.Delete(ctx, "a", []byte("k2"))
			if err == nil && !ok {
				return errors.New("Delete = false")
			}
			if _, ok := tr.Stat(ctx, "a", []byte("k2")); ok {
				return errors.New("still there")
			}
			_, _, err = tr.Get(ctx, "a", []byte("k2"), nil)
			if !errors.Is(err, cache.ErrNotFound) {
				return fmt.Errorf("Get after delete: %v", err)
			}
			return nil
		}, nil},
		{"delete missing", func() error {
			ok, err := tr.Delete(ctx, "a", []byte("k2"))
			if ok {
				return errors.New("Delete = true")
			}
			return err
		}, nil},
		{"clear", func() error {
			n, err := tr.Clear(ctx, "b")
			if err == nil && n != 1 {
				return fmt.Errorf("Clear = %d", n)
			}
			if _, ok := tr.Stat(ctx, "b", []byte("k1")); ok {
				return errors.New("b/k1 survived Clear")
			}
			mustGet(t, tr, "a", []byte("k1"), v1)
			return err
		}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.op(); !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
		})
	}

	st := tr.Stats()
	ts := st.Tiers[0]
	if ts.Name != "ssd" || ts.Blocks != 1 || ts.UsedBytes != footprint(len(encodeKey("a", []byte("k1"))), int64(len(v1)), nil) {
		t.Errorf("tier stats %+v", ts)
	}
	if ts.Hits < 4 || ts.Misses < 2 {
		t.Errorf("hits %d misses %d", ts.Hits, ts.Misses)
	}
	var a cache.NamespaceStats
	for _, n := range st.Namespaces {
		if n.Namespace == "a" {
			a = n
		}
	}
	if a.Blocks != 1 || a.Bytes != int64(len(v1)) || a.Puts != 2 {
		t.Errorf("namespace a stats %+v", a)
	}

	if err := tr.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := tr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := tr.Put(ctx, "a", []byte("x"), v2, cache.PutOptions{}); !errors.Is(err, cache.ErrClosed) {
		t.Fatalf("Put after Close: %v", err)
	}
	if _, _, err := tr.Get(ctx, "a", []byte("k1"), nil); !errors.Is(err, cache.ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
}

// TestLargeWriteReadReopen writes more than a small DRAM tier would hold in
// 1 MiB blocks, reads every byte back, closes, reopens and checks again.
func TestLargeWriteReadReopen(t *testing.T) {
	for _, sto := range stores {
		t.Run(sto.name, func(t *testing.T) { testLargeWriteReadReopen(t, sto.logMin) })
	}
}

func testLargeWriteReadReopen(t *testing.T, logMin int64) {
	n := 256
	if testing.Short() {
		n = 64
	}
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.ValueLogMin = logMin
	tr := newTier(t, cfg)
	ctx := context.Background()
	for i := range n {
		mustPut(t, tr, "big", key(i), value(uint64(i), mib), cache.PutOptions{Depth: int32(i % 16)})
	}
	buf := make([]byte, 0, mib)
	check := func(tr *Tier) {
		t.Helper()
		for i := range n {
			got, _, err := tr.Get(ctx, "big", key(i), buf)
			if err != nil {
				t.Fatalf("Get %d: %v", i, err)
			}
			if !bytes.Equal(got, value(uint64(i), mib)) {
				t.Fatalf("block %d: bytes differ", i)
			}
		}
	}
	check(tr)
	if got := tierStats(tr); got.Blocks != int64(n) || got.BytesIn != int64(n)*mib || got.BytesOut != int64(n)*mib {
		t.Fatalf("stats %+v", got)
	}
	if err := tr.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	blobs, _ := filepath.Glob(filepath.Join(dir, "*.blob"))
	segs, _ := filepath.Glob(filepath.Join(dir, valuesDir, "*.seg"))
	switch {
	case logMin < 0 && (len(blobs) == 0 || len(segs) != 0):
		t.Fatalf("%d blob files, %d segments: values were not separated into blob files", len(blobs), len(segs))
	case logMin >= 0 && (len(blobs) != 0 || len(segs) == 0):
		t.Fatalf("%d blob files, %d segments: values not in the value log", len(blobs), len(segs))
	}

	tr2 := newTier(t, cfg)
	blocks, nbytes, took := tr2.Recovered()
	t.Logf("recovered %d blocks, %d bytes in %v", blocks, nbytes, took)
	if blocks != int64(n) || nbytes != int64(n)*mib {
		t.Fatalf("Recovered = %d blocks %d bytes, want %d, %d", blocks, nbytes, n, n*mib)
	}
	check(tr2)
	info, ok := tr2.Stat(ctx, "big", key(5))
	if !ok || info.Depth != 5 {
		t.Fatalf("Stat after reopen: %+v %v", info, ok)
	}
}

// TestEvictionBudget fills a small tier several times over; the logical
// footprint never exceeds the capacity and the files on disk stay within a
// documented margin of it: capacity + half of it + a blob file for RocksDB,
// capacity + the value log's hard limit + two segments for the value log.
func TestEvictionBudget(t *testing.T) {
	for _, sto := range stores {
		t.Run(sto.name, func(t *testing.T) { testEvictionBudget(t, sto.logMin) })
	}
}

func testEvictionBudget(t *testing.T, logMin int64) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.ValueLogMin = logMin
	cfg.Capacity = 32 * mib
	cfg.WriteBufferSize = 4 * mib
	cfg.BlobFileSize = 4 * mib
	tr := newTier(t, cfg)
	ctx := context.Background()
	const n = 160
	for i := range n {
		mustPut(t, tr, "ev", key(i), value(uint64(i), mib), cache.PutOptions{})
		if used := tierStats(tr).UsedBytes; used > cfg.Capacity {
			t.Fatalf("after put %d: used %d > capacity %d", i, used, cfg.Capacity)
		}
	}
	ts := tierStats(tr)
	if ts.Evictions < n-32 || ts.Blocks > 31 {
		t.Fatalf("stats %+v", ts)
	}
	// The newest blocks are there, the oldest gone.
	mustGet(t, tr, "ev", key(n-1), value(n-1, mib))
	if _, _, err := tr.Get(ctx, "ev", key(0), nil); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("oldest block: %v", err)
	}
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Compaction runs in the background; wait for the files to shrink.
	limit := cfg.Capacity + cfg.Capacity/2 + int64(cfg.BlobFileSize)
	if logMin >= 0 {
		_, hard := tr.deadLimits()
		limit = cfg.Capacity + hard + 2*tr.segmentSize()
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		disk := dirBytes(t, dir)
		if disk <= limit {
			t.Logf("disk %d bytes for capacity %d (limit %d); health %+v", disk, cfg.Capacity, limit, tr.Health())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("disk %d bytes > limit %d; health %+v", disk, limit, tr.Health())
		}
		tr.wmu.Lock()
		tr.noteGarbageLocked(cfg.Capacity) // force one more compaction
		tr.wmu.Unlock()
		time.Sleep(50 * time.Millisecond) // polling interval, not a wait for a condition
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	tr2 := newTier(t, cfg)
	if blocks, _, _ := tr2.Recovered(); blocks != ts.Blocks {
		t.Fatalf("recovered %d blocks, had %d", blocks, ts.Blocks)
	}
	mustGet(t, tr2, "ev", key(n-1), value(n-1, mib))
}

// dirBytes sums the SST and blob files and the value log segments under
// dir.
func dirBytes(t testing.TB, dir string) int64 {
	var n int64
	for _, pat := range []string{"*.sst", "*.blob", filepath.Join(valuesDir, "*.seg")} {
		files, _ := filepath.Glob(filepath.Join(dir, pat))
		for _, f := range files {
			if fi, err := os.Stat(f); err == nil {
				n += fi.Size()
			}
		}
	}
	return n
}

func TestCapacityLoweredOnReopen(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	tr := newTier(t, cfg)
	for i := range 10 {
		mustPut(t, tr, "c", key(i), value(uint64(i), 256<<10), cache.PutOptions{})
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.Capacity = mib + mib/2
	cfg.MaxValueSize = mib
	tr2 := newTier(t, cfg)
	if ts := tierStats(tr2); ts.UsedBytes > cfg.Capacity || ts.Blocks != 5 {
		t.Fatalf("after reopen with a smaller capacity: %+v", ts)
	}
	mustGet(t, tr2, "c", key(9), value(9, 256<<10))
}

func TestSingleflight(t *testing.T) {
	tr := newTier(t, testConfig(t.TempDir()))
	v := value(7, mib)
	mustPut(t, tr, "sf", []byte("k"), v, cache.PutOptions{})
	const readers = 8
	release := make(chan struct{})
	tr.hookBeforeRead = func() { <-release }
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, _, err := tr.Get(context.Background(), "sf", []byte("k"), nil)
			if err == nil && !bytes.Equal(got, v) {
				err = errors.New("wrong bytes")
			}
			errs <- err
		}()
	}
	// Wait until every reader has joined the one flight.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if tr.flights.Joined(string(encodeKey("sf", []byte("k")))) == readers {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("readers did not join one flight")
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := tr.reads.Load(); got != 1 {
		t.Fatalf("%d RocksDB reads for %d concurrent misses, want 1", got, readers)
	}
	tr.hookBeforeRead = nil
	mustGet(t, tr, "sf", []byte("k"), v)
	if got := tr.reads.Load(); got != 2 {
		t.Fatalf("reads = %d, want 2", got)
	}
}

func TestConcurrent(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.Capacity = 24 * mib
	tr := newTier(t, cfg)
	ctx := context.Background()
	const workers, ops = 4, 60
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ops {
				k := key(i % 40)
				want := value(uint64(i%40), 128<<10)
				switch (i + w) % 4 {
				case 0, 1:
					if _, err := tr.Put(ctx, "cc", k, want, cache.PutOptions{}); err != nil {
						t.Error(err)
					}
				case 2:
					got, _, err := tr.Get(ctx, "cc", k, nil)
					if err == nil && !bytes.Equal(got, want) {
						t.Errorf("key %s: wrong bytes", k)
					} else if err != nil && !errors.Is(err, cache.ErrNotFound) {
						t.Error(err)
					}
				case 3:
					if _, err := tr.Delete(ctx, "cc", k); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	if ts := tierStats(tr); ts.UsedBytes > cfg.Capacity || ts.ChecksumFailures != 0 {
		t.Fatalf("stats %+v", ts)
	}
}

// TestAccessOrderSurvivesReopen checks that the last-access times persisted
// on Close drive eviction after a restart.
func TestAccessOrderSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	clk := cfg.Clock.(*clock.Fake)
	const size = 256 << 10
	foot := footprint(len(encodeKey("ao", key(0))), size, nil)
	cfg.Capacity = 4 * foot
	cfg.MaxValueSize = size
	tr := newTier(t, cfg)
	for i := range 4 {
		clk.Advance(time.Second)
		mustPut(t, tr, "ao", key(i), value(uint64(i), size), cache.PutOptions{})
	}
	clk.Advance(time.Second)
	mustGet(t, tr, "ao", key(0), value(0, size)) // 0 is now the most recent
	if _, err := tr.Delete(context.Background(), "ao", key(3)); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}

	tr2 := newTier(t, cfg)
	if _, ok := tr2.Stat(context.Background(), "ao", key(3)); ok {
		t.Fatal("deleted block back after a clean close")
	}
	clk.Advance(time.Second)
	mustPut(t, tr2, "ao", key(4), value(4, size), cache.PutOptions{})
	mustPut(t, tr2, "ao", key(5), value(5, size), cache.PutOptions{}) // evicts 1 (oldest)
	for i, want := range []bool{true, false, true, false, true, true} {
		if _, ok := tr2.Stat(context.Background(), "ao", key(i)); ok != want {
			t.Errorf("block %d present = %v, want %v", i, ok, want)
		}
	}
}

// storedLog is a cache.Observer that records the description each
// Stored call carries.
type storedLog struct {
	mu   sync.Mutex
	meta map[string]*cache.BlockMeta // ns/key → the last Stored's
}

func (o *storedLog) Stored(ns string, key []byte, _ string, m *cache.BlockMeta) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.meta == nil {
		o.meta = map[string]*cache.BlockMeta{}
	}
	o.meta[ns+"/"+string(key)] = m
}
func (o *storedLog) Removed(string, []byte, string) {}
func (o *storedLog) Cleared(string, string)         {}

// TestDescriptionSurvivesReopen: a block put with a description keeps it
// in its record, through the rewrite of its last access at Close and a
// durable put of the block again, and the reopened tier reports it with
// each block it finds; a block put without one is reported without.
func TestDescriptionSurvivesReopen(t *testing.T) {
	for _, sto := range stores {
		t.Run(sto.name, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			cfg.ValueLogMin = sto.logMin
			clk := clock.NewFake(t0)
			cfg.Clock = clk
			tr := newTier(t, cfg)
			desc := func(i int) *cache.BlockMeta {
				return &cache.BlockMeta{Tokens: []uint32{uint32(i), uint32(i + 1), 1 << 31}, Parent: key(i - 1), BlockSize: 3}
			}
			const n = 4
			for i := range n {
				m := desc(i)
				mustPut(t, tr, "ns", key(i), value(uint64(i), 128<<10), cache.PutOptions{Meta: m, Durable: i == 1})
				m.Tokens[0] = 999 // the caller's slices are not kept
			}
			mustPut(t, tr, "ns", key(n), value(n, 128<<10), cache.PutOptions{})
			clk.Advance(time.Second)
			mustGet(t, tr, "ns", key(2), value(2, 128<<10)) // its access is rewritten at Close
			if _, err := tr.Put(context.Background(), "ns", key(3), value(3, 128<<10), cache.PutOptions{Durable: true}); err != nil {
				t.Fatal(err)
			}
			if err := tr.Close(); err != nil {
				t.Fatal(err)
			}
			var log storedLog
			cfg.Observer = &log
			tr2 := newTier(t, cfg)
			for i := range n {
				if got := log.meta["ns/"+string(key(i))]; !reflect.DeepEqual(got, desc(i)) {
					t.Errorf("block %d reported with %+v, want %+v", i, got, desc(i))
				}
				mustGet(t, tr2, "ns", key(i), value(uint64(i), 128<<10))
			}
			if got, ok := log.meta["ns/"+string(key(n))]; !ok || got != nil {
				t.Errorf("block put without a description reported with %+v (%v)", got, ok)
			}
			want := footprint(len(encodeKey("ns", key(0))), 128<<10, desc(0))*n + footprint(len(encodeKey("ns", key(n))), 128<<10, nil)
			if ts := tierStats(tr2); ts.UsedBytes != want {
				t.Errorf("used %d bytes after reopen, want %d", ts.UsedBytes, want)
			}
		})
	}
}
