//go:build linux

package client_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"sync"
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

// slotValues returns writers × perWriter values of sizes that share pages
// (small ones, packed in slabs) and of large ones, keyed "k<writer>-<i>".
func slotValues(writers, perWriter int) map[string][]byte {
	sizes := []int{1, 700, 5000, 4096, 12 << 10, 64<<10 + 3, 1 << 20}
	vals := map[string][]byte{}
	for g := range writers {
		for i := range perWriter {
			vals[fmt.Sprintf("k%d-%d", g, i)] = sized(int64(g*100+i), sizes[(g+i)%len(sizes)])
		}
	}
	return vals
}

// putConcurrently stores vals with PutFrom from writers goroutines, each
// the values of its own writer number, and returns the first error.
func putConcurrently(ctx context.Context, c *client.Client, writers int, vals map[string][]byte) error {
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for g := range writers {
		wg.Go(func() {
			for i := 0; ; i++ {
				k := fmt.Sprintf("k%d-%d", g, i)
				v, ok := vals[k]
				if !ok {
					return
				}
				if _, err := c.PutFrom(ctx, "ns", []byte(k), v, 0); err != nil {
					errs <- fmt.Errorf("PutFrom %s: %w", k, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// checkGetInto reads every value of vals back with GetInto.
func checkGetInto(t *testing.T, c *client.Client, vals map[string][]byte) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for k, v := range vals {
		n, found, err := c.GetInto(context.Background(), "ns", []byte(k), buf)
		if err != nil || !found || !bytes.Equal(buf[:n], v) {
			t.Fatalf("GetInto %s: %d %v %v (bytes equal: %v)", k, n, found, err, bytes.Equal(buf[:n], v))
		}
	}
}

// writeFaults writes one byte of mem (its own value back) and reports
// whether the write faulted.
func writeFaults(mem []byte, off int) (faulted bool) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			faulted = true
		}
	}()
	store(&mem[off], mem[off])
	return false
}

//go:noinline
func store(p *byte, v byte) { *p = v }

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
