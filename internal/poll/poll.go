// Package poll is the one way tests wait for a condition that another
// goroutine or process makes true: poll it with a deadline, never sleep a
// guessed time (STYLE.md, "Tests"; memberlist's internal/retry). The
// deadline only bounds a failing test; a passing one waits as long as the
// condition takes and no longer.
package poll

import (
	"testing"
	"time"
)

// The interval between two looks at the condition starts at minInterval
// and doubles up to maxInterval: a condition that holds at once costs
// almost nothing, and one that takes seconds costs few looks.
const (
	minInterval = time.Millisecond
	maxInterval = 20 * time.Millisecond
)

// Until calls cond until it returns true and returns how long that took;
// when d passes first, it fails t with Fatalf, naming what it waited for.
// Like Fatalf, it must be called from the test's own goroutine.
func Until(t testing.TB, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	interval := minInterval
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(interval)
		interval = min(2*interval, maxInterval)
	}
	return time.Since(start)
}
