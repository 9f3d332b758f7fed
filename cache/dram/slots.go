//go:build linux

package dram

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The slot index is a table in a file beside the arenas that tells a
// process mapping both where each block the tier holds lies, without a
// call: an engine on the same node finds a block's slot, copies its bytes
// out of the arena and then checks that the entry did not change meanwhile
// (docs/zerocopy.md, "Reads without a call"). The tier writes it; readers
// map it read-only.
//
// Layout (little-endian): a 64-byte header, then Entries entries of 32
// bytes:
//
//	header: magic "TPSLOTS1", version u32 (1), entry size u32 (32),
//	        entries u64 (a power of two), window u32 (8), 0 u32,
//	        arena size u64 (a slot's arena is offset / arena size)
//	entry:  seq u64, tag u64, global offset u64, length u64
//
// tag is the first 8 bytes of SHA-256(namespace || 0x00 || key) (1 when
// those are 0; 0 marks an empty entry). A block's entry is one of the
// window entries from tag mod entries on (wrapping); a block that finds
// none free is not indexed (readers then ask the sidecar). seq is even
// when the entry is stable and odd while the tier rewrites it; every
// change adds 2 in all. The tier clears a block's entry before the
// block's memory can hold anything else, so a reader that read seq, then
// the entry, then the bytes, and then seq again unchanged read the
// block's bytes (on x86-64, whose loads are not reordered with older
// loads; elsewhere a reader needs acquire loads).
const (
	slotsFile     = "slots.idx"
	slotsMagic    = "TPSLOTS1"
	slotsVersion  = 1
	slotsHeader   = 64
	slotEntry     = 32
	slotsWindow   = 8
	slotsPerBytes = 32 << 10 // an entry per 32 KiB of capacity
	slotsMin      = 4096
	slotsMax      = 1 << 20 // 32 MiB: within the 64 MiB the injector adds to the arena volume
)

// slotIndex is the tier's writer of the table. Every change happens under
// mu (the callers hold a shard lock, one of many).
type slotIndex struct {
	path      string
	f         *os.File
	mem       []byte
	mask      uint64
	arenaSize int64

	mu      sync.Mutex
	entries atomic.Int64 // entries in use
	full    atomic.Int64 // blocks not indexed: their window was full
}

// SlotIndexStats is a snapshot of the slot index's counters.
type SlotIndexStats struct {
	Capacity  int64 // entries in the table
	Entries   int64 // blocks indexed now
	Unindexed int64 // blocks linked but not indexed: every entry of their window was taken
}

// SlotIndexStats returns the slot index's counters (zero when the tier
// has none).
func (t *Tier) SlotIndexStats() SlotIndexStats {
	s := t.slots
	if s == nil {
		return SlotIndexStats{}
	}
	return SlotIndexStats{Capacity: int64(s.mask + 1), Entries: s.entries.Load(), Unindexed: s.full.Load()}
}

// slotEntries is the table size for a tier of capacity bytes.
func slotEntries(capacity int64) uint64 {
	n := uint64(max(capacity/slotsPerBytes, slotsMin))
	n = 1 << (64 - bits.LeadingZeros64(n-1))
	return min(n, slotsMax)
}

// openSlotIndex creates the table file in dir (replacing one left by an
// earlier run) and maps it.
func openSlotIndex(dir string, capacity, arenaSize int64) (*slotIndex, error) {
	path := filepath.Join(dir, slotsFile)
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("dram: remove stale slot index: %w", err)
	}
	n := slotEntries(capacity)
	size := int64(slotsHeader) + int64(n)*slotEntry
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("dram: create slot index: %w", err)
	}
	fail := func(err error) (*slotIndex, error) {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	// Reserved as the arenas are: on a full tmpfs this fails now, not as
	// SIGBUS at the first write into the mapping.
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		if !errors.Is(err, unix.EOPNOTSUPP) {
			return fail(fmt.Errorf("dram: reserve %d bytes for the slot index: %w", size, err))
		}
		if err := f.Truncate(size); err != nil {
			return fail(fmt.Errorf("dram: size slot index: %w", err))
		}
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("dram: mmap slot index: %w", err))
	}
	copy(mem, slotsMagic)
	binary.LittleEndian.PutUint32(mem[8:], slotsVersion)
	binary.LittleEndian.PutUint32(mem[12:], slotEntry)
	binary.LittleEndian.PutUint64(mem[16:], n)
	binary.LittleEndian.PutUint32(mem[24:], slotsWindow)
	binary.LittleEndian.PutUint64(mem[32:], uint64(arenaSize))
	return &slotIndex{path: path, f: f, mem: mem, mask: n - 1, arenaSize: arenaSize}, nil
}

// slotTag is a block's tag (see the layout above).
func slotTag(ns, key string) uint64 {
	h := sha256.New()
	h.Write([]byte(ns))
	h.Write([]byte{0})
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	t := binary.LittleEndian.Uint64(h.Sum(sum[:0]))
	if t == 0 {
		t = 1
	}
	return t
}

// word returns the i-th u64 of entry e.
func (s *slotIndex) word(e uint64, i int) *uint64 {
	return (*uint64)(unsafe.Pointer(&s.mem[slotsHeader+e*slotEntry+uint64(i)*8]))
}

// set rewrites entry e, seq odd throughout.
func (s *slotIndex) set(e, tag, off, length uint64) {
	seq := s.word(e, 0)
	atomic.AddUint64(seq, 1)
	atomic.StoreUint64(s.word(e, 1), tag)
	atomic.StoreUint64(s.word(e, 2), off)
	atomic.StoreUint64(s.word(e, 3), length)
	atomic.AddUint64(seq, 1)
}

// probe returns, in tag's window, the entry holding (tag, off) and the
// first free entry; ^0 for either when there is none. s.mu held.
func (s *slotIndex) probe(tag, off uint64) (match, free uint64) {
	match, free = ^uint64(0), ^uint64(0)
	for i := uint64(0); i < slotsWindow; i++ {
		e := (tag + i) & s.mask
		switch atomic.LoadUint64(s.word(e, 1)) {
		case tag:
			if match == ^uint64(0) && atomic.LoadUint64(s.word(e, 2)) == off {
				match = e
			}
		case 0:
			if free == ^uint64(0) {
				free = e
			}
		}
	}
	return match, free
}

// add indexes block b (just linked).
func (s *slotIndex) add(b *block) { s.update(b, true) }

// remove clears block b's entry (b is being unlinked; its memory is not
// yet free).
func (s *slotIndex) remove(b *block) { s.update(b, false) }

// update adds (present) or clears block b's entry.
func (s *slotIndex) update(b *block, present bool) {
	if s == nil {
		return
	}
	tag := slotTag(b.ns.name, b.key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mem == nil {
		return
	}
	match, free := s.probe(tag, uint64(b.off))
	switch {
	case !present:
		if match != ^uint64(0) {
			s.set(match, 0, 0, 0)
			s.entries.Add(-1)
		}
	case match != ^uint64(0):
	case free == ^uint64(0):
		s.full.Add(1)
	default:
		s.set(free, tag, uint64(b.off), uint64(b.size))
		s.entries.Add(1)
	}
}

// close unmaps the table and removes its file: readers see it gone.
func (s *slotIndex) close() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if s.mem != nil {
		err = unix.Munmap(s.mem)
		s.mem = nil
	}
	if e := s.f.Close(); err == nil {
		err = e
	}
	if e := os.Remove(s.path); err == nil && !os.IsNotExist(e) {
		err = e
	}
	return err
}
