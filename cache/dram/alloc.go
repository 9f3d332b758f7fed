package dram

import (
	"fmt"
	"math/bits"
	"sync"
)

// The allocator carves the arenas. Design:
//
// All arenas form one address space of global byte offsets
// (arena index × ArenaSize + offset in the arena), managed in pages of
// pageSize bytes. Whole pages are handed out by a page-run allocator;
// runs never cross an arena boundary.
//
// Page runs: free runs carry boundary tags (their length on their first page,
// their first page on their last page), so a freed run coalesces with free
// neighbours in O(1). Free runs sit in segregated lists, one per run-length
// bin: lengths 1..7 have a bin each, longer lengths 4 bins per power of two
// (as in TLSF). A request of n pages first scans a few runs of its own bin
// (good fit: a bin spans at most 25 % of lengths), then takes the head of the
// first non-empty larger bin (found with a 128-bit bitmap, O(1)), then scans
// the rest of its own bin; it fails only when no free run of n pages exists.
// The remainder of a split run goes back to its bin.
//
// Small values: sizes up to half a page (32 KiB) use size classes, 4 per
// power of two from 512 B (512, 640, 768, 896, 1024, 1280, …, 28 KiB,
// 32 KiB), packed in slabs of one page with a 128-bit free bitmap. Slabs
// with free slots are on their class's list; a slab whose last object is
// freed goes back to the page allocator at once. One-page slabs matter in a
// full tier: a new slab needs a single free page, so evicting one block
// always makes room for it. Larger values take a page run (rounding wastes
// less than 64 KiB per value: under 7 % from 1 MiB up).
//
// The footprint of a value (its class size, or its page-rounded size) is what
// counts against the tier's Capacity. Slab tails and partly used slabs are
// the allocator's overhead; when they make an allocation fail although the
// budget has room, the tier evicts more (see Tier.makeRoom).
//
// The allocator is guarded by one mutex, a leaf in the tier's lock order: no
// other lock is taken while it is held. Allocation and free are O(1) apart
// from the bounded bin scans.
const (
	pageShift    = 16
	pageSize     = 1 << pageShift // 64 KiB
	minClassSize = 512
	maxClassSize = pageSize / 2
	classGrain   = 128
	noPage       = ^uint32(0)
)

type sizeClass struct {
	size    uint32 // bytes per object
	span    uint32 // pages per slab (1 with the current classes)
	count   uint32 // objects per slab (≤ 128)
	partial *slab  // slabs with at least one free object
}

type slab struct {
	page       uint32 // first global page
	class      uint8
	nfree      uint32
	free       [2]uint64 // bit set = object free
	prev, next *slab
}

// classes and classIndex are computed once; classIndex maps
// ceil(size/classGrain) to a class number, or -1 where a page run is used.
var (
	classes    []sizeClass
	classIndex []int8
)

func init() {
	for base := uint32(minClassSize); base <= maxClassSize; base *= 2 {
		for i := uint32(0); i < 4 && base+base/4*i <= maxClassSize; i++ {
			size := base + base/4*i
			count := min(pageSize/size, 128)
			classes = append(classes, sizeClass{size: size, span: 1, count: count})
		}
	}
	classIndex = make([]int8, maxClassSize/classGrain+1)
	c := 0
	for g := range classIndex {
		size := uint32(g) * classGrain
		for c < len(classes) && classes[c].size < size {
			c++
		}
		pages := (size + pageSize - 1) / pageSize * pageSize
		if c < len(classes) && classes[c].size < pages {
			classIndex[g] = int8(c)
		} else {
			classIndex[g] = -1
		}
	}
}

// classOf returns the class for a value of size bytes, or -1 for a page run.
func classOf(size int64) int {
	if size > maxClassSize {
		return -1
	}
	if size < 1 {
		size = 1
	}
	return int(classIndex[(size+classGrain-1)/classGrain])
}

// footprint returns the bytes a value of size bytes takes against the budget.
func footprint(size int64) int64 {
	if c := classOf(size); c >= 0 {
		return int64(classes[c].size)
	}
	if size < 1 {
		size = 1
	}
	return (size + pageSize - 1) &^ (pageSize - 1)
}

// allocator manages the global page space of all arenas.
type allocator struct {
	mu sync.Mutex

	npages     uint32 // total pages
	arenaPages uint32 // pages per arena (the last arena may have fewer)

	// Boundary tags: runLen[p] is the length of the free run starting at p
	// (0 when p starts no free run); runTail[p] is 1 + the first page of the
	// free run ending at p (0 when p ends no free run).
	runLen  []uint32
	runTail []uint32
	// Free-list links, valid at the first page of a free run.
	next, prev []uint32
	bins       [nbins]uint32 // heads, noPage when empty
	nonEmpty   [2]uint64

	classes []sizeClass
	slabs   []*slab // by global page, for pages owned by a slab

	freePages uint64
	nslabs    int
}

const nbins = 128

// binOf maps a run length in pages to its bin.
func binOf(n uint32) int {
	if n < 8 {
		return int(n)
	}
	fl := bits.Len32(n) - 1 // ≥ 3
	sl := int(n>>(fl-2)) & 3
	return 8 + (fl-3)*4 + sl
}

func newAllocator(totalBytes, arenaSize int64) (*allocator, error) {
	if totalBytes%pageSize != 0 || arenaSize%pageSize != 0 || totalBytes <= 0 || arenaSize <= 0 {
		return nil, fmt.Errorf("dram: allocator sizes %d/%d not positive multiples of %d", totalBytes, arenaSize, pageSize)
	}
	if totalBytes/pageSize >= int64(noPage) {
		return nil, fmt.Errorf("dram: capacity %d too large for the allocator", totalBytes)
	}
	n := uint32(totalBytes / pageSize)
	a := &allocator{
		npages:     n,
		arenaPages: uint32(arenaSize / pageSize),
		runLen:     make([]uint32, n),
		runTail:    make([]uint32, n),
		next:       make([]uint32, n),
		prev:       make([]uint32, n),
		slabs:      make([]*slab, n),
		classes:    append([]sizeClass(nil), classes...),
	}
	for i := range a.bins {
		a.bins[i] = noPage
	}
	for p := uint32(0); p < n; p += a.arenaPages {
		l := min(a.arenaPages, n-p)
		a.insertRun(p, l)
	}
	return a, nil
}

func (a *allocator) insertRun(p, n uint32) {
	a.runLen[p] = n
	a.runTail[p+n-1] = p + 1
	b := binOf(n)
	a.prev[p] = noPage
	a.next[p] = a.bins[b]
	if h := a.bins[b]; h != noPage {
		a.prev[h] = p
	}
	a.bins[b] = p
	a.nonEmpty[b>>6] |= 1 << (b & 63)
	a.freePages += uint64(n)
}

func (a *allocator) removeRun(p uint32) {
	n := a.runLen[p]
	b := binOf(n)
	if pv := a.prev[p]; pv != noPage {
		a.next[pv] = a.next[p]
	} else {
		a.bins[b] = a.next[p]
		if a.bins[b] == noPage {
			a.nonEmpty[b>>6] &^= 1 << (b & 63)
		}
	}
	if nx := a.next[p]; nx != noPage {
		a.prev[nx] = a.prev[p]
	}
	a.runLen[p] = 0
	a.runTail[p+n-1] = 0
	a.freePages -= uint64(n)
}

// firstBinAbove returns the first non-empty bin > b, or -1.
func (a *allocator) firstBinAbove(b int) int {
	b++
	for w := b >> 6; w < 2; w++ {
		m := a.nonEmpty[w]
		if w == b>>6 {
			m &= ^uint64(0) << (b & 63)
		}
		if m != 0 {
			return w<<6 + bits.TrailingZeros64(m)
		}
	}
	return -1
}

// allocPages returns the first page of a new run of n pages.
func (a *allocator) allocPages(n uint32) (uint32, bool) {
	if n == 0 || uint64(n) > a.freePages {
		return 0, false
	}
	b := binOf(n)
	const scan = 8
	p := a.bins[b]
	for i := 0; i < scan && p != noPage; i++ {
		if a.runLen[p] >= n {
			return a.take(p, n), true
		}
		p = a.next[p]
	}
	if ab := a.firstBinAbove(b); ab >= 0 {
		return a.take(a.bins[ab], n), true
	}
	for ; p != noPage; p = a.next[p] {
		if a.runLen[p] >= n {
			return a.take(p, n), true
		}
	}
	return 0, false
}

func (a *allocator) take(p, n uint32) uint32 {
	l := a.runLen[p]
	a.removeRun(p)
	if l > n {
		a.insertRun(p+n, l-n)
	}
	return p
}

func (a *allocator) freePagesRun(p, n uint32) {
	start, length := p, n
	if p%a.arenaPages != 0 {
		if t := a.runTail[p-1]; t != 0 {
			ls := t - 1
			length += a.runLen[ls]
			a.removeRun(ls)
			start = ls
		}
	}
	if e := p + n; e < a.npages && e%a.arenaPages != 0 {
		if el := a.runLen[e]; el != 0 {
			a.removeRun(e)
			length += el
		}
	}
	a.insertRun(start, length)
}

// alloc reserves room for a value of size bytes and returns its global
// offset; ok is false when no room is left.
func (a *allocator) alloc(size int64) (off int64, ok bool) {
	c := classOf(size)
	a.mu.Lock()
	defer a.mu.Unlock()
	if c < 0 {
		p, ok := a.allocPages(uint32((footprint(size)) >> pageShift))
		return int64(p) << pageShift, ok
	}
	cl := &a.classes[c]
	s := cl.partial
	if s == nil {
		p, ok := a.allocPages(cl.span)
		if !ok {
			return 0, false
		}
		s = &slab{page: p, class: uint8(c), nfree: cl.count}
		for i := uint32(0); i < cl.count; i++ {
			s.free[i>>6] |= 1 << (i & 63)
		}
		for i := uint32(0); i < cl.span; i++ {
			a.slabs[p+i] = s
		}
		a.pushPartial(cl, s)
		a.nslabs++
	}
	w := 0
	if s.free[0] == 0 {
		w = 1
	}
	i := uint32(w<<6 + bits.TrailingZeros64(s.free[w]))
	s.free[w] &^= 1 << (i & 63)
	s.nfree--
	if s.nfree == 0 {
		a.removePartial(cl, s)
	}
	return int64(s.page)<<pageShift + int64(i)*int64(cl.size), true
}

// free returns the room of a value of size bytes at off.
func (a *allocator) free(off, size int64) {
	c := classOf(size)
	a.mu.Lock()
	defer a.mu.Unlock()
	p := uint32(off >> pageShift)
	if c < 0 {
		a.freePagesRun(p, uint32(footprint(size)>>pageShift))
		return
	}
	cl := &a.classes[c]
	s := a.slabs[p]
	if s == nil || int(s.class) != c {
		panic(fmt.Sprintf("dram: free of %d bytes at %d outside a slab of its class", size, off))
	}
	i := uint32((off - int64(s.page)<<pageShift) / int64(cl.size))
	if s.free[i>>6]&(1<<(i&63)) != 0 {
		panic(fmt.Sprintf("dram: double free at %d", off))
	}
	s.free[i>>6] |= 1 << (i & 63)
	s.nfree++
	switch s.nfree {
	case cl.count:
		if cl.count > 1 {
			a.removePartial(cl, s)
		}
		for j := uint32(0); j < cl.span; j++ {
			a.slabs[s.page+j] = nil
		}
		a.freePagesRun(s.page, cl.span)
		a.nslabs--
	case 1:
		a.pushPartial(cl, s)
	}
}

func (a *allocator) pushPartial(cl *sizeClass, s *slab) {
	s.prev = nil
	s.next = cl.partial
	if cl.partial != nil {
		cl.partial.prev = s
	}
	cl.partial = s
}

func (a *allocator) removePartial(cl *sizeClass, s *slab) {
	if s.prev != nil {
		s.prev.next = s.next
	} else {
		cl.partial = s.next
	}
	if s.next != nil {
		s.next.prev = s.prev
	}
	s.prev, s.next = nil, nil
}

// allocStats is a snapshot of the allocator.
type allocStats struct {
	FreePages  uint64
	TotalPages uint64
	Slabs      int
	// LargestFree is the longest free run, in pages.
	LargestFree uint32
}

func (a *allocator) stats() allocStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := allocStats{FreePages: a.freePages, TotalPages: uint64(a.npages), Slabs: a.nslabs}
	if b := a.firstBinAbove(-1); b >= 0 {
		// The largest run is in the highest non-empty bin.
		for hb := nbins - 1; hb >= 0; hb-- {
			if a.nonEmpty[hb>>6]&(1<<(hb&63)) != 0 {
				for p := a.bins[hb]; p != noPage; p = a.next[p] {
					st.LargestFree = max(st.LargestFree, a.runLen[p])
				}
				break
			}
		}
	}
	return st
}
