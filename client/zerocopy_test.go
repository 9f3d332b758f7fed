//go:build linux

package client_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/client"
	"github.com/tidepool-kv/tidepool/internal/poll"
)

// TestZeroCopyRestart: after the sidecar restarts (new arena files), the
// client notices its mappings are stale and remaps; PutFrom and GetInto
// keep working.
func TestZeroCopyRestart(t *testing.T) {
	dir, err := os.MkdirTemp("", "tpzr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx := context.Background()
	stop, _ := runSidecar(t, dir, 16<<20)
	c, err := client.New(filepath.Join(dir, "tp.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	val := randBlock(5)
	if _, err := c.PutFrom(ctx, "ns", []byte("a"), val, 0); err != nil {
		t.Fatal(err)
	}
	stop()
	runSidecar(t, dir, 16<<20)
	// Poll until the new server answers (the client redials).
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := c.Hello(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("restarted sidecar not answering: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if existed, err := c.PutFrom(ctx, "ns", []byte("b"), val, 0); existed || err != nil {
		t.Fatalf("PutFrom after a restart: %v %v", existed, err)
	}
	buf := make([]byte, len(val))
	if n, found, err := c.GetInto(ctx, "ns", []byte("b"), buf); err != nil || !found || n != len(val) || !bytes.Equal(buf, val) {
		t.Fatalf("GetInto after a restart: %d %v %v", n, found, err)
	}
	if _, found, err := c.GetInto(ctx, "ns", []byte("a"), buf); found || err != nil {
		t.Fatalf("a block of the old run: %v %v", found, err)
	}
}

// TestZeroCopyNoSharedArenas: a client that cannot open the arena files
// (another container without the shared volume) gets UNAVAILABLE, and the
// inline calls still work.
func TestZeroCopyNoSharedArenas(t *testing.T) {
	c := startSidecar(t, 16<<20)
	ctx := context.Background()
	h, err := c.Hello(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Hide the files from this client (as if the volume were not mounted).
	for _, a := range h.Arenas {
		if err := os.Chmod(a.Path, 0); err != nil {
			t.Fatal(err)
		}
		defer os.Chmod(a.Path, 0o600)
	}
	if os.Geteuid() == 0 {
		for _, a := range h.Arenas {
			os.Rename(a.Path, a.Path+".hidden")
			defer os.Rename(a.Path+".hidden", a.Path)
		}
	}
	if _, err := c.PutFrom(ctx, "ns", []byte("k"), []byte("v"), 0); client.CodeOf(err) != client.CodeUnavailable {
		t.Fatalf("PutFrom without the arenas = %v", err)
	}
	if _, err := c.Put(ctx, "ns", []byte("k"), []byte("v"), 0); err != nil {
		t.Fatalf("inline Put: %v", err)
	}
}

// TestGetIntoReleasesLeases: GetInto releases its leases in the background,
// batched; Close releases what is still queued.
func TestGetIntoReleasesLeases(t *testing.T) {
	dir, err := os.MkdirTemp("", "tpzl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_, p := runSidecar(t, dir, 16<<20)
	c, err := client.New(filepath.Join(dir, "tp.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	val := randBlock(2)[:100<<10]
	if _, err := c.PutFrom(ctx, "ns", []byte("k"), val, 0); err != nil {
		t.Fatal(err)
	}
	const callers, each = 8, 25
	var wg sync.WaitGroup
	for g := 0; g < callers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, len(val))
			for i := 0; i < each; i++ {
				if n, found, err := c.GetInto(ctx, "ns", []byte("k"), buf); err != nil || !found || n != len(val) || !bytes.Equal(buf, val) {
					t.Errorf("GetInto: %d %v %v", n, found, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	c.Close()
	c.Close()
	if rs := c.CoalesceStats().Release; rs.Items > callers*each || rs.Calls > rs.Items {
		t.Fatalf("background Releases: %+v, for %d GetIntos", rs, callers*each)
	}
	st := p.ZeroCopyStats()
	if st.LiveLeases != 0 || st.Acquired != callers*each || st.Released != callers*each || st.LeaseExpirations != 0 {
		t.Fatalf("after Close: %+v", st)
	}
}

// TestPutFromReservesAhead: after its first put, PutFrom writes into slots
// reserved ahead by the Commits before it, so each put is one round trip
// (a Commit) and no Reserve; a put of a stored key through such a slot
// still reports existed and changes nothing; Close aborts the slots kept.
// With ReserveAhead Off every put takes a Reserve and a Commit.
func TestPutFromReservesAhead(t *testing.T) {
	for _, ahead := range []int{0, client.Off} {
		t.Run(fmt.Sprint("ReserveAhead=", ahead), func(t *testing.T) {
			dir, err := os.MkdirTemp("/dev/shm", "tpra")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			ctx := context.Background()
			_, p := runSidecar(t, dir, 16<<20)
			cfg := client.DefaultConfig(filepath.Join(dir, "tp.sock"))
			cfg.ReserveAhead = ahead
			c, err := client.NewWithConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			const n = 6
			vals := make([][]byte, n)
			for i := range vals {
				vals[i] = sized(int64(i), 100<<10)
				if existed, err := c.PutFrom(ctx, "ns", []byte(fmt.Sprint("k", i)), vals[i], 0); existed || err != nil {
					t.Fatalf("PutFrom %d: %v %v", i, existed, err)
				}
			}
			// A stored key, through a slot reserved ahead: existed, unchanged.
			if existed, err := c.PutFrom(ctx, "ns", []byte("k0"), vals[1], 0); !existed || err != nil {
				t.Fatalf("PutFrom of a stored key: %v %v", existed, err)
			}
			st := c.CoalesceStats()
			// Off: the stored key's Reserve answers EXISTS, nothing to commit.
			wantReserves, wantCommits := int64(1), int64(n+1)
			if ahead == client.Off {
				wantReserves, wantCommits = n+1, n
			}
			if st.Reserve.Calls != wantReserves || st.Commit.Calls != wantCommits {
				t.Fatalf("Reserve calls %d, Commit calls %d; want %d, %d", st.Reserve.Calls, st.Commit.Calls, wantReserves, wantCommits)
			}
			buf := make([]byte, 100<<10)
			for i, v := range vals {
				if m, found, err := c.GetInto(ctx, "ns", []byte(fmt.Sprint("k", i)), buf); err != nil || !found || m != len(v) || !bytes.Equal(buf, v) {
					t.Fatalf("GetInto k%d: %d %v %v", i, m, found, err)
				}
			}
			c.Close()
			poll.Until(t, 10*time.Second, "no reservation left", func() bool { return p.ZeroCopyStats().LiveReservations == 0 })
		})
	}
}
