package evict

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestPrefixScripts(t *testing.T) { runPolicyScripts(t, "prefix", NewPrefix) }

func TestPrefixTable(t *testing.T) {
	type step struct {
		admit  *Entry
		touch  uint64
		remove uint64
	}
	ad := func(id uint64, depth int32, low bool) step {
		return step{admit: &Entry{ID: id, Size: 1, Depth: depth, LowPriority: low}}
	}
	tests := []struct {
		name    string
		steps   []step
		want    []uint64 // drain order
		wantLen int
	}{
		{name: "empty"},
		{name: "equal depth, oldest first", steps: []step{ad(1, 0, false), ad(2, 0, false), ad(3, 0, false)}, want: []uint64{1, 2, 3}, wantLen: 3},
		{name: "deeper first", steps: []step{ad(1, 0, false), ad(2, 5, false), ad(3, 2, false)}, want: []uint64{2, 3, 1}, wantLen: 3},
		{name: "a read outranks any depth", steps: []step{ad(1, 0, false), ad(2, 900, false), {touch: 2}}, want: []uint64{1, 2}, wantLen: 2},
		{name: "re-admit counts as a read", steps: []step{ad(1, 0, false), ad(2, 0, false), ad(1, 0, false)}, want: []uint64{2, 1}, wantLen: 2},
		{name: "remove", steps: []step{ad(1, 0, false), ad(2, 0, false), {remove: 1}, {remove: 77}}, want: []uint64{2}, wantLen: 1},
		{name: "low priority first", steps: []step{ad(1, 0, false), ad(2, 0, true), {touch: 2}, {touch: 2}}, want: []uint64{2, 1}, wantLen: 2},
		{name: "owned copy moves class", steps: []step{ad(1, 0, true), ad(2, 0, false), ad(1, 0, false)}, want: []uint64{2, 1}, wantLen: 2},
		{name: "negative depth is clamped", steps: []step{ad(1, -5, false), ad(2, 0, false)}, want: []uint64{1, 2}, wantLen: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPrefix()
			for _, s := range tt.steps {
				switch {
				case s.admit != nil:
					p.Admit(*s.admit)
				case s.touch != 0:
					p.Touch(s.touch)
				default:
					p.Remove(s.remove)
				}
			}
			if p.Len() != tt.wantLen {
				t.Fatalf("Len = %d, want %d", p.Len(), tt.wantLen)
			}
			var got []uint64
			for {
				id, ok := p.Victim(nil)
				if !ok {
					break
				}
				got = append(got, id)
				p.Remove(id)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("drain = %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("drain = %v, want %v", got, tt.want)
				}
			}
		})
	}
}

// TestPrefixRandomConsistency drives the policy with random operations and
// checks it against a set model: victims are tracked, skipped blocks are
// never returned, Len matches, and the history stays bounded.
func TestPrefixRandomConsistency(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	p := NewPrefix().(*prefix)
	model := map[uint64]bool{} // id -> low priority
	for i := range 50000 {
		id := rng.Uint64N(300)
		switch r := rng.IntN(10); {
		case r < 4:
			low := rng.IntN(4) == 0
			p.Admit(Entry{ID: id, Size: 1, Depth: int32(rng.IntN(20)), LowPriority: low})
			model[id] = low
		case r < 6:
			p.Touch(id)
		case r < 8:
			p.Remove(id)
			delete(model, id)
		default:
			skip := func(x uint64) bool { return x%3 == id%3 }
			v, ok := p.Victim(skip)
			anyLow, anyEvictable := false, false
			for m, low := range model {
				if !skip(m) {
					anyEvictable = true
					anyLow = anyLow || low
				}
			}
			if ok != anyEvictable {
				t.Fatalf("step %d: Victim ok=%v, model has evictable=%v", i, ok, anyEvictable)
			}
			if ok {
				low, tracked := model[v]
				if !tracked || skip(v) {
					t.Fatalf("step %d: Victim = %d (tracked %v, skipped %v)", i, v, tracked, skip(v))
				}
				if anyLow && !low {
					t.Fatalf("step %d: Victim = %d, owned, while a low-priority block is evictable", i, v)
				}
				p.Remove(v)
				delete(model, v)
			}
		}
		if p.Len() != len(model) {
			t.Fatalf("step %d: Len = %d, model %d", i, p.Len(), len(model))
		}
	}
	if len(p.hist) > len(p.ring) || len(p.ring) > historyFactor*301 {
		t.Fatalf("history: %d records, ring %d", len(p.hist), len(p.ring))
	}
	once := 0
	for _, h := range p.hist {
		if h.freq <= 1 {
			once++
		}
	}
	if once != p.once {
		t.Fatalf("once counter %d, history says %d", p.once, once)
	}
	for i, n := range p.heaps[0] {
		if n.idx != i || !n.low {
			t.Fatalf("low heap slot %d: idx %d low %v", i, n.idx, n.low)
		}
	}
}

// TestPrefixRebase checks that rebasing the clock keeps the eviction order:
// a policy whose clock starts just below rebaseAt (so that it rebases
// after a few accesses) evicts in the same order as one starting at 0.
func TestPrefixRebase(t *testing.T) {
	build := func(start float64) []uint64 {
		p := newPrefix(defaultPrefixParams)
		p.clock = start
		for i := range 60 {
			p.Admit(Entry{ID: uint64(i), Depth: int32(i % 7)})
			if i%3 == 0 {
				p.Touch(uint64(i / 2))
			}
			if i%10 == 9 {
				id, _ := p.Victim(nil)
				p.Remove(id)
			}
		}
		if p.clock >= rebaseAt {
			t.Fatalf("clock %v not rebased", p.clock)
		}
		var out []uint64
		for p.Len() > 0 {
			id, _ := p.Victim(nil)
			p.Remove(id)
			out = append(out, id)
		}
		return out
	}
	want := build(0)
	if got := build(rebaseAt - 1e-4); !slices.Equal(got, want) {
		t.Errorf("with a rebase: order %v, want %v", got, want)
	}
}

func BenchmarkPrefix(b *testing.B) {
	const capacity = 100_000
	p := NewPrefix()
	rng := rand.New(rand.NewPCG(3, 4))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		id := uint64(rng.IntN(4 * capacity))
		if rng.IntN(2) == 0 {
			p.Touch(id)
			continue
		}
		p.Admit(Entry{ID: id, Size: 1, Depth: int32(i % 32)})
		for p.Len() > capacity {
			v, _ := p.Victim(nil)
			p.Remove(v)
		}
	}
}
