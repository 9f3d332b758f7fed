// Package region is the registered-memory table shared by the transports in
// rdma/: ids, keys, bounds checks, and a per-region lock so that Deregister
// waits for in-flight accesses.
package region

import (
	crand "crypto/rand"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/tidepool-kv/tidepool/rdma"
)

// entry is one registered region. Accessors hold mu for reading while they
// touch buf; Deregister holds it for writing to wait them out.
type entry struct {
	mu   sync.RWMutex
	buf  []byte
	key  uint32
	base uint64 // the region's address (RegionDesc.Addr): remote offsets are sent as base+off
	dead bool   // set under mu (write) by Deregister
}

// Table maps region ids to registered memory. Safe for concurrent use.
// Lock order: Table.mu, then entry.mu (Deregister); accessors take only
// entry.mu after a lookup under Table.mu (read) that they release first.
type Table struct {
	mu    sync.RWMutex
	m     map[rdma.RegionID]*entry
	next  atomic.Uint64
	bytes atomic.Uint64
	keys  func() uint32
	ids   func() uint64 // nil: sequential
	bases func() uint64 // nil: 0
}

// NewTable returns an empty table whose region ids, keys and addresses
// (bases) are drawn from crypto/rand. Remote access names a byte as (id,
// key, base+offset), like verbs' (rkey, virtual address): a peer that was
// not told the descriptor must guess 64 id bits, 32 key bits and the base
// (64 bits less log2 of the region's length: a 4 GiB region leaves 32), so
// at least 128 bits for any region up to 4 GiB.
func NewTable() *Table {
	t := NewTableWithKeys(func() uint32 { return uint32(randUint64()) })
	t.ids, t.bases = randUint64, randUint64
	return t
}

// NewTableWithKeys returns an empty table with sequential ids and zero
// bases, drawing region keys from keys (a test seam: fuzzers need
// predictable names).
func NewTableWithKeys(keys func() uint32) *Table {
	return &Table{m: make(map[rdma.RegionID]*entry), keys: keys}
}

func randUint64() uint64 {
	var b [8]byte
	if _, err := crand.Read(b[:]); err != nil {
		panic("region: crypto/rand: " + err.Error()) // never fails on Linux
	}
	return binary.LittleEndian.Uint64(b[:])
}

// Register adds buf and returns its descriptor.
func (t *Table) Register(buf []byte) (rdma.RegionDesc, error) {
	if buf == nil {
		return rdma.RegionDesc{}, fmt.Errorf("rdma: register a nil buffer")
	}
	e := &entry{buf: buf, key: t.keys()}
	if t.bases != nil {
		e.base = t.bases()
	}
	t.mu.Lock()
	id := rdma.RegionID(t.next.Add(1))
	if t.ids != nil {
		for {
			id = rdma.RegionID(t.ids())
			if _, taken := t.m[id]; !taken && id != 0 {
				break
			}
		}
	}
	t.m[id] = e
	t.mu.Unlock()
	t.bytes.Add(uint64(len(buf)))
	return rdma.RegionDesc{ID: id, Len: uint64(len(buf)), Key: e.key, Addr: e.base}, nil
}

// RegisterAs adds buf under a descriptor drawn elsewhere: a transport that
// serves the same memory under the same names as another one (rdma/auto
// registers each arena with tcp, then with verbs under tcp's descriptor).
func (t *Table) RegisterAs(buf []byte, d rdma.RegionDesc) error {
	if buf == nil || uint64(len(buf)) != d.Len {
		return fmt.Errorf("rdma: register %d bytes as a region of %d", len(buf), d.Len)
	}
	t.mu.Lock()
	if _, taken := t.m[d.ID]; taken || d.ID == 0 {
		t.mu.Unlock()
		return fmt.Errorf("rdma: region id %d is zero or taken", d.ID)
	}
	t.m[d.ID] = &entry{buf: buf, key: d.Key, base: d.Addr}
	t.mu.Unlock()
	t.bytes.Add(uint64(len(buf)))
	return nil
}

// Deregister removes id, waiting for in-flight accesses to finish.
func (t *Table) Deregister(id rdma.RegionID) error {
	t.mu.Lock()
	e, ok := t.m[id]
	delete(t.m, id)
	t.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %d", rdma.ErrUnknownRegion, id)
	}
	e.mu.Lock()
	e.dead = true
	n := len(e.buf)
	e.buf = nil
	e.mu.Unlock()
	t.bytes.Add(^uint64(n - 1))
	return nil
}

// Len returns the number of regions and their total bytes.
func (t *Table) Len() (int, uint64) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.m), t.bytes.Load()
}

// Span is a pinned range of a region. Release it exactly once.
type Span struct {
	B []byte
	e *entry
}

// Release unpins the span.
func (s Span) Release() {
	if s.e != nil {
		s.e.mu.RUnlock()
	}
}

// Acquire pins n bytes of region id and returns them. Local access
// (checkKey false) names them by offset; remote access (checkKey set) by
// address, the region's base (RegionDesc.Addr) plus the offset, and the
// key must match. The caller must Release the span.
func (t *Table) Acquire(id rdma.RegionID, key uint32, checkKey bool, off, n uint64) (Span, error) {
	t.mu.RLock()
	e, ok := t.m[id]
	t.mu.RUnlock()
	if !ok || (checkKey && e.key != key) {
		return Span{}, fmt.Errorf("%w: %d", rdma.ErrUnknownRegion, id)
	}
	e.mu.RLock()
	if e.dead {
		e.mu.RUnlock()
		return Span{}, fmt.Errorf("%w: %d", rdma.ErrUnknownRegion, id)
	}
	if checkKey {
		off -= e.base
		if rdma.CheckRange(uint64(len(e.buf)), off, n) != nil {
			// Not the offset: it would tell a guesser the base.
			e.mu.RUnlock()
			return Span{}, fmt.Errorf("region %d: %w: %d bytes outside the region", id, rdma.ErrOutOfRange, n)
		}
	}
	if err := rdma.CheckRange(uint64(len(e.buf)), off, n); err != nil {
		e.mu.RUnlock()
		return Span{}, fmt.Errorf("region %d: %w", id, err)
	}
	return Span{B: e.buf[off : off+n : off+n], e: e}, nil
}

// Check validates a range without pinning it.
func (t *Table) Check(id rdma.RegionID, key uint32, checkKey bool, off, n uint64) error {
	s, err := t.Acquire(id, key, checkKey, off, n)
	if err == nil {
		s.Release()
	}
	return err
}
