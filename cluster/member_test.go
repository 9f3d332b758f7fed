package cluster

import (
	"testing"
	"time"
)

// The live count Stats reports is kept as the table changes; every
// transition (join, suspect, leaving, failed, left, back, reaped) keeps it
// equal to a count of the table.
func TestLiveCountKept(t *testing.T) {
	c, err := New(DefaultLocalConfig("a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	count := func() int {
		n := 0
		for _, m := range c.members {
			if m.State.Live() {
				n++
			}
		}
		return n
	}
	now := time.Now()
	steps := []struct {
		name  string
		state State
	}{
		{"x", StateAlive}, {"y", StateAlive}, {"x", StateSuspect}, {"x", StateAlive}, {"y", StateLeaving},
		{"y", StateLeft}, {"x", StateFailed}, {"x", StateFailed}, {"x", StateAlive}, {"z", StateFailed},
	}
	for i, s := range steps {
		c.mu.Lock()
		c.setMemberLocked(s.name, &Member{Name: s.name, State: s.state, Since: now})
		c.mu.Unlock()
		if got, want := c.Stats().Live, count(); got != want {
			t.Fatalf("step %d (%s %s): Stats().Live %d, table %d", i, s.name, s.state, got, want)
		}
	}
	c.reapTombstones(now.Add(c.cfg.Tombstone + time.Second))
	if s := c.Stats(); s.Live != 1 || s.Members != 1 {
		t.Fatalf("after reaping: %+v", s)
	}
}
