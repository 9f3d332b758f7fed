package hdr

import (
	"errors"
	"math"
	"math/rand"
	"slices"
	"testing"
)

func TestBucketRoundTrip(t *testing.T) {
	vals := []int64{0, 1, 127, 128, 255, 256, 257, 511, 512, 1000, 1 << 20, 123456789, math.MaxInt64 - 1, math.MaxInt64}
	r := rand.New(rand.NewSource(1))
	for range 10000 {
		vals = append(vals, r.Int63n(1<<uint(r.Intn(62)+1)))
	}
	for _, v := range vals {
		i := bucketOf(v)
		if i < 0 || i >= numBuckets {
			t.Fatalf("bucketOf(%d) = %d out of range", v, i)
		}
		lo, hi := bucketRange(i)
		if v < lo || v > hi {
			t.Fatalf("value %d in bucket %d [%d,%d]", v, i, lo, hi)
		}
		if v < 256 && lo != hi {
			t.Fatalf("value %d below 256 not exact: [%d,%d]", v, lo, hi)
		}
		if rel := float64(hi-lo) / float64(max(lo, 1)); rel > 1.0/128 {
			t.Fatalf("bucket [%d,%d] too wide: %.4f", lo, hi, rel)
		}
	}
	// Buckets are contiguous and increasing.
	_, prevHi := bucketRange(0)
	for i := 1; i < bucketOf(math.MaxInt64)+1; i++ {
		lo, hi := bucketRange(i)
		if lo != prevHi+1 || hi < lo {
			t.Fatalf("bucket %d = [%d,%d] after hi %d", i, lo, hi, prevHi)
		}
		prevHi = hi
	}
	if prevHi != math.MaxInt64 {
		t.Fatalf("last bucket ends at %d", prevHi)
	}
}

// reference returns the exact q-quantile of sorted values, with the same
// rank rule as ValueAtQuantile.
func reference(sorted []int64, q float64) int64 {
	rank := int(math.Ceil(q * float64(len(sorted))))
	rank = max(rank, 1)
	return sorted[rank-1]
}

func TestQuantiles(t *testing.T) {
	tests := []struct {
		name string
		gen  func(r *rand.Rand) int64
		n    int
	}{
		{"small exact", func(r *rand.Rand) int64 { return r.Int63n(200) }, 1000},
		{"uniform micros", func(r *rand.Rand) int64 { return 1000 + r.Int63n(1_000_000) }, 50000},
		{"lognormal", func(r *rand.Rand) int64 { return int64(math.Exp(r.NormFloat64()*1.5 + 11)) }, 100000},
		{"one value", func(*rand.Rand) int64 { return 4242 }, 10},
		{"bimodal tail", func(r *rand.Rand) int64 {
			if r.Intn(1000) == 0 {
				return 50_000_000 + r.Int63n(1000)
			}
			return 20_000 + r.Int63n(100)
		}, 20000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewSource(7))
			h := New()
			vals := make([]int64, tc.n)
			var sum float64
			for i := range vals {
				vals[i] = tc.gen(r)
				sum += float64(vals[i])
				h.Record(vals[i])
			}
			slices.Sort(vals)
			if h.Count() != uint64(tc.n) || h.Min() != vals[0] || h.Max() != vals[len(vals)-1] {
				t.Fatalf("count/min/max = %d/%d/%d, want %d/%d/%d", h.Count(), h.Min(), h.Max(), tc.n, vals[0], vals[len(vals)-1])
			}
			if m := h.Mean(); math.Abs(m-sum/float64(tc.n)) > 1e-6*m {
				t.Fatalf("mean %f, want %f", m, sum/float64(tc.n))
			}
			for _, q := range []float64{0.01, 0.5, 0.9, 0.99, 0.999, 0.9999} {
				want := reference(vals, q)
				got := h.ValueAtQuantile(q)
				if got < want || float64(got-want) > float64(want)/128+1 {
					t.Errorf("q%.4f = %d, want %d (+0.8%%)", q, got, want)
				}
			}
			if h.ValueAtQuantile(0) != vals[0] || h.ValueAtQuantile(1) != vals[len(vals)-1] {
				t.Errorf("q0/q1 = %d/%d", h.ValueAtQuantile(0), h.ValueAtQuantile(1))
			}
		})
	}
}

func TestMergeResetEmpty(t *testing.T) {
	a, b, all := New(), New(), New()
	r := rand.New(rand.NewSource(3))
	for i := range 5000 {
		v := r.Int63n(1 << 30)
		all.Record(v)
		if i%2 == 0 {
			a.Record(v)
		} else {
			b.Record(v)
		}
	}
	a.Merge(b)
	a.Merge(New())
	a.Merge(nil)
	for _, q := range []float64{0, 0.5, 0.99, 1} {
		if a.ValueAtQuantile(q) != all.ValueAtQuantile(q) {
			t.Fatalf("merged q%.2f = %d, want %d", q, a.ValueAtQuantile(q), all.ValueAtQuantile(q))
		}
	}
	if a.Count() != all.Count() || a.Min() != all.Min() || a.Max() != all.Max() {
		t.Fatal("merged count/min/max differ")
	}
	a.Reset()
	if a.Count() != 0 || a.Min() != 0 || a.Max() != 0 || a.Mean() != 0 || a.ValueAtQuantile(0.5) != 0 {
		t.Fatalf("reset histogram not empty: %d %d %d", a.Count(), a.Min(), a.Max())
	}
	a.RecordN(-5, 3)
	a.RecordN(9, 0)
	if a.Count() != 3 || a.Max() != 0 {
		t.Fatalf("negative values should count as 0: count %d max %d", a.Count(), a.Max())
	}
	if err := a.RecordChecked(-1); !errors.Is(err, ErrNegative) {
		t.Fatalf("RecordChecked(-1) = %v", err)
	}
}

func BenchmarkRecord(b *testing.B) {
	h := New()
	r := rand.New(rand.NewSource(1))
	vals := make([]int64, 1024)
	for i := range vals {
		vals[i] = r.Int63n(10_000_000)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		h.Record(vals[i&1023])
	}
	b.ReportMetric(float64(h.ValueAtQuantile(0.99)), "p99-value")
}
