package proxy

import (
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tidepool-kv/tidepool/internal/clock"
)

// TestFailureLog: failures at a node are logged once per interval, with
// how many failed since the last line; each node has its own interval.
func TestFailureLog(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	clk := clock.NewFake(time.Unix(1000, 0))
	l := newFailureLog(zap.New(core), "pushes failed", 30*time.Second, clk)
	boom := errors.New("boom")

	l.failed("a", 3, boom) // logged at once
	l.failed("a", 2, boom)
	l.failed("b", 1, boom) // another node: its own line
	clk.Advance(29 * time.Second)
	l.failed("a", 4, boom)
	if n := logs.Len(); n != 2 {
		t.Fatalf("%d lines within the interval, want 2 (one per node)", n)
	}
	clk.Advance(time.Second)
	l.failed("a", 1, boom) // the interval has passed: 2+4+1 since the first line
	lines := logs.All()
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3", len(lines))
	}
	for i, want := range []struct {
		node   string
		failed int64
	}{{"a", 3}, {"b", 1}, {"a", 7}} {
		f := lines[i].ContextMap()
		if lines[i].Message != "pushes failed" || f["node"] != want.node || f["failed"] != want.failed || f["error"] != "boom" {
			t.Fatalf("line %d: %q %v, want node %s failed %d", i, lines[i].Message, f, want.node, want.failed)
		}
	}
}
