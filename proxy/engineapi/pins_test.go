package engineapi_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/client"
)

// versioned is the value of version v of key k: a header naming both, then
// bytes derived from them, so that any answer can be checked on its own.
func versioned(k, v, size int) []byte {
	b := randBytes(int64(k)<<32|int64(v), size)
	binary.LittleEndian.PutUint32(b[0:], uint32(k))
	binary.LittleEndian.PutUint32(b[4:], uint32(v))
	return b
}

// checkVersioned reports whether b is exactly some version of key k.
func checkVersioned(k int, b []byte) error {
	if len(b) < 8 {
		return fmt.Errorf("key %d: %d bytes", k, len(b))
	}
	if got := int(binary.LittleEndian.Uint32(b)); got != k {
		return fmt.Errorf("key %d answered with key %d's value", k, got)
	}
	v := int(binary.LittleEndian.Uint32(b[4:]))
	if !bytes.Equal(b, versioned(k, v, len(b))) {
		return fmt.Errorf("key %d version %d: wrong bytes", k, v)
	}
	return nil
}

// TestGetInPlace drives Get and BatchGet, which answer from the arenas in
// place, against overwrites, deletes and eviction pressure on a small
// tier: every answer must be exactly one version of its key, and once the
// load stops no block may stay pinned (the tracer released every pin after
// its reply was written), which the tier's used bytes show after a delete
// of everything.
func TestGetInPlace(t *testing.T) {
	ts := startServer(t, serverOpts{capacity: 24 << 20, maxValue: 2 << 20})
	ctx := context.Background()
	const keys = 12
	sizes := []int{100, 5000, 1 << 20, 1<<20 + 17}
	var version [keys]atomic.Int32
	key := func(k int) []byte { return []byte{'k', byte(k)} }
	size := func(k int) int { return sizes[k%len(sizes)] }
	for k := 0; k < keys; k++ {
		if _, err := ts.c.Put(ctx, "pin", key(k), versioned(k, 0, size(k)), 0); err != nil {
			t.Fatal(err)
		}
	}

	var stop atomic.Bool
	var wg sync.WaitGroup
	errc := make(chan error, 64)
	fail := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	var answered atomic.Int64
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				if g%2 == 0 {
					k := (g + i) % keys
					v, found, err := ts.c.Get(ctx, "pin", key(k))
					if err != nil {
						fail(err)
						return
					}
					if found {
						if err := checkVersioned(k, v); err != nil {
							fail(err)
							return
						}
						answered.Add(1)
					}
					continue
				}
				batch := [][]byte{key(i % keys), key((i + 5) % keys), key((i + 7) % keys)}
				res, err := ts.c.BatchGet(ctx, "pin", batch)
				if err != nil {
					fail(err)
					return
				}
				for j, r := range res {
					if r.Code == client.CodeOK {
						if err := checkVersioned(int(batch[j][1]), r.Value); err != nil {
							fail(err)
							return
						}
						answered.Add(1)
					}
				}
			}
		}(g)
	}
	// Writers: overwrite, delete, and fill the tier past its capacity with
	// other blocks so that eviction runs while replies are being written.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			k := i % keys
			switch i % 5 {
			case 3:
				if _, err := ts.c.Delete(ctx, "pin", key(k)); err != nil {
					fail(err)
					return
				}
			case 4:
				filler := []byte(fmt.Sprintf("fill-%d", i))
				if _, err := ts.c.Put(ctx, "fill", filler, versioned(1000, i, 1<<20), 0); err != nil {
					fail(err)
					return
				}
			default:
				v := int(version[k].Add(1))
				if _, err := ts.c.Put(ctx, "pin", key(k), versioned(k, v, size(k)), 0); err != nil {
					fail(err)
					return
				}
			}
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for answered.Load() < 600 && time.Now().Before(deadline) && len(errc) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if answered.Load() == 0 {
		t.Fatal("no Get found a block")
	}
	t.Logf("%d blocks answered in place or copied", answered.Load())

	// Every pin must be gone: delete everything and the tier is empty.
	for _, ns := range []string{"pin", "fill"} {
		if _, err := ts.c.Clear(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	if st := ts.tier.Stats(); st.Tiers[0].UsedBytes != 0 || st.Tiers[0].Blocks != 0 {
		t.Fatalf("after clearing: %d bytes in %d blocks still held (a pin leaked)", st.Tiers[0].UsedBytes, st.Tiers[0].Blocks)
	}
}
