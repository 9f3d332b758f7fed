package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/internal/hdr"
)

// fakeEngine is an in-memory Engine; every failEvery-th call fails.
type fakeEngine struct {
	mu        sync.Mutex
	m         map[string]int
	calls     atomic.Int64
	puts      atomic.Int64
	gets      atomic.Int64
	failEvery int64
}

var errFake = errors.New("fake failure")

func newFake() *fakeEngine { return &fakeEngine{m: map[string]int{}} }

func (f *fakeEngine) fail() bool {
	n := f.calls.Add(1)
	return f.failEvery > 0 && n%f.failEvery == 0
}

func (f *fakeEngine) Put(_ context.Context, key, value []byte) error {
	f.puts.Add(1)
	if f.fail() {
		return errFake
	}
	f.mu.Lock()
	f.m[string(key)] = len(value)
	f.mu.Unlock()
	return nil
}

func (f *fakeEngine) Get(_ context.Context, key []byte) (int, bool, error) {
	f.gets.Add(1)
	if f.fail() {
		return 0, false, errFake
	}
	f.mu.Lock()
	n, ok := f.m[string(key)]
	f.mu.Unlock()
	return n, ok, nil
}

func (f *fakeEngine) Lookup(_ context.Context, keys [][]byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, k := range keys {
		if _, ok := f.m[string(k)]; !ok {
			return i, nil
		}
	}
	return len(keys), nil
}

func (f *fakeEngine) BatchGet(_ context.Context, keys [][]byte) (int64, int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b int64
	miss := 0
	for _, k := range keys {
		if n, ok := f.m[string(k)]; ok {
			b += int64(n)
		} else {
			miss++
		}
	}
	return b, miss, nil
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want []string
	}{
		{"default ok", func(*Config) {}, nil},
		{"bad op", func(c *Config) { c.Op = "scan" }, []string{"unknown op"}},
		{"everything wrong", func(c *Config) {
			c.Size, c.Keys, c.Concurrency, c.Duration, c.ReadRatio, c.Batch = 0, 0, 0, 0, 2, 0
		}, []string{"size 0", "keys 0", "concurrency 0", "duration or op count", "read ratio", "batch 0"}},
		{"batch over keys", func(c *Config) { c.Op, c.Keys, c.Batch = OpLookup, 4, 8 }, []string{"batch 8 exceeds keys 4"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.edit(&c)
			err := c.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestRunOps(t *testing.T) {
	tests := []struct {
		op        Op
		failEvery int64
		wantBytes func(r Report) int64
	}{
		{OpPut, 0, func(r Report) int64 { return r.Ops * 1000 }},
		{OpGet, 0, func(r Report) int64 { return r.Ops * 1000 }},
		{OpGet, 10, func(r Report) int64 { return (r.Ops - r.Errors) * 1000 }},
		{OpBatchGet, 0, func(r Report) int64 { return r.Ops * 4 * 1000 }},
		{OpLookup, 0, func(Report) int64 { return 0 }},
		{OpMixed, 0, func(r Report) int64 { return r.Ops * 1000 }},
	}
	for _, tc := range tests {
		t.Run(string(tc.op), func(t *testing.T) {
			ctx := context.Background()
			f := newFake()
			if err := Prefill(ctx, f, 1000, 50, 4); err != nil {
				t.Fatal(err)
			}
			f.calls.Store(0)
			f.puts.Store(0)
			f.failEvery = tc.failEvery
			cfg := DefaultConfig()
			cfg.Op, cfg.Size, cfg.Keys, cfg.Concurrency, cfg.Ops, cfg.Batch = tc.op, 1000, 50, 3, 3000, 4
			var progress atomic.Int64
			var last Progress
			cfg.Progress = func(p Progress) { progress.Add(1); last = p }
			r, err := Run(ctx, cfg, f)
			if err != nil {
				t.Fatal(err)
			}
			if r.Ops != 3000 {
				t.Fatalf("ops = %d, want exactly 3000", r.Ops)
			}
			if tc.failEvery > 0 && (r.Errors < 250 || r.Errors > 350 || r.FirstError == "") {
				t.Fatalf("errors = %d (first %q), want about 300", r.Errors, r.FirstError)
			}
			if tc.failEvery == 0 && (r.Errors != 0 || r.Misses != 0) {
				t.Fatalf("errors %d misses %d on a prefilled key set", r.Errors, r.Misses)
			}
			if r.Bytes != tc.wantBytes(r) {
				t.Fatalf("bytes = %d, want %d", r.Bytes, tc.wantBytes(r))
			}
			if tc.op == OpMixed {
				if p := f.puts.Load(); p < 150 || p > 450 {
					t.Fatalf("mixed at ratio 0.9 made %d puts of 3000", p)
				}
			}
			if progress.Load() < 1 || last.Fraction != 1 || last.Ops != 3000 {
				t.Fatalf("progress calls %d, last %+v", progress.Load(), last)
			}
			if r.OpsPerSec <= 0 || r.P50Us <= 0 || r.P50Us > r.P99Us || r.P99Us > r.P999Us || r.P999Us > r.MaxUs {
				t.Fatalf("implausible report %+v", r)
			}
		})
	}
}

func TestRunDurationAndCancel(t *testing.T) {
	f := newFake()
	cfg := DefaultConfig()
	cfg.Op, cfg.Concurrency, cfg.Duration = OpPut, 2, 50*time.Millisecond
	start := time.Now()
	r, err := Run(context.Background(), cfg, f)
	if err != nil || r.Ops == 0 || time.Since(start) > 5*time.Second {
		t.Fatalf("duration run: %v, %d ops in %v", err, r.Ops, time.Since(start))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cfg.Duration = time.Hour
	if _, err := Run(ctx, cfg, f); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run: %v", err)
	}
}

func TestReport(t *testing.T) {
	h := hdr.New()
	for i := 1; i <= 1000; i++ {
		h.Record(int64(i) * 1000) // 1..1000 µs
	}
	cfg := DefaultConfig()
	cfg.Op, cfg.Size, cfg.Concurrency = OpGet, 1<<20, 16
	r := NewReport(cfg, h, 2*time.Second, 1000<<20, 3, 1)
	if r.OpsPerSec != 500 || r.BytesPerSec != 500<<20 || r.Errors != 3 || r.Misses != 1 {
		t.Fatalf("rates %+v", r)
	}
	within := func(got, want float64) bool { return got >= want && got <= want*1.008 }
	if !within(r.P50Us, 500) || !within(r.P90Us, 900) || !within(r.P99Us, 990) || !within(r.P999Us, 999) || r.MaxUs != 1000 {
		t.Fatalf("percentiles %+v", r)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	json.Unmarshal(b, &m)
	for _, k := range []string{"ops_per_sec", "bytes_per_sec", "p50_us", "p90_us", "p99_us", "p999_us", "errors"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q: %s", k, b)
		}
	}
	var buf bytes.Buffer
	r.WriteText(&buf)
	for _, w := range []string{"get, 1MiB values", "concurrency 16", "500 ops/s", "p99 99", "3 errors"} {
		if !strings.Contains(buf.String(), w) {
			t.Errorf("text report lacks %q:\n%s", w, buf.String())
		}
	}
	if r := NewReport(cfg, hdr.New(), 0, 0, 0, 0); r.OpsPerSec != 0 || r.P99Us != 0 {
		t.Fatalf("empty report %+v", r)
	}
}

func TestProgressLineAndSizes(t *testing.T) {
	p := Progress{Elapsed: 2 * time.Second, Ops: 200, Bytes: 2 << 20, Fraction: 0.5}
	if l := ProgressLine(p, 10); !strings.HasPrefix(l, "[#####.....] ") || !strings.Contains(l, "100 ops/s") {
		t.Fatalf("bar %q", l)
	}
	if l := ProgressLine(p, 0); strings.Contains(l, "[") || !strings.Contains(l, "1.0 MiB/s") {
		t.Fatalf("plain %q", l)
	}
	for n, want := range map[int64]string{4096: "4KiB", 1 << 20: "1MiB", 1000: "1000B", 3 << 30: "3GiB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %s, want %s", n, got, want)
		}
	}
}
