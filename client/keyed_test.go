//go:build linux

package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tidepool-kv/tidepool/client"
	"github.com/tidepool-kv/tidepool/internal/pkey"
)

// TestWriteKeyed: where the machine has protection keys, the default
// write mode writes through a keyed mapping; concurrent PutFroms of small (slab-packed) and large values
// write the right bytes, and no write of the process to the keyed
// mappings lands outside a copy: a write from the test's goroutine faults
// before, during and after the other goroutines' puts.
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

	sizes := []int{1, 700, 5000, 4096, 12 << 10, 64<<10 + 3, 1 << 20}
	const writers, perWriter = 8, 20
	vals := map[string][]byte{}
	for g := range writers {
		for i := range perWriter {
			vals[fmt.Sprintf("k%d-%d", g, i)] = sized(int64(g*100+i), sizes[(g+i)%len(sizes)])
		}
	}
	var wg sync.WaitGroup
	var done atomic.Bool
	errs := make(chan error, writers)
	for g := range writers {
		wg.Go(func() {
			for i := range perWriter {
				k := fmt.Sprintf("k%d-%d", g, i)
				if _, err := c.PutFrom(ctx, "ns", []byte(k), vals[k], 0); err != nil {
					errs <- fmt.Errorf("PutFrom %s: %w", k, err)
					return
				}
			}
		})
	}
	go func() { wg.Wait(); done.Store(true) }()
	var tried, faulted int
	for !done.Load() {
		n, f := probe()
		tried, faulted = tried+n, faulted+f
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if faulted != tried {
		t.Fatalf("during the puts: %d of %d writes through the keyed mapping faulted, want all", faulted, tried)
	}
	buf := make([]byte, 1<<20)
	for k, v := range vals {
		n, found, err := c.GetInto(ctx, "ns", []byte(k), buf)
		if err != nil || !found || !bytes.Equal(buf[:n], v) {
			t.Fatalf("GetInto %s: %d %v %v (bytes equal: %v)", k, n, found, err, bytes.Equal(buf[:n], v))
		}
	}
	if tried, faulted := probe(); tried == 0 || faulted != tried {
		t.Fatalf("after the puts: %d of %d writes through the keyed mapping faulted, want all", faulted, tried)
	}
}

// TestWriteKeyedWithoutKeys: on a machine without protection keys the
// default mode writes with pwrite: puts land, no keyed mapping is made.
func TestWriteKeyedWithoutKeys(t *testing.T) {
	client.WithoutProtectionKeys(t)
	c := startSidecar(t, 16<<20)
	ctx := context.Background()
	vals := [][]byte{sized(1, 100), sized(2, 70_000), sized(3, 1<<20)}
	for i, v := range vals {
		if existed, err := c.PutFrom(ctx, "ns", []byte(fmt.Sprint(i)), v, 0); err != nil || existed {
			t.Fatalf("PutFrom %d: existed %v, %v", i, existed, err)
		}
	}
	for _, mem := range client.KeyedMaps(c) {
		if mem != nil {
			t.Fatal("a keyed mapping without protection keys")
		}
	}
	buf := make([]byte, 1<<20)
	for i, v := range vals {
		n, found, err := c.GetInto(ctx, "ns", []byte(fmt.Sprint(i)), buf)
		if err != nil || !found || !bytes.Equal(buf[:n], v) {
			t.Fatalf("GetInto %d: %d %v %v", i, n, found, err)
		}
	}
}
