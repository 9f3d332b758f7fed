package client

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// TestCallAfterClose: calls racing Close, and calls after it, fail with
// UNAVAILABLE; none goes through the closed Kitex client (which panics:
// "client is already closed"). Run with -race.
func TestCallAfterClose(t *testing.T) {
	c, err := New("/nonexistent/tidepool-close-test.sock")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				_, _ = c.Stats(context.Background(), "ns")
			}
		}()
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	_, err = c.Stats(context.Background(), "ns")
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeUnavailable {
		t.Fatalf("call after Close: %v, want UNAVAILABLE", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
