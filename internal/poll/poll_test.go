package poll

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

func TestUntilReturnsWhenCondHolds(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	go func() {
		for range 3 {
			n.Add(1)
		}
	}()
	Until(t, 10*time.Second, "three increments", func() bool { return n.Load() == 3 })
	calls := 0
	Until(t, time.Second, "a condition true at once", func() bool { calls++; return true })
	if calls != 1 {
		t.Fatalf("cond called %d times for a condition true at once, want 1", calls)
	}
}

// recorder is a testing.TB that records a Fatalf instead of stopping the
// test, so that Until's failure can be checked.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestUntilFailsAfterDeadline(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	calls := 0
	// Fatalf does not stop the loop here (a real one would end the
	// goroutine), so the condition turns true after the failure.
	Until(r, time.Millisecond, "the never-true thing", func() bool {
		calls++
		return r.failed != ""
	})
	if want := "timed out after 1ms waiting for the never-true thing"; r.failed != want {
		t.Fatalf("failure %q, want %q", r.failed, want)
	}
	if calls < 2 {
		t.Fatalf("cond called %d times, want at least 2", calls)
	}
}
