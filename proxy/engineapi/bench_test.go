package engineapi_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/client"
)

// Benchmarks of the engine API over a real Unix socket, and of the raw
// socket limit in the same run, so that ratios are meaningful on a noisy
// machine:
//
//	go test -run '^$' -bench . -benchtime 2s ./proxy/engineapi/
//
// Each reports bytes/s (b.SetBytes) and p50/p99 latency in µs.

var benchSizes = []int{4 << 10, 64 << 10, 1 << 20, 4 << 20}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

// latencies collects per-op durations from many goroutines.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) report(b *testing.B) {
	if len(l.d) == 0 {
		return
	}
	sort.Slice(l.d, func(i, j int) bool { return l.d[i] < l.d[j] })
	q := func(p float64) float64 { return float64(l.d[int(p*float64(len(l.d)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
}

// runConcurrent runs b.N ops over `callers` goroutines, each op timed.
func runConcurrent(b *testing.B, callers int, op func(i int) error) {
	var lat latencies
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	for g := 0; g < callers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				start := time.Now()
				if err := op(i); err != nil {
					failed.Store(err)
					return
				}
				lat.add(time.Since(start))
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	lat.report(b)
}

func benchServer(b *testing.B, capacity int64) *testServer {
	return startServer(b, serverOpts{capacity: capacity, maxValue: 8 << 20, maxBatch: 1024})
}

func BenchmarkGet(b *testing.B) {
	for _, size := range benchSizes {
		for _, callers := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/callers=%d", sizeName(size), callers), func(b *testing.B) {
				ts := benchServer(b, 512<<20)
				ctx := context.Background()
				const keys = 16
				val := randBytes(1, size)
				for k := 0; k < keys; k++ {
					if _, err := ts.c.Put(ctx, "bench", []byte{byte(k)}, val, 0); err != nil {
						b.Fatal(err)
					}
				}
				b.SetBytes(int64(size))
				runConcurrent(b, callers, func(i int) error {
					v, found, err := ts.c.Get(ctx, "bench", []byte{byte(i % keys)})
					if err == nil && (!found || len(v) != size) {
						err = fmt.Errorf("bad get: found=%v len=%d", found, len(v))
					}
					return err
				})
			})
		}
	}
}

func BenchmarkPut(b *testing.B) {
	for _, size := range benchSizes {
		for _, callers := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/callers=%d", sizeName(size), callers), func(b *testing.B) {
				// Capacity well above the working set of one run would be
				// best; eviction keeps it bounded either way.
				ts := benchServer(b, 512<<20)
				ctx := context.Background()
				val := randBytes(1, size)
				b.SetBytes(int64(size))
				runConcurrent(b, callers, func(i int) error {
					_, err := ts.c.Put(ctx, "bench", []byte(fmt.Sprintf("k%d", i)), val, 0)
					return err
				})
			})
		}
	}
}

func BenchmarkBatchGet(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10} {
		for _, callers := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/batch=32/callers=%d", sizeName(size), callers), func(b *testing.B) {
				ts := benchServer(b, 512<<20)
				ctx := context.Background()
				keys := make([][]byte, 32)
				val := randBytes(1, size)
				for k := range keys {
					keys[k] = []byte(fmt.Sprintf("k%d", k))
					if _, err := ts.c.Put(ctx, "bench", keys[k], val, int32(k)); err != nil {
						b.Fatal(err)
					}
				}
				b.SetBytes(int64(size * len(keys)))
				runConcurrent(b, callers, func(i int) error {
					res, err := ts.c.BatchGet(ctx, "bench", keys)
					if err == nil && res[31].Code != client.CodeOK {
						err = fmt.Errorf("miss in batch")
					}
					return err
				})
			})
		}
	}
}

func BenchmarkLookup256(b *testing.B) {
	for _, callers := range []int{1, 16} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			ts := benchServer(b, 64<<20)
			ctx := context.Background()
			keys := make([][]byte, 256)
			for k := range keys {
				keys[k] = randBytes(int64(k), 32)
				if _, err := ts.c.Put(ctx, "bench", keys[k], []byte("v"), int32(k)); err != nil {
					b.Fatal(err)
				}
			}
			runConcurrent(b, callers, func(i int) error {
				n, err := ts.c.Lookup(ctx, "bench", keys)
				if err == nil && n != 256 {
					err = fmt.Errorf("lookup matched %d", n)
				}
				return err
			})
		})
	}
}

// BenchmarkRawUnixCopy is the limit the Get path is compared with: a server
// writes `size` bytes per request on a Unix stream socket and the caller
// reads them all, over 16 connections used concurrently.
func BenchmarkRawUnixCopy(b *testing.B) {
	for _, size := range []int{1 << 20} {
		for _, callers := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/callers=%d", sizeName(size), callers), func(b *testing.B) {
				dir, err := os.MkdirTemp("", "raw")
				if err != nil {
					b.Fatal(err)
				}
				defer os.RemoveAll(dir)
				ln, err := net.Listen("unix", filepath.Join(dir, "raw.sock"))
				if err != nil {
					b.Fatal(err)
				}
				defer ln.Close()
				payload := randBytes(1, size)
				go func() {
					for {
						c, err := ln.Accept()
						if err != nil {
							return
						}
						go func(c net.Conn) {
							defer c.Close()
							var req [1]byte
							for {
								if _, err := io.ReadFull(c, req[:]); err != nil {
									return
								}
								// The server copies the block out of its store,
								// as the Get path does.
								out := make([]byte, size)
								copy(out, payload)
								if _, err := c.Write(out); err != nil {
									return
								}
							}
						}(c)
					}
				}()
				conns := make(chan net.Conn, callers)
				for i := 0; i < callers; i++ {
					c, err := net.Dial("unix", filepath.Join(dir, "raw.sock"))
					if err != nil {
						b.Fatal(err)
					}
					defer c.Close()
					conns <- c
				}
				b.SetBytes(int64(size))
				runConcurrent(b, callers, func(i int) error {
					c := <-conns
					defer func() { conns <- c }()
					if _, err := c.Write([]byte{1}); err != nil {
						return err
					}
					buf := make([]byte, size)
					_, err := io.ReadFull(c, buf)
					return err
				})
			})
		}
	}
}
