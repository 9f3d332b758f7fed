// Package hdr is a small log-linear latency histogram in the spirit of HDR
// Histogram: values (non-negative int64, typically nanoseconds) fall into
// buckets that are exact below 256 and then split every power of two into
// 128 equal sub-buckets, so any recorded value is reported within 1/128
// (< 0.8 %) of its true value, over the whole int64 range, in a fixed 58 KiB
// of counters. Recording is one bits.Len64 and an increment.
//
// A Histogram is not safe for concurrent use: give each goroutine its own and
// Merge them at the end.
package hdr

import (
	"errors"
	"math"
	"math/bits"
)

// subBits is log2 of the sub-buckets per power of two.
const subBits = 7

const (
	subCount = 1 << subBits // 128
	// numBuckets covers every non-negative int64.
	numBuckets = (64-subBits-1)*subCount + 2*subCount
)

// ErrNegative is returned by RecordChecked for a negative value.
var ErrNegative = errors.New("hdr: negative value")

// Histogram counts values in log-linear buckets. The zero value is not
// usable; call New.
type Histogram struct {
	counts   []uint64
	total    uint64
	min, max int64
	sum      float64
}

// New returns an empty histogram.
func New() *Histogram {
	return &Histogram{counts: make([]uint64, numBuckets), min: math.MaxInt64}
}

// bucketOf returns the bucket index of v ≥ 0.
func bucketOf(v int64) int {
	e := bits.Len64(uint64(v)) - (subBits + 1)
	if e < 0 {
		e = 0
	}
	return e*subCount + int(uint64(v)>>uint(e))
}

// bucketRange returns the smallest and largest value of bucket i.
func bucketRange(i int) (lo, hi int64) {
	if i < 2*subCount {
		return int64(i), int64(i)
	}
	e := i/subCount - 1
	m := int64(i - e*subCount)
	lo = m << uint(e)
	hi = lo + (int64(1) << uint(e)) - 1
	return lo, hi
}

// Record adds one value; negative values count as 0.
func (h *Histogram) Record(v int64) { h.RecordN(v, 1) }

// RecordChecked adds one value and refuses a negative one.
func (h *Histogram) RecordChecked(v int64) error {
	if v < 0 {
		return ErrNegative
	}
	h.Record(v)
	return nil
}

// RecordN adds n copies of v; negative values count as 0.
func (h *Histogram) RecordN(v int64, n uint64) {
	if n == 0 {
		return
	}
	if v < 0 {
		v = 0
	}
	h.counts[bucketOf(v)] += n
	h.total += n
	h.sum += float64(v) * float64(n)
	if v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
}

// Merge adds every value of o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o == nil || o.total == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.total += o.total
	h.sum += o.sum
	h.min = min(h.min, o.min)
	h.max = max(h.max, o.max)
}

// Reset empties h.
func (h *Histogram) Reset() {
	clear(h.counts)
	h.total, h.sum, h.min, h.max = 0, 0, math.MaxInt64, 0
}

// Count is the number of recorded values.
func (h *Histogram) Count() uint64 { return h.total }

// Min is the smallest recorded value (0 when empty).
func (h *Histogram) Min() int64 {
	if h.total == 0 {
		return 0
	}
	return h.min
}

// Max is the largest recorded value (0 when empty).
func (h *Histogram) Max() int64 { return h.max }

// Mean is the exact mean of the recorded values (0 when empty).
func (h *Histogram) Mean() float64 {
	if h.total == 0 {
		return 0
	}
	return h.sum / float64(h.total)
}

// ValueAtQuantile returns the value below or at which a fraction q (0..1)
// of the recorded values lie: the largest value of the bucket holding the
// ceil(q·count)-th smallest value, capped at Max, so it never understates a
// latency and overstates it by less than 0.8 %. q ≤ 0 gives Min, q ≥ 1 Max;
// an empty histogram gives 0.
func (h *Histogram) ValueAtQuantile(q float64) int64 {
	if h.total == 0 {
		return 0
	}
	if q <= 0 || math.IsNaN(q) {
		return h.min
	}
	if q >= 1 {
		return h.max
	}
	rank := uint64(math.Ceil(q * float64(h.total)))
	if rank < 1 {
		rank = 1
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			_, hi := bucketRange(i)
			return max(min(hi, h.max), h.min)
		}
	}
	return h.max
}
