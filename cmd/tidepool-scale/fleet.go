package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	metrics "github.com/hashicorp/go-metrics"

	"github.com/tidepool-kv/tidepool/cluster"
)

// node is one cluster member of the fleet: a real cluster.Cluster (a real
// memberlist over its own UDP and TCP sockets on loopback) and the counts
// read from memberlist's own log lines.
type node struct {
	name string
	c    *cluster.Cluster
	log  *logCounter
}

// logCounter counts memberlist's log lines that matter here. memberlist
// writes each line with one Write (a log.Logger).
type logCounter struct {
	refuteSuspect atomic.Int64 // this node heard it was suspected while alive
	refuteDead    atomic.Int64 // this node heard it was declared dead while alive
	markedFailed  atomic.Int64 // this node's suspicion timer declared a member failed
	queueDrops    atomic.Int64 // alive/suspect/dead messages dropped: memberlist's handler queue was full
}

func (l *logCounter) Write(p []byte) (int, error) {
	switch {
	case bytes.Contains(p, []byte("Refuting a suspect message")):
		l.refuteSuspect.Add(1)
	case bytes.Contains(p, []byte("Refuting a dead message")):
		l.refuteDead.Add(1)
	case bytes.Contains(p, []byte("as failed, suspect timeout reached")):
		l.markedFailed.Add(1)
	case bytes.Contains(p, []byte("handler queue full, dropping message")):
		l.queueDrops.Add(1)
	}
	return len(p), nil
}

// profile names a set of gossip timings.
type profile string

const (
	profShipped   profile = "shipped" // cluster.DefaultConfig: what `tidepool serve` runs
	profMemberLAN profile = "lan"     // memberlist's LAN defaults (tidepool's shipped defaults before 2026-12-06)
	profLocal     profile = "local"   // cluster.DefaultLocalConfig: the tests' timings
)

func (p profile) config(name string) (cluster.Config, error) {
	var c cluster.Config
	switch p {
	case profShipped:
		c = cluster.DefaultConfig()
	case profMemberLAN:
		c = cluster.DefaultConfig()
		c.ProbeInterval, c.ProbeTimeout, c.SuspicionMult = time.Second, 500*time.Millisecond, 4
		c.SuspicionMaxTimeoutMult, c.AwarenessMaxMultiplier = 6, 8
		c.GossipInterval, c.GossipNodes = 200*time.Millisecond, 3
		c.Compression = true
	case profLocal:
		c = cluster.DefaultLocalConfig(name)
	default:
		return c, fmt.Errorf("unknown profile %q (shipped, lan, local)", p)
	}
	if t := overrides; t != nil {
		t(&c)
	}
	c.NodeName = name
	c.BindAddr = "127.0.0.1"
	c.BindPort = 0
	// The hand-off and subscriber buffers are allocated up front (about
	// 90 bytes an event): half the default keeps 1,000 members in a few
	// hundred MiB. A join that overflows it resyncs the member table.
	c.EventBuffer = 2048
	return c, nil
}

// overrides, when set, adjusts every member's config after its profile
// (the -probe-interval, ... flags).
var overrides func(*cluster.Config)

// fleet is N members in this process.
type fleet struct {
	prof   profile
	prefix string

	mu     sync.Mutex
	nodes  []*node
	seq    int
	failed atomic.Int64 // members whose start failed (add)
}

func newFleet(prof profile, prefix string) *fleet { return &fleet{prof: prof, prefix: prefix} }

// add starts n members; each joins the first member and two random ones
// started before it (and join, when given). Members start from
// `parallel` goroutines at once. A member that fails to start (its join
// timed out in a saturated process) is counted in f.failed, said on
// stderr and left out; add returns the members that started, and an
// error only when none did.
func (f *fleet) add(ctx context.Context, n, parallel int, join []string) ([]*node, error) {
	out := make([]*node, n)
	errs := make(chan error, n)
	sem := make(chan struct{}, max(parallel, 1))
	var wg sync.WaitGroup
	t0 := time.Now()
	next := t0.Add(5 * time.Second)
	for i := range n {
		if ctx.Err() != nil {
			break // interrupted: the members started so far are closed by the caller
		}
		if progress && time.Now().After(next) {
			next = next.Add(5 * time.Second)
			fmt.Fprintf(os.Stderr, "# %5.1f s: starting member %d of %d\n", time.Since(t0).Seconds(), i+1, n)
		}
		if joinRate > 0 && n > 1 {
			// Staggered joins: every join makes its joiner gossip an
			// alive message for each member it learned, so joins at
			// full speed keep all queues full (see docs/scale.md).
			if d := time.Until(t0.Add(time.Duration(float64(i) / joinRate * float64(time.Second)))); d > 0 {
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(d):
				}
			}
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			nd, err := f.start(ctx, join)
			if err != nil {
				errs <- err
				return
			}
			out[i] = nd
		}()
	}
	wg.Wait()
	close(errs)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	started := slices.DeleteFunc(out, func(nd *node) bool { return nd == nil })
	var first error
	for err := range errs {
		f.failed.Add(1)
		fmt.Fprintln(os.Stderr, "# a member did not start:", err)
		first = cmp.Or(first, err)
	}
	if len(started) == 0 && n > 0 {
		return nil, first
	}
	return started, nil
}

func (f *fleet) start(ctx context.Context, join []string) (*node, error) {
	f.mu.Lock()
	name := fmt.Sprintf("%s%05d", f.prefix, f.seq)
	f.seq++
	// The first member and two random ones, as a pod joining through a
	// headless Service reaches some of the pods already up.
	peers := append([]string(nil), join...)
	if len(f.nodes) > 0 {
		peers = append(peers, f.nodes[0].c.Addr())
	}
	for range 2 {
		if len(f.nodes) == 0 {
			break
		}
		peers = append(peers, f.nodes[rand.IntN(len(f.nodes))].c.Addr())
	}
	f.mu.Unlock()
	cfg, err := f.prof.config(name)
	if err != nil {
		return nil, err
	}
	lc := &logCounter{}
	cfg.LogOutput = lc
	cfg.Join = peers
	c, err := cluster.New(cfg, nil)
	if err != nil {
		return nil, err
	}
	jctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := c.Start(jctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	nd := &node{name: name, c: c, log: lc}
	f.mu.Lock()
	f.nodes = append(f.nodes, nd)
	f.mu.Unlock()
	return nd, nil
}

// all returns the members that have not been removed.
func (f *fleet) all() []*node {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*node(nil), f.nodes...)
}

// remove takes nd out of the fleet; leave says whether it leaves
// gracefully first (else it stops answering: a crash as peers see it).
func (f *fleet) remove(nd *node, leave bool) {
	f.mu.Lock()
	for i, x := range f.nodes {
		if x == nd {
			f.nodes = append(f.nodes[:i], f.nodes[i+1:]...)
			break
		}
	}
	f.mu.Unlock()
	if leave {
		_ = nd.c.Leave(5 * time.Second)
	}
	_ = nd.c.Close()
}

func (f *fleet) close() {
	var wg sync.WaitGroup
	for _, nd := range f.all() {
		wg.Add(1)
		go func() { defer wg.Done(); _ = nd.c.Close() }()
	}
	wg.Wait()
}

// liveMin is the smallest live-member count any member sees.
func liveMin(ns []*node) int {
	m := -1
	for _, nd := range ns {
		if l := nd.c.Stats().Live; m < 0 || l < m {
			m = l
		}
	}
	return m
}

// joinRate, when > 0, starts at most this many members a second in add
// (-join-rate).
var joinRate float64

// progress makes waitConverged report the smallest view on stderr every
// 5 s (-v).
var progress bool

// waitSeen polls until every member of ns but name holds name live.
func waitSeen(ctx context.Context, ns []*node, name string, limit time.Duration) (time.Duration, error) {
	t0 := time.Now()
	for {
		missing := 0
		for _, nd := range ns {
			if m, ok := nd.c.Member(name); nd.name != name && (!ok || !m.State.Live()) {
				missing++
			}
		}
		if missing == 0 {
			return time.Since(t0), nil
		}
		if time.Since(t0) > limit {
			return 0, fmt.Errorf("%s not seen in %v by %d of %d members", name, limit, missing, len(ns)-1)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(pollEvery(len(ns))):
		}
	}
}

// waitConverged polls until every member of ns sees at least want live
// members.
func waitConverged(ctx context.Context, ns []*node, want int, limit time.Duration) (time.Duration, error) {
	t0 := time.Now()
	deadline := t0.Add(limit)
	next := t0.Add(5 * time.Second)
	for {
		lm := liveMin(ns)
		if lm >= want {
			return time.Since(t0), nil
		}
		if progress && time.Now().After(next) {
			next = next.Add(5 * time.Second)
			fmt.Fprintf(os.Stderr, "# %5.1f s: smallest view %d of %d\n", time.Since(t0).Seconds(), lm, want)
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("not converged in %v: smallest view %d of %d", limit, lm, want)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(pollEvery(len(ns))):
		}
	}
}

// pollEvery is how often the harness reads every member's view: N reads
// of a kept count (Stats().Live, O(1) each), each taking the member's
// table lock, so at 1,000 members every 100 ms rather than every 20.
func pollEvery(n int) time.Duration {
	return max(20*time.Millisecond, time.Duration(n)*100*time.Microsecond)
}

// counters sums memberlist's byte and message counters over every member
// of this process (go-metrics' global sink: memberlist reports there).
type counters struct {
	mu sync.Mutex
	v  map[string]float64
	metrics.BlackholeSink
}

func (c *counters) IncrCounter(key []string, val float32) {
	c.IncrCounterWithLabels(key, val, nil)
}

func (c *counters) IncrCounterWithLabels(key []string, val float32, _ []metrics.Label) {
	k := strings.Join(key, ".")
	c.mu.Lock()
	c.v[k] += float64(val)
	c.mu.Unlock()
}

func (c *counters) snapshot() map[string]float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]float64, len(c.v))
	for k, v := range c.v {
		out[k] = v
	}
	return out
}

var sink = &counters{v: map[string]float64{}}

func init() {
	cfg := metrics.DefaultConfig("")
	cfg.EnableHostname = false
	cfg.EnableHostnameLabel = false
	cfg.EnableRuntimeMetrics = false
	cfg.EnableServiceLabel = false
	if _, err := metrics.NewGlobal(cfg, sink); err != nil {
		panic(err)
	}
}

// gossipBytes is the bytes memberlist sent (UDP and TCP) per the sink.
func gossipBytes(s map[string]float64) (udp, tcp float64) {
	for k, v := range s {
		switch {
		case strings.HasSuffix(k, "memberlist.udp.sent"):
			udp += v
		case strings.HasSuffix(k, "memberlist.tcp.sent"):
			tcp += v
		}
	}
	return udp, tcp
}

// udpRcvbufErrors is the host's count of UDP datagrams dropped because a
// socket's receive buffer was full (/proc/net/snmp, Udp RcvbufErrors), or
// -1 when it cannot be read.
func udpRcvbufErrors() int64 {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return -1
	}
	var head []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if head == nil {
			head = f
			continue
		}
		for i, h := range head {
			if h == "RcvbufErrors" && i < len(f) {
				var v int64
				if _, err := fmt.Sscan(f[i], &v); err == nil {
					return v
				}
			}
		}
	}
	return -1
}

// cpuTime is the CPU time (user + system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// queueDrops sums the handler-queue drops of ns.
func queueDrops(ns []*node) int64 {
	var n int64
	for _, nd := range ns {
		n += nd.log.queueDrops.Load()
	}
	return n
}
