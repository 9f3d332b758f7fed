package proxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/clock"
)

func TestBreaker(t *testing.T) {
	type step struct {
		advance  time.Duration
		allow    bool        // expected from allow("n")
		probe    bool        // expected probe flag
		outcome  callOutcome // reported when allowed
		wantDown int         // nodes down after the step
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"success keeps it closed", []step{
			{allow: true, outcome: callOK}, {allow: true, outcome: callOK},
		}},
		{"a failure opens it until the period ends, then one probe closes it", []step{
			{allow: true, outcome: callFailed, wantDown: 1},
			{advance: time.Second, allow: false, wantDown: 1},
			{advance: 1500 * time.Millisecond, allow: true, probe: true, outcome: callOK},
			{allow: true, outcome: callOK},
		}},
		{"a failed probe opens it again", []step{
			{allow: true, outcome: callFailed, wantDown: 1},
			{advance: 3 * time.Second, allow: true, probe: true, outcome: callFailed, wantDown: 1},
			{advance: time.Second, allow: false, wantDown: 1},
		}},
		{"a caller that gave up says nothing of the node", []step{
			{allow: true, outcome: callGaveUp},
			{allow: true, outcome: callOK},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(time.Unix(1e9, 0))
			b := newBreaker(2*time.Second, clk)
			for i, s := range tc.steps {
				clk.Advance(s.advance)
				ok, probe := b.allow("n")
				if ok != s.allow || probe != s.probe {
					t.Fatalf("step %d: allow = %v, %v; want %v, %v", i, ok, probe, s.allow, s.probe)
				}
				if ok {
					b.done("n", probe, s.outcome)
				}
				if got := len(b.down()); got != s.wantDown {
					t.Fatalf("step %d: %d down, want %d", i, got, s.wantDown)
				}
			}
		})
	}
	// While a probe is in flight, other calls fail fast.
	clk := clock.NewFake(time.Unix(1e9, 0))
	b := newBreaker(time.Second, clk)
	b.allow("n")
	b.done("n", false, callFailed)
	clk.Advance(2 * time.Second)
	if ok, probe := b.allow("n"); !ok || !probe {
		t.Fatal("no probe after the period")
	}
	if ok, _ := b.allow("n"); ok {
		t.Fatal("a second call went through during the probe")
	}
	if b.fastFails.Load() != 1 || b.opens.Load() != 1 {
		t.Fatalf("fast fails %d, opens %d", b.fastFails.Load(), b.opens.Load())
	}
}

func TestOutcomeOf(t *testing.T) {
	live := context.Background()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		parent context.Context
		err    error
		want   callOutcome
	}{
		{live, nil, callOK},
		{live, cache.ErrNotFound, callOK},
		{live, fmt.Errorf("x: %w", cache.ErrChecksum), callOK},
		{live, context.DeadlineExceeded, callFailed},
		{live, fmt.Errorf("refused: %w", cache.ErrUnavailable), callFailed},
		{live, errors.New("connection reset"), callFailed},
		{gone, context.Canceled, callGaveUp},
	} {
		if got := outcomeOf(tc.parent, tc.err); got != tc.want {
			t.Errorf("outcomeOf(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

// hangPeers is fakePeers with a switch that makes every call hang until its
// context ends (a SIGSTOPped or partitioned owner), honouring the answer
// bound the router sets, as peerapi.Client does.
type hangPeers struct {
	*fakePeers
	hang   atomic.Bool
	calls  atomic.Int64
	answer atomic.Int64 // the last AnswerTimeout seen on a fetch
}

func (h *hangPeers) wait(ctx context.Context, fetch bool, d time.Duration) error {
	h.calls.Add(1)
	if fetch {
		h.answer.Store(int64(d))
		if d > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d)
			defer cancel()
		}
	}
	if !h.hang.Load() {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

func (h *hangPeers) Acquire(ctx context.Context, node, ns string, keys [][]byte, opts FetchOptions) ([]RemoteBlock, error) {
	if err := h.wait(ctx, true, opts.AnswerTimeout); err != nil {
		return nil, err
	}
	return h.fakePeers.Acquire(ctx, node, ns, keys, opts)
}

func (h *hangPeers) Lookup(ctx context.Context, node, ns string, keys [][]byte) ([]bool, error) {
	if err := h.wait(ctx, false, 0); err != nil {
		return nil, err
	}
	return h.fakePeers.Lookup(ctx, node, ns, keys)
}

// TestHungOwnerFailsFast: while the owner of a block hangs, the first read
// of it waits the short remote bound (not the fetch timeout) and misses;
// later reads make no call at all until PeerDownFor has passed; then one
// probe goes through, and once the owner answers again reads are served.
func TestHungOwnerFailsFast(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Unix(1e9, 0))
	names := []string{"a", "b"}
	ps := map[string]*Proxy{}
	for _, n := range names {
		ps[n] = newRouteProxy(t)
	}
	hp := &hangPeers{fakePeers: &fakePeers{self: "a", nodes: ps}}
	cfg := RouteConfig{RemoteTimeout: 20 * time.Millisecond, PeerDownFor: time.Minute, Clock: clk, RebalanceRate: Off, HotThreshold: Off}
	if err := ps["a"].AttachCluster(&fakeCluster{self: "a", nodes: names}, hp, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ps["a"].DetachCluster(0) })
	fc := &fakeCluster{self: "a", nodes: names}
	var key []byte
	for i := 0; key == nil; i++ {
		if k := []byte(fmt.Sprint("k", i)); fc.Owners("ns", k)[0] == "b" {
			key = k
		}
	}
	if _, err := ps["b"].PutLocal(ctx, "ns", key, []byte("v"), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}

	hp.hang.Store(true)
	if _, _, err := ps["a"].Get(ctx, "ns", key, ScopeCluster); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("get while the owner hangs: %v", err)
	}
	if got := time.Duration(hp.answer.Load()); got != cfg.RemoteTimeout {
		t.Fatalf("fetch answer bound %v, want %v", got, cfg.RemoteTimeout)
	}
	if hp.calls.Load() != 1 {
		t.Fatalf("%d calls, want 1", hp.calls.Load())
	}
	// The owner is now marked down: reads miss without a call.
	for i := 0; i < 3; i++ {
		if _, _, err := ps["a"].Get(ctx, "ns", key, ScopeCluster); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("get: %v", err)
		}
		if _, ok, _ := ps["a"].Exists(ctx, "ns", key, ScopeCluster); ok {
			t.Fatal("exists found the block")
		}
		if n, _ := ps["a"].Lookup(ctx, "ns", [][]byte{key}, ScopeCluster); n != 0 {
			t.Fatalf("lookup matched %d", n)
		}
	}
	if hp.calls.Load() != 1 {
		t.Fatalf("%d calls while the owner was down, want 1", hp.calls.Load())
	}
	rs := ps["a"].RouteStats()
	if rs.FastFails != 9 || rs.PeerDownOpens != 1 || rs.PeersDown != 1 {
		t.Fatalf("stats %+v", rs)
	}
	// After PeerDownFor one probe goes through; the owner answers again.
	clk.Advance(time.Minute)
	hp.hang.Store(false)
	v, _, err := ps["a"].Get(ctx, "ns", key, ScopeCluster)
	if err != nil || string(v) != "v" {
		t.Fatalf("get after recovery: %q %v", v, err)
	}
	if hp.calls.Load() != 2 || ps["a"].RouteStats().PeersDown != 0 {
		t.Fatalf("calls %d, stats %+v", hp.calls.Load(), ps["a"].RouteStats())
	}
}

// TestLookupAsksNextOwner: a key its first owner lacks is asked of the
// next listed owner (the previous owner after a membership change), and
// cluster-scope Exists names the node that holds it.
func TestLookupAsksNextOwner(t *testing.T) {
	ctx := context.Background()
	ps, _ := newFakeCluster(t, "a", "b", "c")
	// c's view of the key: owned by a now, by b before.
	var key []byte
	fc := &fakeCluster{nodes: []string{"a", "b", "c"}}
	for i := 0; key == nil; i++ {
		if k := []byte(fmt.Sprint("k", i)); fc.Owners("ns", k)[0] == "a" {
			key = k
		}
	}
	mc := &listCluster{self: "c", owners: []string{"a", "b"}}
	fp := &fakePeers{self: "c", nodes: ps}
	ps["c"].DetachCluster(0)
	if err := ps["c"].AttachCluster(mc, fp, RouteConfig{RebalanceRate: Off, HotThreshold: Off}); err != nil {
		t.Fatal(err)
	}
	if _, err := ps["b"].PutLocal(ctx, "ns", key, []byte("v"), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	info, ok, err := ps["c"].Exists(ctx, "ns", key, ScopeCluster)
	if err != nil || !ok || info.Tier != "remote" || info.Node != "b" {
		t.Fatalf("exists: %+v %v %v", info, ok, err)
	}
	if n, err := ps["c"].Lookup(ctx, "ns", [][]byte{key}, ScopeCluster); err != nil || n != 1 {
		t.Fatalf("lookup: %d %v", n, err)
	}
}

// listCluster lists the same owners for every key.
type listCluster struct {
	self   string
	owners []string
}

func (c *listCluster) Self() string                          { return c.self }
func (c *listCluster) Replicas() int                         { return 1 }
func (c *listCluster) Owners(ns string, key []byte) []string { return c.owners }
func (c *listCluster) Members() []MemberInfo {
	var out []MemberInfo
	for _, n := range append([]string{c.self}, c.owners...) {
		out = append(out, MemberInfo{Name: n, State: "alive", Self: n == c.self})
	}
	return out
}

// TestDeleteClearEverywhere: cluster-scope Delete and Clear reach every
// member (owner and copies); local scope only this node.
func TestDeleteClearEverywhere(t *testing.T) {
	ctx := context.Background()
	ps, _ := newFakeCluster(t, "a", "b", "c")
	for _, n := range []string{"a", "b", "c"} {
		for _, k := range []string{"x", "y", "z"} {
			if _, err := ps[n].PutLocal(ctx, "ns", []byte(k), []byte("v"+n), cache.PutOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if ok, err := ps["a"].Delete(ctx, "ns", []byte("x"), ScopeLocal); err != nil || !ok {
		t.Fatalf("local delete: %v %v", ok, err)
	}
	if _, ok, _ := ps["b"].Exists(ctx, "ns", []byte("x"), ScopeLocal); !ok {
		t.Fatal("a local delete reached b")
	}
	if ok, err := ps["a"].Delete(ctx, "ns", []byte("y"), ScopeDefault); err != nil || !ok {
		t.Fatalf("cluster delete: %v %v", ok, err)
	}
	for _, n := range []string{"a", "b", "c"} {
		if _, ok, _ := ps[n].Exists(ctx, "ns", []byte("y"), ScopeLocal); ok {
			t.Fatalf("%s still holds y", n)
		}
	}
	// Held elsewhere only: still reported deleted.
	if ok, err := ps["a"].Delete(ctx, "ns", []byte("x"), ScopeCluster); err != nil || !ok {
		t.Fatalf("cluster delete of a key held elsewhere: %v %v", ok, err)
	}
	n, err := ps["b"].Clear(ctx, "ns", ScopeDefault)
	if err != nil || n != 3 { // z on a, b and c
		t.Fatalf("clear: %d %v", n, err)
	}
	for _, name := range []string{"a", "b", "c"} {
		if _, ok, _ := ps[name].Exists(ctx, "ns", []byte("z"), ScopeLocal); ok {
			t.Fatalf("%s still holds z", name)
		}
	}
	if rs := ps["b"].RouteStats(); rs.RemoteDeletes != 2 || rs.RemoteDeleteErr != 0 {
		t.Fatalf("stats %+v", rs)
	}
}

// downPeers fails every call to one node, as an unreachable member.
type downPeers struct {
	*fakePeers
	down string
}

func (d *downPeers) Delete(ctx context.Context, node, ns string, keys [][]byte) ([]bool, error) {
	if node == d.down {
		return nil, fmt.Errorf("dial %s: %w", node, cache.ErrUnavailable)
	}
	return d.fakePeers.Delete(ctx, node, ns, keys)
}

func (d *downPeers) Clear(ctx context.Context, node, ns string) (int64, error) {
	if node == d.down {
		return 0, fmt.Errorf("dial %s: %w", node, cache.ErrUnavailable)
	}
	return d.fakePeers.Clear(ctx, node, ns)
}

// TestDeleteEverywhereReportsUnreached: a cluster-scope Delete or Clear
// that cannot reach a member does the rest and reports UNAVAILABLE naming
// it; the member is then marked down, and a retry fails at once without
// calling it.
func TestDeleteEverywhereReportsUnreached(t *testing.T) {
	ctx := context.Background()
	names := []string{"a", "b", "c"}
	ps := map[string]*Proxy{}
	for _, n := range names {
		p := newRouteProxy(t)
		ps[n] = p
		if _, err := p.PutLocal(ctx, "ns", []byte("k"), []byte("v"), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	dp := &downPeers{fakePeers: &fakePeers{self: "a", nodes: ps}, down: "c"}
	if err := ps["a"].AttachCluster(&fakeCluster{self: "a", nodes: names}, dp, RouteConfig{RebalanceRate: Off, HotThreshold: Off}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ps["a"].DetachCluster(0) })
	ok, err := ps["a"].Delete(ctx, "ns", []byte("k"), ScopeCluster)
	if !ok || !errors.Is(err, cache.ErrUnavailable) || !strings.Contains(err.Error(), "c") {
		t.Fatalf("delete with c unreachable: %v %v", ok, err)
	}
	for n, want := range map[string]bool{"a": false, "b": false, "c": true} {
		if _, held, _ := ps[n].Exists(ctx, "ns", []byte("k"), ScopeLocal); held != want {
			t.Fatalf("%s holds k: %v, want %v", n, held, want)
		}
	}
	if _, err := ps["a"].Clear(ctx, "ns", ScopeCluster); !errors.Is(err, cache.ErrUnavailable) {
		t.Fatalf("clear with c down: %v", err)
	}
	if rs := ps["a"].RouteStats(); rs.FastFails != 1 || rs.RemoteDeleteErr != 2 || rs.PeersDown != 1 {
		t.Fatalf("stats %+v", rs)
	}
}
