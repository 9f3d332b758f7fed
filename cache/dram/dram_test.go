//go:build linux

package dram

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/clock"
)

var ctx = context.Background()

// testConfig starts from the defaults with a small capacity, a temp dir and
// a fake clock.
func testConfig(t testing.TB, capacity int64) (Config, *clock.Fake) {
	t.Helper()
	fc := clock.NewFake(time.Unix(1_000_000, 0))
	cfg := DefaultConfig()
	cfg.Dir = filepath.Join(t.TempDir(), "arenas")
	cfg.Capacity = capacity
	cfg.ArenaSize = 4 << 20
	cfg.MaxValueSize = 4 << 20
	cfg.Clock = fc
	return cfg, fc
}

func newTier(t testing.TB, cfg Config) *Tier {
	t.Helper()
	tr, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Error(err)
		}
	})
	return tr
}

// pattern returns the deterministic value of key with the given size.
func pattern(key string, size int) []byte {
	v := make([]byte, size)
	var seed uint64 = 1469598103934665603
	for i := 0; i < len(key); i++ {
		seed = (seed ^ uint64(key[i])) * 1099511628211
	}
	for i := 0; i < size; i += 8 {
		seed = seed*6364136223846793005 + 1442695040888963407
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], seed)
		copy(v[i:], w[:])
	}
	return v
}

func TestConfigValidate(t *testing.T) {
	ok := DefaultConfig()
	tests := []struct {
		name   string
		mutate func(*Config)
		want   []string // substrings, one per expected problem
	}{
		{"defaults", func(*Config) {}, nil},
		{"zero fields take defaults", func(c *Config) {
			*c = Config{Dir: "/x", Capacity: 8 << 20}
		}, nil},
		{"empty dir", func(c *Config) { c.Dir = "" }, []string{"Dir"}},
		{"small capacity", func(c *Config) { c.Capacity = 1000 }, []string{"Capacity"}},
		{"arena not page multiple", func(c *Config) { c.ArenaSize = 100000 }, []string{"ArenaSize"}},
		{"value larger than arena", func(c *Config) { c.ArenaSize = 16 << 20; c.MaxValueSize = 32 << 20 }, []string{"MaxValueSize"}},
		{"lease order", func(c *Config) { c.LeaseTimeout = time.Minute; c.MaxLease = time.Second }, []string{"MaxLease"}},
		{"every problem at once", func(c *Config) {
			c.Dir = ""
			c.Capacity = 1
			c.MaxKeySize = -1
			c.LeaseTimeout = -time.Second
		}, []string{"Dir", "Capacity", "MaxKeySize", "LeaseTimeout"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mutate(&c)
			err := c.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate accepted a bad config")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %s", err, w)
				}
			}
			if n := strings.Count(err.Error(), "dram: config:"); n != len(tt.want) {
				t.Errorf("%d problems reported, want %d: %v", n, len(tt.want), err)
			}
		})
	}
}

func TestArenaFiles(t *testing.T) {
	cfg, _ := testConfig(t, 10<<20) // 4 + 4 + 2 MiB
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(cfg.Dir, "arena-0007.mem")
	other := filepath.Join(cfg.Dir, "keep.txt")
	for _, p := range []string{stale, other} {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale arena not removed: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("unrelated file removed: %v", err)
	}
	want := []int64{4 << 20, 4 << 20, 2 << 20}
	arenas := tr.Arenas()
	if len(arenas) != len(want) {
		t.Fatalf("%d arenas, want %d", len(arenas), len(want))
	}
	for i, a := range arenas {
		fi, err := os.Stat(a.Path)
		if err != nil {
			t.Fatal(err)
		}
		if a.Size != want[i] || fi.Size() != want[i] || filepath.Base(a.Path) != fmt.Sprintf("arena-%04d.mem", i) {
			t.Errorf("arena %d: %+v, file size %d", i, a, fi.Size())
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("arena mode %v", fi.Mode().Perm())
		}
		var st unix.Stat_t
		if err := unix.Stat(a.Path, &st); err != nil {
			t.Fatal(err)
		}
		if st.Blocks*512 < want[i] {
			t.Errorf("arena %d: %d bytes reserved, want %d (fallocate)", i, st.Blocks*512, want[i])
		}
	}
	// A value lands where its lease says.
	if _, err := tr.Put(ctx, "ns", []byte("k"), []byte("hello"), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	l, err := tr.Acquire(ctx, "ns", []byte("k"), 0)
	if err != nil {
		t.Fatal(err)
	}
	ai, off, n := l.Location()
	f, err := os.ReadFile(arenas[ai].Path)
	if err != nil {
		t.Fatal(err)
	}
	if string(f[off:off+n]) != "hello" || string(l.Bytes()) != "hello" {
		t.Errorf("arena file holds %q at %d", f[off:off+n], off)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for _, a := range arenas {
		if _, err := os.Stat(a.Path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("arena file left after Close: %v", err)
		}
	}
	if fi, err := os.Stat(cfg.Dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("dir mode: %v %v", fi.Mode(), err)
	}
}

func TestNewTooLittleSpace(t *testing.T) {
	cfg, _ := testConfig(t, 0)
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(cfg.Dir, &st); err != nil {
		t.Fatal(err)
	}
	cfg.Capacity = int64(st.Bavail)*int64(st.Bsize) + 1<<30
	cfg.ArenaSize = 1 << 30
	if cfg.Capacity/pageSize >= int64(noPage) {
		t.Skip("file system too large for this test")
	}
	_, err := New(cfg, nil)
	if !errors.Is(err, ErrArenaSpace) {
		t.Fatalf("New = %v, want ErrArenaSpace", err)
	}
	ents, _ := os.ReadDir(cfg.Dir)
	if len(ents) != 0 {
		t.Errorf("files left behind: %v", ents)
	}
}

func TestPutGet(t *testing.T) {
	cfg, _ := testConfig(t, 16<<20)
	tr := newTier(t, cfg)
	tests := []struct {
		name string
		size int
		opts cache.PutOptions
	}{
		{"empty", 0, cache.PutOptions{}},
		{"1B", 1, cache.PutOptions{}},
		{"4KiB", 4 << 10, cache.PutOptions{Depth: 3}},
		{"odd", 65537, cache.PutOptions{LowPriority: true}},
		{"1MiB", 1 << 20, cache.PutOptions{Depth: 9}},
		{"4MiB", 4 << 20, cache.PutOptions{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := []byte("key-" + tt.name)
			val := pattern(tt.name, tt.size)
			existed, err := tr.Put(ctx, "ns", key, val, tt.opts)
			if err != nil || existed {
				t.Fatalf("Put = %v, %v", existed, err)
			}
			// A second put is a no-op, even with other bytes.
			existed, err = tr.Put(ctx, "ns", key, []byte("other"), tt.opts)
			if err != nil || !existed {
				t.Fatalf("second Put = %v, %v", existed, err)
			}
			got, info, err := tr.Get(ctx, "ns", key, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, val) || cap(got) != tt.size {
				t.Fatalf("Get returned %d bytes (cap %d), want %d", len(got), cap(got), tt.size)
			}
			want := cache.Info{Size: int64(tt.size), Checksum: cache.Checksum(val), Depth: tt.opts.Depth, Tier: "dram"}
			if info != want {
				t.Fatalf("Info = %+v, want %+v", info, want)
			}
			if st, ok := tr.Stat(ctx, "ns", key); !ok || st != want {
				t.Fatalf("Stat = %+v, %v", st, ok)
			}
			// dst with room is reused.
			buf := make([]byte, 1, tt.size+10)
			got, _, err = tr.Get(ctx, "ns", key, buf)
			if err != nil || !bytes.Equal(got, val) || (tt.size > 0 && &got[0] != &buf[:1][0]) {
				t.Fatalf("Get into dst: reused=%v err=%v", tt.size > 0 && &got[0] == &buf[:1][0], err)
			}
			// Another namespace does not see it.
			if _, _, err := tr.Get(ctx, "other", key, nil); !errors.Is(err, cache.ErrNotFound) {
				t.Fatalf("Get in other namespace: %v", err)
			}
		})
	}
}

func TestInvalidArguments(t *testing.T) {
	cfg, _ := testConfig(t, 8<<20)
	cfg.MaxKeySize = 16
	cfg.MaxValueSize = 1 << 20
	tr := newTier(t, cfg)
	long := bytes.Repeat([]byte("k"), 17)
	tests := []struct {
		name  string
		key   []byte
		value []byte
		want  error
	}{
		{"empty key", nil, []byte("v"), cache.ErrInvalidKey},
		{"long key", long, []byte("v"), cache.ErrInvalidKey},
		{"value too large", []byte("k"), make([]byte, 1<<20+1), cache.ErrTooLarge},
		{"max key ok", long[:16], []byte("v"), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := tr.Put(ctx, "ns", tt.key, tt.value, cache.PutOptions{}); !errors.Is(err, tt.want) {
				t.Fatalf("Put = %v, want %v", err, tt.want)
			}
			if tt.want == cache.ErrInvalidKey {
				if _, _, err := tr.Get(ctx, "ns", tt.key, nil); !errors.Is(err, tt.want) {
					t.Errorf("Get = %v", err)
				}
				if _, err := tr.Delete(ctx, "ns", tt.key); !errors.Is(err, tt.want) {
					t.Errorf("Delete = %v", err)
				}
				if _, err := tr.Acquire(ctx, "ns", tt.key, 0); !errors.Is(err, tt.want) {
					t.Errorf("Acquire = %v", err)
				}
			}
		})
	}
	if st := tr.Stats().Tiers[0]; st.Blocks != 1 || st.UsedBytes != 512 {
		t.Errorf("stats after rejected puts: %+v", st)
	}
}

type evicted struct {
	ns, key string
	value   []byte
	info    cache.Info
}

// recordEvictions sets cfg.OnEvict to record copies of what it gets.
func recordEvictions(cfg *Config) *[]evicted {
	var mu sync.Mutex
	var out []evicted
	cfg.OnEvict = func(ns string, key, value []byte, info cache.Info) {
		mu.Lock()
		defer mu.Unlock()
		out = append(out, evicted{ns, string(key), bytes.Clone(value), info})
	}
	return &out
}

func putN(t *testing.T, tr *Tier, ns string, n, size int, opts cache.PutOptions) {
	t.Helper()
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("k%d", i)
		if _, err := tr.Put(ctx, ns, []byte(k), pattern(k, size), opts); err != nil {
			t.Fatalf("Put %s: %v", k, err)
		}
	}
}

func TestEvictionLRU(t *testing.T) {
	cfg, _ := testConfig(t, 1<<20) // 16 blocks of 64 KiB
	got := recordEvictions(&cfg)
	tr := newTier(t, cfg)
	putN(t, tr, "ns", 16, 64<<10, cache.PutOptions{})
	if st := tr.Stats().Tiers[0]; st.UsedBytes != 1<<20 || st.Evictions != 0 {
		t.Fatalf("full tier: %+v", st)
	}
	if _, _, err := tr.Get(ctx, "ns", []byte("k0"), nil); err != nil { // k0 becomes MRU
		t.Fatal(err)
	}
	if _, err := tr.Put(ctx, "ns", []byte("new"), pattern("new", 100<<10), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	// 100 KiB has a 128 KiB footprint: two 64 KiB blocks go, k1 and k2.
	if len(*got) != 2 || (*got)[0].key != "k1" || (*got)[1].key != "k2" {
		t.Fatalf("evicted %v", keysOf(*got))
	}
	for _, e := range *got {
		want := pattern(e.key, 64<<10)
		if e.ns != "ns" || !bytes.Equal(e.value, want) || e.info.Checksum != cache.Checksum(want) || e.info.Size != 64<<10 {
			t.Fatalf("OnEvict got wrong block for %s", e.key)
		}
	}
	for _, k := range []string{"k0", "k3", "k15", "new"} {
		if _, ok := tr.Stat(ctx, "ns", []byte(k)); !ok {
			t.Errorf("%s evicted", k)
		}
	}
	st := tr.Stats()
	if ts := st.Tiers[0]; ts.Evictions != 2 || ts.Blocks != 15 || ts.UsedBytes > ts.CapacityBytes {
		t.Errorf("tier stats %+v", ts)
	}
	if ns := st.Namespaces[0]; ns.Evictions != 2 || ns.Blocks != 15 || ns.Puts != 17 || ns.Hits != 1 {
		t.Errorf("namespace stats %+v", ns)
	}
}

func TestEvictionPrefersLowPriorityAndDeep(t *testing.T) {
	cfg, _ := testConfig(t, 1<<20)
	got := recordEvictions(&cfg)
	tr := newTier(t, cfg)
	for d := 0; d < 8; d++ { // a chain admitted in depth order
		k := fmt.Sprintf("c%d", d)
		if _, err := tr.Put(ctx, "ns", []byte(k), pattern(k, 64<<10), cache.PutOptions{Depth: int32(d)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 8; i++ { // younger copies owned elsewhere
		k := fmt.Sprintf("low%d", i)
		if _, err := tr.Put(ctx, "ns", []byte(k), pattern(k, 64<<10), cache.PutOptions{LowPriority: true}); err != nil {
			t.Fatal(err)
		}
	}
	putN(t, tr, "x", 10, 64<<10, cache.PutOptions{})
	want := []string{"low0", "low1", "low2", "low3", "low4", "low5", "low6", "low7", "c7", "c6"}
	if ks := keysOf(*got); strings.Join(ks, ",") != strings.Join(want, ",") {
		t.Fatalf("eviction order %v, want %v", ks, want)
	}
}

func keysOf(es []evicted) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.key)
	}
	return out
}

func TestNoSpace(t *testing.T) {
	cfg, fc := testConfig(t, 1<<20)
	got := recordEvictions(&cfg)
	tr := newTier(t, cfg)

	if _, err := tr.Put(ctx, "ns", []byte("huge"), make([]byte, 1<<20+1), cache.PutOptions{}); !errors.Is(err, cache.ErrNoSpace) {
		t.Fatalf("value > capacity: %v", err)
	}
	putN(t, tr, "ns", 16, 64<<10, cache.PutOptions{})
	var leases []cache.Lease
	for i := 0; i < 16; i++ {
		l, err := tr.Acquire(ctx, "ns", []byte(fmt.Sprintf("k%d", i)), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	// Everything pinned: no room, nothing changes.
	if _, err := tr.Put(ctx, "ns", []byte("more"), make([]byte, 4096), cache.PutOptions{}); !errors.Is(err, cache.ErrNoSpace) {
		t.Fatalf("all pinned: %v", err)
	}
	if st := tr.Stats().Tiers[0]; st.Blocks != 16 || st.Evictions != 0 || len(*got) != 0 {
		t.Fatalf("a failed put changed the tier: %+v", st)
	}
	// Half unpinned, but the value needs more than that: still nothing changes.
	for _, l := range leases[:8] {
		if err := l.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tr.Put(ctx, "ns", []byte("more"), make([]byte, 600<<10), cache.PutOptions{}); !errors.Is(err, cache.ErrNoSpace) {
		t.Fatalf("half pinned, value larger than the rest: %v", err)
	}
	if st := tr.Stats().Tiers[0]; st.Blocks != 16 || st.Evictions != 0 {
		t.Fatalf("a failed put evicted: %+v", st)
	}
	// Once the leases expire the pinned blocks are evictable.
	fc.Advance(2 * time.Second)
	if _, err := tr.Put(ctx, "ns", []byte("more"), pattern("more", 1<<20), cache.PutOptions{}); err != nil {
		t.Fatalf("after lease expiry: %v", err)
	}
	for _, l := range leases[8:] {
		if err := l.Release(); !errors.Is(err, cache.ErrLeaseExpired) {
			t.Fatalf("Release of a reclaimed lease = %v", err)
		}
	}
	if v, _, err := tr.Get(ctx, "ns", []byte("more"), nil); err != nil || !bytes.Equal(v, pattern("more", 1<<20)) {
		t.Fatalf("Get after reclaim: %v", err)
	}
}

func TestLeases(t *testing.T) {
	cfg, fc := testConfig(t, 1<<20)
	got := recordEvictions(&cfg)
	tr := newTier(t, cfg)
	key := []byte("k")
	val := pattern("k", 64<<10)
	if _, err := tr.Put(ctx, "ns", key, val, cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("pinned block survives eviction", func(t *testing.T) {
		l, err := tr.Acquire(ctx, "ns", key, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if l.Deadline() != fc.Now().Add(time.Second) {
			t.Errorf("deadline %v", l.Deadline())
		}
		putN(t, tr, "fill", 40, 64<<10, cache.PutOptions{})
		if _, ok := tr.Stat(ctx, "ns", key); !ok {
			t.Fatal("pinned block evicted")
		}
		if !bytes.Equal(l.Bytes(), val) || l.Info().Checksum != cache.Checksum(val) {
			t.Fatal("lease bytes changed")
		}
		if err := l.Release(); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(); err != nil {
			t.Fatalf("second Release: %v", err)
		}
	})

	t.Run("delete of a pinned block frees at release", func(t *testing.T) {
		tr.Clear(ctx, "fill")
		if _, err := tr.Put(ctx, "ns", []byte("d"), val, cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		l, err := tr.Acquire(ctx, "ns", []byte("d"), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		used := tr.Stats().Tiers[0].UsedBytes
		if ok, err := tr.Delete(ctx, "ns", []byte("d")); !ok || err != nil {
			t.Fatalf("Delete = %v, %v", ok, err)
		}
		if _, ok := tr.Stat(ctx, "ns", []byte("d")); ok {
			t.Fatal("deleted block still indexed")
		}
		if _, _, err := tr.Get(ctx, "ns", []byte("d"), nil); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("Get deleted: %v", err)
		}
		if u := tr.Stats().Tiers[0].UsedBytes; u != used {
			t.Fatalf("memory of a pinned block freed at Delete: %d → %d", used, u)
		}
		if !bytes.Equal(l.Bytes(), val) {
			t.Fatal("bytes of a deleted pinned block changed")
		}
		if err := l.Release(); err != nil {
			t.Fatal(err)
		}
		if u := tr.Stats().Tiers[0].UsedBytes; u != used-64<<10 {
			t.Fatalf("Release did not free: %d → %d", used, u)
		}
	})

	t.Run("delete of a pinned block frees at expiry", func(t *testing.T) {
		if _, err := tr.Put(ctx, "ns", []byte("e"), val, cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		l, err := tr.Acquire(ctx, "ns", []byte("e"), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := tr.Clear(ctx, "ns"); n != 2 || err != nil {
			t.Fatalf("Clear = %d, %v", n, err)
		}
		fc.Advance(time.Second + 1)
		// Filling the tier reaps the expired zombie: all 16 blocks fit.
		putN(t, tr, "fill", 16, 64<<10, cache.PutOptions{})
		if st := tr.Stats().Tiers[0]; st.Blocks != 16 || st.UsedBytes != 1<<20 {
			t.Fatalf("zombie not reaped: %+v", st)
		}
		if err := l.Release(); !errors.Is(err, cache.ErrLeaseExpired) {
			t.Fatalf("Release after reclaim = %v", err)
		}
	})

	t.Run("lease capped at MaxLease", func(t *testing.T) {
		l, err := tr.Acquire(ctx, "fill", []byte("k0"), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release()
		if l.Deadline() != fc.Now().Add(cfg.MaxLease) {
			t.Fatalf("deadline %v, want now+%v", l.Deadline().Sub(fc.Now()), cfg.MaxLease)
		}
	})

	for _, e := range *got {
		if e.ns == "ns" && (e.key == "d" || e.key == "e") {
			t.Errorf("OnEvict called for deleted block %s", e.key)
		}
	}
}

func TestClear(t *testing.T) {
	cfg, _ := testConfig(t, 4<<20)
	got := recordEvictions(&cfg)
	tr := newTier(t, cfg)
	putN(t, tr, "a", 50, 4096, cache.PutOptions{})
	putN(t, tr, "b", 30, 4096, cache.PutOptions{})
	n, err := tr.Clear(ctx, "a")
	if n != 50 || err != nil {
		t.Fatalf("Clear = %d, %v", n, err)
	}
	if n, _ := tr.Clear(ctx, "a"); n != 0 {
		t.Fatalf("second Clear = %d", n)
	}
	if n, _ := tr.Clear(ctx, "never"); n != 0 {
		t.Fatalf("Clear of unknown namespace = %d", n)
	}
	for i := 0; i < 30; i++ {
		k := fmt.Sprintf("k%d", i)
		if v, _, err := tr.Get(ctx, "b", []byte(k), nil); err != nil || !bytes.Equal(v, pattern(k, 4096)) {
			t.Fatalf("b/%s: %v", k, err)
		}
		if _, ok := tr.Stat(ctx, "a", []byte(k)); ok {
			t.Fatalf("a/%s survived Clear", k)
		}
	}
	st := tr.Stats()
	if st.Tiers[0].Blocks != 30 || st.Tiers[0].UsedBytes != 30*4096 || len(*got) != 0 {
		t.Fatalf("after Clear: %+v, %d OnEvict calls", st.Tiers[0], len(*got))
	}
	if st.Namespaces[0].Namespace != "a" || st.Namespaces[0].Blocks != 0 || st.Namespaces[0].Bytes != 0 ||
		st.Namespaces[1].Blocks != 30 || st.Namespaces[1].Bytes != 30*4096 || st.Namespaces[1].Hits != 30 {
		t.Fatalf("namespace stats %+v", st.Namespaces)
	}
}

func TestChecksumMismatch(t *testing.T) {
	cfg, _ := testConfig(t, 4<<20)
	cfg.VerifyReads = true // the default skips the check (TestVerifyReads)
	tr := newTier(t, cfg)
	val := pattern("k", 10000)
	if _, err := tr.Put(ctx, "ns", []byte("k"), val, cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	l, err := tr.Acquire(ctx, "ns", []byte("k"), 0)
	if err != nil {
		t.Fatal(err)
	}
	ai, off, _ := l.Location()
	l.Release()
	tr.arenas[ai].mem[off+777] ^= 0x40 // a flipped bit in memory
	v, _, err := tr.Get(ctx, "ns", []byte("k"), make([]byte, 0, 20000))
	if !errors.Is(err, cache.ErrChecksum) || v != nil {
		t.Fatalf("Get of a corrupt block = %d bytes, %v", len(v), err)
	}
	if st := tr.Stats().Tiers[0]; st.ChecksumFailures != 1 {
		t.Fatalf("ChecksumFailures = %d", st.ChecksumFailures)
	}
}

func TestStats(t *testing.T) {
	cfg, _ := testConfig(t, 4<<20)
	tr := newTier(t, cfg)
	putN(t, tr, "m1", 3, 1000, cache.PutOptions{})
	tr.Get(ctx, "m1", []byte("k0"), nil)
	tr.Get(ctx, "m1", []byte("k1"), nil)
	tr.Get(ctx, "m1", []byte("nope"), nil)
	tr.Get(ctx, "m2", []byte("nope"), nil)
	tr.Delete(ctx, "m1", []byte("k2"))
	st := tr.Stats()
	want := cache.TierStats{Name: "dram", CapacityBytes: 4 << 20, UsedBytes: 2 * 1024, Blocks: 2,
		Hits: 2, Misses: 2, BytesIn: 3000, BytesOut: 2000}
	if st.Tiers[0] != want {
		t.Errorf("tier stats\n got %+v\nwant %+v", st.Tiers[0], want)
	}
	wantNS := []cache.NamespaceStats{
		{Namespace: "m1", Blocks: 2, Bytes: 2000, Hits: 2, Misses: 1, Puts: 3},
		{Namespace: "m2", Misses: 1},
	}
	if fmt.Sprint(st.Namespaces) != fmt.Sprint(wantNS) {
		t.Errorf("namespace stats\n got %+v\nwant %+v", st.Namespaces, wantNS)
	}
}

func TestClosed(t *testing.T) {
	cfg, _ := testConfig(t, 4<<20)
	tr := newTier(t, cfg)
	putN(t, tr, "ns", 1, 100, cache.PutOptions{})
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Put(ctx, "ns", []byte("x"), []byte("v"), cache.PutOptions{}); !errors.Is(err, cache.ErrClosed) {
		t.Errorf("Put after Close: %v", err)
	}
	if _, _, err := tr.Get(ctx, "ns", []byte("k0"), nil); !errors.Is(err, cache.ErrClosed) {
		t.Errorf("Get after Close: %v", err)
	}
	if _, err := tr.Delete(ctx, "ns", []byte("k0")); !errors.Is(err, cache.ErrClosed) {
		t.Errorf("Delete after Close: %v", err)
	}
	if _, err := tr.Clear(ctx, "ns"); !errors.Is(err, cache.ErrClosed) {
		t.Errorf("Clear after Close: %v", err)
	}
	if _, ok := tr.Stat(ctx, "ns", []byte("k0")); ok {
		t.Error("Stat after Close found a block")
	}
	_ = tr.Stats()
}

// TestConcurrent runs Put/Get/Delete/Clear from several goroutines over a
// tier small enough to evict constantly, and checks every byte of every Get.
func TestConcurrent(t *testing.T) {
	cfg, fc := testConfig(t, 6<<20)
	cfg.ArenaSize = 1 << 20
	cfg.MaxValueSize = 1 << 20
	var values map[string][]byte
	var evictMu sync.Mutex
	evictions := 0
	cfg.OnEvict = func(ns string, key, value []byte, info cache.Info) {
		if !bytes.Equal(value, values[ns+"/"+string(key)]) || int64(len(value)) != info.Size {
			t.Errorf("OnEvict: wrong bytes for %s/%s", ns, key)
		}
		evictMu.Lock()
		evictions++
		evictMu.Unlock()
	}
	tr := newTier(t, cfg)
	// Every key has one size and one value, made up front.
	sizes := []int{100, 4096, 5000, 40 << 10, 64 << 10, 100 << 10, 300 << 10}
	const nsCount, keyCount = 2, 150
	values = map[string][]byte{}
	for n := 0; n < nsCount; n++ {
		for k := 0; k < keyCount; k++ {
			name := fmt.Sprintf("ns%d/k%d", n, k)
			values[name] = pattern(name, sizes[(k*3+n)%len(sizes)])
		}
	}
	const workers = 4
	ops := 2000
	if testing.Short() {
		ops = 500
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			var dst []byte
			seed := uint64(w)*7919 + 1
			for i := 0; i < ops; i++ {
				seed = seed*6364136223846793005 + 1442695040888963407
				r := seed >> 33
				ns := fmt.Sprintf("ns%d", r%nsCount)
				k := fmt.Sprintf("k%d", (r>>2)%keyCount)
				want := values[ns+"/"+k]
				key := []byte(k)
				switch op := (r >> 20) % 20; {
				case op < 8:
					if _, err := tr.Put(ctx, ns, key, want, cache.PutOptions{Depth: int32(r % 4)}); err != nil && !errors.Is(err, cache.ErrNoSpace) {
						t.Errorf("Put: %v", err)
					}
				case op < 17:
					v, info, err := tr.Get(ctx, ns, key, dst)
					if err == nil {
						if !bytes.Equal(v, want) || info.Size != int64(len(v)) {
							t.Errorf("Get %s/%s: wrong bytes", ns, k)
							return
						}
						dst = v
					} else if !errors.Is(err, cache.ErrNotFound) {
						t.Errorf("Get: %v", err)
					}
				case op < 18:
					l, err := tr.Acquire(ctx, ns, key, 0)
					if err == nil {
						if !bytes.Equal(l.Bytes(), want) {
							t.Errorf("Acquire %s/%s: wrong bytes", ns, k)
						}
						if err := l.Release(); err != nil {
							t.Errorf("Release: %v", err)
						}
					}
				case op < 19:
					if _, err := tr.Delete(ctx, ns, key); err != nil {
						t.Errorf("Delete: %v", err)
					}
				default:
					if r%50 == 0 {
						if _, err := tr.Clear(ctx, ns); err != nil {
							t.Errorf("Clear: %v", err)
						}
					} else {
						tr.Stat(ctx, ns, key)
					}
				}
				if w == 0 && i%500 == 0 {
					fc.Advance(time.Millisecond)
				}
			}
		}(w)
	}
	wg.Wait()
	st := tr.Stats().Tiers[0]
	t.Logf("stats %+v, OnEvict calls %d", st, evictions)
	if st.UsedBytes > st.CapacityBytes || st.UsedBytes < 0 || st.Blocks < 0 {
		t.Fatalf("inconsistent stats %+v", st)
	}
	// Everything left is consistent: budget equals the sum of footprints.
	var sum, n int64
	for i := range tr.shards {
		for _, m := range tr.shards[i].m {
			for _, b := range m {
				sum += b.foot
				n++
				if b.pins.Load() != 0 {
					t.Errorf("block left pinned")
				}
			}
		}
	}
	if sum != st.UsedBytes || n != st.Blocks || len(tr.zombies) != 0 {
		t.Fatalf("index holds %d blocks / %d bytes, stats say %d / %d, %d zombies", n, sum, st.Blocks, st.UsedBytes, len(tr.zombies))
	}
	if tr.policy.Len() != int(n) || len(tr.byID) != int(n) {
		t.Fatalf("policy tracks %d, byID %d, index %d", tr.policy.Len(), len(tr.byID), n)
	}
	// Clearing everything gives the whole arena back.
	for _, ns := range []string{"ns0", "ns1"} {
		tr.Clear(ctx, ns)
	}
	if a := tr.alloc.stats(); a.FreePages != a.TotalPages || tr.used.Load() != 0 {
		t.Fatalf("after clearing all: alloc %+v, used %d", a, tr.used.Load())
	}
}

// TestCloseWhileBusy closes the tier under concurrent Put and Get: requests
// either complete with correct bytes or fail with ErrClosed, nothing
// crashes on the unmapped arenas.
func TestCloseWhileBusy(t *testing.T) {
	cfg, _ := testConfig(t, 4<<20)
	tr := newTier(t, cfg)
	val := pattern("v", 64<<10)
	var wg sync.WaitGroup
	started := make(chan struct{}, 4)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			dst := make([]byte, 0, len(val))
			for i := 0; ; i++ {
				if i == 10 {
					started <- struct{}{}
				}
				key := []byte(fmt.Sprintf("w%d-%d", w, i%100))
				_, err := tr.Put(ctx, "ns", key, val, cache.PutOptions{})
				if errors.Is(err, cache.ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("Put: %v", err)
					return
				}
				v, _, err := tr.Get(ctx, "ns", key, dst)
				switch {
				case errors.Is(err, cache.ErrClosed):
					return
				case err == nil && !bytes.Equal(v, val):
					t.Error("Get: wrong bytes")
					return
				case err != nil && !errors.Is(err, cache.ErrNotFound):
					t.Errorf("Get: %v", err)
					return
				}
			}
		}(w)
	}
	for i := 0; i < 4; i++ {
		<-started
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// TestPresent: the present prefix of a key list, as Stat says key by key,
// without counting reads; with a present slice, every key's presence.
func TestPresent(t *testing.T) {
	cfg, _ := testConfig(t, 4<<20)
	tr := newTier(t, cfg)
	putN(t, tr, "m1", 4, 100, cache.PutOptions{}) // k0..k3
	keys := func(names ...string) [][]byte {
		out := make([][]byte, len(names))
		for i, n := range names {
			out[i] = []byte(n)
		}
		return out
	}
	cases := []struct {
		name string
		ns   string
		keys [][]byte
		want int
		each []bool // every key's answer
	}{
		{"none asked", "m1", nil, 0, []bool{}},
		{"all present", "m1", keys("k0", "k1", "k2", "k3"), 4, []bool{true, true, true, true}},
		{"first missing", "m1", keys("x", "k0"), 0, []bool{false, true}},
		{"gap", "m1", keys("k0", "k1", "x", "k3"), 2, []bool{true, true, false, true}},
		{"unknown namespace", "m2", keys("k0"), 0, []bool{false}},
		{"empty key", "m1", keys("k0", "", "k1"), 1, []bool{true, false, true}},
		{"key too long", "m1", [][]byte{[]byte("k0"), make([]byte, 1000)}, 1, []bool{true, false}},
	}
	before := tr.Stats().Tiers[0]
	for _, c := range cases {
		if got := tr.Present(ctx, c.ns, c.keys, nil); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
		each := make([]bool, len(c.keys))
		for i := range each {
			each[i] = true // overwritten: every key is answered
		}
		if got := tr.Present(ctx, c.ns, c.keys, each); got != c.want || !slices.Equal(each, c.each) {
			t.Errorf("%s, every key: %d %v, want %d %v", c.name, got, each, c.want, c.each)
		}
	}
	if after := tr.Stats().Tiers[0]; after.Hits != before.Hits || after.Misses != before.Misses {
		t.Errorf("Present counted reads: %+v -> %+v", before, after)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if got := tr.Present(cctx, "m1", keys("k0"), nil); got != 0 {
		t.Errorf("cancelled context: %d", got)
	}
}

// TestChecksumMismatchRemoves: with VerifyReads, a block whose bytes went
// bad is removed by the read that finds it (Get or Pin): Stat and Present stop
// reporting it, the read counts as a miss (Get) or not at all (Pin, whose
// caller goes on to Get), and the next Put stores a good copy.
func TestChecksumMismatchRemoves(t *testing.T) {
	read := map[string]func(tr *Tier, key []byte) error{
		"Get": func(tr *Tier, key []byte) error { _, _, err := tr.Get(ctx, "ns", key, nil); return err },
		"Pin": func(tr *Tier, key []byte) error {
			l, err := tr.Pin(ctx, "ns", key)
			if err == nil {
				l.Release()
			}
			return err
		},
	}
	for name, readFn := range read {
		t.Run(name, func(t *testing.T) {
			cfg, _ := testConfig(t, 4<<20)
			cfg.VerifyReads = true // the default skips the check (TestVerifyReads)
			tr := newTier(t, cfg)
			key := []byte("k")
			val := pattern("k", 10000)
			if _, err := tr.Put(ctx, "ns", key, val, cache.PutOptions{}); err != nil {
				t.Fatal(err)
			}
			l, err := tr.Acquire(ctx, "ns", key, 0)
			if err != nil {
				t.Fatal(err)
			}
			ai, off, _ := l.Location()
			l.Release()
			before := tr.Stats()
			tr.arenas[ai].mem[off+777] ^= 0x40
			if err := readFn(tr, key); !errors.Is(err, cache.ErrChecksum) {
				t.Fatalf("read of a corrupt block: %v", err)
			}
			if _, ok := tr.Stat(ctx, "ns", key); ok {
				t.Fatal("corrupt block still reported by Stat")
			}
			if n := tr.Present(ctx, "ns", [][]byte{key}, nil); n != 0 {
				t.Fatal("corrupt block still counted by Present")
			}
			st := tr.Stats()
			ts, ns := st.Tiers[0], st.Namespaces[0]
			wantMiss := int64(0)
			if name == "Get" {
				wantMiss = 1
			}
			if ts.ChecksumFailures != 1 || ts.Hits != before.Tiers[0].Hits || ts.Misses != before.Tiers[0].Misses+wantMiss ||
				ts.Blocks != 0 || ts.UsedBytes != 0 || ts.BytesOut != before.Tiers[0].BytesOut ||
				ns.Blocks != 0 || ns.Bytes != 0 || ns.Hits != before.Namespaces[0].Hits || ns.Misses != before.Namespaces[0].Misses+wantMiss {
				t.Fatalf("counters after the failed read: %+v %+v (before %+v)", ts, ns, before)
			}
			if existed, err := tr.Put(ctx, "ns", key, val, cache.PutOptions{}); err != nil || existed {
				t.Fatalf("re-Put after the bad read: existed %v, %v", existed, err)
			}
			got, _, err := tr.Get(ctx, "ns", key, nil)
			if err != nil || !bytes.Equal(got, val) {
				t.Fatalf("Get after the re-Put: %v", err)
			}
		})
	}
}

// TestDeleteWaitsForOnEvict: an eviction unlinks its block before OnEvict
// runs, so a Delete or Clear can find nothing while OnEvict still acts on
// the block (a demotion). They return only once that OnEvict has, and do
// not wait for evictions of other blocks.
func TestDeleteWaitsForOnEvict(t *testing.T) {
	for _, op := range []string{"Delete", "Clear", "Delete of another key"} {
		t.Run(op, func(t *testing.T) {
			cfg, _ := testConfig(t, 4<<20)
			entered, gate := make(chan struct{}), make(chan struct{})
			var once sync.Once
			open := func() { once.Do(func() { close(gate) }) }
			t.Cleanup(open)
			cfg.OnEvict = func(ns string, key, _ []byte, _ cache.Info) {
				if ns == "ns" && string(key) == "victim" {
					close(entered)
					<-gate
				}
			}
			tr := newTier(t, cfg)
			if _, err := tr.Put(ctx, "ns", []byte("victim"), pattern("victim", 1<<20), cache.PutOptions{}); err != nil {
				t.Fatal(err)
			}
			puts := make(chan error, 1)
			go func() { // evicts the victim, and stops in its OnEvict
				for i := range 4 {
					k := fmt.Sprintf("k%d", i)
					if _, err := tr.Put(ctx, "other", []byte(k), pattern(k, 1<<20), cache.PutOptions{}); err != nil {
						puts <- err
						return
					}
				}
				puts <- nil
			}()
			defer func() { // before the tier closes
				open()
				if err := <-puts; err != nil {
					t.Error(err)
				}
			}()
			<-entered
			done := make(chan bool, 1)
			go func() {
				var found bool
				switch op {
				case "Delete":
					found, _ = tr.Delete(ctx, "ns", []byte("victim"))
				case "Clear":
					n, _ := tr.Clear(ctx, "ns")
					found = n > 0
				default:
					found, _ = tr.Delete(ctx, "ns", []byte("bystander"))
				}
				done <- found
			}()
			if op == "Delete of another key" {
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					t.Fatal("a Delete of another key waited for the eviction")
				}
				return
			}
			select {
			case <-done:
				t.Fatalf("%s returned while OnEvict of its block ran", op)
			case <-time.After(50 * time.Millisecond):
			}
			open()
			if found := <-done; found {
				t.Fatalf("%s found the evicted block", op)
			}
		})
	}
}
