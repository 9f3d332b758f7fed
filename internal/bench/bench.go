// Package bench is the load generator behind `tidepool bench`: N workers call
// one operation (put, get, mixed, lookup, batch-get) against an Engine for a
// duration or an operation count, record every call's latency in an HDR-style
// histogram, and produce a Report (ops/s, bytes/s, latency percentiles,
// errors). The Engine is an adapter over the engine API client, so this
// package stays free of the wire.
package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidepool-kv/tidepool/internal/hdr"
)

// ErrInvalidConfig is wrapped by every Config.Validate error.
var ErrInvalidConfig = errors.New("bench: invalid config")

// Op is an operation a benchmark repeats.
type Op string

// The operations.
const (
	// OpPut stores a new block per call (fresh keys: a put of an existing
	// key is a no-op and would measure nothing).
	OpPut Op = "put"
	// OpGet reads one random key of the prefilled key set per call.
	OpGet Op = "get"
	// OpMixed does a get with probability ReadRatio, else a put.
	OpMixed Op = "mixed"
	// OpLookup asks for the longest present prefix of Batch consecutive
	// prefilled keys per call.
	OpLookup Op = "lookup"
	// OpBatchGet reads Batch random prefilled keys per call.
	OpBatchGet Op = "batch-get"
)

// Ops lists the operations in the order the usage shows them.
var Ops = []Op{OpPut, OpGet, OpMixed, OpLookup, OpBatchGet}

// Engine is what a benchmark calls. Implementations bind the namespace,
// scope and transfer mode (inline or zero-copy).
type Engine interface {
	// Put stores value under key.
	Put(ctx context.Context, key, value []byte) error
	// Get reads key and returns the value's length, or found=false.
	Get(ctx context.Context, key []byte) (n int, found bool, err error)
	// Lookup returns how many leading keys are present.
	Lookup(ctx context.Context, keys [][]byte) (int, error)
	// BatchGet reads keys and returns the bytes read and the misses.
	BatchGet(ctx context.Context, keys [][]byte) (bytes int64, misses int, err error)
}

// Config describes one benchmark run.
type Config struct {
	// Op is the operation. Default OpGet.
	Op Op
	// Size is the value size in bytes. Default 4096.
	Size int
	// Keys is the size of the key set reads draw from (prefilled by
	// Prefill). Default 1000.
	Keys int
	// Concurrency is the number of workers calling at once. Default 16.
	Concurrency int
	// Duration bounds the run when Ops is 0. Default 10s.
	Duration time.Duration
	// Ops, when positive, is the total number of calls; Duration then only
	// bounds the run as a safety net.
	Ops int64
	// ReadRatio is OpMixed's fraction of gets (0..1). Default 0.9.
	ReadRatio float64
	// Batch is the number of keys per OpLookup/OpBatchGet call. Default 16.
	Batch int
	// Seed makes key choices reproducible. Default 1.
	Seed int64
	// Progress, if set, is called about every ProgressEvery with the counts
	// so far (from one goroutine).
	Progress func(Progress)
	// ProgressEvery is the progress period. Default 1s.
	ProgressEvery time.Duration
}

// DefaultConfig returns 4 KiB gets over 1000 keys, 16 workers, 10 s.
func DefaultConfig() Config {
	return Config{Op: OpGet, Size: 4096, Keys: 1000, Concurrency: 16, Duration: 10 * time.Second, ReadRatio: 0.9, Batch: 16, Seed: 1, ProgressEvery: time.Second}
}

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(f string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+f, append([]any{ErrInvalidConfig}, a...)...))
	}
	known := false
	for _, o := range Ops {
		known = known || c.Op == o
	}
	if !known {
		bad("unknown op %q (want one of %v)", c.Op, Ops)
	}
	if c.Size < 1 {
		bad("size %d < 1", c.Size)
	}
	if c.Keys < 1 {
		bad("keys %d < 1", c.Keys)
	}
	if c.Concurrency < 1 {
		bad("concurrency %d < 1", c.Concurrency)
	}
	if c.Duration <= 0 && c.Ops <= 0 {
		bad("need a positive duration or op count")
	}
	if c.Ops < 0 {
		bad("ops %d < 0", c.Ops)
	}
	if c.ReadRatio < 0 || c.ReadRatio > 1 {
		bad("read ratio %g not in 0..1", c.ReadRatio)
	}
	if c.Batch < 1 {
		bad("batch %d < 1", c.Batch)
	}
	if (c.Op == OpLookup || c.Op == OpBatchGet) && c.Batch > c.Keys {
		bad("batch %d exceeds keys %d", c.Batch, c.Keys)
	}
	if c.ProgressEvery < 0 {
		bad("progress period %v < 0", c.ProgressEvery)
	}
	return errors.Join(errs...)
}

// Progress is a snapshot of a running benchmark.
type Progress struct {
	Elapsed time.Duration
	Ops     int64
	Errors  int64
	Bytes   int64
	// Fraction of the run done, 0..1 (by ops when Ops is set, else time).
	Fraction float64
}

// ReadKey is the key of the i-th prefilled block of a value size: keys of
// different sizes never collide, so an earlier run cannot leave a key of
// the wrong size behind.
func ReadKey(size, i int) []byte { return []byte(fmt.Sprintf("bench/s%d/k%08d", size, i)) }

// Value returns a deterministic value of size bytes.
func Value(size int) []byte {
	v := make([]byte, size)
	rand.New(rand.NewSource(int64(size))).Read(v)
	return v
}

// Prefill stores the key set reads draw from, with concurrency workers. It
// returns the first error.
func Prefill(ctx context.Context, eng Engine, size, keys, concurrency int) error {
	val := Value(size)
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, concurrency)
	for range max(concurrency, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= keys || ctx.Err() != nil {
					return
				}
				if err := eng.Put(ctx, ReadKey(size, i), val); err != nil {
					errc <- fmt.Errorf("bench: prefill key %d: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	return <-errc
}

// worker counters, read by the progress goroutine.
type counters struct {
	ops, errs, bytes, misses atomic.Int64
}

// Run runs one benchmark. For the read operations the key set must have
// been prefilled (Prefill). The latency of failed calls is recorded too.
func Run(ctx context.Context, cfg Config, eng Engine) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	if cfg.ProgressEvery == 0 {
		cfg.ProgressEvery = time.Second
	}
	// The duration ends the loop, not the calls: a call in flight when time
	// is up completes normally (its latency counts), so the end of a run
	// never shows up as a burst of cancelled calls. ctx still cancels
	// everything.
	var stopped atomic.Bool
	if cfg.Ops <= 0 || cfg.Duration > 0 {
		t := time.AfterFunc(cfg.Duration, func() { stopped.Store(true) })
		defer t.Stop()
	}
	rctx := ctx

	val := Value(cfg.Size)
	nonce := time.Now().UnixNano()
	var c counters
	var issued atomic.Int64
	hists := make([]*hdr.Histogram, cfg.Concurrency)
	firstErr := make([]error, cfg.Concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range cfg.Concurrency {
		hists[w] = hdr.New()
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := hists[w]
			r := rand.New(rand.NewSource(cfg.Seed*1_000_003 + int64(w)))
			keys := make([][]byte, cfg.Batch)
			var seq int64
			for !stopped.Load() && rctx.Err() == nil {
				if cfg.Ops > 0 && issued.Add(1) > cfg.Ops {
					return
				}
				op := cfg.Op
				if op == OpMixed {
					op = OpPut
					if r.Float64() < cfg.ReadRatio {
						op = OpGet
					}
				}
				var (
					n    int64
					miss int
					err  error
				)
				t0 := time.Now()
				switch op {
				case OpPut:
					seq++
					err = eng.Put(rctx, []byte(fmt.Sprintf("bench/w%d/%d/%d/%d", cfg.Size, nonce, w, seq)), val)
					n = int64(cfg.Size)
				case OpGet:
					var got int
					var found bool
					got, found, err = eng.Get(rctx, ReadKey(cfg.Size, r.Intn(cfg.Keys)))
					n = int64(got)
					if err == nil && !found {
						miss = 1
					}
				case OpLookup:
					first := r.Intn(cfg.Keys - cfg.Batch + 1)
					for i := range keys {
						keys[i] = ReadKey(cfg.Size, first+i)
					}
					var m int
					m, err = eng.Lookup(rctx, keys)
					miss = cfg.Batch - m
				case OpBatchGet:
					for i := range keys {
						keys[i] = ReadKey(cfg.Size, r.Intn(cfg.Keys))
					}
					n, miss, err = eng.BatchGet(rctx, keys)
				}
				lat := time.Since(t0)
				if err != nil && rctx.Err() != nil {
					return // cancelled: not a failure of the sidecar
				}
				h.Record(lat.Nanoseconds())
				c.ops.Add(1)
				c.misses.Add(int64(miss))
				if err != nil {
					c.errs.Add(1)
					if firstErr[w] == nil {
						firstErr[w] = err
					}
					continue
				}
				c.bytes.Add(n)
			}
		}()
	}

	done := make(chan struct{})
	var pwg sync.WaitGroup
	if cfg.Progress != nil {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			t := time.NewTicker(cfg.ProgressEvery)
			defer t.Stop()
			for {
				select {
				case <-done:
					return
				case <-t.C:
					cfg.Progress(snapshot(&c, cfg, time.Since(start)))
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(done)
	pwg.Wait()
	if cfg.Progress != nil {
		p := snapshot(&c, cfg, elapsed)
		p.Fraction = 1
		cfg.Progress(p)
	}

	all := hdr.New()
	for _, h := range hists {
		all.Merge(h)
	}
	rep := NewReport(cfg, all, elapsed, c.bytes.Load(), c.errs.Load(), c.misses.Load())
	for _, e := range firstErr {
		if e != nil {
			rep.FirstError = e.Error()
			break
		}
	}
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	return rep, nil
}

func snapshot(c *counters, cfg Config, el time.Duration) Progress {
	p := Progress{Elapsed: el, Ops: c.ops.Load(), Errors: c.errs.Load(), Bytes: c.bytes.Load()}
	if cfg.Ops > 0 {
		p.Fraction = float64(p.Ops) / float64(cfg.Ops)
	} else if cfg.Duration > 0 {
		p.Fraction = float64(el) / float64(cfg.Duration)
	}
	p.Fraction = min(max(p.Fraction, 0), 1)
	return p
}

// ProgressLine renders p as a one-line bar of width cells (plain text when
// width is 0).
func ProgressLine(p Progress, width int) string {
	secs := p.Elapsed.Seconds()
	rate := 0.0
	if secs > 0 {
		rate = float64(p.Ops) / secs
	}
	tail := fmt.Sprintf("%5.1fs %10d ops %10.0f ops/s %9.1f MiB/s %d errors", secs, p.Ops, rate, float64(p.Bytes)/secs/(1<<20), p.Errors)
	if width <= 0 {
		return tail
	}
	fill := int(p.Fraction * float64(width))
	return "[" + strings.Repeat("#", fill) + strings.Repeat(".", width-fill) + "] " + tail
}
