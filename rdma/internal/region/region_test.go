package region

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/rdma"
)

func TestTable(t *testing.T) {
	tb := NewTableWithKeys(func() uint32 { return 7 })
	buf := make([]byte, 100)
	d, err := tb.Register(buf)
	if err != nil || d.Len != 100 || d.Key != 7 || d.ID == 0 {
		t.Fatalf("Register = %+v, %v", d, err)
	}
	if _, err := tb.Register(nil); err == nil {
		t.Fatal("nil buffer registered")
	}
	tests := []struct {
		name     string
		id       rdma.RegionID
		key      uint32
		checkKey bool
		off, n   uint64
		want     error
	}{
		{"whole", d.ID, 7, true, 0, 100, nil},
		{"empty at end", d.ID, 7, true, 100, 0, nil},
		{"local ignores key", d.ID, 1, false, 10, 10, nil},
		{"wrong key", d.ID, 8, true, 0, 1, rdma.ErrUnknownRegion},
		{"unknown id", d.ID + 1, 7, true, 0, 1, rdma.ErrUnknownRegion},
		{"past end", d.ID, 7, true, 90, 11, rdma.ErrOutOfRange},
		{"offset past end", d.ID, 7, true, 101, 0, rdma.ErrOutOfRange},
		{"overflow", d.ID, 7, true, 1, ^uint64(0), rdma.ErrOutOfRange},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := tb.Acquire(tt.id, tt.key, tt.checkKey, tt.off, tt.n)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Acquire: %v, want %v", err, tt.want)
			}
			if err == nil {
				if uint64(len(s.B)) != tt.n || uint64(cap(s.B)) != tt.n {
					t.Fatalf("span len %d cap %d, want %d", len(s.B), cap(s.B), tt.n)
				}
				s.Release()
			}
		})
	}
	if n, b := tb.Len(); n != 1 || b != 100 {
		t.Fatalf("Len = %d, %d", n, b)
	}
}

func TestDeregisterWaitsForSpans(t *testing.T) {
	tb := NewTable()
	d, _ := tb.Register(make([]byte, 10))
	s, err := tb.Acquire(d.ID, d.Key, true, d.Addr, 10) // remote access: by address
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- tb.Deregister(d.ID) }()
	select {
	case err := <-done:
		t.Fatalf("Deregister returned (%v) while a span was pinned", err)
	case <-time.After(50 * time.Millisecond): // bounded negative check
	}
	s.Release()
	if err := <-done; err != nil {
		t.Fatalf("Deregister: %v", err)
	}
	if _, err := tb.Acquire(d.ID, d.Key, true, d.Addr, 1); !errors.Is(err, rdma.ErrUnknownRegion) {
		t.Fatalf("Acquire after Deregister: %v", err)
	}
	if err := tb.Deregister(d.ID); !errors.Is(err, rdma.ErrUnknownRegion) {
		t.Fatalf("second Deregister: %v", err)
	}
	if n, b := tb.Len(); n != 0 || b != 0 {
		t.Fatalf("Len after Deregister = %d, %d", n, b)
	}
}

// TestRegionNamesAreUnguessable: NewTable names regions with random 64-bit
// ids (not a counter a peer could walk) and random keys, all distinct.
func TestRegionNamesAreUnguessable(t *testing.T) {
	tb := NewTable()
	ids := map[rdma.RegionID]bool{}
	var high, keys int
	for i := 0; i < 64; i++ {
		d, err := tb.Register(make([]byte, 1))
		if err != nil {
			t.Fatal(err)
		}
		if ids[d.ID] || d.ID == 0 {
			t.Fatalf("id %d repeated or zero", d.ID)
		}
		ids[d.ID] = true
		if d.ID > 1<<32 {
			high++
		}
		if d.Key != 0 {
			keys++
		}
	}
	// A counter would give 1..64; random ids are above 2^32 with
	// probability 1-2^-32 each.
	if high < 60 || keys < 60 {
		t.Fatalf("%d of 64 ids above 2^32, %d non-zero keys: not random", high, keys)
	}
}

// TestRemoteAccessByAddress: remote access names bytes by the region's
// random base plus the offset; the offset alone (a guess without the base)
// is out of range, and the error does not reveal the base.
func TestRemoteAccessByAddress(t *testing.T) {
	tb := NewTable()
	buf := []byte("0123456789")
	d, err := tb.Register(buf)
	if err != nil {
		t.Fatal(err)
	}
	if d.Addr == 0 {
		t.Fatal("no base drawn")
	}
	s, err := tb.Acquire(d.ID, d.Key, true, d.Addr+3, 4)
	if err != nil || string(s.B) != "3456" {
		t.Fatalf("remote access at base+3: %q %v", s.B, err)
	}
	s.Release()
	if s, err := tb.Acquire(d.ID, 0, false, 3, 4); err != nil || string(s.B) != "3456" {
		t.Fatalf("local access at 3: %q %v", s.B, err)
	} else {
		s.Release()
	}
	_, err = tb.Acquire(d.ID, d.Key, true, 3, 4)
	if !errors.Is(err, rdma.ErrOutOfRange) {
		t.Fatalf("remote access without the base: %v, want ErrOutOfRange", err)
	}
	if strings.Contains(err.Error(), fmt.Sprint(3-d.Addr)) {
		t.Fatalf("error %q reveals the base", err)
	}
}
