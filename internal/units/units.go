// Package units parses and formats the sizes and counts people type:
// "512MiB", "4GiB", "1.5GB", "3M" tokens.
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

var byteSuffixes = []struct {
	s string
	m float64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

// ParseBytes parses a byte size: a plain number of bytes, or a number with
// one of the suffixes KiB MiB GiB TiB (powers of 1024), KB MB GB TB (powers
// of 1000), K M G T (powers of 1024, as in most tools) or B. Case is ignored
// in the suffix; spaces between number and suffix are allowed.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("units: empty size")
	}
	mult := 1.0
	for _, suf := range byteSuffixes {
		if len(t) > len(suf.s) && strings.EqualFold(t[len(t)-len(suf.s):], suf.s) {
			mult = suf.m
			t = strings.TrimSpace(t[:len(t)-len(suf.s)])
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("units: %q is not a size (examples: 4096, 512MiB, 4GiB)", s)
	}
	if v < 0 {
		return 0, fmt.Errorf("units: %q is negative", s)
	}
	b := v * mult
	if b > math.MaxInt64/2 {
		return 0, fmt.Errorf("units: %q is too large", s)
	}
	return int64(b), nil
}

// FormatBytes renders n with a binary suffix: 1536 → "1.5KiB".
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	v := strconv.FormatFloat(float64(n)/float64(div), 'f', -1, 64)
	if i := strings.IndexByte(v, '.'); i >= 0 && len(v) > i+3 {
		v = v[:i+3]
	}
	return v + []string{"KiB", "MiB", "GiB", "TiB", "PiB"}[exp]
}

// ParseCount parses a count with an optional decimal suffix k, M, G
// (thousands, millions, billions), as in "--capacity-tokens 3M".
func ParseCount(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := 1.0
	if n := len(t); n > 1 {
		switch t[n-1] {
		case 'k', 'K':
			mult, t = 1e3, t[:n-1]
		case 'm', 'M':
			mult, t = 1e6, t[:n-1]
		case 'g', 'G', 'b', 'B':
			mult, t = 1e9, t[:n-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 || math.IsNaN(v) || math.IsInf(v, 0) || v*mult > math.MaxInt64/2 {
		return 0, fmt.Errorf("units: %q is not a count (examples: 500k, 3M)", s)
	}
	return int64(v * mult), nil
}
