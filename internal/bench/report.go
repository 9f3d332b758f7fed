package bench

import (
	"fmt"
	"io"
	"time"

	"github.com/tidepool-kv/tidepool/internal/hdr"
)

// Report is the outcome of one run. The JSON names are the stable interface
// of `tidepool bench --json`.
type Report struct {
	Op          Op      `json:"op"`
	Size        int     `json:"size"`
	Keys        int     `json:"keys"`
	Batch       int     `json:"batch,omitempty"`
	Concurrency int     `json:"concurrency"`
	Mode        string  `json:"mode,omitempty"`  // "inline" or "zero-copy"
	Scope       string  `json:"scope,omitempty"` // "local", "remote"
	Ops         int64   `json:"ops"`
	Errors      int64   `json:"errors"`
	Misses      int64   `json:"misses"`
	Seconds     float64 `json:"seconds"`
	OpsPerSec   float64 `json:"ops_per_sec"`
	Bytes       int64   `json:"bytes"`
	BytesPerSec float64 `json:"bytes_per_sec"`
	MeanUs      float64 `json:"mean_us"`
	P50Us       float64 `json:"p50_us"`
	P90Us       float64 `json:"p90_us"`
	P99Us       float64 `json:"p99_us"`
	P999Us      float64 `json:"p999_us"`
	MaxUs       float64 `json:"max_us"`
	FirstError  string  `json:"first_error,omitempty"`
}

// NewReport builds a Report from a run's latency histogram (nanoseconds)
// and counters.
func NewReport(cfg Config, h *hdr.Histogram, elapsed time.Duration, bytes, errs, misses int64) Report {
	us := func(ns int64) float64 { return float64(ns) / 1e3 }
	r := Report{
		Op: cfg.Op, Size: cfg.Size, Keys: cfg.Keys, Concurrency: cfg.Concurrency,
		Ops: int64(h.Count()), Errors: errs, Misses: misses, Seconds: elapsed.Seconds(), Bytes: bytes,
		MeanUs: h.Mean() / 1e3,
		P50Us:  us(h.ValueAtQuantile(0.50)), P90Us: us(h.ValueAtQuantile(0.90)),
		P99Us: us(h.ValueAtQuantile(0.99)), P999Us: us(h.ValueAtQuantile(0.999)),
		MaxUs: us(h.Max()),
	}
	if cfg.Op == OpLookup || cfg.Op == OpBatchGet {
		r.Batch = cfg.Batch
	}
	if s := elapsed.Seconds(); s > 0 {
		r.OpsPerSec = float64(r.Ops) / s
		r.BytesPerSec = float64(bytes) / s
	}
	return r
}

// WriteText prints r for a human.
func (r Report) WriteText(w io.Writer) {
	what := fmt.Sprintf("%s, %s values", r.Op, FormatSize(int64(r.Size)))
	if r.Batch > 0 {
		what += fmt.Sprintf(", %d keys per call", r.Batch)
	}
	if r.Mode != "" {
		what += ", " + r.Mode
	}
	if r.Scope != "" {
		what += ", " + r.Scope
	}
	fmt.Fprintf(w, "%s; %d keys, concurrency %d, %.2fs\n", what, r.Keys, r.Concurrency, r.Seconds)
	fmt.Fprintf(w, "  throughput  %12.0f ops/s  %10.1f MiB/s (%.2f GB/s)\n", r.OpsPerSec, r.BytesPerSec/(1<<20), r.BytesPerSec/1e9)
	fmt.Fprintf(w, "  latency µs  mean %.1f  p50 %.1f  p90 %.1f  p99 %.1f  p99.9 %.1f  max %.1f\n", r.MeanUs, r.P50Us, r.P90Us, r.P99Us, r.P999Us, r.MaxUs)
	fmt.Fprintf(w, "  calls       %d ok+failed, %d errors, %d misses\n", r.Ops, r.Errors, r.Misses)
	if r.FirstError != "" {
		fmt.Fprintf(w, "  first error %s\n", r.FirstError)
	}
}

// FormatSize prints a byte count the way sizes are given on the command
// line (4KiB, 1MiB, 1000B).
func FormatSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
