package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/internal/poll"
)

func startNode(t testing.TB, name string, mod func(*Config), join ...string) *Cluster {
	t.Helper()
	c, err := tryStart(t, name, mod, join...)
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	return c
}

func tryStart(t testing.TB, name string, mod func(*Config), join ...string) (*Cluster, error) {
	t.Helper()
	cfg := DefaultLocalConfig(name)
	cfg.Join = join
	cfg.Meta.PeerAddr = "127.0.0.1:1"
	if mod != nil {
		mod(&cfg)
	}
	c, err := New(cfg, nil)
	if err != nil {
		t.Fatalf("New(%s): %v", name, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	// A join that must fail gives up after a second; good joins take ms.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return c, c.Start(ctx)
}

func stateOf(c *Cluster, name string) State {
	for _, m := range c.Members() {
		if m.Name == name {
			return m.State
		}
	}
	return 0
}

func liveCount(c *Cluster) int { return len(LiveNames(c.Members())) }

func TestConfigValidate(t *testing.T) {
	if err := DefaultLocalConfig("a").Validate(); err != nil {
		t.Fatalf("local defaults: %v", err)
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	bad := Config{BindAddr: "nope", BindPort: -1, SecretKey: []byte("short"), Join: []string{""},
		ProbeInterval: time.Second, ProbeTimeout: 2 * time.Second, Label: strings.Repeat("l", 300),
		Meta: Meta{Zone: strings.Repeat("z", 300)}, GossipInterval: -1, EventBuffer: -1, Tombstone: -1}
	err := bad.Validate()
	for _, want := range []string{"BindAddr", "BindPort", "SecretKey", "Join", "ProbeTimeout",
		"GossipInterval", "EventBuffer", "Label", "zone", "Tombstone"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() does not report %s: %v", want, err)
		}
	}
	if _, err := New(bad, nil); err == nil {
		t.Error("New accepted a bad config")
	}
}

func TestResolveJoin(t *testing.T) {
	cfg := DefaultLocalConfig("r")
	cfg.LookupHost = func(_ context.Context, host string) ([]string, error) {
		switch host {
		case "tidepool-headless.default.svc.cluster.local":
			return []string{"10.0.0.3", "10.0.0.1", "10.0.0.2"}, nil
		case "single":
			return []string{"10.0.1.1"}, nil
		}
		return nil, fmt.Errorf("no such host %s", host)
	}
	c, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.resolve(context.Background(), []string{
		"tidepool-headless.default.svc.cluster.local", "single:8000", "10.0.0.1:7946", "[::1]:9", "missing"})
	want := []string{"10.0.0.1:7946", "10.0.0.2:7946", "10.0.0.3:7946", "10.0.1.1:8000", "[::1]:9"}
	if !slices.Equal(got, want) {
		t.Fatalf("resolve = %v, want %v", got, want)
	}
	if err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("resolve error %v does not name the failed lookup", err)
	}
}

func TestLifecycleErrors(t *testing.T) {
	c, err := New(DefaultLocalConfig("x"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Leave(time.Second); !errors.Is(err, ErrNotStarted) {
		t.Fatalf("Leave before Start: %v", err)
	}
	if _, err := c.Join(context.Background(), []string{"127.0.0.1:1"}); !errors.Is(err, ErrNotStarted) {
		t.Fatalf("Join before Start: %v", err)
	}
	ch, cancel := c.Subscribe()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, ok := <-ch; ok {
		t.Fatal("subscription open after Close")
	}
	cancel()
	if err := c.Start(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close: %v", err)
	}
}

// TestFiveNodes: join, converge, metadata updates, graceful leave seen as
// left, a node closed without leaving seen as failed.
func TestFiveNodes(t *testing.T) {
	seed := startNode(t, "n0", nil)
	events, cancel := seed.Subscribe()
	defer cancel()
	nodes := []*Cluster{seed}
	for i := 1; i < 5; i++ {
		// Half join by a DNS name that resolves (through the seam) to the seed.
		mod := func(c *Config) {
			c.LookupHost = func(context.Context, string) ([]string, error) { return []string{"127.0.0.1"}, nil }
		}
		_, port, _ := strings.Cut(seed.Addr(), ":")
		join := seed.Addr()
		if i%2 == 0 {
			join = "tidepool-headless:" + port
		}
		nodes = append(nodes, startNode(t, fmt.Sprintf("n%d", i), mod, join))
	}
	took := poll.Until(t, 10*time.Second, "5 live members everywhere", func() bool {
		for _, n := range nodes {
			if liveCount(n) != 5 {
				return false
			}
		}
		return true
	})
	t.Logf("5 nodes converged in %v", took)
	for _, m := range seed.Members() {
		if m.Meta.NodeID != m.Name || m.Meta.Protocol != ProtocolVersion || m.Meta.PeerAddr != "127.0.0.1:1" {
			t.Fatalf("member %s has metadata %+v", m.Name, m.Meta)
		}
		if m.Local != (m.Name == "n0") {
			t.Fatalf("member %s Local=%v", m.Name, m.Local)
		}
	}

	// Metadata updates spread.
	m := nodes[1].LocalMeta()
	m.Tiers = []TierUsage{{TierDRAM, 1 << 30, 12345}}
	m.NodeID = "ignored"
	ctx, cancelU := context.WithTimeout(context.Background(), 5*time.Second)
	if err := nodes[1].UpdateMeta(ctx, m); err != nil {
		t.Fatalf("UpdateMeta: %v", err)
	}
	cancelU()
	poll.Until(t, 10*time.Second, "n1's tier usage at n0", func() bool {
		for _, mm := range seed.Members() {
			if mm.Name == "n1" && len(mm.Meta.Tiers) == 1 && mm.Meta.Tiers[0].Used == 12345 && mm.Meta.NodeID == "n1" {
				return true
			}
		}
		return false
	})

	// Graceful leave: seen as left, not failed.
	if err := nodes[4].Leave(3 * time.Second); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	if err := nodes[4].Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	poll.Until(t, 10*time.Second, "n4 left everywhere", func() bool {
		for _, n := range nodes[:4] {
			if stateOf(n, "n4") != StateLeft {
				return false
			}
		}
		return true
	})

	// Close without leave: seen as failed.
	start := time.Now()
	if err := nodes[3].Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	poll.Until(t, 15*time.Second, "n3 failed everywhere", func() bool {
		for _, n := range nodes[:3] {
			if stateOf(n, "n3") != StateFailed {
				return false
			}
		}
		return true
	})
	t.Logf("failure of n3 noticed by all in %v", time.Since(start))
	if got := LiveNames(seed.Members()); !slices.Equal(got, []string{"n0", "n1", "n2"}) {
		t.Fatalf("live after leave and failure: %v", got)
	}
	ring, err := seed.Ring(DefaultRingConfig())
	if err != nil || !slices.Equal(ring.Members(), []string{"n0", "n1", "n2"}) {
		t.Fatalf("Ring() = %v, %v", ring, err)
	}
	if m, ok := seed.Member(ring.Owner([]byte("k"))); !ok || m.Meta.PeerAddr != "127.0.0.1:1" || !m.State.Live() {
		t.Fatalf("Member(owner) = %+v, %v", m, ok)
	}
	if m, ok := seed.Member("n3"); !ok || m.State != StateFailed {
		t.Fatalf("Member(n3) = %+v, %v", m, ok)
	}
	if _, ok := seed.Member("nobody"); ok {
		t.Fatal("Member(nobody) found")
	}

	// The subscriber saw joins, the update, the leaving, left and failed.
	seen := map[string]bool{}
	var last uint64
	for len(events) > 0 {
		ev := <-events
		if ev.Seq != last+1 && last != 0 {
			t.Fatalf("event sequence jumps from %d to %d", last, ev.Seq)
		}
		last = ev.Seq
		seen[fmt.Sprintf("%s %s %s", ev.Kind, ev.Member.Name, ev.Member.State)] = true
	}
	for _, want := range []string{"join n1 alive", "update n1 alive", "update n4 leaving", "left n4 left", "failed n3 failed"} {
		if !seen[want] {
			t.Errorf("subscriber did not see %q (saw %v)", want, seen)
		}
	}
	if s := seed.Stats(); s.Live != 3 || s.Members != 5 || s.Dropped != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestLabelMismatchRefused(t *testing.T) {
	a := startNode(t, "a", func(c *Config) { c.Label = "prod" })
	_, err := tryStart(t, "b", func(c *Config) { c.Label = "staging"; c.JoinRetryInterval = 50 * time.Millisecond }, a.Addr())
	if !errors.Is(err, ErrJoin) {
		t.Fatalf("join across labels: %v, want ErrJoin", err)
	}
	if got := LiveNames(a.Members()); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("members of a: %v", got)
	}
	// Same label joins.
	c := startNode(t, "c", func(c *Config) { c.Label = "prod" }, a.Addr())
	poll.Until(t, 5*time.Second, "c in a's view", func() bool { return liveCount(a) == 2 && liveCount(c) == 2 })
}

func TestProtocolMismatchRefused(t *testing.T) {
	a := startNode(t, "a", nil)
	b, err := tryStart(t, "b", func(c *Config) { c.Meta.Protocol = ProtocolVersion + 1 }, a.Addr())
	if !errors.Is(err, ErrJoin) {
		t.Fatalf("join with another protocol: %v, want ErrJoin", err)
	}
	if got := LiveNames(a.Members()); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("members of a: %v", got)
	}
	if got := LiveNames(b.Members()); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("members of b: %v", got)
	}
	if a.Stats().RefusedPeers == 0 && b.Stats().RefusedPeers == 0 {
		t.Fatal("no refusal counted")
	}
}

func TestEncryptedGossip(t *testing.T) {
	key := []byte("0123456789abcdef")
	a := startNode(t, "a", func(c *Config) { c.SecretKey = key })
	b := startNode(t, "b", func(c *Config) { c.SecretKey = key }, a.Addr())
	poll.Until(t, 5*time.Second, "a and b together", func() bool { return liveCount(a) == 2 && liveCount(b) == 2 })
	_, err := tryStart(t, "plain", func(c *Config) { c.JoinRetryInterval = 50 * time.Millisecond }, a.Addr())
	if !errors.Is(err, ErrJoin) {
		t.Fatalf("unencrypted join to an encrypted cluster: %v, want ErrJoin", err)
	}
}

// measure builds an n-node cluster and returns the time for every node to
// see n live members, and for every survivor to see a closed node failed.
func measure(t testing.TB, n int) (converge, detect time.Duration) {
	seed := startNode(t, "m0", nil)
	nodes := []*Cluster{seed}
	start := time.Now()
	for i := 1; i < n; i++ {
		// Join through a few earlier nodes, as a headless Service would give.
		join := []string{seed.Addr(), nodes[len(nodes)/2].Addr(), nodes[len(nodes)-1].Addr()}
		nodes = append(nodes, startNode(t, fmt.Sprintf("m%d", i), nil, join...))
	}
	joined := time.Since(start)
	// Converged: every node sees n live members; measured from the first join.
	settle := poll.Until(t, 60*time.Second, fmt.Sprintf("%d live members everywhere", n), func() bool {
		for _, c := range nodes {
			if liveCount(c) != n {
				return false
			}
		}
		return true
	})
	converge = time.Since(start)
	t.Logf("%d nodes: all started and joined in %v, then all views complete %v later", n, joined, settle)
	victim := nodes[n/2]
	name := victim.cfg.NodeName
	killed := time.Now()
	_ = victim.Close()
	poll.Until(t, 60*time.Second, name+" failed everywhere", func() bool {
		for _, c := range nodes {
			if c != victim && stateOf(c, name) != StateFailed {
				return false
			}
		}
		return true
	})
	return converge, time.Since(killed)
}

// TestLargeCluster runs 64 memberlist nodes in one process. It is heavy for
// a 2-core CI box, so it runs only with TIDEPOOL_CLUSTER_LARGE=1:
//
//	TIDEPOOL_CLUSTER_LARGE=1 go test -run TestLargeCluster -v ./cluster/
func TestLargeCluster(t *testing.T) {
	if os.Getenv("TIDEPOOL_CLUSTER_LARGE") == "" {
		t.Skip("set TIDEPOOL_CLUSTER_LARGE=1 to run the 64-node cluster")
	}
	converge, detect := measure(t, 64)
	t.Logf("64 nodes, GOMAXPROCS=%d: converged in %v, killed node noticed by all in %v", runtime.GOMAXPROCS(0), converge, detect)
	if detect > 3*time.Second {
		t.Errorf("failure detection took %v, target < 3s", detect)
	}
}

// BenchmarkCluster64 reports convergence and detection times of a 64-node
// in-process cluster:
//
//	go test -run XXX -bench Cluster64 -benchtime 1x ./cluster/
func BenchmarkCluster64(b *testing.B) {
	var conv, det time.Duration
	for i := 0; i < b.N; i++ {
		c, d := measure(b, 64)
		conv += c
		det += d
	}
	b.ReportMetric(conv.Seconds()/float64(b.N), "converge-s")
	b.ReportMetric(det.Seconds()/float64(b.N), "detect-s")
}

func TestUserMsg(t *testing.T) {
	typ, name, err := decodeUserMsg(encodeUserMsg(userMsgLeaving, "node-1"))
	if err != nil || typ != userMsgLeaving || name != "node-1" {
		t.Fatalf("round trip: %d %q %v", typ, name, err)
	}
	for _, b := range [][]byte{nil, {1, 1}, {2, 1, 0}, {1, 1, 5, 'a'}, {1, 1, 0, 'x'}} {
		if _, _, err := decodeUserMsg(b); !errors.Is(err, errUserMsg) {
			t.Errorf("decodeUserMsg(%x) = %v, want errUserMsg", b, err)
		}
	}
}

func FuzzDecodeUserMsg(f *testing.F) {
	f.Add(encodeUserMsg(userMsgLeaving, "tidepool-0"))
	f.Add([]byte{1, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, name, err := decodeUserMsg(b)
		if err != nil {
			return
		}
		if out := encodeUserMsg(typ, name); string(out) != string(b) {
			t.Fatalf("not canonical: %x -> %x", b, out)
		}
	})
}

// TestResyncAfterDroppedHandoff simulates lost delegate notifications: the
// loop must rebuild its table from memberlist.
func TestResyncAfterDroppedHandoff(t *testing.T) {
	a := startNode(t, "a", nil)
	startNode(t, "b", nil, a.Addr())
	startNode(t, "c", nil, a.Addr())
	poll.Until(t, 10*time.Second, "3 live members at a", func() bool { return liveCount(a) == 3 })
	a.mu.Lock()
	delete(a.members, "b")
	a.members["ghost"] = &Member{Name: "ghost", State: StateAlive, Meta: Meta{NodeID: "ghost"}}
	a.mu.Unlock()
	a.handoffDrops.Add(1)
	a.resync.Store(true)
	a.kick <- struct{}{}
	poll.Until(t, 10*time.Second, "resynced table at a", func() bool {
		return stateOf(a, "b") == StateAlive && stateOf(a, "ghost") == StateFailed
	})
	if s := a.Stats(); s.HandoffDrops != 1 || s.Live != 3 {
		t.Fatalf("stats after resync: %+v", s)
	}
}

// TestBackgroundJoin: with BackgroundJoin, Start returns at once although
// the Join name resolves to nothing yet (a first pod), counts the failed
// round, and keeps trying: once the name resolves to a live member the
// node joins it. A name that resolves to this node only is a failed round,
// not a join with itself.
func TestBackgroundJoin(t *testing.T) {
	var answer atomic.Pointer[[]string]
	answer.Store(&[]string{})
	lookup := func(_ context.Context, host string) ([]string, error) {
		if host != "peers.test" {
			return nil, fmt.Errorf("lookup %s: no such host", host)
		}
		if a := *answer.Load(); len(a) > 0 {
			return a, nil
		}
		return nil, fmt.Errorf("lookup %s: no such host", host)
	}
	// B's port is fixed first, so that A's Join entry can name it.
	b := startNode(t, "b", nil)
	_, bport, _ := strings.Cut(b.Addr(), ":")
	start := time.Now()
	a, err := tryStart(t, "a", func(c *Config) {
		c.BackgroundJoin, c.LookupHost = true, lookup
		c.JoinRetryMax = 200 * time.Millisecond
	}, "peers.test:"+bport)
	if err != nil {
		t.Fatalf("Start with an unresolvable name: %v, want nil (joining goes on)", err)
	}
	if took := time.Since(start); took > 900*time.Millisecond {
		t.Fatalf("Start took %v; want one round, not the retry loop", took)
	}
	poll.Until(t, 5*time.Second, "two failed join rounds", func() bool { return a.Stats().JoinFailures >= 2 })
	if a.hasPeer() {
		t.Fatalf("a has a peer before the name resolves: %v", a.Members())
	}
	answer.Store(&[]string{"127.0.0.1"})
	poll.Until(t, 10*time.Second, "a joined b in the background", func() bool {
		return stateOf(a, "b") == StateAlive && stateOf(b, "a") == StateAlive
	})

	// A name that resolves to this node only.
	_, aport, _ := strings.Cut(a.Addr(), ":")
	solo, err := tryStart(t, "solo", func(c *Config) {
		c.BackgroundJoin, c.LookupHost = true, func(context.Context, string) ([]string, error) { return []string{"127.0.0.1"}, nil }
	}, "self.test:"+aport)
	if err != nil {
		t.Fatal(err)
	}
	// solo's own port differs from a's: it joins a. Now one whose name
	// resolves to itself alone.
	poll.Until(t, 5*time.Second, "solo joined a", func() bool { return stateOf(solo, "a") == StateAlive })
	cfg := DefaultLocalConfig("self")
	cfg.BindPort = freeUDPTCPPort(t)
	cfg.BackgroundJoin = true
	cfg.Join = []string{fmt.Sprintf("127.0.0.1:%d", cfg.BindPort)}
	self, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { self.Close() })
	if err := self.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "a failed round on a self-only name", func() bool { return self.Stats().JoinFailures >= 1 })
	if self.hasPeer() {
		t.Fatalf("self joined someone: %v", self.Members())
	}
}

// freeUDPTCPPort returns a loopback port free for TCP a moment ago.
func freeUDPTCPPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestJoinContactsFew: a join given every member's address (a headless
// Service in a big fleet) exchanges state with joinFanout of them, not
// all, and still learns every member; dead addresses are skipped past
// until some answer.
func TestJoinContactsFew(t *testing.T) {
	var addrs []string
	var first *Cluster
	for i := range 6 {
		var join []string
		if first != nil {
			join = []string{first.Addr()}
		}
		c := startNode(t, fmt.Sprintf("m%d", i), nil, join...)
		if first == nil {
			first = c
		}
		addrs = append(addrs, c.Addr())
	}
	poll.Until(t, 10*time.Second, "six members", func() bool { return liveCount(first) == 6 })
	j := startNode(t, "joiner", nil)
	n, err := j.Join(context.Background(), addrs)
	if err != nil || n != joinFanout {
		t.Fatalf("Join(6 live addresses) = %d, %v; want %d, nil", n, err, joinFanout)
	}
	poll.Until(t, 10*time.Second, "the joiner sees all", func() bool { return liveCount(j) == 7 })

	// Five closed ports and one live member: the join goes past the
	// dead ones, whatever order it picks.
	var dead []string
	for range 5 {
		dead = append(dead, fmt.Sprintf("127.0.0.1:%d", freeUDPTCPPort(t)))
	}
	k := startNode(t, "late", nil)
	n, err = k.Join(context.Background(), append(dead, addrs[3]))
	if err != nil || n != 1 {
		t.Fatalf("Join(5 dead + 1 live) = %d, %v; want 1, nil", n, err)
	}
	poll.Until(t, 10*time.Second, "the late joiner sees all", func() bool { return liveCount(k) == 8 })
	if _, err := k.Join(context.Background(), dead); !errors.Is(err, ErrJoin) {
		t.Fatalf("Join(only dead) = %v; want ErrJoin", err)
	}
}
