package proxy

import (
	"testing"
	"time"
)

// TestPushTimeout: a push may take FetchTimeout per 16 MiB it carries, so
// that a large one is not cut for being large.
func TestPushTimeout(t *testing.T) {
	r := &router{cfg: RouteConfig{FetchTimeout: 5 * time.Second}}
	items := func(sizes ...int) []PutItem {
		var out []PutItem
		for _, n := range sizes {
			out = append(out, PutItem{Value: make([]byte, n)})
		}
		return out
	}
	for _, tc := range []struct {
		items []PutItem
		want  time.Duration
	}{
		{nil, 5 * time.Second},
		{items(1), 5 * time.Second},
		{items(16<<20 - 1), 5 * time.Second},
		{items(8<<20, 8<<20), 10 * time.Second},
		{items(20 * 4 << 20), 30 * time.Second}, // 80 MiB
	} {
		if got := r.pushTimeout(tc.items); got != tc.want {
			t.Fatalf("pushTimeout of %d items: %v, want %v", len(tc.items), got, tc.want)
		}
	}
}
