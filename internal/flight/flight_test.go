package flight

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/internal/poll"
)

// TestDoOnce: concurrent callers of one key run fn once and all get its
// result; another key is a flight of its own; a later call runs fn again.
func TestDoOnce(t *testing.T) {
	g := New[string, int](nil)
	var runs atomic.Int32
	gate := make(chan struct{})
	fn := func() (int, error) { runs.Add(1); <-gate; return 42, nil }
	const n = 8
	var wg sync.WaitGroup
	results := make([]int, n)
	shared := make([]bool, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			results[i], err, shared[i] = g.Do(context.Background(), "k", fn)
			if err != nil {
				t.Error(err)
			}
		}()
	}
	poll.Until(t, 5*time.Second, "every caller joined", func() bool { return g.Joined("k") == n })
	if v, err, sh := g.Do(context.Background(), "other", func() (int, error) { return 7, nil }); v != 7 || err != nil || sh {
		t.Fatalf("other key: %v %v %v", v, err, sh)
	}
	close(gate)
	wg.Wait()
	leaders := 0
	for i := range n {
		if results[i] != 42 {
			t.Fatalf("caller %d got %d", i, results[i])
		}
		if !shared[i] {
			leaders++
		}
	}
	if runs.Load() != 1 || leaders != 1 {
		t.Fatalf("fn ran %d times, %d leaders", runs.Load(), leaders)
	}
	if g.InFlight() != 0 {
		t.Fatal("a finished call is still in flight")
	}
	if v, _, _ := g.Do(context.Background(), "k", func() (int, error) { return 43, nil }); v != 43 {
		t.Fatal("a finished call's result was reused")
	}
}

// TestWaiterContext: a waiter whose context ends gets its error; the
// leader and the other waiters are not affected.
func TestWaiterContext(t *testing.T) {
	g := New[string, string](nil)
	c, leader := g.Join("k")
	if !leader {
		t.Fatal("first Join is not the leader")
	}
	w, leader := g.Join("k")
	if leader || w != c {
		t.Fatal("second Join did not join")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := w.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	w.Leave()
	c.Finish("v", nil)
	if v, err := c.Wait(context.Background()); v != "v" || err != nil {
		t.Fatalf("leader: %q %v", v, err)
	}
	c.Leave()
}

// TestRelease: a shared result is released once, after the last
// participant Left, and only when the call succeeded.
func TestRelease(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want int32
	}{{"success", nil, 1}, {"failure", errors.New("boom"), 0}} {
		t.Run(tc.name, func(t *testing.T) {
			var released atomic.Int32
			g := New[int, *int](func(*int) { released.Add(1) })
			lead, _ := g.Join(1)
			w1, _ := g.Join(1)
			w2, _ := g.Join(1)
			v := 5
			lead.Finish(&v, tc.err)
			lead.Leave()
			w1.Leave()
			if released.Load() != 0 {
				t.Fatal("released while a participant still reads it")
			}
			if got, err := w2.Wait(context.Background()); err != tc.err || (err == nil && *got != 5) {
				t.Fatalf("w2: %v %v", got, err)
			}
			w2.Leave()
			if released.Load() != tc.want {
				t.Fatalf("released %d times, want %d", released.Load(), tc.want)
			}
		})
	}
}

// TestPanic: a leader that panics does not leave its waiters hanging.
func TestPanic(t *testing.T) {
	g := New[string, int](nil)
	gate := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		defer func() { _ = recover() }()
		g.Do(context.Background(), "k", func() (int, error) { <-gate; panic("boom") })
	}()
	poll.Until(t, 5*time.Second, "the leader started", func() bool { return g.Joined("k") == 1 })
	go func() {
		_, err, _ := g.Do(context.Background(), "k", func() (int, error) { return 0, nil })
		done <- err
	}()
	poll.Until(t, 5*time.Second, "the waiter joined", func() bool { return g.Joined("k") == 2 })
	close(gate)
	if err := <-done; !errors.Is(err, ErrPanicked) {
		t.Fatalf("waiter of a panicked leader: %v", err)
	}
}
