package dram

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
)

// damage flips one bit of the stored bytes of (ns, key), as a stray write
// into the arena would.
func damage(t *testing.T, tr *Tier, ns string, key []byte, at int64) {
	t.Helper()
	l, err := tr.AcquireUncounted(ctx, ns, key, 0)
	if err != nil {
		t.Fatal(err)
	}
	ai, off, _ := l.Location()
	l.Release()
	tr.arenas[ai].mem[off+at] ^= 0x20
}

// TestScrubRate: the bytes checked follow the rate, per step, with no
// timed assertion: the fake clock says how much time passed, and after
// every step the total is within one block of rate × elapsed. A long idle
// gap gives at most one tick's worth, not a burst.
func TestScrubRate(t *testing.T) {
	cfg, fc := testConfig(t, 4<<20)
	tr := newTier(t, cfg)
	const block = 64 << 10
	for i := range 48 { // 3 MiB
		if _, err := tr.Put(ctx, "ns", fmt.Appendf(nil, "k%d", i), pattern("v", block), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		rate int64
		tick time.Duration
	}{
		{256 << 10, 100 * time.Millisecond}, // a block takes 2.5 ticks
		{1 << 20, 100 * time.Millisecond},   // 1.6 blocks a tick
		{3 << 20, 50 * time.Millisecond},
	} {
		t.Run(fmt.Sprint(tc.rate), func(t *testing.T) {
			s, err := NewScrubber(tr, ScrubConfig{Rate: tc.rate, Tick: tc.tick}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var total int64
			var elapsed time.Duration
			// Stop before the first pass ends: a pass end ends a step early.
			steps := int(float64(40*block) / float64(tc.rate) / tc.tick.Seconds())
			for i := range steps {
				fc.Advance(tc.tick)
				elapsed += tc.tick
				n := s.step()
				total += n
				want := float64(tc.rate) * elapsed.Seconds()
				if float64(total) > want+block || float64(total) < want-block {
					t.Fatalf("step %d: %d bytes checked after %v at %d B/s (want %.0f ± one block)", i, total, elapsed, tc.rate, want)
				}
				if n%block != 0 {
					t.Fatalf("step %d checked %d bytes: not whole blocks", i, n)
				}
			}
			if st := s.Stats(); st.Bytes != total || st.Blocks != total/block || st.Failed != 0 {
				t.Fatalf("stats %+v, %d bytes checked", st, total)
			}
			// An hour idle: one tick's worth (plus the block in progress).
			before := s.Stats().Bytes
			fc.Advance(time.Hour)
			if n := s.step(); float64(n) > float64(tc.rate)*tc.tick.Seconds()+block {
				t.Fatalf("after an hour idle one step checked %d bytes at %d B/s", n, tc.rate)
			}
			if s.Stats().Bytes < before {
				t.Fatal("counter went back")
			}
		})
	}
	// Scrubbing is not reading: no hit, no recency, nothing out.
	if st := tr.Stats().Tiers[0]; st.Hits != 0 || st.Misses != 0 || st.BytesOut != 0 || st.ChecksumFailures != 0 {
		t.Fatalf("tier counters after scrubbing: %+v", st)
	}
}

// TestScrubRemovesDamaged: a block damaged in place is found by the next
// pass, removed as a verified read removes it (Stat, Present), and
// counted; the other blocks stay, and a re-Put stores a good copy.
func TestScrubRemovesDamaged(t *testing.T) {
	cfg, fc := testConfig(t, 4<<20)
	tr := newTier(t, cfg)
	keys := [][]byte{[]byte("a"), []byte("b"), []byte("c")}
	for _, k := range keys {
		if _, err := tr.Put(ctx, "ns", k, pattern(string(k), 100000), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	damage(t, tr, "ns", keys[1], 4321)
	// The default does not verify zero-copy reads in place: Acquire
	// hands out the damaged bytes.
	if l, err := tr.Acquire(ctx, "ns", keys[1], 0); err != nil || bytes.Equal(l.Bytes(), pattern("b", 100000)) {
		t.Fatalf("unverified Acquire of the damaged block: %v (want its damaged bytes)", err)
	} else {
		l.Release()
	}
	s, err := NewScrubber(tr, ScrubConfig{Rate: 1 << 20, Tick: 100 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := 0; s.Stats().Passes < 1; i++ {
		if i > 100 {
			t.Fatalf("no pass ended after %d steps: %+v", i, s.Stats())
		}
		fc.Advance(100 * time.Millisecond)
		s.step()
	}
	st := s.Stats()
	if st.Failed != 1 || st.Blocks != 3 || st.Bytes != 300000 || st.LastPass <= 0 {
		t.Fatalf("scrub stats after a pass: %+v", st)
	}
	if _, ok := tr.Stat(ctx, "ns", keys[1]); ok {
		t.Fatal("damaged block still reported by Stat")
	}
	if n := tr.Present(ctx, "ns", keys, nil); n != 1 {
		t.Fatalf("Present = %d, want 1", n)
	}
	ts := tr.Stats().Tiers[0]
	if ts.ChecksumFailures != 1 || ts.Blocks != 2 || ts.UsedBytes != 2*footprint(100000) {
		t.Fatalf("tier after the scrub: %+v", ts)
	}
	for _, k := range [][]byte{keys[0], keys[2]} {
		if v, _, err := tr.Get(ctx, "ns", k, nil); err != nil || !bytes.Equal(v, pattern(string(k), 100000)) {
			t.Fatalf("Get %s after the scrub: %v", k, err)
		}
	}
	if existed, err := tr.Put(ctx, "ns", keys[1], pattern("b", 100000), cache.PutOptions{}); err != nil || existed {
		t.Fatalf("re-Put: %v %v", existed, err)
	}
	// The next pass finds nothing more.
	for p := s.Stats().Passes; s.Stats().Passes == p; {
		fc.Advance(100 * time.Millisecond)
		s.step()
	}
	if st := s.Stats(); st.Failed != 1 {
		t.Fatalf("second pass: %+v", st)
	}
}

// TestScrubSkipsGone: blocks deleted after their shard was loaded are not
// checked (nor counted), and a pinned block being read is checked without
// disturbing the reader.
func TestScrubSkipsGone(t *testing.T) {
	cfg, fc := testConfig(t, 4<<20)
	tr := newTier(t, cfg)
	for i := range 64 {
		if _, err := tr.Put(ctx, "ns", fmt.Appendf(nil, "k%d", i), pattern("v", 1000), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	l, err := tr.Acquire(ctx, "ns", []byte("k7"), 0)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := NewScrubber(tr, ScrubConfig{Rate: 1 << 30}, nil)
	defer s.Close()
	fc.Advance(time.Millisecond) // budget ≈ 1 MB: loads the shards as it goes
	s.mu.Lock()
	// Load the first non-empty shard, then delete everything.
	for len(s.batch) == 0 && s.shard < numShards {
		s.next(fc.Now())
	}
	s.mu.Unlock()
	if _, err := tr.Clear(ctx, "ns"); err != nil {
		t.Fatal(err)
	}
	for s.Stats().Passes < 1 {
		fc.Advance(100 * time.Millisecond)
		s.step()
	}
	if st := s.Stats(); st.Blocks != 0 || st.Failed != 0 {
		t.Fatalf("scrubbed blocks deleted before their check: %+v", st)
	}
	if !bytes.Equal(l.Bytes(), pattern("v", 1000)) {
		t.Fatal("leased bytes changed")
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if ts := tr.Stats().Tiers[0]; ts.UsedBytes != 0 || ts.Blocks != 0 {
		t.Fatalf("after Release: %+v", ts)
	}
}

// TestScrubberLifecycle: Start runs it on its own ticker until Close (or
// ctx); Close without Start and twice is fine; bad configs are refused.
func TestScrubberLifecycle(t *testing.T) {
	cfg, _ := testConfig(t, 4<<20)
	tr := newTier(t, cfg)
	if _, err := NewScrubber(tr, ScrubConfig{Rate: -1, Tick: -1}, nil); err == nil {
		t.Fatal("negative rate accepted")
	}
	if _, err := NewScrubber(nil, ScrubConfig{}, nil); err == nil {
		t.Fatal("nil tier accepted")
	}
	s, _ := NewScrubber(tr, ScrubConfig{}, nil)
	if s.cfg.Rate != DefaultScrubRate || s.cfg.Tick != 100*time.Millisecond {
		t.Fatalf("defaults: %+v", s.cfg)
	}
	s.Close()
	s.Close()
	s.Start(ctx) // after Close: nothing runs

	// A real clock and ticker: the damaged block is found; poll with a
	// deadline.
	cfg2, _ := testConfig(t, 4<<20)
	cfg2.Clock = nil
	tr2 := newTier(t, cfg2)
	if _, err := tr2.Put(ctx, "ns", []byte("x"), pattern("x", 5000), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	damage(t, tr2, "ns", []byte("x"), 10)
	s2, _ := NewScrubber(tr2, ScrubConfig{Rate: 1 << 20, Tick: time.Millisecond}, nil)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s2.Start(cctx)
	s2.Start(cctx)
	deadline := time.Now().Add(10 * time.Second)
	for s2.Stats().Failed == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("scrubber found nothing: %+v", s2.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	s2.Close()
	if _, ok := tr2.Stat(ctx, "ns", []byte("x")); ok {
		t.Fatal("damaged block still present")
	}
}

// TestVerifyReads: by default same-host reads (Get, Pin, Acquire) do not
// checksum; with VerifyReads, or for a namespace in VerifyReadsNamespaces,
// each refuses a damaged block with cache.ErrChecksum and removes it.
func TestVerifyReads(t *testing.T) {
	reads := map[string]func(tr *Tier, ns string, key []byte) ([]byte, error){
		"Get": func(tr *Tier, ns string, key []byte) ([]byte, error) {
			v, _, err := tr.Get(ctx, ns, key, nil)
			return v, err
		},
		"Pin": func(tr *Tier, ns string, key []byte) ([]byte, error) {
			l, err := tr.Pin(ctx, ns, key)
			if err != nil {
				return nil, err
			}
			defer l.Release()
			return bytes.Clone(l.Bytes()), nil
		},
		"Acquire": func(tr *Tier, ns string, key []byte) ([]byte, error) {
			l, err := tr.Acquire(ctx, ns, key, 0)
			if err != nil {
				return nil, err
			}
			defer l.Release()
			return bytes.Clone(l.Bytes()), nil
		},
	}
	for _, tc := range []struct {
		name    string
		all     bool
		listed  []string
		ns      string
		refused bool
	}{
		{"default", false, nil, "ns", false},
		{"verify_reads", true, nil, "ns", true},
		{"listed namespace", false, []string{"other", "ns"}, "ns", true},
		{"unlisted namespace", false, []string{"other"}, "ns", false},
	} {
		for name, read := range reads {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				cfg, _ := testConfig(t, 4<<20)
				cfg.VerifyReads, cfg.VerifyReadsNamespaces = tc.all, tc.listed
				tr := newTier(t, cfg)
				val := pattern("k", 30000)
				if _, err := tr.Put(ctx, tc.ns, []byte("k"), val, cache.PutOptions{}); err != nil {
					t.Fatal(err)
				}
				if v, err := read(tr, tc.ns, []byte("k")); err != nil || !bytes.Equal(v, val) {
					t.Fatalf("read of a good block: %v", err)
				}
				damage(t, tr, tc.ns, []byte("k"), 2000)
				v, err := read(tr, tc.ns, []byte("k"))
				if tr.VerifiesReads(tc.ns) != tc.refused {
					t.Fatalf("VerifiesReads(%q) = %v", tc.ns, !tc.refused)
				}
				st := tr.Stats().Tiers[0]
				// The reads that copy (Get, and Pin whose caller copies
				// into an answer) always check; Acquire as configured.
				if !tc.refused && name == "Acquire" {
					if err != nil || bytes.Equal(v, val) || len(v) != len(val) {
						t.Fatalf("unverified read of a damaged block: %v", err)
					}
					return
				}
				if !errors.Is(err, cache.ErrChecksum) || v != nil {
					t.Fatalf("verified read of a damaged block: %d bytes, %v", len(v), err)
				}
				if _, ok := tr.Stat(ctx, tc.ns, []byte("k")); ok || st.ChecksumFailures != 1 || st.Blocks != 0 {
					t.Fatalf("damaged block not removed: present %v, %+v", ok, st)
				}
				// One good read (a hit), then the refused one: no hit.
				wantMiss := int64(1)
				if name == "Pin" {
					wantMiss = 0 // the caller's Get that follows counts it
				}
				if st.Hits != 1 || st.Misses != wantMiss || st.BytesOut != int64(len(val)) {
					t.Fatalf("counters: %+v", st)
				}
			})
		}
	}
}

// TestPutKnownChecksum: a Put that carries the checksum its bytes are
// known by (a block moved within the sidecar: a hot replica demoted to a
// low-priority copy) refuses bytes that no longer match it and stores
// nothing; with the right checksum it stores the block as usual.
func TestPutKnownChecksum(t *testing.T) {
	cfg, _ := testConfig(t, 4<<20)
	tr := newTier(t, cfg)
	val := pattern("p", 50000)
	bad := cache.PutOptions{Checksum: cache.Checksum(val) ^ 4, HasChecksum: true}
	if _, err := tr.Put(ctx, "ns", []byte("p"), val, bad); !errors.Is(err, cache.ErrChecksum) {
		t.Fatalf("Put with a wrong known checksum: %v", err)
	}
	if st := tr.Stats().Tiers[0]; st.Blocks != 0 || st.UsedBytes != 0 {
		t.Fatalf("after the refused Put: %+v", st)
	}
	good := cache.PutOptions{Checksum: cache.Checksum(val), HasChecksum: true}
	if existed, err := tr.Put(ctx, "ns", []byte("p"), val, good); err != nil || existed {
		t.Fatalf("Put with the right checksum: %v %v", existed, err)
	}
	if v, info, err := tr.Get(ctx, "ns", []byte("p"), nil); err != nil || !bytes.Equal(v, val) || info.Checksum != good.Checksum {
		t.Fatalf("Get: %v", err)
	}
}
