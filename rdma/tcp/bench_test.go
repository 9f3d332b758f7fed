package tcp

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/rdma"
)

// rawServer is the baseline: a plain Go TCP stream copy with the same
// request/response shape as a transfer. For a write the client sends size
// bytes and the server answers one byte; for a read the client sends one
// byte and the server answers size bytes.
func rawServer(t testing.TB, size int, write bool) (addr string, stop func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				buf := make([]byte, size)
				one := make([]byte, 1)
				for {
					if write {
						if _, err := io.ReadFull(c, buf); err != nil {
							return
						}
						if _, err := c.Write(one); err != nil {
							return
						}
					} else {
						if _, err := io.ReadFull(c, one); err != nil {
							return
						}
						if _, err := c.Write(buf); err != nil {
							return
						}
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), func() { ln.Close(); wg.Wait() }
}

// runConc runs total operations over conc goroutines and returns the time.
func runConc(total, conc int, op func(worker int) error) (time.Duration, error) {
	var wg sync.WaitGroup
	errs := make(chan error, conc)
	start := time.Now()
	for w := 0; w < conc; w++ {
		n := total / conc
		if w < total%conc {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < n; i++ {
				if err := op(w); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return time.Since(start), <-errs
}

// rawClient holds conc connections to a rawServer.
type rawClient struct {
	conns []net.Conn
	bufs  [][]byte
	write bool
}

func newRawClient(b *testing.B, addr string, size, conc int, write bool) *rawClient {
	rc := &rawClient{write: write}
	for i := 0; i < conc; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		rc.conns = append(rc.conns, c)
		rc.bufs = append(rc.bufs, make([]byte, size))
	}
	return rc
}

func (rc *rawClient) op(w int) error {
	c, buf := rc.conns[w], rc.bufs[w]
	one := buf[:1]
	if rc.write {
		if _, err := c.Write(buf); err != nil {
			return err
		}
		_, err := io.ReadFull(c, one)
		return err
	}
	if _, err := c.Write(one); err != nil {
		return err
	}
	_, err := io.ReadFull(c, buf)
	return err
}

// BenchmarkTransfer compares rdma/tcp 1 MiB writes and reads with 1 and 16
// concurrent callers against a raw Go TCP stream copy of the same shape, in
// the same run:
//
//	go test -run XXX -bench Transfer -benchtime 2000x ./rdma/tcp/
//
// MB/s is rdma/tcp; raw-MB/s the baseline; ratio = rdma/tcp / raw.
func BenchmarkTransfer(b *testing.B) {
	const size = 1 << 20
	for _, write := range []bool{true, false} {
		for _, conc := range []int{1, 16} {
			name := "read"
			if write {
				name = "write"
			}
			b.Run(fmt.Sprintf("%s/1MiB/callers=%d", name, conc), func(b *testing.B) {
				a, s := newLocal(b, nil), newLocal(b, nil)
				p, err := a.Connect(context.Background(), s.Addr())
				if err != nil {
					b.Fatal(err)
				}
				locals := make([]rdma.RegionDesc, conc)
				remotes := make([]rdma.RegionDesc, conc)
				for i := range locals {
					locals[i], _ = a.Register(make([]byte, size))
					remotes[i], _ = s.Register(make([]byte, size))
				}
				do := p.Read
				if write {
					do = p.Write
				}
				ctx := context.Background()
				// Warm the pool.
				if _, err := runConc(conc, conc, func(w int) error {
					return do(ctx, rdma.Op{Local: locals[w].ID, Remote: remotes[w], Len: size})
				}); err != nil {
					b.Fatal(err)
				}
				addr, stop := rawServer(b, size, write)
				b.Cleanup(stop) // after the client conns close (cleanups run last-in first-out)
				raw := newRawClient(b, addr, size, conc, write)
				if _, err := runConc(conc, conc, raw.op); err != nil {
					b.Fatal(err)
				}
				// Interleave rounds of rdma/tcp and raw transfers so that both
				// see the same machine load; the timer covers rdma/tcp only.
				b.SetBytes(size)
				b.ResetTimer()
				var d, rawD, cpu, rawCPU time.Duration
				const rounds = 10
				for r := 0; r < rounds; r++ {
					n := b.N/rounds + btoi(r < b.N%rounds)
					c0 := cpuTime()
					b.StartTimer()
					dd, err := runConc(n, conc, func(w int) error {
						return do(ctx, rdma.Op{Local: locals[w].ID, Remote: remotes[w], Len: size})
					})
					b.StopTimer()
					c1 := cpuTime()
					if err != nil {
						b.Fatal(err)
					}
					rd, err := runConc(n, conc, raw.op)
					if err != nil {
						b.Fatal(err)
					}
					d += dd
					rawD += rd
					cpu += c1 - c0
					rawCPU += cpuTime() - c1
				}
				// CPU time per MiB (both ends: they share this process) is
				// the figure that survives a busy machine.
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/MiB")
				b.ReportMetric(float64(rawCPU.Microseconds())/float64(b.N), "raw-cpu-us/MiB")
				mbps := float64(b.N) * size / d.Seconds() / 1e6
				rawMBps := float64(b.N) * size / rawD.Seconds() / 1e6
				b.ReportMetric(rawMBps, "raw-MB/s")
				b.ReportMetric(mbps/rawMBps, "ratio")
			})
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// cpuTime returns the user+system CPU time of this process.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
