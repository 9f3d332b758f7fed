//go:build linux

package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/client"
	"github.com/tidepool-kv/tidepool/internal/poll"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/engineapi"
)

// callGate counts the calls the server answers, by method, and can hold
// the answers of one method: the call has been served (its leases taken,
// its reservations made) but the client does not have the answer yet.
type callGate struct {
	method  atomic.Value  // string: the method held; "" none
	entered chan struct{} // a held call reports here...
	pass    chan struct{} // ...and waits for a token here

	mu    sync.Mutex
	calls map[string]int
}

func newCallGate() *callGate {
	g := &callGate{entered: make(chan struct{}), pass: make(chan struct{}), calls: map[string]int{}}
	g.method.Store("")
	return g
}

func (g *callGate) observe(method string, _ time.Duration, _ string) {
	g.mu.Lock()
	g.calls[method]++
	g.mu.Unlock()
	if g.method.Load().(string) == method {
		g.entered <- struct{}{}
		<-g.pass
	}
}

func (g *callGate) count(method string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls[method]
}

// startGated runs a sidecar whose calls go through a callGate, and a
// client of it.
func startGated(t *testing.T, capacity int64) (*client.Client, *proxy.Proxy, *callGate) {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "tpco")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	g := newCallGate()
	ecfg := engineapi.DefaultConfig()
	ecfg.Observer = g.observe
	stop, p := runSidecarWith(t, dir, capacity, ecfg)
	// Every PutFrom takes a Reserve and a Commit here (these tests count
	// them): no slots reserved ahead.
	cfg := client.DefaultConfig(filepath.Join(dir, "tp.sock"))
	cfg.ReserveAhead = client.Off
	c, err := client.NewWithConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.method.Store("")
		c.Close()
		stop()
	})
	return c, p, g
}

func sized(seed int64, n int) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

// TestCoalescedCalls: 32 concurrent callers of GetInto (hits, misses,
// buffers too small) and PutFrom (new keys, present keys), every byte
// checked; the server sees fewer Acquire, Reserve and Commit calls than
// there were GetIntos and PutFroms, and no lease or reservation is left.
func TestCoalescedCalls(t *testing.T) {
	c, p, g := startGated(t, 96<<20)
	ctx := context.Background()
	const (
		stored  = 48
		callers = 32
		each    = 24
	)
	vals := make([][]byte, stored)
	for k := range vals {
		vals[k] = sized(int64(k), 1+k*2731) // 1 B … 128 KiB
		if existed, err := c.PutFrom(ctx, "ns", []byte(fmt.Sprint("k", k)), vals[k], 0); existed || err != nil {
			t.Fatalf("PutFrom: %v %v", existed, err)
		}
	}
	base := map[string]int{"Acquire": g.count("Acquire"), "Reserve": g.count("Reserve"), "Commit": g.count("Commit")}
	var gets, puts atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < callers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 128<<10)
			for i := 0; i < each; i++ {
				k := (w*7 + i*5) % stored
				key := []byte(fmt.Sprint("k", k))
				var err error
				switch i % 5 {
				case 0, 1: // a hit
					gets.Add(1)
					var n int
					var found bool
					n, found, err = c.GetInto(ctx, "ns", key, buf)
					if err == nil && (!found || n != len(vals[k]) || !bytes.Equal(buf[:n], vals[k])) {
						err = fmt.Errorf("GetInto %s: n %d found %v, bytes equal %v", key, n, found, bytes.Equal(buf[:n], vals[k]))
					}
				case 2: // a buffer too small
					gets.Add(1)
					small := buf[:len(vals[k])/2]
					n, found, gerr := c.GetInto(ctx, "ns", key, small)
					if client.CodeOf(gerr) != client.CodeTooLarge || n != len(vals[k]) || found {
						err = fmt.Errorf("GetInto %s into %d bytes: %d %v %v", key, len(small), n, found, gerr)
					}
				case 3: // a miss
					gets.Add(1)
					n, found, gerr := c.GetInto(ctx, "ns", []byte(fmt.Sprint("miss", w, i)), buf)
					if gerr != nil || found || n != 0 {
						err = fmt.Errorf("GetInto of a miss: %d %v %v", n, found, gerr)
					}
				case 4: // a put: new key, then the same key again
					puts.Add(2)
					nk := []byte(fmt.Sprint("new", w, i))
					v := sized(int64(w*1000+i), 1+(w*each+i)*97%(64<<10))
					existed, perr := c.PutFrom(ctx, "ns", nk, v, 0)
					if perr != nil || existed {
						err = fmt.Errorf("PutFrom %s: %v %v", nk, existed, perr)
						break
					}
					if existed, perr = c.PutFrom(ctx, "ns", nk, v, 0); perr != nil || !existed {
						err = fmt.Errorf("PutFrom %s again: %v %v", nk, existed, perr)
						break
					}
					n, found, gerr := c.GetInto(ctx, "ns", nk, buf)
					gets.Add(1)
					if gerr != nil || !found || !bytes.Equal(buf[:n], v) {
						err = fmt.Errorf("GetInto %s after PutFrom: %d %v %v", nk, n, found, gerr)
					}
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	acquires := g.count("Acquire") - base["Acquire"]
	reserves := g.count("Reserve") - base["Reserve"]
	commits := g.count("Commit") - base["Commit"]
	st := c.CoalesceStats()
	t.Logf("%d GetIntos: %d Acquire calls; %d PutFroms: %d Reserve and %d Commit calls; client: %+v",
		gets.Load(), acquires, puts.Load(), reserves, commits, st)
	// Every PutFrom reserves; only those of new keys commit. Up to
	// twice GOMAXPROCS Commits go out at once: with that many per caller,
	// they need not queue.
	commitsMax := int(puts.Load())/2 - 1
	if 2*runtime.GOMAXPROCS(0) >= callers/4 {
		commitsMax++
	}
	if acquires >= int(gets.Load()) || reserves >= int(puts.Load()) || commits > commitsMax {
		t.Errorf("not coalesced: %d GetIntos, %d Acquire calls; %d PutFroms, %d Reserve, %d Commit calls", gets.Load(), acquires, puts.Load(), reserves, commits)
	}
	// The fill made no GetInto: the client's counters match the server's.
	if st.Acquire.Items != gets.Load() || int(st.Acquire.Calls) != acquires {
		t.Errorf("client counted %d Acquire calls of %d items; the server %d calls, for %d GetIntos", st.Acquire.Calls, st.Acquire.Items, acquires, gets.Load())
	}
	c.Close()
	zs := p.ZeroCopyStats()
	if zs.LiveLeases != 0 || zs.LiveReservations != 0 || zs.Acquired != zs.Released || zs.LeaseExpirations != 0 {
		t.Errorf("after Close: %+v", zs)
	}
}

// result of a call started in a goroutine.
type callResult struct {
	n     int
	found bool
	err   error
}

func goGetInto(ctx context.Context, c *client.Client, ns, key string, buf []byte) chan callResult {
	ch := make(chan callResult, 1)
	go func() {
		n, found, err := c.GetInto(ctx, ns, []byte(key), buf)
		ch <- callResult{n, found, err}
	}()
	return ch
}

func goPutFrom(ctx context.Context, c *client.Client, key string, val []byte) chan callResult {
	ch := make(chan callResult, 1)
	go func() {
		existed, err := c.PutFrom(ctx, "ns", []byte(key), val, 0)
		ch <- callResult{found: existed, err: err}
	}()
	return ch
}

func queued(c *client.Client, which int) int {
	a, r, m := client.Queued(c)
	return [3]int{a, r, m}[which]
}

// TestCoalesceAbandonAcquire: GetIntos queue behind an Acquire in flight;
// one leaves while queued (its key is never sent), one while the batched
// Acquire is in flight (the lease it would have got is released); the
// others get their blocks, and every lease is released.
func TestCoalesceAbandonAcquire(t *testing.T) {
	c, p, g := startGated(t, 16<<20)
	ctx := context.Background()
	val := sized(1, 100<<10)
	if _, err := c.PutFrom(ctx, "ns", []byte("k"), val, 0); err != nil {
		t.Fatal(err)
	}
	before := p.ZeroCopyStats()
	g.method.Store("Acquire")
	lead := goGetInto(ctx, c, "ns", "k", make([]byte, len(val)))
	<-g.entered
	ctxInFlight, cancelInFlight := context.WithCancel(ctx)
	defer cancelInFlight()
	ctxQueued, cancelQueued := context.WithCancel(ctx)
	defer cancelQueued()
	buf := make([]byte, len(val))
	leaveInFlight := goGetInto(ctxInFlight, c, "ns", "k", make([]byte, len(val)))
	poll.Until(t, 10*time.Second, "1 queued", func() bool { return queued(c, 0) == 1 })
	stay := goGetInto(ctx, c, "ns", "k", buf)
	poll.Until(t, 10*time.Second, "2 queued", func() bool { return queued(c, 0) == 2 })
	leaveQueued := goGetInto(ctxQueued, c, "ns", "k", make([]byte, len(val)))
	poll.Until(t, 10*time.Second, "3 queued", func() bool { return queued(c, 0) == 3 })
	cancelQueued()
	if r := <-leaveQueued; !errors.Is(r.err, context.Canceled) || r.found {
		t.Fatalf("left while queued: %+v", r)
	}
	g.pass <- struct{}{} // the lead's answer
	<-g.entered          // the batched Acquire was served
	cancelInFlight()
	if r := <-leaveInFlight; !errors.Is(r.err, context.Canceled) || r.found {
		t.Fatalf("left in flight: %+v", r)
	}
	g.method.Store("")
	g.pass <- struct{}{}
	for name, ch := range map[string]chan callResult{"lead": lead, "stay": stay} {
		if r := <-ch; r.err != nil || !r.found || r.n != len(val) {
			t.Errorf("%s: %+v", name, r)
		}
	}
	if !bytes.Equal(buf, val) {
		t.Error("wrong bytes")
	}
	st := c.CoalesceStats().Acquire
	if st.Calls != 2 || st.Items != 3 || st.Dropped != 2 {
		t.Errorf("client stats %+v, want 2 calls of 3 items, 2 dropped", st)
	}
	poll.Until(t, 10*time.Second, "every lease released", func() bool {
		zs := p.ZeroCopyStats()
		return zs.LiveLeases == 0 && zs.Released-before.Released == 3
	})
	if zs := p.ZeroCopyStats(); zs.Acquired-before.Acquired != 3 || zs.LeaseExpirations != 0 {
		t.Errorf("server stats %+v, want 3 leases", zs)
	}
}

// TestCoalesceAbandonReserve: as TestCoalesceAbandonAcquire for PutFrom's
// Reserve: a reservation whose caller left is aborted.
func TestCoalesceAbandonReserve(t *testing.T) {
	c, p, g := startGated(t, 16<<20)
	ctx := context.Background()
	vals := map[string][]byte{}
	for i, k := range []string{"lead", "leave-in-flight", "stay", "leave-queued"} {
		vals[k] = sized(int64(i), 10<<10+i)
	}
	g.method.Store("Reserve")
	lead := goPutFrom(ctx, c, "lead", vals["lead"])
	<-g.entered
	ctxInFlight, cancelInFlight := context.WithCancel(ctx)
	defer cancelInFlight()
	ctxQueued, cancelQueued := context.WithCancel(ctx)
	defer cancelQueued()
	leaveInFlight := goPutFrom(ctxInFlight, c, "leave-in-flight", vals["leave-in-flight"])
	poll.Until(t, 10*time.Second, "1 queued", func() bool { return queued(c, 1) == 1 })
	stay := goPutFrom(ctx, c, "stay", vals["stay"])
	poll.Until(t, 10*time.Second, "2 queued", func() bool { return queued(c, 1) == 2 })
	leaveQueued := goPutFrom(ctxQueued, c, "leave-queued", vals["leave-queued"])
	poll.Until(t, 10*time.Second, "3 queued", func() bool { return queued(c, 1) == 3 })
	cancelQueued()
	if r := <-leaveQueued; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("left while queued: %+v", r)
	}
	g.pass <- struct{}{}
	<-g.entered
	cancelInFlight()
	if r := <-leaveInFlight; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("left in flight: %+v", r)
	}
	g.method.Store("")
	g.pass <- struct{}{}
	for name, ch := range map[string]chan callResult{"lead": lead, "stay": stay} {
		if r := <-ch; r.err != nil || r.found {
			t.Errorf("%s: %+v", name, r)
		}
	}
	// A reservation leaves the table before its abort is counted: wait
	// for the counts, not only the table.
	poll.Until(t, 10*time.Second, "every reservation committed or aborted", func() bool {
		zs := p.ZeroCopyStats()
		return zs.LiveReservations == 0 && zs.Committed+zs.Aborted+zs.ReservationsReclaimed == zs.Reserved
	})
	zs := p.ZeroCopyStats()
	if zs.Reserved != 3 || zs.Committed != 2 || zs.Aborted != 1 || zs.ReservationsReclaimed != 0 {
		t.Errorf("server stats %+v, want 3 reserved, 2 committed, 1 aborted", zs)
	}
	for k, v := range vals {
		got, found, err := c.Get(ctx, "ns", []byte(k))
		if want := !strings.HasPrefix(k, "leave"); err != nil || found != want || (found && !bytes.Equal(got, v)) {
			t.Errorf("Get %s: found %v err %v, want found %v", k, found, err, want)
		}
	}
}

// TestCoalesceAbandonCommit: a PutFrom that leaves while its Commit is
// queued has its reservation aborted, not committed.
func TestCoalesceAbandonCommit(t *testing.T) {
	c, p, g := startGated(t, 16<<20)
	ctx := context.Background()
	g.method.Store("Commit")
	// Twice GOMAXPROCS Commits go out before the next one queues.
	width := 2 * runtime.GOMAXPROCS(0)
	var leads []chan callResult
	for i := 0; i < width; i++ {
		leads = append(leads, goPutFrom(ctx, c, fmt.Sprint("lead", i), sized(int64(i), 5000)))
		<-g.entered
	}
	ctxQueued, cancelQueued := context.WithCancel(ctx)
	defer cancelQueued()
	leave := goPutFrom(ctxQueued, c, "leave", sized(-1, 5000))
	poll.Until(t, 10*time.Second, "1 queued", func() bool { return queued(c, 2) == 1 })
	cancelQueued()
	if r := <-leave; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("left while queued: %+v", r)
	}
	g.method.Store("")
	for range leads {
		g.pass <- struct{}{}
	}
	for i, lead := range leads {
		if r := <-lead; r.err != nil || r.found {
			t.Fatalf("lead %d: %+v", i, r)
		}
	}
	poll.Until(t, 10*time.Second, "the reservation aborted", func() bool {
		zs := p.ZeroCopyStats()
		return zs.LiveReservations == 0 && zs.Aborted == 1
	})
	if zs := p.ZeroCopyStats(); zs.Reserved != int64(width)+1 || zs.Committed != int64(width) {
		t.Errorf("server stats %+v", zs)
	}
	if _, found, err := c.Get(ctx, "ns", []byte("leave")); found || err != nil {
		t.Errorf("Get of the abandoned put: %v %v", found, err)
	}
}

// TestCoalesceSharedError: the error of a batched call reaches every
// caller queued in it.
func TestCoalesceSharedError(t *testing.T) {
	c, _, g := startGated(t, 16<<20)
	ctx := context.Background()
	bad := strings.Repeat("n", 1000) // longer than the server accepts
	g.method.Store("Acquire")
	lead := goGetInto(ctx, c, bad, "k", make([]byte, 10))
	<-g.entered
	var waiters []chan callResult
	for i := 0; i < 4; i++ {
		waiters = append(waiters, goGetInto(ctx, c, bad, fmt.Sprint("k", i), make([]byte, 10)))
		poll.Until(t, 10*time.Second, "queued", func() bool { return queued(c, 0) == i+1 })
	}
	g.pass <- struct{}{}
	<-g.entered
	g.method.Store("")
	g.pass <- struct{}{}
	if r := <-lead; client.CodeOf(r.err) != client.CodeInvalidArgument {
		t.Errorf("lead: %+v", r)
	}
	for i, ch := range waiters {
		if r := <-ch; client.CodeOf(r.err) != client.CodeInvalidArgument {
			t.Errorf("waiter %d: %+v", i, r)
		}
	}
	if n := g.count("Acquire"); n != 2 {
		t.Errorf("%d Acquire calls, want 2", n)
	}
}
