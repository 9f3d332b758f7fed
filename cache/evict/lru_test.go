package evict

import (
	"math/rand/v2"
	"reflect"
	"testing"
)

// lruOp is one step of a scripted policy test.
type lruOp struct {
	admit  *Entry
	touch  uint64
	remove uint64
}

func lruAdmit(id uint64, depth int32) lruOp {
	return lruOp{admit: &Entry{ID: id, Size: 1, Depth: depth}}
}
func lruAdmitLow(id uint64, depth int32) lruOp {
	return lruOp{admit: &Entry{ID: id, Size: 1, Depth: depth, LowPriority: true}}
}
func lruTouch(id uint64) lruOp  { return lruOp{touch: id} }
func lruRemove(id uint64) lruOp { return lruOp{remove: id} }

// lruDrain returns the eviction order of everything left in p.
func lruDrain(p Policy, skip func(uint64) bool) []uint64 {
	var out []uint64
	for {
		id, ok := p.Victim(skip)
		if !ok {
			return out
		}
		out = append(out, id)
		p.Remove(id)
	}
}

func TestLRUOrder(t *testing.T) {
	tests := []struct {
		name string
		ops  []lruOp
		want []uint64 // eviction order
	}{
		{
			name: "empty",
			want: nil,
		},
		{
			name: "plain LRU at equal depth",
			ops:  []lruOp{lruAdmit(1, 0), lruAdmit(2, 0), lruAdmit(3, 0)},
			want: []uint64{1, 2, 3},
		},
		{
			name: "chain 0..3 evicts deepest first",
			ops:  []lruOp{lruAdmit(10, 0), lruAdmit(11, 1), lruAdmit(12, 2), lruAdmit(13, 3)},
			want: []uint64{13, 12, 11, 10},
		},
		{
			name: "two chains admitted one after the other",
			ops: []lruOp{
				lruAdmit(10, 0), lruAdmit(11, 1), lruAdmit(12, 2),
				lruAdmit(20, 0), lruAdmit(21, 1),
			},
			want: []uint64{12, 11, 10, 21, 20},
		},
		{
			name: "a new run starts when depth does not increase",
			ops: []lruOp{
				lruAdmit(10, 0), lruAdmit(11, 1),
				lruAdmit(30, 0), // depth did not increase: new run
				lruAdmit(12, 2), // joins the new run, deeper first
			},
			want: []uint64{11, 10, 12, 30},
		},
		{
			name: "touched block moves to MRU end",
			ops:  []lruOp{lruAdmit(1, 0), lruAdmit(2, 0), lruAdmit(3, 0), lruTouch(1)},
			want: []uint64{2, 3, 1},
		},
		{
			name: "touched chain in depth order keeps deepest-first",
			ops: []lruOp{
				lruAdmit(10, 0), lruAdmit(11, 1), lruAdmit(12, 2),
				lruAdmit(20, 0),
				lruTouch(10), lruTouch(11), lruTouch(12),
			},
			want: []uint64{20, 12, 11, 10},
		},
		{
			name: "touch inside a run starts a new run",
			ops:  []lruOp{lruAdmit(10, 0), lruAdmit(11, 1), lruAdmit(12, 2), lruAdmit(13, 3), lruTouch(11)},
			want: []uint64{13, 12, 10, 11},
		},
		{
			name: "low priority evicted before any normal entry",
			ops: []lruOp{
				lruAdmit(1, 0), lruAdmit(2, 0),
				lruAdmitLow(3, 0), lruAdmitLow(4, 0),
				lruTouch(3),
			},
			want: []uint64{4, 3, 1, 2},
		},
		{
			name: "low priority chain deepest first",
			ops:  []lruOp{lruAdmit(1, 0), lruAdmitLow(10, 0), lruAdmitLow(11, 1), lruAdmitLow(12, 2)},
			want: []uint64{12, 11, 10, 1},
		},
		{
			name: "interleaved priorities break runs",
			ops:  []lruOp{lruAdmit(10, 0), lruAdmitLow(50, 0), lruAdmit(11, 1)},
			want: []uint64{50, 10, 11},
		},
		{
			name: "removed and unknown ids",
			ops:  []lruOp{lruAdmit(1, 0), lruAdmit(2, 0), lruAdmit(3, 0), lruRemove(2), lruRemove(99), lruTouch(98)},
			want: []uint64{1, 3},
		},
		{
			name: "remove oldest of an open run then continue it",
			ops:  []lruOp{lruAdmit(10, 0), lruAdmit(11, 1), lruAdmit(12, 2), lruRemove(12), lruAdmit(13, 3)},
			want: []uint64{13, 11, 10},
		},
		{
			name: "re-admit refreshes",
			ops:  []lruOp{lruAdmit(1, 0), lruAdmit(2, 0), lruAdmit(1, 0)},
			want: []uint64{2, 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewLRU()
			for _, o := range tt.ops {
				switch {
				case o.admit != nil:
					p.Admit(*o.admit)
				case o.touch != 0:
					p.Touch(o.touch)
				case o.remove != 0:
					p.Remove(o.remove)
				}
			}
			if got := p.Len(); got != len(tt.want) {
				t.Fatalf("Len = %d, want %d", got, len(tt.want))
			}
			if got := lruDrain(p, nil); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("eviction order = %v, want %v", got, tt.want)
			}
			if p.Len() != 0 {
				t.Fatalf("Len after drain = %d", p.Len())
			}
		})
	}
}

func TestLRUVictimSkips(t *testing.T) {
	tests := []struct {
		name   string
		pinned []uint64
		want   uint64
		ok     bool
	}{
		{name: "none pinned", want: 1, ok: true},
		{name: "oldest pinned", pinned: []uint64{1}, want: 2, ok: true},
		{name: "low pinned falls to normal", pinned: []uint64{1, 2}, want: 3, ok: true},
		{name: "all pinned", pinned: []uint64{1, 2, 3, 4}, ok: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewLRU()
			p.Admit(Entry{ID: 3, Size: 1})
			p.Admit(Entry{ID: 4, Size: 1})
			p.Admit(Entry{ID: 1, Size: 1, LowPriority: true})
			p.Admit(Entry{ID: 2, Size: 1, LowPriority: true})
			pinned := map[uint64]bool{}
			for _, id := range tt.pinned {
				pinned[id] = true
			}
			id, ok := p.Victim(func(id uint64) bool { return pinned[id] })
			if ok != tt.ok || (ok && id != tt.want) {
				t.Fatalf("Victim = %d,%v want %d,%v", id, ok, tt.want, tt.ok)
			}
			if p.Len() != 4 {
				t.Fatalf("Victim changed Len to %d", p.Len())
			}
		})
	}
}

// TestLRURandomConsistency drives the policy with random operations and checks
// it against a simple model: it tracks exactly the admitted-not-removed ids,
// and drains each exactly once.
func TestLRURandomConsistency(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	p := NewLRU()
	live := map[uint64]bool{}
	for i := 0; i < 20000; i++ {
		id := uint64(r.IntN(300) + 1)
		switch r.IntN(4) {
		case 0, 1:
			p.Admit(Entry{ID: id, Size: 1, Depth: int32(r.IntN(5)), LowPriority: r.IntN(5) == 0})
			live[id] = true
		case 2:
			p.Touch(id)
		case 3:
			p.Remove(id)
			delete(live, id)
		}
		if p.Len() != len(live) {
			t.Fatalf("step %d: Len = %d, want %d", i, p.Len(), len(live))
		}
	}
	seen := map[uint64]bool{}
	for _, id := range lruDrain(p, nil) {
		if !live[id] || seen[id] {
			t.Fatalf("drained unexpected or duplicate id %d", id)
		}
		seen[id] = true
	}
	if len(seen) != len(live) {
		t.Fatalf("drained %d ids, want %d", len(seen), len(live))
	}
}

func BenchmarkLRU(b *testing.B) {
	p := NewLRU()
	const n = 1 << 16
	for i := uint64(1); i <= n; i++ {
		p.Admit(Entry{ID: i, Size: 1, Depth: int32(i % 8)})
	}
	b.ReportAllocs()
	b.ResetTimer()
	next := uint64(n + 1)
	for i := 0; i < b.N; i++ {
		p.Touch(uint64(i%n) + 1)
		id, _ := p.Victim(nil)
		p.Remove(id)
		p.Admit(Entry{ID: next, Size: 1, Depth: int32(i % 8)})
		next++
	}
}
