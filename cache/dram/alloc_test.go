package dram

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

func TestFootprint(t *testing.T) {
	tests := []struct {
		size, want int64
	}{
		{0, 512},
		{1, 512},
		{512, 512},
		{513, 640},
		{4096, 4096},
		{4097, 5120},
		{28672, 28672},
		{32768, 32768},
		{32769, 65536},
		{65536, 65536},
		{65537, 131072},
		{200000, 262144},
		{262144, 262144},
		{262145, 327680},
		{1 << 20, 1 << 20},
		{1<<20 + 1, 1<<20 + pageSize},
	}
	for _, tt := range tests {
		if got := footprint(tt.size); got != tt.want {
			t.Errorf("footprint(%d) = %d, want %d", tt.size, got, tt.want)
		}
	}
	// Rounding never wastes more than 25 % or one page.
	for s := int64(512); s < 8<<20; s += 997 {
		if f := footprint(s); f < s || float64(f) > max(1.25*float64(s)+1, float64(s+pageSize)) {
			t.Fatalf("footprint(%d) = %d", s, f)
		}
	}
}

func TestBinOf(t *testing.T) {
	prev := -1
	for n := uint32(1); n < 1<<20; n++ {
		b := binOf(n)
		if b < prev || b >= nbins {
			t.Fatalf("binOf(%d) = %d after %d", n, b, prev)
		}
		prev = b
	}
	if b := binOf(^uint32(0)); b >= nbins {
		t.Fatalf("binOf(max) = %d", b)
	}
}

// checker tracks live allocations at classGrain granularity and fails on any
// overlap or out-of-arena allocation.
type checker struct {
	t         *testing.T
	a         *allocator
	total     int64
	arenaSize int64
	used      []bool
	live      map[int64]int64 // off → size
}

func newChecker(t *testing.T, total, arenaSize int64) *checker {
	t.Helper()
	a, err := newAllocator(total, arenaSize)
	if err != nil {
		t.Fatal(err)
	}
	return &checker{t: t, a: a, total: total, arenaSize: arenaSize,
		used: make([]bool, total/classGrain), live: map[int64]int64{}}
}

func (c *checker) alloc(size int64) bool {
	c.t.Helper()
	_, ok := c.allocAt(size)
	return ok
}

func (c *checker) allocAt(size int64) (int64, bool) {
	c.t.Helper()
	off, ok := c.a.alloc(size)
	if !ok {
		return 0, false
	}
	foot := footprint(size)
	if off < 0 || off+foot > c.total {
		c.t.Fatalf("alloc(%d) = %d outside [0,%d)", size, off, c.total)
	}
	if off/c.arenaSize != (off+foot-1)/c.arenaSize {
		c.t.Fatalf("alloc(%d) = %d crosses an arena boundary", size, off)
	}
	if off%classGrain != 0 {
		c.t.Fatalf("alloc(%d) = %d misaligned", size, off)
	}
	for g := off / classGrain; g < (off+foot)/classGrain; g++ {
		if c.used[g] {
			c.t.Fatalf("alloc(%d) = %d overlaps a live allocation", size, off)
		}
		c.used[g] = true
	}
	c.live[off] = size
	return off, true
}

func (c *checker) free(off int64) {
	size := c.live[off]
	delete(c.live, off)
	for g := off / classGrain; g < (off+footprint(size))/classGrain; g++ {
		c.used[g] = false
	}
	c.a.free(off, size)
}

func (c *checker) freeAll() {
	for off := range c.live {
		c.free(off)
	}
}

// requireEmpty checks that everything coalesced back: one free run per arena.
func (c *checker) requireEmpty() {
	c.t.Helper()
	st := c.a.stats()
	if st.FreePages != st.TotalPages || st.Slabs != 0 {
		c.t.Fatalf("after freeing all: %+v", st)
	}
	want := min(c.arenaSize, c.total) / pageSize
	if int64(st.LargestFree) != want {
		c.t.Fatalf("largest free run %d pages, want %d (not coalesced)", st.LargestFree, want)
	}
	arenas := (c.total + c.arenaSize - 1) / c.arenaSize
	runs := 0
	for b := range c.a.bins {
		for p := c.a.bins[b]; p != noPage; p = c.a.next[p] {
			runs++
		}
	}
	if int64(runs) != arenas {
		c.t.Fatalf("%d free runs, want %d", runs, arenas)
	}
}

func TestAllocPatterns(t *testing.T) {
	const arena = 4 << 20
	tests := []struct {
		name  string
		total int64
		sizes []int64
	}{
		{"pages only", 8 << 20, []int64{64 << 10, 128 << 10, 1 << 20, 300 << 10}},
		{"small classes", 4 << 20, []int64{512, 700, 4096, 9000, 60000}},
		{"mixed", 12 << 20, []int64{4096, 1 << 20, 512, 2 << 20, 100 << 10, 65537}},
		{"last arena short", arena + 3*pageSize, []int64{64 << 10, 4096}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newChecker(t, tt.total, arena)
			// Fill to exhaustion with a repeating pattern.
			n := 0
			for i := 0; c.alloc(tt.sizes[i%len(tt.sizes)]); i++ {
				n++
			}
			if n == 0 {
				t.Fatal("nothing allocated")
			}
			// Free every other allocation, then the rest, in two orders.
			i := 0
			for off := range c.live {
				if i%2 == 0 {
					c.free(off)
				}
				i++
			}
			c.freeAll()
			c.requireEmpty()
			// The whole arena is one run again.
			if !c.alloc(min(arena, tt.total)) {
				t.Fatal("cannot allocate a whole arena after freeing all")
			}
			c.freeAll()
			c.requireEmpty()
		})
	}
}

func TestAllocCoalescing(t *testing.T) {
	c := newChecker(t, 1<<20, 1<<20) // 16 pages
	offs := make([]int64, 0, 16)
	for i := 0; i < 16; i++ {
		off, ok := c.a.alloc(pageSize)
		if !ok {
			t.Fatalf("page %d: no room", i)
		}
		c.live[off] = pageSize
		offs = append(offs, off)
	}
	if _, ok := c.a.alloc(pageSize); ok {
		t.Fatal("allocated past the end")
	}
	// Free pages 1, 3, 2 (merging left and right), then 0.
	for _, i := range []int{1, 3, 2} {
		c.free(offs[i])
	}
	if got := c.a.stats().LargestFree; got != 3 {
		t.Fatalf("largest free run %d pages, want 3", got)
	}
	if !c.alloc(3 * pageSize) {
		t.Fatal("3-page run not found after coalescing")
	}
	c.freeAll()
	c.requireEmpty()
}

func TestAllocArenaBoundary(t *testing.T) {
	// Two arenas of 4 pages: a 5-page run must never be formed across them.
	c := newChecker(t, 8*pageSize, 4*pageSize)
	if c.alloc(5 * pageSize) {
		t.Fatal("5-page run crosses arenas")
	}
	for c.alloc(pageSize) {
	}
	c.freeAll()
	c.requireEmpty()
	if c.alloc(5 * pageSize) {
		t.Fatal("coalesced across the arena boundary")
	}
}

// TestAllocRandomNoOverlap is the randomized no-overlap test: random sizes
// from 1 B to 2 MiB, random frees, every allocation checked against every
// live byte.
func TestAllocRandomNoOverlap(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	c := newChecker(t, 32<<20, 8<<20)
	var offs []int64
	steps := 10000
	if testing.Short() {
		steps = 5000
	}
	fails := 0
	for i := 0; i < steps; i++ {
		if len(offs) > 0 && (r.IntN(2) == 0 || fails > 3) {
			j := r.IntN(len(offs))
			c.free(offs[j])
			offs[j] = offs[len(offs)-1]
			offs = offs[:len(offs)-1]
			fails = 0
			continue
		}
		var size int64
		switch r.IntN(3) {
		case 0:
			size = int64(r.IntN(8<<10) + 1)
		case 1:
			size = int64(r.IntN(256<<10) + 1)
		default:
			size = int64(r.IntN(2<<20) + 1)
		}
		if off, ok := c.allocAt(size); ok {
			offs = append(offs, off)
			fails = 0
		} else {
			fails++
		}
	}
	c.freeAll()
	c.requireEmpty()
}

// TestAllocFragmentation checks that the page allocator keeps large runs
// available: after a random mix is freed down to 25 % occupancy, a run of a
// quarter arena is still found, and sizes smaller than a page never scatter
// over more slabs than needed.
func TestAllocFragmentation(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	const total = 64 << 20
	c := newChecker(t, total, total)
	for c.alloc(int64(r.IntN(1<<20) + 1)) {
	}
	var offs []int64
	for off := range c.live {
		offs = append(offs, off)
	}
	r.Shuffle(len(offs), func(i, j int) { offs[i], offs[j] = offs[j], offs[i] })
	for _, off := range offs[:len(offs)*3/4] {
		c.free(off)
	}
	st := c.a.stats()
	t.Logf("after freeing 75%%: free %d/%d pages, largest run %d pages", st.FreePages, st.TotalPages, st.LargestFree)
	if st.LargestFree < uint32(st.TotalPages/32) {
		t.Fatalf("largest free run %d pages of %d free: too fragmented", st.LargestFree, st.FreePages)
	}
	c.freeAll()
	c.requireEmpty()

	// Small values: 10000 allocations of 4 KiB use exactly 625 one-page slabs.
	for i := 0; i < 10000; i++ {
		if !c.alloc(4096) {
			t.Fatal("no room for 4 KiB")
		}
	}
	if st := c.a.stats(); st.Slabs != 625 {
		t.Fatalf("%d slabs for 10000 × 4 KiB, want 625", st.Slabs)
	}
	c.freeAll()
	c.requireEmpty()
}

func BenchmarkAlloc(b *testing.B) {
	for _, size := range []int64{4 << 10, 64 << 10, 1 << 20} {
		b.Run(sizeName(size), func(b *testing.B) {
			a, err := newAllocator(1<<30, 256<<20)
			if err != nil {
				b.Fatal(err)
			}
			offs := make([]int64, 0, 64)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				off, ok := a.alloc(size)
				if !ok {
					b.Fatal("full")
				}
				offs = append(offs, off)
				if len(offs) == cap(offs) {
					for _, o := range offs {
						a.free(o, size)
					}
					offs = offs[:0]
				}
			}
		})
	}
}

func sizeName(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
