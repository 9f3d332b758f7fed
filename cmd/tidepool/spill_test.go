package main

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tidepool-kv/tidepool/client"
	"github.com/tidepool-kv/tidepool/internal/proctest"
)

// TestReadsDuringSpill: on a real sidecar whose DRAM tier is full and
// spilling to SSD under a flood of fresh puts, reads of resident blocks
// keep completing with the right bytes while the flood goes on. The check
// is by counts, not time: the flood's put count and the sidecar's
// eviction count both advance between the first and the last read, so
// every read ran while DRAM was spilling; a read that waited for the
// spill to finish could only complete after the flood is stopped, and the
// flood is stopped only after the last read.
func TestReadsDuringSpill(t *testing.T) {
	const size = 1 << 20
	d := startDaemon(t, "--dram-capacity", "24MiB", "--ssd-capacity", "1GiB")
	ctx := context.Background()
	c, err := client.New(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hot := make([][]byte, 4)
	for i := range hot {
		hot[i] = restartValue(1000+i, size)
		// Durable: written through to SSD, so the block is found in one
		// tier or the other whatever the flood evicts.
		if _, err := c.PutWith(ctx, "hot", []byte(fmt.Sprint(i)), hot[i], client.PutOptions{Durable: true}); err != nil {
			t.Fatal(err)
		}
	}

	// The flood: fresh 1 MiB keys from 4 callers until stopped.
	var puts atomic.Int64
	var floodErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := restartValue(w, size)
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := c.Put(ctx, "flood", []byte(fmt.Sprintf("w%d-%d", w, n)), v, 0); err != nil {
					floodErr.Store(err)
					return
				}
				puts.Add(1)
			}
		}()
	}
	stopFlood := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}
	defer stopFlood()

	evictions := func() float64 { return scrape(t, d, `tidepool_tier_evictions_total{tier="dram"}`)[0] }
	// Wait (with a deadline) until the flood has filled DRAM and it spills.
	deadline := time.Now().Add(60 * time.Second)
	for evictions() < 8 {
		if time.Now().After(deadline) {
			t.Fatalf("DRAM never spilled: %d puts", puts.Load())
		}
		if err := floodErr.Load(); err != nil {
			t.Fatalf("flood put: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	putsBefore, evBefore := puts.Load(), evictions()
	const reads = 64
	for i := range reads {
		k := i % len(hot)
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second) // hang guard
		v, found, err := c.Get(rctx, "hot", []byte(fmt.Sprint(k)))
		cancel()
		if err != nil || !found || !bytes.Equal(v, hot[k]) {
			t.Fatalf("read %d of block %d while spilling: found %v, right bytes %v, %v", i, k, found, bytes.Equal(v, hot[k]), err)
		}
	}
	putsAfter, evAfter := puts.Load(), evictions()
	stopFlood()
	if err := floodErr.Load(); err != nil {
		t.Fatalf("flood put: %v", err)
	}
	if putsAfter <= putsBefore || evAfter <= evBefore {
		t.Fatalf("the flood did not run during the reads: puts %d → %d, DRAM evictions %v → %v", putsBefore, putsAfter, evBefore, evAfter)
	}
	t.Logf("%d reads while the flood put %d blocks and DRAM evicted %v", reads, putsAfter-putsBefore, evAfter-evBefore)
}

// TestSSDBackgroundPriority: a real sidecar with ssd_background_priority
// low (and the value log off, so that the blocks go through RocksDB's
// memtables) runs RocksDB's flushes at nice 19 once DRAM spills enough to
// flush a memtable (a flush thread lowers itself when it runs a job, so one that
// has not run any yet is still at the process's); one on the default leaves every
// flush thread at the process's nice value. cache/ssd's
// TestBackgroundPriority checks both pools of each setting after a flush
// and a compaction.
func TestSSDBackgroundPriority(t *testing.T) {
	// The sidecar inherits this process's nice value (the test may run
	// under nice(1)); the raw getpriority syscall returns 20 - nice.
	raw, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	if err != nil {
		t.Fatal(err)
	}
	own := 20 - raw
	for _, c := range []struct {
		flags []string
		nice  int
	}{{[]string{"--ssd-background-priority", "low"}, 19}, {nil, own}} {
		t.Run(fmt.Sprintf("nice=%d", c.nice), func(t *testing.T) {
			d := startDaemon(t, append([]string{"--dram-capacity", "16MiB", "--ssd-capacity", "1GiB", "--ssd-value-log-min", "0"}, c.flags...)...)
			cl, err := client.New(d.socket)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			// 64 MiB through a 16 MiB DRAM: more than one 32 MiB memtable
			// of demotions, so RocksDB flushes at least once.
			v := restartValue(7, 1<<20)
			for i := range 64 {
				if _, err := cl.Put(context.Background(), "p", []byte(fmt.Sprint(i)), v, 0); err != nil {
					t.Fatal(err)
				}
			}
			flushers := func() map[string]int { return rocksThreads(t, d.cmd.Process.Pid, "rocksdb:high") }
			deadline := time.Now().Add(60 * time.Second)
			for scrape(t, d, "tidepool_demotions_total")[0] < 40 || (c.nice != own && !anyNice(flushers(), c.nice)) {
				if time.Now().After(deadline) {
					t.Fatalf("demotions %v, flush threads %v: want one at nice %d", scrape(t, d, "tidepool_demotions_total"), flushers(), c.nice)
				}
				time.Sleep(100 * time.Millisecond)
			}
			f := flushers()
			for _, n := range f {
				if n != own && n != c.nice {
					t.Fatalf("flush threads %v: nice %d, want %d (or %d before its first job)", f, n, c.nice, own)
				}
			}
			if c.nice == own && !anyNice(f, own) {
				t.Fatalf("flush threads %v, want them at nice %d", f, own)
			}
		})
	}
}

// TestDemotionWait: a real sidecar with demotion_wait and a demotion queue
// of one block, flooded with fresh puts from 8 callers through a 16 MiB
// DRAM tier: evictions that find the queue full wait for the SSD instead of
// dropping (tidepool_demotion_waits_total > 0, nothing dropped), and every
// block reads back whole from one tier or the other.
func TestDemotionWait(t *testing.T) {
	const size, callers, each = 1 << 20, 8, 32
	d := startDaemon(t, "--dram-capacity", "16MiB", "--ssd-capacity", "1GiB",
		"--max-value-size", "1MiB", "--demotion-queue", "1MiB", "--demotion-wait", "1m")
	ctx := context.Background()
	c, err := client.New(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	for w := range callers {
		wg.Go(func() {
			for i := range each {
				k := fmt.Appendf(nil, "w%d-%d", w, i)
				if _, err := c.Put(ctx, "flood", k, restartValue(w*each+i, size), 0); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if got := scrape(t, d, "tidepool_demotions_dropped_total")[0]; got != 0 {
		t.Fatalf("%v demotions dropped with demotion_wait", got)
	}
	if got := scrape(t, d, "tidepool_demotion_waits_total")[0]; got == 0 {
		t.Fatal("no eviction waited: the flood never filled a one-block queue")
	}
	for w := range callers {
		for i := range each {
			k := fmt.Appendf(nil, "w%d-%d", w, i)
			v, _, err := c.Get(ctx, "flood", k)
			if err != nil || !bytes.Equal(v, restartValue(w*each+i, size)) {
				t.Fatalf("block %s: %v (%d bytes)", k, err, len(v))
			}
		}
	}
	t.Logf("waits %v, waited %vs in all, demotions %v", scrape(t, d, "tidepool_demotion_waits_total")[0],
		scrape(t, d, "tidepool_demotion_wait_seconds_total")[0], scrape(t, d, "tidepool_demotions_total")[0])
}

// rocksThreads returns the nice value of each thread of process pid whose
// name is name, by thread id.
func rocksThreads(t *testing.T, pid int, name string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, th := range proctest.Threads(t, strconv.Itoa(pid)) {
		if th.Name == name {
			out[th.TID] = th.Nice
		}
	}
	return out
}

// anyNice reports whether a thread of threads is at nice n.
func anyNice(threads map[string]int, n int) bool {
	for _, v := range threads {
		if v == n {
			return true
		}
	}
	return false
}
