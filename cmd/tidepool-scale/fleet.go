package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
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
}

func (l *logCounter) Write(p []byte) (int, error) {
	switch {
	case bytes.Contains(p, []byte("Refuting a suspect message")):
		l.refuteSuspect.Add(1)
	case bytes.Contains(p, []byte("Refuting a dead message")):
		l.refuteDead.Add(1)
	case bytes.Contains(p, []byte("as failed, suspect timeout reached")):
		l.markedFailed.Add(1)
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

	mu    sync.Mutex
	nodes []*node
	seq   int
}

func newFleet(prof profile, prefix string) *fleet { return &fleet{prof: prof, prefix: prefix} }

// add starts n members; each joins the first member and two random ones
// started before it (and join, when given). Members start from
// `parallel` goroutines at once.
func (f *fleet) add(ctx context.Context, n, parallel int, join []string) ([]*node, error) {
	out := make([]*node, n)
	errs := make(chan error, n)
	sem := make(chan struct{}, max(parallel, 1))
	var wg sync.WaitGroup
	for i := range n {
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
	if err := <-errs; err != nil {
		return nil, err
	}
	return out, nil
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

// waitConverged polls until every member of ns sees want live members.
func waitConverged(ctx context.Context, ns []*node, want int, limit time.Duration) (time.Duration, error) {
	t0 := time.Now()
	deadline := t0.Add(limit)
	for {
		if liveMin(ns) == want {
			return time.Since(t0), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("not converged in %v: smallest view %d of %d", limit, liveMin(ns), want)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
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
