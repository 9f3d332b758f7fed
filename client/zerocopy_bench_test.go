//go:build linux

package client_test

import (
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cloudwego/kitex/pkg/klog"

	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/client"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/engineapi"
)

// Benchmarks of the zero-copy path against the inline path and a plain
// memcpy of the same bytes, in one run (the ratios are what matters on a
// shared machine):
//
//	go test -run '^$' -bench 'ZeroCopy' -benchtime 2s ./client/
//
// All move 1 MiB blocks with 16 concurrent callers; b.SetBytes makes the
// MB/s column comparable.

const (
	benchBlock   = 1 << 20
	benchCallers = 16
	benchKeys    = 64
)

var crcTab = crc32.MakeTable(crc32.Castagnoli)

// startSidecar runs a proxy over a DRAM tier on a Unix socket, in process.
func startSidecar(tb testing.TB, capacity int64) *client.Client {
	tb.Helper()
	// tmpfs, as in a pod (an emptyDir with medium: Memory): arenas on a
	// disk file system would pay for writeback.
	dir, err := os.MkdirTemp("/dev/shm", "tpzc")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	dcfg := dram.DefaultConfig()
	dcfg.Dir = filepath.Join(dir, "arenas")
	dcfg.Capacity = capacity
	dcfg.ArenaSize = min(capacity, 256<<20)
	dcfg.MaxValueSize = 8 << 20
	tier, err := dram.New(dcfg, nil)
	if err != nil {
		tb.Fatal(err)
	}
	pcfg := proxy.DefaultConfig()
	pcfg.MaxValueBytes = 8 << 20
	p, err := proxy.New(pcfg, tier, nil)
	if err != nil {
		tb.Fatal(err)
	}
	sock := filepath.Join(dir, "tp.sock")
	ln, err := engineapi.Listen(sock, 0o600, -1)
	if err != nil {
		tb.Fatal(err)
	}
	srv, err := engineapi.NewServer(engineapi.DefaultConfig(), p, ln, nil)
	if err != nil {
		tb.Fatal(err)
	}
	srv.Start(context.Background())
	<-srv.Ready()
	c, err := client.New(sock)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		c.Close()
		srv.Close()
		tier.Close()
	})
	return c
}

func init() { klog.SetOutput(io.Discard) }

func randBlock(seed int64) []byte {
	b := make([]byte, benchBlock)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

// runParallel runs b.N ops over benchCallers goroutines; op gets the
// caller's index and the op number.
func runParallel(b *testing.B, op func(caller, i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	b.SetBytes(benchBlock)
	b.ResetTimer()
	for g := 0; g < benchCallers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				if err := op(g, i); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
}

func fill(b *testing.B, c *client.Client, ns string) [][]byte {
	vals := make([][]byte, benchKeys)
	for k := range vals {
		vals[k] = randBlock(int64(k))
		if _, err := c.Put(context.Background(), ns, []byte{byte(k)}, vals[k], 0); err != nil {
			b.Fatal(err)
		}
	}
	return vals
}

func BenchmarkZeroCopy(b *testing.B) {
	ctx := context.Background()
	bufs := make([][]byte, benchCallers)
	for i := range bufs {
		bufs[i] = make([]byte, benchBlock)
	}
	b.Run("memcpy", func(b *testing.B) {
		srcs := make([][]byte, benchKeys)
		for k := range srcs {
			srcs[k] = randBlock(int64(k))
		}
		runParallel(b, func(g, i int) error {
			copy(bufs[g], srcs[i%benchKeys])
			return nil
		})
	})
	b.Run("memcpy+crc", func(b *testing.B) {
		srcs := make([][]byte, benchKeys)
		for k := range srcs {
			srcs[k] = randBlock(int64(k))
		}
		runParallel(b, func(g, i int) error {
			copy(bufs[g], srcs[i%benchKeys])
			crc32.Checksum(bufs[g], crcTab)
			return nil
		})
	})
	b.Run("GetInto", func(b *testing.B) {
		c := startSidecar(b, 256<<20)
		fill(b, c, "bench")
		runParallel(b, func(g, i int) error {
			n, found, err := c.GetInto(ctx, "bench", []byte{byte(i % benchKeys)}, bufs[g])
			if err == nil && (!found || n != benchBlock) {
				err = fmt.Errorf("GetInto: %d %v", n, found)
			}
			return err
		})
	})
	b.Run("AcquireRead", func(b *testing.B) {
		// Acquire, checksum the bytes in place (no copy), Release.
		c := startSidecar(b, 256<<20)
		fill(b, c, "bench")
		runParallel(b, func(g, i int) error {
			ls, _, err := c.Acquire(ctx, "bench", [][]byte{{byte(i % benchKeys)}}, 0)
			if err != nil {
				return err
			}
			var crc uint32
			if err := c.ViewSlot(ctx, ls[0].Slot, func(v []byte) { crc = crc32.Checksum(v, crcTab) }); err != nil {
				return err
			}
			if crc != ls[0].Checksum {
				return fmt.Errorf("checksum")
			}
			rel, err := c.Release(ctx, []int64{ls[0].LeaseID})
			if err == nil && rel[0] != nil {
				err = rel[0]
			}
			return err
		})
	})
	b.Run("Get-inline", func(b *testing.B) {
		c := startSidecar(b, 256<<20)
		fill(b, c, "bench")
		runParallel(b, func(g, i int) error {
			v, found, err := c.Get(ctx, "bench", []byte{byte(i % benchKeys)})
			if err == nil && (!found || len(v) != benchBlock) {
				err = fmt.Errorf("Get: %d %v", len(v), found)
			}
			return err
		})
	})
	for _, mode := range []struct {
		name string
		m    client.WriteMode
	}{{"pwrite", client.WritePwrite}, {"mmap", client.WriteMmap}} {
		b.Run("PutFrom-"+mode.name, func(b *testing.B) {
			c := startSidecar(b, 256<<20) // evicts as it goes
			c.SetWriteMode(mode.m)
			srcs := make([][]byte, benchKeys)
			for k := range srcs {
				srcs[k] = randBlock(int64(k))
			}
			runParallel(b, func(g, i int) error {
				existed, err := c.PutFrom(ctx, "bench", []byte(fmt.Sprint(i)), srcs[i%benchKeys], 0)
				if err == nil && existed {
					err = fmt.Errorf("existed")
				}
				return err
			})
		})
	}
	b.Run("Put-inline", func(b *testing.B) {
		c := startSidecar(b, 256<<20)
		srcs := make([][]byte, benchKeys)
		for k := range srcs {
			srcs[k] = randBlock(int64(k))
		}
		runParallel(b, func(g, i int) error {
			existed, err := c.Put(ctx, "bench", []byte(fmt.Sprint(i)), srcs[i%benchKeys], 0)
			if err == nil && existed {
				err = fmt.Errorf("existed")
			}
			return err
		})
	})
}
