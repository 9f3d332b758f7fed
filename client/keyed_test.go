//go:build linux

package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"testing"

	"github.com/tidepool-kv/tidepool/client"
	"github.com/tidepool-kv/tidepool/internal/pkey"
)

// TestWriteKeyed: where the machine has protection keys, the default
// write mode writes through a keyed mapping; concurrent PutFroms of small
// (slab-packed) and large values write the right bytes, and nothing of
// the process touches the keyed mappings outside a copy: a write (of the
// byte's own value) from the test's goroutine faults before, during and
// after the other goroutines' puts.
func TestWriteKeyed(t *testing.T) {
	k, err := pkey.Alloc()
	if errors.Is(err, pkey.ErrUnsupported) {
		t.Skip(err)
	}
	if err == nil {
		k.Free()
	}
	c := startSidecar(t, 64<<20)
	ctx := context.Background()
	if _, err := c.PutFrom(ctx, "ns", []byte("first"), []byte("x"), 0); err != nil {
		t.Fatal(err) // maps the arenas
	}
	keyed := 0
	for _, mem := range client.KeyedMaps(c) {
		if mem != nil {
			keyed++
		}
	}
	if keyed != 1 {
		t.Fatalf("the default write mode made %d keyed mappings for a put, want 1", keyed)
	}
	probe := func() (tried, faulted int) {
		for _, mem := range client.KeyedMaps(c) {
			for off := 0; off < len(mem); off += 4096 * 61 {
				tried++
				if writeFaults(mem, off) {
					faulted++
				}
			}
		}
		return tried, faulted
	}
	if tried, faulted := probe(); tried == 0 || faulted != tried {
		t.Fatalf("before the puts: %d of %d writes through the keyed mapping faulted, want all", faulted, tried)
	}

	vals := slotValues(8, 20)
	putErr := make(chan error, 1)
	go func() { putErr <- putConcurrently(ctx, c, 8, vals) }()
	var tried, faulted int
probing:
	for {
		select {
		case err := <-putErr:
			if err != nil {
				t.Fatal(err)
			}
			break probing
		default:
			n, f := probe()
			tried, faulted = tried+n, faulted+f
		}
	}
	if tried == 0 || faulted != tried {
		t.Fatalf("during the puts: %d of %d writes through the keyed mapping faulted, want all", faulted, tried)
	}
	checkGetInto(t, c, vals)
	if tried, faulted := probe(); tried == 0 || faulted != tried {
		t.Fatalf("after the puts: %d of %d writes through the keyed mapping faulted, want all", faulted, tried)
	}
	// The stretches written had their page tables filled at their first
	// write (a kernel before 5.14 cannot: its writes fault page by page);
	// the probes above fault all the same, filled or not.
	if filled, chunks, nofill := client.KeyedFilled(c); !nofill && (filled == 0 || filled > chunks) {
		t.Fatalf("%d of %d chunks of the keyed mappings filled after the puts", filled, chunks)
	}
}

// TestWriteKeyedWithoutKeys: on a machine without protection keys the
// default mode writes with pwrite: puts land, no keyed mapping is made.
func TestWriteKeyedWithoutKeys(t *testing.T) {
	client.WithoutProtectionKeys(t)
	c := startSidecar(t, 16<<20)
	vals := slotValues(2, 7)
	if err := putConcurrently(context.Background(), c, 2, vals); err != nil {
		t.Fatal(err)
	}
	for _, mem := range client.KeyedMaps(c) {
		if mem != nil {
			t.Fatal("a keyed mapping without protection keys")
		}
	}
	checkGetInto(t, c, vals)
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
