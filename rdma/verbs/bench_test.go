//go:build verbs

package verbs

import (
	"context"
	"fmt"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/internal/peerauth"
	"github.com/tidepool-kv/tidepool/protocol/frame"
	"github.com/tidepool-kv/tidepool/rdma"
	"github.com/tidepool-kv/tidepool/rdma/tcp"
)

// BenchmarkRemoteRead: remote 1 MiB block fetches the way the peer API
// does them (a summed Read into a local slot), over verbs and over the TCP
// transport on the same host, with 1 and 16 callers. Reports Gb/s and the
// p50/p99 latency of one fetch. scripts/test-rdma.sh bench runs it in the
// Soft-RoCE guest next to ib_read_bw.
func BenchmarkRemoteRead(b *testing.B) {
	key, err := peerauth.NewKey([]byte("verbs-benchmark-secret"), "bench")
	if err != nil {
		b.Fatal(err)
	}
	ip := os.Getenv("TIDEPOOL_RDMA_BENCH_IP")
	if ip == "" {
		ip = "127.0.0.1"
	}
	const size = 1 << 20
	mk := map[string]func(b *testing.B) (rdma.Transport, rdma.Transport){
		"rdma": func(b *testing.B) (rdma.Transport, rdma.Transport) {
			cfg := testConfig(b)
			cfg.ListenAddr = ip + ":0"
			cfg.Key = key
			x, err := NewTransport(cfg, nil)
			if err != nil {
				b.Fatal(err)
			}
			y, err := NewTransport(cfg, nil)
			if err != nil {
				b.Fatal(err)
			}
			return x, y
		},
		"tcp": func(b *testing.B) (rdma.Transport, rdma.Transport) {
			cfg := tcp.DefaultLocalConfig()
			cfg.ListenAddr = ip + ":0"
			cfg.Key = key
			x, err := tcp.New(cfg, nil)
			if err != nil {
				b.Fatal(err)
			}
			y, err := tcp.New(cfg, nil)
			if err != nil {
				b.Fatal(err)
			}
			return x, y
		},
	}
	for _, tr := range []string{"rdma", "tcp"} {
		for _, callers := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/callers=%d", tr, callers), func(b *testing.B) {
				x, y := mk[tr](b)
				defer x.Close()
				defer y.Close()
				src := make([]byte, size)
				for i := range src {
					src[i] = byte(i * 7)
				}
				sum := frame.Checksum(src)
				rd, err := y.Register(src)
				if err != nil {
					b.Fatal(err)
				}
				dst := make([]byte, callers*size)
				ld, err := x.Register(dst)
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				p, err := x.Connect(ctx, y.Addr())
				if err != nil {
					b.Fatal(err)
				}
				defer p.Close()
				// Warm the pool: one QP or connection per caller.
				var wg sync.WaitGroup
				for w := 0; w < callers; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						_ = p.Read(ctx, rdma.Op{Local: ld.ID, LocalOff: uint64(w * size), Remote: rd, Len: size, Sum: sum, SumKnown: true})
					}()
				}
				wg.Wait()
				lat := make([][]time.Duration, callers)
				errs := make(chan error, callers)
				b.SetBytes(size)
				b.ResetTimer()
				start := time.Now()
				for w := 0; w < callers; w++ {
					n := b.N / callers
					if w < b.N%callers {
						n++
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						op := rdma.Op{Local: ld.ID, LocalOff: uint64(w * size), Remote: rd, Len: size, Sum: sum, SumKnown: true}
						for i := 0; i < n; i++ {
							t0 := time.Now()
							if err := p.Read(ctx, op); err != nil {
								errs <- err
								return
							}
							lat[w] = append(lat[w], time.Since(t0))
						}
					}()
				}
				wg.Wait()
				el := time.Since(start)
				b.StopTimer()
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
				var all []time.Duration
				for _, l := range lat {
					all = append(all, l...)
				}
				sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
				if len(all) > 0 {
					b.ReportMetric(float64(b.N)*size*8/el.Seconds()/1e9, "Gb/s")
					b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-us")
					b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-us")
				}
			})
		}
	}
}
