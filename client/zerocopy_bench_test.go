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
	"syscall"
	"testing"
	"time"

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
// All move 1 MiB blocks, with 1 and with 16 concurrent callers
// (callers=N); b.SetBytes makes the MB/s column comparable.

const (
	benchBlock = 1 << 20
	maxCallers = 16
	benchKeys  = 64
	// benchCapacity holds the benchKeys blocks of the read benchmarks; the
	// put benchmarks cycle through it, evicting.
	benchCapacity = 96 << 20
)

var crcTab = crc32.MakeTable(crc32.Castagnoli)

// benchCallers is the number of concurrent callers of the running
// benchmark (1 or maxCallers).
var benchCallers = maxCallers

// startSidecar runs a proxy over a DRAM tier on a Unix socket, in process,
// in a new directory on tmpfs (as in a pod: an emptyDir with medium:
// Memory; arenas on a disk file system would pay for writeback).
func startSidecar(tb testing.TB, capacity int64) *client.Client {
	tb.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "tpzc")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	stop, _ := runSidecar(tb, dir, capacity)
	c, err := client.New(filepath.Join(dir, "tp.sock"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		c.Close()
		stop()
	})
	return c
}

// sidecarVerifyReads is dram.Config.VerifyReads of the sidecars started
// next (benchmarks of the sidecar's verify_reads).
var sidecarVerifyReads bool

// runSidecar serves dir/tp.sock with arenas in dir/arenas until stop.
func runSidecar(tb testing.TB, dir string, capacity int64) (stop func(), p *proxy.Proxy) {
	tb.Helper()
	return runSidecarWith(tb, dir, capacity, engineapi.DefaultConfig())
}

// runSidecarWith is runSidecar with the engine API configured by ecfg.
func runSidecarWith(tb testing.TB, dir string, capacity int64, ecfg engineapi.Config) (stop func(), p *proxy.Proxy) {
	tb.Helper()
	dcfg := dram.DefaultConfig()
	dcfg.Dir = filepath.Join(dir, "arenas")
	dcfg.Capacity = capacity
	dcfg.ArenaSize = min(capacity, 256<<20)
	dcfg.MaxValueSize = 8 << 20
	dcfg.VerifyReads = sidecarVerifyReads
	tier, err := dram.New(dcfg, nil)
	if err != nil {
		tb.Fatal(err)
	}
	pcfg := proxy.DefaultConfig()
	pcfg.MaxValueBytes = 8 << 20
	p, err = proxy.New(pcfg, proxy.Deps{Store: tier, ZeroCopy: tier, Scan: tier}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := engineapi.Listen(filepath.Join(dir, "tp.sock"), 0o600, -1)
	if err != nil {
		tb.Fatal(err)
	}
	srv, err := engineapi.NewServer(ecfg, p, ln, nil)
	if err != nil {
		tb.Fatal(err)
	}
	srv.Start(context.Background())
	<-srv.Ready()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			srv.Close()
			tier.Close()
		})
	}
	tb.Cleanup(stop)
	return stop, p
}

func init() { klog.SetOutput(io.Discard) }

func randBlock(seed int64) []byte {
	b := make([]byte, benchBlock)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

// warmOps is how many ops run, untimed, before each measurement: they dial
// the client's connections and touch the buffers and arena pages. (On the
// VM these figures come from, the first write to a page of memory costs
// about 8 ms per MiB, a host-side fault, and later writes 30–70 µs: cold
// memory would swamp everything else. A sidecar's arenas are warm after
// their first fill.)
const warmOps = 2 * benchKeys

// runParallel runs warmOps untimed ops (numbered -warmOps..-1), then b.N
// timed ones, over benchCallers goroutines; op gets the caller's index and
// the op number.
func runParallel(b *testing.B, op func(caller, i int) error) {
	run := func(from, to int) {
		var next atomic.Int64
		next.Store(int64(from))
		var wg sync.WaitGroup
		var failed atomic.Value
		for g := 0; g < benchCallers; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1)) - 1
					if i >= to {
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
		if err, _ := failed.Load().(error); err != nil {
			b.Fatal(err)
		}
	}
	run(-warmOps, 0)
	// The reference: a plain memcpy of the same number of 1 MiB blocks by
	// the same callers, interleaved with the measured op in 8 rounds (the
	// machine is shared: only same-moment ratios mean something).
	refSrc.Do(func() {
		for k := range refSrcs {
			refSrcs[k] = randBlock(int64(k))
		}
	})
	dsts := make([][]byte, benchCallers)
	for g := range dsts {
		dsts[g] = make([]byte, benchBlock)
		copy(dsts[g], refSrcs[g]) // touch
	}
	measured := op
	memcpy := func(g, i int) error { copy(dsts[g], refSrcs[key(i)[0]]); return nil }
	const rounds = 8
	var took, ref, cpu, refCPU time.Duration
	b.SetBytes(benchBlock)
	b.ResetTimer()
	for r := 0; r < rounds; r++ {
		from, to := b.N*r/rounds, b.N*(r+1)/rounds
		start, cpu0 := time.Now(), cpuTime()
		op = measured
		run(from, to)
		took += time.Since(start)
		cpu += cpuTime() - cpu0
		b.StopTimer()
		start, cpu0 = time.Now(), cpuTime()
		op = memcpy
		run(from, to)
		ref += time.Since(start)
		refCPU += cpuTime() - cpu0
		b.StartTimer()
	}
	b.StopTimer()
	if b.N >= rounds {
		mbs := func(d time.Duration) float64 { return float64(b.N) * benchBlock / d.Seconds() / 1e6 }
		b.ReportMetric(mbs(ref), "memcpy-MB/s")
		b.ReportMetric(100*mbs(took)/mbs(ref), "%memcpy")
		// How many of the machine's cores the op kept busy (client and
		// in-process sidecar together): below GOMAXPROCS, it waits.
		b.ReportMetric(cpu.Seconds()/took.Seconds(), "cores")
		// CPU time per op against the memcpy's: less sensitive to other
		// processes on the machine than the throughputs.
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
		b.ReportMetric(float64(refCPU.Microseconds())/float64(b.N), "memcpy-cpu-µs/op")
	}
}

// cpuTime returns the CPU time the process used so far (user and system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var (
	refSrc  sync.Once
	refSrcs [benchKeys][]byte
)

// key returns the key of block i of the read benchmarks.
func key(i int) []byte { return []byte{byte((i%benchKeys + benchKeys) % benchKeys)} }

// warmArena writes every page of the tier's arenas once (see warmOps).
func warmArena(b *testing.B, c *client.Client, capacity int64) {
	blk := randBlock(99)
	for i := int64(0); i < capacity/benchBlock+8; i++ {
		if _, err := c.PutFrom(context.Background(), "warm", []byte(fmt.Sprint(i)), blk, 0); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := c.Clear(context.Background(), "warm"); err != nil {
		b.Fatal(err)
	}
}

func fill(b *testing.B, c *client.Client, ns string) [][]byte {
	warmArena(b, c, benchCapacity)
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
	for _, n := range []int{1, maxCallers} {
		b.Run(fmt.Sprintf("callers=%d", n), func(b *testing.B) {
			benchCallers = n
			defer func() { benchCallers = maxCallers }()
			benchZeroCopy(b)
		})
	}
}

// benchZeroCopy runs every path with benchCallers callers. GetInto and
// AcquireRead are the defaults (the sidecar does not verify same-host
// reads, the client does not either); -verify variants check the CRC-32C
// as verify_reads or SetVerifyReads(true) do.
func benchZeroCopy(b *testing.B) {
	ctx := context.Background()
	bufs := make([][]byte, maxCallers)
	for i := range bufs {
		bufs[i] = make([]byte, benchBlock)
	}
	b.Run("memcpy", func(b *testing.B) {
		srcs := make([][]byte, benchKeys)
		for k := range srcs {
			srcs[k] = randBlock(int64(k))
		}
		runParallel(b, func(g, i int) error {
			copy(bufs[g], srcs[key(i)[0]])
			return nil
		})
	})
	b.Run("memcpy+crc", func(b *testing.B) {
		srcs := make([][]byte, benchKeys)
		for k := range srcs {
			srcs[k] = randBlock(int64(k))
		}
		runParallel(b, func(g, i int) error {
			copy(bufs[g], srcs[key(i)[0]])
			crc32.Checksum(bufs[g], crcTab)
			return nil
		})
	})
	b.Run("GetInto", func(b *testing.B) {
		c := startSidecar(b, benchCapacity)
		fill(b, c, "bench")
		st := c.CoalesceStats()
		runParallel(b, func(g, i int) error {
			n, found, err := c.GetInto(ctx, "bench", key(i), bufs[g])
			if err == nil && (!found || n != benchBlock) {
				err = fmt.Errorf("GetInto: %d %v", n, found)
			}
			return err
		})
		reportBatches(b, st, c.CoalesceStats())
	})
	b.Run("GetInto-serververify", func(b *testing.B) { // verify_reads: the sidecar checks in Acquire
		sidecarVerifyReads = true
		c := startSidecar(b, benchCapacity)
		sidecarVerifyReads = false
		fill(b, c, "bench")
		st := c.CoalesceStats()
		runParallel(b, func(g, i int) error {
			n, found, err := c.GetInto(ctx, "bench", key(i), bufs[g])
			if err == nil && (!found || n != benchBlock) {
				err = fmt.Errorf("GetInto: %d %v", n, found)
			}
			return err
		})
		reportBatches(b, st, c.CoalesceStats())
	})
	b.Run("GetInto-verify", func(b *testing.B) { // SetVerifyReads(true): the client checks
		c := startSidecar(b, benchCapacity)
		c.SetVerifyReads(true)
		fill(b, c, "bench")
		st := c.CoalesceStats()
		runParallel(b, func(g, i int) error {
			n, found, err := c.GetInto(ctx, "bench", key(i), bufs[g])
			if err == nil && (!found || n != benchBlock) {
				err = fmt.Errorf("GetInto: %d %v", n, found)
			}
			return err
		})
		reportBatches(b, st, c.CoalesceStats())
	})
	for _, tc := range []struct {
		batch  int
		verify bool
	}{{1, false}, {8, false}, {1, true}, {8, true}} {
		batch := tc.batch
		name := fmt.Sprintf("AcquireRead-batch%d", batch)
		if tc.verify {
			name += "-serververify" // verify_reads: the sidecar checks in Acquire
		}
		// Acquire a batch, read each block in place (a copy out, as an
		// engine's host-to-GPU copy would), Release the batch: what a
		// connector's load path does.
		b.Run(name, func(b *testing.B) {
			sidecarVerifyReads = tc.verify
			c := startSidecar(b, benchCapacity)
			sidecarVerifyReads = false
			fill(b, c, "bench")
			runParallel(b, func(g, i int) error {
				if (i%batch+batch)%batch != 0 {
					return nil // one op per block; the batch is read by its first op
				}
				keys := make([][]byte, 0, batch)
				for k := 0; k < batch; k++ {
					keys = append(keys, key(i+k))
				}
				ls, _, err := c.Acquire(ctx, "bench", keys, 0)
				if err != nil {
					return err
				}
				ids := make([]int64, len(ls))
				for k, l := range ls {
					if l.Code != client.CodeOK {
						return fmt.Errorf("acquire: %v", l.Code)
					}
					ids[k] = l.LeaseID
					if err := c.ViewSlot(ctx, l.Slot, func(v []byte) { copy(bufs[g], v) }); err != nil {
						return err
					}
				}
				rel, err := c.Release(ctx, ids)
				for _, e := range rel {
					if e != nil {
						return e
					}
				}
				return err
			})
		})
	}
	b.Run("Get-inline", func(b *testing.B) {
		c := startSidecar(b, benchCapacity)
		fill(b, c, "bench")
		runParallel(b, func(g, i int) error {
			v, found, err := c.Get(ctx, "bench", key(i))
			if err == nil && (!found || len(v) != benchBlock) {
				err = fmt.Errorf("Get: %d %v", len(v), found)
			}
			return err
		})
	})
	b.Run("AppendGet-inline", func(b *testing.B) { // the socket, into the caller's buffer
		c := startSidecar(b, benchCapacity)
		fill(b, c, "bench")
		runParallel(b, func(g, i int) error {
			v, found, err := c.AppendGet(ctx, bufs[g][:0], "bench", key(i))
			if err == nil && (!found || len(v) != benchBlock) {
				err = fmt.Errorf("AppendGet: %d %v", len(v), found)
			}
			return err
		})
	})
	for _, mode := range []struct {
		name string
		m    client.WriteMode
	}{{"pwrite", client.WritePwrite}, {"mapped", client.WriteMapped}, {"keyed", client.WriteKeyed}} {
		b.Run("PutFrom-"+mode.name, func(b *testing.B) {
			c := startSidecar(b, benchCapacity) // evicts as it goes
			c.SetWriteMode(mode.m)
			warmArena(b, c, benchCapacity)
			srcs := make([][]byte, benchKeys)
			for k := range srcs {
				srcs[k] = randBlock(int64(k))
			}
			st := c.CoalesceStats()
			runParallel(b, func(g, i int) error {
				existed, err := c.PutFrom(ctx, "bench", []byte(fmt.Sprint(i)), srcs[key(i)[0]], 0)
				if err == nil && existed {
					err = fmt.Errorf("existed")
				}
				return err
			})
			reportBatches(b, st, c.CoalesceStats())
		})
	}
	b.Run("Put-inline", func(b *testing.B) {
		c := startSidecar(b, benchCapacity)
		warmArena(b, c, benchCapacity)
		srcs := make([][]byte, benchKeys)
		for k := range srcs {
			srcs[k] = randBlock(int64(k))
		}
		runParallel(b, func(g, i int) error {
			existed, err := c.Put(ctx, "bench", []byte(fmt.Sprint(i)), srcs[key(i)[0]], 0)
			if err == nil && existed {
				err = fmt.Errorf("existed")
			}
			return err
		})
	})
}

// reportBatches reports the mean batch of the coalesced calls made between
// two snapshots of the client's counters.
func reportBatches(b *testing.B, from, to client.CoalesceStats) {
	for _, k := range []struct {
		unit     string
		from, to client.CallStats
	}{{"keys/Acquire", from.Acquire, to.Acquire}, {"items/Reserve", from.Reserve, to.Reserve}, {"items/Commit", from.Commit, to.Commit}, {"ids/Release", from.Release, to.Release}} {
		if calls := k.to.Calls - k.from.Calls; calls > 0 {
			b.ReportMetric(float64(k.to.Items-k.from.Items)/float64(calls), k.unit)
		}
	}
}
