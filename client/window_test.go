//go:build linux

package client_test

import (
	"context"
	"os"
	"testing"

	"github.com/tidepool-kv/tidepool/client"
)

// TestWriteMmapWindows: with WriteMmap, concurrent PutFroms of values that
// share pages (small ones, packed in slabs) and of large ones write the
// right bytes, and afterwards every page of the client's mapping is
// read-only again: a write through it faults.
func TestWriteMmapWindows(t *testing.T) {
	dir, err := os.MkdirTemp("/dev/shm", "tpwin")
	if err != nil {
		t.Skip("no /dev/shm:", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	runSidecar(t, dir, 64<<20)
	c, err := client.New(dir + "/tp.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetWriteMode(client.WriteMmap)
	ctx := context.Background()
	vals := slotValues(8, 14)
	if err := putConcurrently(ctx, c, 8, vals); err != nil {
		t.Fatal(err)
	}
	checkGetInto(t, c, vals)
	mems, open := client.WriteWindows(c)
	if open != 0 {
		t.Fatalf("%d shared pages still counted open", open)
	}
	tried, faulted := 0, 0
	for _, mem := range mems {
		for off := 0; off < len(mem); off += 4096 * 7 {
			tried++
			if writeFaults(mem, off) {
				faulted++
			}
		}
	}
	if tried == 0 || faulted != tried {
		t.Fatalf("%d of %d writes through the mapping faulted, want all", faulted, tried)
	}
}

// TestWriteMmapSharedPage: two windows that share a page (the end of one
// slot, the start of the next): the page stays writable until both are
// closed, and the pages of each slot alone are read-only once it closes.
func TestWriteMmapSharedPage(t *testing.T) {
	dir, err := os.MkdirTemp("/dev/shm", "tpwin")
	if err != nil {
		t.Skip("no /dev/shm:", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	runSidecar(t, dir, 16<<20)
	c, err := client.New(dir + "/tp.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.PutFrom(context.Background(), "ns", []byte("map"), []byte("x"), 0); err != nil {
		t.Fatal(err) // maps the arenas
	}
	const pg = 4096
	// a: bytes [pg+100, 3pg+100), pages 1..3; b: [3pg+100, 5pg), pages 3..4.
	closeA, mem, err := client.OpenWindow(c, pg+100, 2*pg)
	if err != nil {
		t.Fatal(err)
	}
	closeB, _, err := client.OpenWindow(c, 3*pg+100, 2*pg-100)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		step    string
		off     int
		faults  bool
		closeFn func() error
	}{
		{"both open: a's own page", pg + 200, false, nil},
		{"both open: the shared page", 3*pg + 50, false, nil},
		{"both open: b's own page", 4*pg + 10, false, closeA},
		{"a closed: a's own page", 2 * pg, true, nil},
		{"a closed: the shared page, b still open", 3 * pg, false, nil},
		{"a closed: b's own page", 4 * pg, false, closeB},
		{"both closed: the shared page", 3*pg + 4000, true, nil},
		{"both closed: b's own page", 4*pg + 1, true, nil},
		{"never opened: page 0", 0, true, nil},
	} {
		if got := writeFaults(mem, tc.off); got != tc.faults {
			t.Fatalf("%s (offset %d): write faulted %v, want %v", tc.step, tc.off, got, tc.faults)
		}
		if tc.closeFn != nil {
			if err := tc.closeFn(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, open := client.WriteWindows(c); open != 0 {
		t.Fatalf("%d shared pages still counted open", open)
	}
}
