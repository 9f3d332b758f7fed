package client

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/tidepool-kv/tidepool/internal/crc32c"
	"github.com/tidepool-kv/tidepool/internal/pkey"
)

// WriteMode says how PutFrom writes a reserved slot.
type WriteMode int

const (
	// WritePwrite copies with pwrite(2) on the arena file, after
	// checksumming the source (what WriteKeyed falls back to without
	// protection keys: it writes nothing outside the slot and needs no
	// writable mapping).
	WritePwrite WriteMode = iota
	// WriteMapped keeps a read-write MAP_SHARED mapping of each whole arena
	// and copies into the slot with the checksum fused in (the fastest).
	// The process then has every arena mapped writable, so a stray write
	// of its own can damage other blocks: the trust is that of the
	// read-write descriptor the other modes hold, with less margin.
	WriteMapped
	// WriteKeyed keeps a read-write MAP_SHARED mapping of each arena
	// whose pages carry a memory protection key (x86 PKU) that denies
	// every thread access to them, and copies into a slot with the
	// checksum fused in on a thread that allows itself access for the
	// copy alone (internal/pkey): as fast as WriteMapped, and a stray
	// write of the process to an arena faults, as with the read-only
	// mappings. The default. Where the CPU or kernel has no protection
	// keys, or none is free, PutFrom writes with pwrite instead.
	WriteKeyed
)

// writeKey is the process's protection key for WriteKeyed, allocated on
// first use; every client shares it (a process has 15).
var writeKey struct {
	once sync.Once
	k    pkey.Key
	err  error
}

// keyForWrites returns the process's key (a variable: tests take the
// keys away).
var keyForWrites = func() (pkey.Key, error) {
	writeKey.once.Do(func() { writeKey.k, writeKey.err = pkey.Alloc() })
	return writeKey.k, writeKey.err
}

// writable returns the read-write mapping of the whole arena.
func (a *arenaMap) writable() ([]byte, error) {
	a.wonce.Do(func() {
		a.wmem, a.werr = syscall.Mmap(int(a.rw.Fd()), 0, int(a.size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
		if a.werr != nil {
			a.werr = fmt.Errorf("tidepool: zero-copy: mmap %s writable: %w", a.path, a.werr)
		}
	})
	return a.wmem, a.werr
}

// keyed returns the mapping of WriteKeyed and its key.
func (a *arenaMap) keyed() ([]byte, pkey.Key, error) {
	k, err := keyForWrites()
	if err != nil {
		return nil, 0, err
	}
	a.konce.Do(func() {
		mem, err := syscall.Mmap(int(a.rw.Fd()), 0, int(a.size), syscall.PROT_NONE, syscall.MAP_SHARED)
		if err == nil {
			// Tagged before it is writable: no moment without the key.
			if err = k.Protect(mem, syscall.PROT_READ|syscall.PROT_WRITE); err != nil {
				syscall.Munmap(mem)
			}
		}
		if err != nil {
			a.kerr = fmt.Errorf("tidepool: zero-copy: mmap %s keyed: %w", a.path, err)
			return
		}
		a.kmem = mem
		a.kfilled = make([]atomic.Bool, (a.size+fillChunk-1)/fillChunk)
	})
	return a.kmem, k, a.kerr
}

// fillChunk is the stretch of a keyed mapping whose page table fill fills
// at once, at the first write into it.
const fillChunk = 2 << 20

// madvPopulateWrite is MADV_POPULATE_WRITE (Linux ≥ 5.14): fault the range
// in, writable, now.
const madvPopulateWrite = 23

// fill faults in the fillChunks of the keyed mapping that [off, off+n)
// touches and no write touched before, one madvise each: a write fault per
// 4 KiB page costs about twice as much as the kernel filling the page table
// in one call (the first pass of a process through the arenas). It runs
// inside the key's Write: the kernel checks the caller's access rights as
// it faults the pages in. Two writers may fill one chunk at once; harmless.
func (a *arenaMap) fill(off, n int64) {
	if n <= 0 || a.knofill.Load() {
		return
	}
	for i := off / fillChunk; i <= (off+n-1)/fillChunk; i++ {
		if a.kfilled[i].Load() {
			continue
		}
		start := i * fillChunk
		if err := syscall.Madvise(a.kmem[start:min(start+fillChunk, a.size)], madvPopulateWrite); err != nil {
			a.knofill.Store(true) // EINVAL before 5.14
			return
		}
		a.kfilled[i].Store(true)
	}
}

// SetWriteMode chooses how PutFrom writes slots (benchmarks compare them).
// The default is WriteKeyed, which writes with pwrite where the machine
// has no protection keys.
func (c *Client) SetWriteMode(m WriteMode) {
	c.zc.mode.Store(int32(m))
}

// writeSlot writes buf into a reserved slot and returns its CRC-32C.
func (c *Client) writeSlot(arenas []*arenaMap, s Slot, buf []byte) (uint32, error) {
	if _, err := view(arenas, s); err != nil {
		return 0, err
	}
	a := arenas[s.Arena]
	switch WriteMode(c.zc.mode.Load()) {
	case WriteMapped:
		mem, err := a.writable()
		if err != nil {
			return 0, err
		}
		return crc32c.Copy(mem[s.Offset:s.Offset+s.Length], buf), nil
	case WriteKeyed:
		if mem, k, err := a.keyed(); err == nil {
			var crc uint32
			k.Write(func() {
				a.fill(s.Offset, s.Length)
				crc = crc32c.Copy(mem[s.Offset:s.Offset+s.Length], buf)
			})
			return crc, nil
		} else if !errors.Is(err, pkey.ErrUnsupported) {
			return 0, err
		}
		// No protection keys: pwrite.
	}
	// A piece at a time: pwrite copies it (reading buf from memory), then
	// the checksum reads it again from cache. Checksumming the whole of buf
	// first read it twice from memory (a 1 MiB CRC-32C from memory runs at
	// a third of its speed from cache).
	var crc uint32
	for off := int64(0); off < int64(len(buf)); off += pwriteChunk {
		p := buf[off:min(off+pwriteChunk, int64(len(buf)))]
		if _, err := a.rw.WriteAt(p, s.Offset+off); err != nil {
			return 0, fmt.Errorf("tidepool: zero-copy: write slot: %w", err)
		}
		crc = crc32c.Update(crc, p)
	}
	return crc, nil
}

// pwriteChunk is the piece writeSlot writes with one pwrite before it
// checksums it: small enough to stay in the L2 cache, large enough that
// the syscalls cost little (8 per MiB).
const pwriteChunk = 128 << 10
