package peerapi_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/proxy"
)

// rawReadServer is the baseline: a plain Go TCP stream copy with the shape
// of a pull (the client sends one byte, the server answers size bytes), as
// rdma/tcp's benchmark does.
func rawReadServer(b *testing.B, size int) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	b.Cleanup(func() { ln.Close(); wg.Wait() })
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
				buf, one := make([]byte, size), make([]byte, 1)
				for {
					if _, err := io.ReadFull(c, one); err != nil {
						return
					}
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// cpuTime is the user+system CPU time of this process so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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

// BenchmarkRemoteGet: a Get of a 1 MiB block held by the other of two
// nodes on loopback, with 16 callers (each op deletes the local copy first,
// so every Get is a remote fetch: peer Acquire, rdma/tcp pull into a
// reserved slot, CRC-verified commit, the local read into a new buffer,
// lease release; "fetch" stops before the local read),
// against a raw Go TCP stream copy of 1 MiB with 16 connections in the same
// run:
//
//	go test -run XXX -bench RemoteGet -benchtime 400x ./proxy/peerapi/
//
// MB/s is the tidepool remote Get; raw-MB/s the baseline; ratio = tidepool
// / raw (target >= 0.7).
//
// "get-1caller" and "fetch-1caller" are "get" and "fetch" with one caller
// (and one raw connection): the latency of one remote read.
//
// "get-secret" is "get" on a cluster with a peer secret (every connection
// authenticated, docs/security.md), "get-encrypted" with encryption too.
func BenchmarkRemoteGet(b *testing.B) {
	b.Run("get", func(b *testing.B) { benchRemote(b, remoteGetPinned, nodeOpts{}) })
	b.Run("get-1caller", func(b *testing.B) { benchRemoteConc(b, remoteGetPinned, nodeOpts{}, 1) })
	b.Run("get-secret", func(b *testing.B) {
		benchRemote(b, remoteGetPinned, nodeOpts{label: "bench", secret: "bench-cluster-secret"})
	})
	b.Run("get-encrypted", func(b *testing.B) {
		benchRemote(b, remoteGetPinned, nodeOpts{label: "bench", secret: "bench-cluster-secret", encrypt: true})
	})
	b.Run("get-copy", func(b *testing.B) { benchRemote(b, remoteGetCopy, nodeOpts{}) })
	b.Run("fetch", func(b *testing.B) { benchRemote(b, remoteFetch, nodeOpts{}) })
	b.Run("fetch-1caller", func(b *testing.B) { benchRemoteConc(b, remoteFetch, nodeOpts{}, 1) })
}

type remoteMode int

const (
	// remoteGetPinned: the engine API's Get (proxy.GetPinned), the fetched
	// block answered in place in the DRAM arena, pinned until the reply
	// would be written.
	remoteGetPinned remoteMode = iota
	// remoteGetCopy: proxy.Get, which copies the block out of the arena.
	remoteGetCopy
	// remoteFetch: the peer client's calls alone, as the proxy's fetch
	// makes them (Acquire, Pull into a reserved slot, Release; the block
	// lands in the local store).
	remoteFetch
)

// benchRemote times remote Gets of blocks owned by the other node, with
// 16 callers.
func benchRemote(b *testing.B, mode remoteMode, o nodeOpts) { benchRemoteConc(b, mode, o, 16) }

// benchRemoteConc is benchRemote with conc callers (and as many
// connections for the raw baseline).
func benchRemoteConc(b *testing.B, mode remoteMode, o nodeOpts, conc int) {
	const size, ns = 1 << 20, "bench"
	o.capacity, o.fetchTimeout, o.prefault = 96<<20, 10*time.Second, true
	nodes := newCluster(b, 2, o)
	a, owner := nodes[0], nodes[1]
	ctx := context.Background()
	keys := make([][]byte, conc)
	for w := range keys {
		keys[w] = keyOwnedBy(b, nodes, ns, fmt.Sprint("w", w), owner.name)
		if _, err := owner.p.PutLocal(ctx, ns, keys[w], value(byte(w), size), cache.PutOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	var alone atomic.Int64 // blocks fetched by fetchAlone (not the proxy's counters)
	get := func(w int) error {
		a.p.Delete(ctx, ns, keys[w], proxy.ScopeLocal)
		switch mode {
		case remoteFetch:
			err := fetchAlone(ctx, a, owner.name, ns, keys[w])
			if err == nil {
				alone.Add(1)
			}
			return err
		case remoteGetPinned:
			var pins proxy.Pins
			v, _, err := a.p.GetPinned(ctx, ns, keys[w], proxy.ScopeCluster, &pins)
			if err == nil && (len(v) != size || pins.Len() != 1) {
				err = fmt.Errorf("got %d bytes, %d pins", len(v), pins.Len())
			}
			if rerr := pins.Release(); err == nil {
				err = rerr
			}
			return err
		}
		v, _, err := a.p.Get(ctx, ns, keys[w], proxy.ScopeCluster)
		if err == nil && len(v) != size {
			err = fmt.Errorf("got %d bytes", len(v))
		}
		return err
	}
	// Warm the connections.
	if _, err := runConc(conc, conc, get); err != nil {
		b.Fatal(err)
	}
	raddr := rawReadServer(b, size)
	conns := make([]net.Conn, conc)
	bufs := make([][]byte, conc)
	for w := range conns {
		c, err := net.Dial("tcp", raddr)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		conns[w], bufs[w] = c, make([]byte, size)
	}
	raw := func(w int) error {
		if _, err := conns[w].Write(bufs[w][:1]); err != nil {
			return err
		}
		_, err := io.ReadFull(conns[w], bufs[w])
		return err
	}

	b.SetBytes(size)
	b.ResetTimer()
	// Interleave rounds so that both see the same machine load.
	var tpTime, rawTime, tpCPU, rawCPU time.Duration
	const round = 64
	for done := 0; done < b.N; done += round {
		n := min(round, b.N-done)
		c0 := cpuTime()
		d, err := runConc(n, conc, get)
		if err != nil {
			b.Fatal(err)
		}
		tpTime += d
		b.StopTimer()
		c1 := cpuTime()
		d, err = runConc(n, conc, raw)
		if err != nil {
			b.Fatal(err)
		}
		rawTime += d
		rawCPU += cpuTime() - c1
		tpCPU += c1 - c0
		b.StartTimer()
	}
	b.StopTimer()
	mb := float64(b.N) * size / 1e6
	b.ReportMetric(mb/rawTime.Seconds(), "raw-MB/s")
	b.ReportMetric(rawTime.Seconds()/tpTime.Seconds(), "ratio")
	// Both ends run in this process: CPU per MiB counts sender and receiver.
	b.ReportMetric(float64(tpCPU.Microseconds())/float64(b.N), "cpu-µs/MiB")
	b.ReportMetric(float64(rawCPU.Microseconds())/float64(b.N), "raw-cpu-µs/MiB")
	st := a.stats(owner.name)
	if fetched := st.FetchedBlocks + alone.Load(); fetched < int64(b.N) {
		b.Fatalf("only %d remote fetches for %d gets", fetched, b.N)
	}
}

// fetchAlone brings one block from node into a's store with the peer
// client's calls only: what the proxy's fetch does, without the routing.
func fetchAlone(ctx context.Context, a *node, node, ns string, key []byte) error {
	blocks, err := a.cli.Acquire(ctx, node, ns, [][]byte{key}, proxy.FetchOptions{})
	if err != nil {
		return err
	}
	b := blocks[0]
	if b.Err != nil {
		return b.Err
	}
	defer a.cli.Release(node, []int64{b.Lease})
	slot, err := a.tier.Reserve(ctx, ns, key, b.Length, cache.PutOptions{Depth: b.Depth, LowPriority: true}, 0)
	if err != nil {
		return err
	}
	if err := a.cli.Pull(ctx, node, b, slot); err != nil {
		slot.Abort()
		return err
	}
	_, err = slot.CommitChecked(ctx, b.Checksum)
	return err
}

// BenchmarkLookup: a cluster-scope prefix Lookup of 256 keys on node a of
// two nodes on loopback (peer secret set, as a clustered serve), the keys
// written as through the other node: b holds every one, a holds those it
// owns (about half), so a's local prefix ends at the first key b owns and
// the rest is asked of b. "local" is the same lookup where a holds every
// key (no peer call), in the same run. The views keep no previous ring (a
// cluster formed minutes ago); cpu-µs counts both nodes (one process):
//
//	go test -run XXX -bench Lookup -benchtime 3000x ./proxy/peerapi/
func BenchmarkLookup(b *testing.B) {
	const ns, n = "bench", 256
	nodes := newCluster(b, 2, nodeOpts{label: "bench", secret: "bench-cluster-secret", settled: true})
	a, other := nodes[0], nodes[1]
	ctx := context.Background()
	keys := make([][]byte, n)
	local := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("lookup-%d", i))
		local[i] = []byte(fmt.Sprintf("local-%d", i))
		if _, err := other.p.PutLocal(ctx, ns, keys[i], value(byte(i), 64), cache.PutOptions{}); err != nil {
			b.Fatal(err)
		}
		if other.view.Owners(ns, keys[i])[0] == a.name {
			if _, err := a.p.PutLocal(ctx, ns, keys[i], value(byte(i), 64), cache.PutOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := a.p.PutLocal(ctx, ns, local[i], value(byte(i), 64), cache.PutOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	lookup := func(keys [][]byte) {
		got, err := a.p.Lookup(ctx, ns, keys, proxy.ScopeCluster)
		if err != nil || got != n {
			b.Fatalf("lookup: %d of %d, %v", got, n, err)
		}
	}
	lookup(keys) // warm the connection
	b.ResetTimer()
	var other_, local_, cpu time.Duration
	for i := 0; i < b.N; i++ {
		c0, t0 := cpuTime(), time.Now()
		lookup(keys)
		t1, c1 := time.Now(), cpuTime()
		lookup(local)
		local_ += time.Since(t1)
		other_ += t1.Sub(t0)
		cpu += c1 - c0
	}
	b.StopTimer()
	b.ReportMetric(float64(other_.Microseconds())/float64(b.N), "µs/lookup")
	// Both nodes run in this process: the CPU counts both ends.
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/lookup")
	b.ReportMetric(float64(local_.Microseconds())/float64(b.N), "local-µs/lookup")
}
