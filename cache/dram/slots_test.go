//go:build linux

package dram

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tidepool-kv/tidepool/cache"
)

// slotReader reads a slot index file as a reader in another process would:
// its own read-only mapping, by the layout documented in slots.go, nothing
// of the tier's code.
type slotReader struct {
	mem       []byte
	n         uint64
	window    uint64
	arenaSize int64
}

func openSlotReader(t *testing.T, path string) *slotReader {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	if string(mem[:8]) != "TPSLOTS1" || binary.LittleEndian.Uint32(mem[8:]) != 1 || binary.LittleEndian.Uint32(mem[12:]) != 32 {
		t.Fatalf("header %q", mem[:16])
	}
	r := &slotReader{mem: mem, n: binary.LittleEndian.Uint64(mem[16:]), window: uint64(binary.LittleEndian.Uint32(mem[24:])),
		arenaSize: int64(binary.LittleEndian.Uint64(mem[32:]))}
	if r.n == 0 || r.n&(r.n-1) != 0 || int64(64+r.n*32) != st.Size() {
		t.Fatalf("%d entries in a file of %d bytes", r.n, st.Size())
	}
	return r
}

type slotFound struct {
	entry, seq     uint64
	arena          int
	offset, length int64
}

func (r *slotReader) u64(e uint64, i int) uint64 {
	return binary.LittleEndian.Uint64(r.mem[64+e*32+uint64(i)*8:])
}

// find returns where (ns, key) lies, by the reader's protocol: seq even
// and the same before and after the entry is read.
func (r *slotReader) find(ns, key string) (slotFound, bool) {
	sum := sha256.Sum256(append(append([]byte(ns), 0), key...))
	tag := binary.LittleEndian.Uint64(sum[:8])
	if tag == 0 {
		tag = 1
	}
	for i := uint64(0); i < r.window; i++ {
		e := (tag + i) & (r.n - 1)
		s1 := r.u64(e, 0)
		if s1&1 != 0 || r.u64(e, 1) != tag {
			continue
		}
		off, length := r.u64(e, 2), r.u64(e, 3)
		if r.u64(e, 0) != s1 {
			continue
		}
		return slotFound{entry: e, seq: s1, arena: int(int64(off) / r.arenaSize), offset: int64(off) % r.arenaSize,
			length: int64(length)}, true
	}
	return slotFound{}, false
}

func (r *slotReader) unchanged(f slotFound) bool { return r.u64(f.entry, 0) == f.seq }

func TestSlotIndexFindsEveryBlock(t *testing.T) {
	cfg, _ := testConfig(t, 16<<20)
	tr := newTier(t, cfg)
	path := tr.SlotIndexPath()
	if path == "" {
		t.Fatal("no slot index")
	}
	r := openSlotReader(t, path)
	arenas := tr.Arenas()
	read := func(f slotFound) []byte {
		b, err := os.ReadFile(arenas[f.arena].Path)
		if err != nil {
			t.Fatal(err)
		}
		return b[f.offset : f.offset+f.length]
	}
	for i := range 40 {
		key := fmt.Sprintf("k%d", i)
		if _, err := tr.Put(ctx, "ns", []byte(key), pattern(key, 100_000+i), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 40 {
		key := fmt.Sprintf("k%d", i)
		f, ok := r.find("ns", key)
		if !ok {
			t.Fatalf("%s not indexed", key)
		}
		if !bytes.Equal(read(f), pattern(key, 100_000+i)) {
			t.Fatalf("%s: the slot indexed holds other bytes", key)
		}
		if _, ok := r.find("other", key); ok {
			t.Fatalf("%s found under another namespace", key)
		}
	}
	// Delete: the entry goes, and a reader that found it before sees it
	// changed.
	f, _ := r.find("ns", "k3")
	if ok, err := tr.Delete(ctx, "ns", []byte("k3")); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if _, ok := r.find("ns", "k3"); ok {
		t.Fatal("deleted block still indexed")
	}
	if r.unchanged(f) {
		t.Fatal("a reader of the deleted block sees its entry unchanged")
	}
	// Eviction: 16 MiB hold ~160 values of 100 KB; 400 more evict the
	// first ones, and every block indexed is one the tier holds, where
	// the index says.
	for i := range 400 {
		key := fmt.Sprintf("e%d", i)
		if _, err := tr.Put(ctx, "ns", []byte(key), pattern(key, 100_000), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	indexed := 0
	for i := range 400 {
		key := fmt.Sprintf("e%d", i)
		_, held := tr.Stat(ctx, "ns", []byte(key))
		f, ok := r.find("ns", key)
		if ok != held {
			t.Fatalf("%s: held %v, indexed %v", key, held, ok)
		}
		if ok {
			indexed++
			if !bytes.Equal(read(f), pattern(key, 100_000)) {
				t.Fatalf("%s: the slot indexed holds other bytes", key)
			}
		}
	}
	if indexed == 0 || indexed == 400 {
		t.Fatalf("%d of 400 indexed after evictions", indexed)
	}
	if st := tr.SlotIndexStats(); st.Entries != tr.Stats().Tiers[0].Blocks || st.Unindexed != 0 || st.Capacity < 4096 {
		t.Fatalf("slot index stats %+v with %d blocks held", st, tr.Stats().Tiers[0].Blocks)
	}
	if _, err := tr.Clear(ctx, "ns"); err != nil {
		t.Fatal(err)
	}
	for i := range 400 {
		if _, ok := r.find("ns", fmt.Sprintf("e%d", i)); ok {
			t.Fatal("cleared block still indexed")
		}
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("slot index left after Close: %v", err)
	}
}

// TestSlotIndexUnderChurn reads the index while blocks are stored, evicted
// and deleted: whatever a reader finds and then sees unchanged after
// reading the slot is the value of that key.
func TestSlotIndexUnderChurn(t *testing.T) {
	cfg, _ := testConfig(t, 8<<20)
	tr := newTier(t, cfg)
	r := openSlotReader(t, tr.SlotIndexPath())
	var maps [][]byte
	for _, a := range tr.Arenas() {
		f, err := os.Open(a.Path)
		if err != nil {
			t.Fatal(err)
		}
		m, err := unix.Mmap(int(f.Fd()), 0, int(a.Size), unix.PROT_READ, unix.MAP_SHARED)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		maps = append(maps, m)
		t.Cleanup(func() { unix.Munmap(m) })
	}
	const keys, size = 200, 64 << 10
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			key := fmt.Sprintf("c%d", i%keys)
			if i%7 == 0 {
				tr.Delete(ctx, "ns", []byte(key))
				continue
			}
			tr.Put(ctx, "ns", []byte(key), pattern(key, size), cache.PutOptions{})
		}
	}()
	checked, changed := 0, 0
	buf := make([]byte, size)
	for round := 0; checked < 4000 && round < 400000; round++ {
		key := fmt.Sprintf("c%d", round%keys)
		f, ok := r.find("ns", key)
		if !ok {
			continue
		}
		if f.length != size {
			t.Fatalf("%s: length %d", key, f.length)
		}
		copy(buf, maps[f.arena][f.offset:f.offset+f.length])
		if !r.unchanged(f) {
			changed++
			continue
		}
		checked++
		if !bytes.Equal(buf, pattern(key, size)) {
			close(stop)
			wg.Wait()
			t.Fatalf("%s: bytes read through an unchanged entry are not its value", key)
		}
	}
	close(stop)
	wg.Wait()
	if checked == 0 {
		t.Fatal("no read checked")
	}
	t.Logf("%d reads checked, %d saw their entry change", checked, changed)
}
