package tiered

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/cache/ssd"
	"github.com/tidepool-kv/tidepool/internal/poll"
)

const mib = 1 << 20

// testConfig is a small store: DRAM of dramCap bytes, an SSD tier of 1 GiB
// in ssdDir (empty: no SSD tier).
func testConfig(t testing.TB, dramCap int64, ssdDir string) Config {
	cfg := DefaultConfig()
	cfg.DRAM = dram.DefaultConfig()
	cfg.DRAM.Dir = t.TempDir()
	cfg.DRAM.Capacity = dramCap
	cfg.DRAM.ArenaSize = 0
	cfg.DRAM.MaxValueSize = 4 * mib
	cfg.DRAM.ArenaSize = dramCap
	cfg.DRAM.LazyFault = true
	cfg.QueueBytes = 64 * mib
	if ssdDir != "" {
		sc := ssd.DefaultConfig()
		sc.Dir = ssdDir
		sc.Capacity = 1 << 30
		sc.WriteBufferSize = 8 * mib
		sc.MaxWriteBuffers = 3
		sc.BlobFileSize = 16 * mib
		sc.BackgroundJobs = 2
		sc.MinFreeBytes = -1 // no free-space floor
		sc.MaxValueSize = 4 * mib
		cfg.SSD = &sc
	}
	return cfg
}

func newStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := New(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// value returns n deterministic pseudo-random bytes for seed.
func value(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), byte(seed >> 24)})
	r.Read(b)
	return b
}

func key(i int) []byte { return fmt.Appendf(nil, "block-%06d", i) }

var ctx = context.Background()

func waitIdle(t testing.TB, s *Store) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.WaitIdle(c); err != nil {
		t.Fatalf("WaitIdle: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	base := testConfig(t, 8*mib, t.TempDir())
	tests := []struct {
		name string
		mod  func(c *Config)
		want string
	}{
		{"ok", func(c *Config) {}, ""},
		{"no ssd", func(c *Config) { c.SSD = nil }, ""},
		{"on evict set", func(c *Config) { c.DRAM.OnEvict = func(string, []byte, []byte, cache.Info) {} }, "OnEvict"},
		{"watermarks inverted", func(c *Config) { c.HighWatermark, c.LowWatermark = 0.5, 0.8 }, "LowWatermark"},
		{"negative queue", func(c *Config) { c.QueueBlocks = -1 }, "QueueBlocks"},
		{"bad tiers", func(c *Config) { c.DRAM.Dir = ""; sc := *c.SSD; sc.Dir = ""; c.SSD = &sc }, "Dir"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.mod(&c)
			err := c.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.want))) {
				t.Fatalf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestSpillReadBack stores 256 MiB through a 32 MiB DRAM tier and reads
// every byte back: most blocks come from SSD and are promoted.
func TestSpillReadBack(t *testing.T) {
	const n, size = 256, 1 * mib
	s := newStore(t, testConfig(t, 32*mib, t.TempDir()))
	start := time.Now()
	for i := range n {
		if existed, err := s.Put(ctx, "ns", key(i), value(uint64(i), size), cache.PutOptions{Depth: int32(i % 8)}); err != nil || existed {
			t.Fatalf("put %d: existed=%v err=%v", i, existed, err)
		}
		if i%16 == 15 {
			waitIdle(t, s) // keep the queue from overflowing: this test wants every block
		}
	}
	waitIdle(t, s)
	wrote := time.Since(start)
	// The DRAM tier counts an eviction just before it hands the block to
	// the demotion queue: the last one can still be on its way.
	var m Movement
	var ds cache.TierStats
	poll.Until(t, 20*time.Second, "demotions to match evictions", func() bool {
		m, ds = s.Movement(), s.dram.Stats().Tiers[0]
		return m.Demotions == ds.Evictions
	})
	if m.DemotionsDropped != 0 || m.DemotionErrors != 0 {
		t.Fatalf("dropped %d, errors %d", m.DemotionsDropped, m.DemotionErrors)
	}
	if m.Demotions != ds.Evictions || m.Demotions < n-32 {
		t.Fatalf("demotions %d, dram evictions %d", m.Demotions, ds.Evictions)
	}
	start = time.Now()
	var buf []byte
	for _, i := range rand.New(rand.NewPCG(1, 2)).Perm(n) {
		v, info, err := s.Get(ctx, "ns", key(i), buf)
		if err != nil {
			t.Fatalf("get %d: %v", i, err)
		}
		if !bytes.Equal(v, value(uint64(i), size)) || info.Size != size || info.Depth != int32(i%8) {
			t.Fatalf("block %d: wrong bytes or info %+v", i, info)
		}
		buf = v
	}
	read := time.Since(start)
	m = s.Movement()
	if m.Promotions < n-32 || m.SSDReads+m.QueueHits != m.Promotions {
		t.Fatalf("promotions %d, ssd reads %d, queue hits %d", m.Promotions, m.SSDReads, m.QueueHits)
	}
	st := s.Stats()
	if len(st.Tiers) != 2 || st.Tiers[0].Name != "dram" || st.Tiers[1].Name != "ssd" || st.Tiers[1].Blocks != n {
		t.Fatalf("stats tiers %+v", st.Tiers)
	}
	if len(st.Namespaces) != 1 || st.Namespaces[0].Hits != n || st.Namespaces[0].Puts < n {
		t.Fatalf("stats namespaces %+v", st.Namespaces)
	}
	t.Logf("wrote %d MiB in %v, read back in %v; %+v", n*size/mib, wrote, read, m)
}

// TestPromotion: a block evicted from DRAM is served from SSD and comes
// back to DRAM.
func TestPromotion(t *testing.T) {
	s := newStore(t, testConfig(t, 4*mib, t.TempDir()))
	for i := range 8 {
		if _, err := s.Put(ctx, "ns", key(i), value(uint64(i), mib), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitIdle(t, s)
	info, ok := s.Stat(ctx, "ns", key(0))
	if !ok || info.Tier != ssd.TierName {
		t.Fatalf("block 0 before read: %+v %v", info, ok)
	}
	v, _, err := s.Get(ctx, "ns", key(0), nil)
	if err != nil || !bytes.Equal(v, value(0, mib)) {
		t.Fatalf("get: %v", err)
	}
	if info, ok := s.Stat(ctx, "ns", key(0)); !ok || info.Tier != dram.TierName {
		t.Fatalf("block 0 after read: %+v %v", info, ok)
	}
	if m := s.Movement(); m.Promotions != 1 || m.SSDReads != 1 {
		t.Fatalf("movement %+v", m)
	}
	// Still in SSD (inclusive): evicting it again writes nothing.
	if _, ok := s.ssd.Stat(ctx, "ns", key(0)); !ok {
		t.Fatal("promoted block left the ssd tier")
	}
	if _, _, err := s.Get(ctx, "ns", []byte("absent"), nil); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("absent: %v", err)
	}
	// Put of a key only SSD holds is a no-op.
	if existed, err := s.Put(ctx, "ns", key(1), value(1, mib), cache.PutOptions{}); err != nil || !existed {
		t.Fatalf("re-put of a demoted key: %v %v", existed, err)
	}
}

// TestDroppedDemotions: with the writer stuck, evictions beyond the queue
// bound are dropped and counted, and puts do not wait.
func TestDroppedDemotions(t *testing.T) {
	cfg := testConfig(t, 4*mib, t.TempDir())
	cfg.QueueBlocks = 2
	s, err := New(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	gate := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	defer release()
	s.hookWrite = func() { <-gate }

	const n = 20
	for i := range n {
		if _, err := s.Put(ctx, "ns", key(i), value(uint64(i), mib), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	m := s.Movement()
	evicted := s.dram.Stats().Tiers[0].Evictions
	// One item may be with the writer (blocked), two queued.
	if m.DemotionsDropped < evicted-3 || m.DemotionsDropped == 0 {
		t.Fatalf("evicted %d, dropped %d, queue %d", evicted, m.DemotionsDropped, m.QueueBlocks)
	}
	// A queued block is still served, from the queue.
	var queued int
	for i := range n {
		if info, ok := s.Stat(ctx, "ns", key(i)); ok && info.Tier == ssd.TierName {
			queued = i
			break
		}
	}
	release()
	waitIdle(t, s)
	// The watermark evictor may still be finishing an eviction (the DRAM
	// tier hands a block to OnEvict before it counts the eviction).
	poll.Until(t, 20*time.Second, "every eviction demoted or dropped", func() bool {
		m, evicted = s.Movement(), s.dram.Stats().Tiers[0].Evictions
		return m.Demotions+m.DemotionsDropped == evicted
	})
	if v, _, err := s.Get(ctx, "ns", key(queued), nil); err != nil || !bytes.Equal(v, value(uint64(queued), mib)) {
		t.Fatalf("queued block %d: %v", queued, err)
	}
}

// TestQueueServesAndDeleteCancels: a block waiting in the queue is served
// from it, and deleting it means the writer never writes it.
func TestQueueServesAndDeleteCancels(t *testing.T) {
	s := newStore(t, testConfig(t, 4*mib, t.TempDir()))
	gate := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release) // before Close (cleanups run last first): a failure does not hang it
	s.hookWrite = func() { <-gate }
	for i := range 8 {
		if _, err := s.Put(ctx, "ns", key(i), value(uint64(i), mib), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Block 0 is with the writer (blocked); the next are queued.
	poll.Until(t, 20*time.Second, "writer to take an item", func() bool { return s.Movement().QueueBlocks >= 2 })
	var inQueue []int
	for i := range 8 {
		if info, ok := s.Stat(ctx, "ns", key(i)); ok && info.Tier == ssd.TierName {
			inQueue = append(inQueue, i)
		}
	}
	if len(inQueue) < 2 {
		t.Fatalf("queued blocks: %v", inQueue)
	}
	for _, i := range inQueue {
		if ok, err := s.Delete(ctx, "ns", key(i)); !ok || err != nil {
			t.Fatalf("delete %d: %v %v", i, ok, err)
		}
	}
	release()
	waitIdle(t, s)
	for _, i := range inQueue {
		if _, ok := s.Stat(ctx, "ns", key(i)); ok {
			t.Fatalf("deleted block %d came back", i)
		}
		if _, _, err := s.Get(ctx, "ns", key(i), nil); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("deleted block %d: %v", i, err)
		}
	}
	if n, err := s.Clear(ctx, "ns"); err != nil || n == 0 {
		t.Fatalf("clear: %d %v", n, err)
	}
	// The watermark loop may be demoting a block while Clear runs: that
	// block is already unlinked (Clear does not see it) and its memory is
	// freed when the demotion's callback returns.
	poll.Until(t, 20*time.Second, "clear to settle", func() bool {
		st := s.Stats()
		return st.Tiers[0].Blocks == 0 && st.Tiers[1].Blocks == 0
	})
}

// TestConcurrentMissesOneRead: many concurrent Gets of a block in SSD only
// cost one SSD read and one promotion.
func TestConcurrentMissesOneRead(t *testing.T) {
	s := newStore(t, testConfig(t, 16*mib, t.TempDir()))
	want := value(7, 4*mib)
	if _, err := s.Put(ctx, "ns", key(7), want, cache.PutOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.dram.Delete(ctx, "ns", key(7)); !ok {
		t.Fatal("durable put not in dram")
	}
	const g = 32
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, g)
	for range g {
		wg.Go(func() {
			<-start
			v, _, err := s.Get(ctx, "ns", key(7), nil)
			if err == nil && !bytes.Equal(v, want) {
				err = errors.New("wrong bytes")
			}
			errs <- err
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if m := s.Movement(); m.SSDReads != 1 || m.Promotions != 1 {
		t.Fatalf("ssd reads %d, promotions %d", m.SSDReads, m.Promotions)
	}
}

// TestDurableWritesThrough: a durable put is in SSD when Put returns.
func TestDurableWritesThrough(t *testing.T) {
	s := newStore(t, testConfig(t, 8*mib, t.TempDir()))
	if _, err := s.Put(ctx, "ns", key(1), value(1, mib), cache.PutOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.ssd.Stat(ctx, "ns", key(1)); !ok {
		t.Fatal("durable block not in ssd")
	}
	if info, ok := s.Stat(ctx, "ns", key(1)); !ok || info.Tier != dram.TierName {
		t.Fatalf("durable block not in dram: %+v", info)
	}
	if existed, err := s.Put(ctx, "ns", key(1), value(1, mib), cache.PutOptions{Durable: true}); err != nil || !existed {
		t.Fatalf("second durable put: %v %v", existed, err)
	}
	// DRAM only: a durable put cannot be made durable, so it is refused
	// (it used to be acknowledged and lost at the next stop), and nothing
	// is stored.
	d := newStore(t, testConfig(t, 8*mib, ""))
	if _, err := d.Put(ctx, "ns", key(1), value(1, mib), cache.PutOptions{Durable: true}); !errors.Is(err, cache.ErrUnavailable) {
		t.Fatalf("durable put without an ssd tier: %v, want cache.ErrUnavailable", err)
	}
	if _, ok := d.Stat(ctx, "ns", key(1)); ok {
		t.Fatal("refused durable put stored the block")
	}
	if d.Prefetch(ctx, "ns", [][]byte{key(1)}) != 0 || d.Movement().SSD != nil {
		t.Fatal("dram-only store prefetched or reports an ssd")
	}
}

// TestCloseSpillsAndReopens: a clean Close copies DRAM into SSD, and a new
// store on the same directory serves every block.
func TestCloseSpillsAndReopens(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, 16*mib, dir)
	cfg.StopSpillTimeout = 30 * time.Second
	s, err := New(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	const n = 24 // 8 demoted, 16 in DRAM only at Close
	for i := range n {
		if _, err := s.Put(ctx, "ns", key(i), value(uint64(i), mib), cache.PutOptions{Depth: int32(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := s.Put(ctx, "ns", key(99), []byte("x"), cache.PutOptions{}); !errors.Is(err, cache.ErrClosed) {
		t.Fatalf("put after close: %v", err)
	}
	if m := s.Movement(); m.Spilled == 0 || m.SpillMissed != 0 || m.Spilled+m.Demotions != n {
		t.Fatalf("movement at close %+v", m)
	}

	cfg2 := testConfig(t, 16*mib, dir)
	r := newStore(t, cfg2)
	if b, _, _ := r.SSD().Recovered(); b != n {
		t.Fatalf("recovered %d blocks, want %d", b, n)
	}
	for i := range n {
		v, info, err := r.Get(ctx, "ns", key(i), nil)
		if err != nil || !bytes.Equal(v, value(uint64(i), mib)) || info.Depth != int32(i) {
			t.Fatalf("block %d after reopen: %v %+v", i, err, info)
		}
	}
}

// TestPrefetch promotes SSD blocks into DRAM in the background.
func TestPrefetch(t *testing.T) {
	s := newStore(t, testConfig(t, 8*mib, t.TempDir()))
	for i := range 4 {
		if _, err := s.Put(ctx, "ns", key(i), value(uint64(i), mib), cache.PutOptions{Durable: true}); err != nil {
			t.Fatal(err)
		}
		s.dram.Delete(ctx, "ns", key(i))
	}
	s.Put(ctx, "ns", key(10), value(10, mib), cache.PutOptions{})
	keys := [][]byte{key(0), key(1), key(2), key(3), key(10), []byte("absent")}
	if n := s.Prefetch(ctx, "ns", keys); n != 4 {
		t.Fatalf("queued %d, want 4", n)
	}
	poll.Until(t, 20*time.Second, "prefetch", func() bool { return s.Movement().Promotions == 4 })
	for i := range 4 {
		if info, ok := s.dram.Stat(ctx, "ns", key(i)); !ok || info.Tier != dram.TierName {
			t.Fatalf("block %d not in dram after prefetch", i)
		}
	}
}

// TestZeroCopyForwarding: Acquire promotes from SSD; Reserve (and Bind of
// a slot reserved ahead) refuses a key held below.
func TestZeroCopyForwarding(t *testing.T) {
	s := newStore(t, testConfig(t, 8*mib, t.TempDir()))
	if len(s.Arenas()) == 0 {
		t.Fatal("no arenas")
	}
	want := value(3, mib)
	s.Put(ctx, "ns", key(3), want, cache.PutOptions{Durable: true})
	s.dram.Delete(ctx, "ns", key(3))
	if _, err := s.Reserve(ctx, "ns", key(3), mib, cache.PutOptions{}, 0); !errors.Is(err, cache.ErrExists) {
		t.Fatalf("reserve of a key in ssd: %v", err)
	}
	// A slot reserved ahead is refused the key at Bind, and stays open.
	r, err := s.ReserveUnbound(ctx, "ns", mib, cache.PutOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Bind(key(3), cache.PutOptions{}); !errors.Is(err, cache.ErrExists) {
		t.Fatalf("bind of a key in ssd: %v", err)
	}
	if err := r.Bind(key(4), cache.PutOptions{}); err != nil {
		t.Fatalf("bind of a new key: %v", err)
	}
	if err := r.Abort(); err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx, "ns", key(3), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(l.Bytes(), want) {
		t.Fatal("acquired bytes differ")
	}
	l.Release()
	if _, err := s.Acquire(ctx, "ns", []byte("absent"), time.Second); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("acquire absent: %v", err)
	}
}

// TestDiskBudget: writing 5× the SSD capacity through the store keeps the
// SSD's accounted bytes under its capacity and its files near it.
func TestDiskBudget(t *testing.T) {
	cfg := testConfig(t, 8*mib, t.TempDir())
	cfg.SSD.Capacity = 32 * mib
	cfg.SSD.BlobFileSize = 4 * mib
	cfg.SSD.WriteBufferSize = 4 * mib
	s := newStore(t, cfg)
	for i := range 160 {
		if _, err := s.Put(ctx, "ns", key(i), value(uint64(i), mib), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		if i%8 == 7 {
			waitIdle(t, s)
		}
		if used := s.Stats().Tiers[1].UsedBytes; used > cfg.SSD.Capacity {
			t.Fatalf("ssd used %d > capacity", used)
		}
	}
	waitIdle(t, s)
	if err := s.SSD().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	limit := cfg.SSD.Capacity*3/2 + int64(cfg.SSD.BlobFileSize)
	poll.Until(t, 20*time.Second, "disk bytes under budget", func() bool { return s.Movement().SSD.DiskBytes <= limit })
	if st := s.Stats().Tiers[1]; st.Evictions == 0 {
		t.Fatalf("ssd never evicted: %+v", st)
	}
}

type fakeEvicter struct{ targets chan int64 }

func (f fakeEvicter) EvictTo(target int64) int {
	select {
	case f.targets <- target:
	default:
	}
	return 1
}

// TestWatermarkLoop: above the high watermark, the loop asks the DRAM tier
// to evict down to the low one. The loop under test runs against a fake
// evicter; the store is opened without watermarks so that its own loop
// (against the real DRAM tier) cannot evict first, then given them.
func TestWatermarkLoop(t *testing.T) {
	cfg := testConfig(t, 8*mib, t.TempDir())
	cfg.HighWatermark, cfg.LowWatermark = -1, -1 // off
	cfg.WatermarkInterval = time.Millisecond
	s := newStore(t, cfg)
	s.cfg.HighWatermark, s.cfg.LowWatermark = 0.5, 0.25
	ev := fakeEvicter{targets: make(chan int64, 1)}
	s.bg.Add(1)
	go s.watermarks(ev)
	for i := range 5 {
		s.Put(ctx, "ns", key(i), value(uint64(i), mib), cache.PutOptions{})
	}
	select {
	case target := <-ev.targets:
		if target != 2*mib {
			t.Fatalf("EvictTo(%d), want %d", target, 2*mib)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watermark loop did not evict")
	}
	poll.Until(t, 20*time.Second, "counter", func() bool { return s.Movement().WatermarkEvictions > 0 })
}

// TestPresent: the present prefix counts blocks in DRAM and, past the
// first DRAM miss, blocks on SSD; with a present slice every key is
// answered, from either tier.
func TestPresent(t *testing.T) {
	s := newStore(t, testConfig(t, 4*mib, t.TempDir()))
	for i := range 8 {
		if _, err := s.Put(ctx, "ns", key(i), value(uint64(i), mib), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitIdle(t, s)
	if info, ok := s.Stat(ctx, "ns", key(0)); !ok || info.Tier != ssd.TierName {
		t.Fatalf("block 0 should be on SSD only: %+v %v", info, ok)
	}
	all := make([][]byte, 8)
	for i := range all {
		all[i] = key(i)
	}
	if got := s.Present(ctx, "ns", all, nil); got != 8 {
		t.Fatalf("all 8 (DRAM and SSD): %d", got)
	}
	withGap := [][]byte{key(7), key(0), []byte("absent"), key(1)}
	if got := s.Present(ctx, "ns", withGap, nil); got != 2 {
		t.Fatalf("prefix before the gap: %d, want 2", got)
	}
	if got := s.Present(ctx, "other", all, nil); got != 0 {
		t.Fatalf("unknown namespace: %d", got)
	}
	present := []bool{false, false, true, false}
	if got := s.Present(ctx, "ns", withGap, present); got != 2 || !slices.Equal(present, []bool{true, true, false, true}) {
		t.Fatalf("every key: prefix %d, %v; want 2, [true true false true]", got, present)
	}
}

// TestStatsCountEachRead: each read of the store counts once, whichever
// path serves it (Get, Acquire, after Prefetch), and movement is not
// counted as puts or reads.
func TestStatsCountEachRead(t *testing.T) {
	s := newStore(t, testConfig(t, 8*mib, t.TempDir()))
	const size = 64 << 10
	for i := range 3 { // SSD only
		if _, err := s.ssd.Put(ctx, "ns", key(i), value(uint64(i), size), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	type counts struct{ dramHits, dramMisses, ssdHits, ssdMisses, nsHits, nsMisses, nsPuts, promotions int64 }
	check := func(step string, want counts) {
		t.Helper()
		st := s.Stats()
		var got counts
		got.dramHits, got.dramMisses = st.Tiers[0].Hits, st.Tiers[0].Misses
		got.ssdHits, got.ssdMisses = st.Tiers[1].Hits, st.Tiers[1].Misses
		for _, n := range st.Namespaces {
			if n.Namespace == "ns" {
				got.nsHits, got.nsMisses, got.nsPuts = n.Hits, n.Misses, n.Puts
			}
		}
		got.promotions = s.Movement().Promotions
		if got != want {
			t.Fatalf("after %s: %+v, want %+v", step, got, want)
		}
	}
	if _, _, err := s.Get(ctx, "ns", key(0), nil); err != nil {
		t.Fatal(err)
	}
	check("a Get of an SSD-only block", counts{0, 1, 1, 0, 1, 0, 0, 1})
	if _, _, err := s.Get(ctx, "ns", key(0), nil); err != nil {
		t.Fatal(err)
	}
	check("a DRAM hit", counts{1, 1, 1, 0, 2, 0, 0, 1})
	l, err := s.Acquire(ctx, "ns", key(1), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	check("an Acquire of an SSD-only block", counts{1, 2, 2, 0, 3, 0, 0, 2})
	if s.Prefetch(ctx, "ns", [][]byte{key(2)}) != 1 {
		t.Fatal("prefetch queued nothing")
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if info, ok := s.Stat(ctx, "ns", key(2)); ok && info.Tier == dram.TierName {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("prefetched block never reached DRAM")
		}
		time.Sleep(time.Millisecond)
	}
	check("a prefetch", counts{1, 2, 2, 0, 3, 0, 0, 3})
	if _, _, err := s.Get(ctx, "ns", key(9), nil); !errors.Is(err, cache.ErrNotFound) {
		t.Fatal(err)
	}
	check("a miss", counts{1, 3, 2, 1, 3, 1, 0, 3})
	if _, _, err := s.Get(ctx, "other", key(9), nil); !errors.Is(err, cache.ErrNotFound) {
		t.Fatal(err)
	}
	if n := s.Stats().Namespaces; n[slices.IndexFunc(n, func(n cache.NamespaceStats) bool { return n.Namespace == "other" })].Misses != 1 {
		t.Fatalf("miss of a namespace the SSD tier never held: %+v", n)
	}
	if _, err := s.Put(ctx, "ns", key(10), value(10, size), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "ns", key(11), value(11, size), cache.PutOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	check("two puts", counts{1, 4, 2, 2, 3, 1, 2, 3})
}

// TestDamagedBlockNotMovedDown: a DRAM block whose bytes were damaged in
// place after they were checked is not written to SSD with a fresh
// checksum, neither by demotion nor by the spill at Close: the SSD tier
// gets the DRAM block's checksum and refuses bytes that no longer match.
// A later read misses instead of returning the damaged bytes as good.
func TestDamagedBlockNotMovedDown(t *testing.T) {
	const size = 1 * mib
	ssdDir := t.TempDir()
	cfg := testConfig(t, 8*mib, ssdDir)
	cfg.StopSpillTimeout = 30 * time.Second
	s, err := New(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	damage := func(k []byte) {
		l, err := s.dram.AcquireUncounted(ctx, "ns", k, 0)
		if err != nil {
			t.Fatal(err)
		}
		l.Bytes()[size/2] ^= 0x11 // a stray write into the arena
		l.Release()
	}
	// Block 0 is damaged, then evicted by the blocks after it (twice the
	// tier: the reads below count as uses of block 0).
	if _, err := s.Put(ctx, "ns", key(0), value(0, size), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	damage(key(0))
	// Read in place (Acquire is unchecked by default; a Get, which
	// copies, would find the damage and remove the block).
	if l, err := s.dram.Acquire(ctx, "ns", key(0), 0); err != nil || bytes.Equal(l.Bytes(), value(0, size)) || cache.Checksum(l.Bytes()) == l.Info().Checksum {
		t.Fatalf("block 0 not damaged: %v", err)
	} else {
		l.Release()
	}
	for i := 1; i < 20; i++ {
		if _, err := s.Put(ctx, "ns", key(i), value(uint64(i), size), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitIdle(t, s)
	poll.Until(t, 20*time.Second, "the demotion of block 0 to be refused", func() bool { return s.Movement().DemotionErrors == 1 })
	if _, ok := s.ssd.Stat(ctx, "ns", key(0)); ok {
		t.Fatal("damaged block 0 was demoted to SSD")
	}
	if _, ok := s.ssd.Stat(ctx, "ns", key(1)); !ok {
		t.Fatal("good block 1 was not demoted")
	}
	if v, _, err := s.Get(ctx, "ns", key(0), nil); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("Get of the damaged, evicted block: %d bytes, %v; want a miss", len(v), err)
	}
	// Blocks 18 and 19 are in DRAM only; 19, damaged, is not spilled at
	// Close, 18 is.
	for _, i := range []int{18, 19} {
		if _, ok := s.ssd.Stat(ctx, "ns", key(i)); ok {
			t.Fatalf("block %d is in SSD already", i)
		}
	}
	damage(key(19))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := newStore(t, testConfig(t, 8*mib, ssdDir))
	if _, ok := s2.ssd.Stat(ctx, "ns", key(19)); ok {
		t.Fatal("damaged block 19 was spilled to SSD at Close")
	}
	if v, _, err := s2.Get(ctx, "ns", key(18), nil); err != nil || !bytes.Equal(v, value(18, size)) {
		t.Fatalf("good block 18 after the restart: %v", err)
	}
}

// TestAcquireVerifiedFallsBackToSSD: with verify_reads, an Acquire whose
// DRAM copy fails its checksum removes it and pins the SSD copy, promoted,
// as a miss would; with no SSD copy it reports cache.ErrChecksum.
func TestAcquireVerifiedFallsBackToSSD(t *testing.T) {
	cfg := testConfig(t, 8*mib, t.TempDir())
	cfg.DRAM.VerifyReads = true
	s := newStore(t, cfg)
	want := value(5, mib)
	for i, durable := range []bool{true, false} {
		if _, err := s.Put(ctx, "ns", key(i), want, cache.PutOptions{Durable: durable}); err != nil {
			t.Fatal(err)
		}
		l, err := s.dram.AcquireUncounted(ctx, "ns", key(i), 0)
		if err != nil {
			t.Fatal(err)
		}
		l.Bytes()[777] ^= 1
		l.Release()
	}
	l, err := s.Acquire(ctx, "ns", key(0), time.Second)
	if err != nil {
		t.Fatalf("Acquire of a damaged DRAM block with an SSD copy: %v", err)
	}
	if !bytes.Equal(l.Bytes(), want) {
		t.Fatal("acquired bytes differ")
	}
	l.Release()
	if _, err := s.Acquire(ctx, "ns", key(1), time.Second); !errors.Is(err, cache.ErrChecksum) {
		t.Fatalf("Acquire of a damaged DRAM-only block: %v", err)
	}
	if st := s.dram.Stats().Tiers[0]; st.ChecksumFailures != 2 {
		t.Fatalf("dram checksum failures %d", st.ChecksumFailures)
	}
}

// TestQueueReadKeepsItsBytes: demotion buffers are reused once written,
// except one a reader took from the queue, which keeps its bytes however
// many demotions follow.
func TestQueueReadKeepsItsBytes(t *testing.T) {
	s := newStore(t, testConfig(t, 4*mib, t.TempDir()))
	gate := make(chan struct{})
	s.hookWrite = func() { <-gate }
	for i := range 8 {
		if _, err := s.Put(ctx, "ns", key(i), value(uint64(i), mib), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, 20*time.Second, "writer to take an item", func() bool { return s.Movement().QueueBlocks >= 2 })
	read := -1
	for i := range 8 {
		if info, ok := s.Stat(ctx, "ns", key(i)); ok && info.Tier == ssd.TierName {
			s.qmu.Lock()
			_, queued := s.pending[fkey("ns", key(i))]
			s.qmu.Unlock()
			if queued {
				read = i
			}
		}
	}
	if read < 0 {
		t.Fatal("no block in the queue")
	}
	// fetch returns the queue's own buffer (callers copy it): held here
	// across the demotions below.
	v, _, err := s.fetch(ctx, "ns", key(read))
	if err != nil || !bytes.Equal(v, value(uint64(read), mib)) {
		t.Fatalf("queue read of block %d: %d bytes, %v", read, len(v), err)
	}
	close(gate)
	waitIdle(t, s)
	s.qmu.Lock()
	free := len(s.free)
	s.qmu.Unlock()
	if free == 0 {
		t.Fatal("no demotion buffer kept for reuse")
	}
	for i := 100; i < 140; i++ {
		if _, err := s.Put(ctx, "ns", key(i), value(uint64(i), mib), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitIdle(t, s)
	if !bytes.Equal(v, value(uint64(read), mib)) {
		t.Fatalf("block %d read from the queue changed under its reader", read)
	}
	for i := 100; i < 140; i++ {
		got, _, err := s.Get(ctx, "ns", key(i), nil)
		if err != nil || !bytes.Equal(got, value(uint64(i), mib)) {
			t.Fatalf("block %d: %d bytes, %v", i, len(got), err)
		}
	}
}

// TestFreeBuffersTrimmedWhenIdle: the demotion buffers kept for reuse are
// dropped once the queue has been idle, so a burst of spills does not pin
// its memory.
func TestFreeBuffersTrimmedWhenIdle(t *testing.T) {
	s := newStore(t, testConfig(t, 4*mib, t.TempDir()))
	s.freeIdle = 20 * time.Millisecond
	for i := range 12 {
		if _, err := s.Put(ctx, "ns", key(i), value(uint64(i), mib), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitIdle(t, s)
	if s.Movement().Demotions == 0 {
		t.Fatal("nothing demoted")
	}
	poll.Until(t, 20*time.Second, "kept buffers to be dropped", func() bool {
		s.qmu.Lock()
		defer s.qmu.Unlock()
		return len(s.free) == 0 && s.freeBytes == 0 && s.freeTrim == nil
	})
}

// descTable is a cache.Descriptions of fixed descriptions, and a
// cache.Observer that records the description each SSD Stored carries.
type descTable struct {
	mu     sync.Mutex
	give   map[string]*cache.BlockMeta
	stored map[string]*cache.BlockMeta
}

func (d *descTable) Description(ns string, key []byte) *cache.BlockMeta {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.give[ns+"/"+string(key)]
}
func (d *descTable) Stored(ns string, key []byte, tier string, m *cache.BlockMeta) {
	if tier != ssd.TierName {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stored[ns+"/"+string(key)] = m
}
func (d *descTable) Removed(string, []byte, string) {}
func (d *descTable) Cleared(string, string)         {}

// TestCopiesKeepDescriptions: blocks that reach SSD by demotion, by the
// stop spill and by a durable put keep their descriptions in their
// records, and the reopened SSD tier reports them with each block.
func TestCopiesKeepDescriptions(t *testing.T) {
	dir := t.TempDir()
	desc := func(i int) *cache.BlockMeta {
		return &cache.BlockMeta{Tokens: []uint32{uint32(i), 7}, Parent: key(i - 1), BlockSize: 2}
	}
	d := &descTable{give: map[string]*cache.BlockMeta{}}
	const n = 24 // 8 demoted, 16 in DRAM only at Close
	for i := range n {
		d.give["ns/"+string(key(i))] = desc(i)
	}
	cfg := testConfig(t, 16*mib, dir)
	cfg.StopSpillTimeout = 30 * time.Second
	cfg.Descriptions = d
	s := newStore(t, cfg)
	for i := range n {
		if _, err := s.Put(ctx, "ns", key(i), value(uint64(i), mib), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A durable put's own description, which Descriptions does not know.
	if _, err := s.Put(ctx, "ns", key(n), value(n, mib), cache.PutOptions{Durable: true, Meta: desc(n)}); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, s)
	if m := s.Movement(); m.Demotions == 0 {
		t.Fatalf("nothing demoted: %+v", m)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if m := s.Movement(); m.Spilled == 0 {
		t.Fatalf("nothing spilled: %+v", m)
	}

	rec := &descTable{stored: map[string]*cache.BlockMeta{}}
	cfg2 := testConfig(t, 16*mib, dir)
	cfg2.Observer = rec
	newStore(t, cfg2)
	for i := range n + 1 {
		if got := rec.stored["ns/"+string(key(i))]; !reflect.DeepEqual(got, desc(i)) {
			t.Errorf("block %d: the reopened SSD reports %+v, want %+v", i, got, desc(i))
		}
	}
}
