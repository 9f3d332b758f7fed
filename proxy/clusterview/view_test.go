package clusterview

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cluster"
	"github.com/tidepool-kv/tidepool/internal/clock"
	"github.com/tidepool-kv/tidepool/internal/poll"
)

func startNode(t *testing.T, name string, join ...string) *cluster.Cluster {
	t.Helper()
	cfg := cluster.DefaultLocalConfig(name)
	cfg.Join = join
	cfg.Meta = cluster.Meta{PeerAddr: "127.0.0.1:1" + name[1:], TransferAddr: "127.0.0.1:2" + name[1:], Zone: "z-" + name}
	c, err := cluster.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", DefaultConfig(), true},
		{"zero takes defaults", Config{}, true},
		{"no grace", Config{Grace: -1}, true},
		{"bad ring", Config{Ring: cluster.RingConfig{Partitions: -1, LoadFactor: 0.5, Replicas: 1}}, false},
		{"ring fields default one by one", Config{Ring: cluster.RingConfig{Replicas: 2}}, true},
		{"negative resync", Config{Resync: -time.Second}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok %v", err, tc.ok)
			}
		})
	}
	if _, err := New(nil, Config{}, nil); err == nil {
		t.Fatal("New(nil cluster) succeeded")
	}
}

// TestViewFollowsMembership: a join moves some keys to the new node; during
// the grace period Owners lists the previous owner after the new one, then
// only the new one. Members and Addrs come from the node metadata.
func TestViewFollowsMembership(t *testing.T) {
	a := startNode(t, "n1")
	b := startNode(t, "n2", a.Addr())
	clk := clock.NewFake(time.Unix(1e9, 0))
	v, err := New(a, Config{Grace: time.Minute, Clock: clk, Resync: 50 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if err := v.Start(context.Background()); err == nil {
		t.Fatal("second Start succeeded")
	}
	poll.Until(t, 10*time.Second, "two members", func() bool { return v.Stats().Members == 2 })
	// The view may have first seen n1 alone: let the grace period of that
	// change pass, so that the check below starts from a settled view.
	clk.Advance(2 * time.Minute)
	if v.Self() != "n1" || v.Replicas() != 1 {
		t.Fatalf("self %q replicas %d", v.Self(), v.Replicas())
	}
	const ns = "m"
	before := map[string]string{}
	for i := 0; i < 300; i++ {
		k := fmt.Sprint("k", i)
		o := v.Owners(ns, []byte(k))
		if len(o) != 1 {
			t.Fatalf("owners %v", o)
		}
		before[k] = o[0]
	}
	c := startNode(t, "n3", a.Addr())
	poll.Until(t, 10*time.Second, "three members", func() bool { return v.Stats().Members == 3 })
	moved := 0
	for k, old := range before {
		o := v.Owners(ns, []byte(k))
		switch {
		case o[0] == old:
			if len(o) != 1 {
				t.Fatalf("%s: unmoved key lists %v", k, o)
			}
		default:
			if o[0] == "n3" {
				moved++
			}
			if !slices.Equal(o, []string{o[0], old}) {
				t.Fatalf("%s: owners %v, want [%s %s]", k, o, o[0], old)
			}
		}
	}
	if moved < 50 || moved > 150 {
		t.Fatalf("%d of 300 keys moved on the third join", moved)
	}
	if g := v.Stats().GraceUntil; !g.Equal(clk.Now().Add(time.Minute)) {
		t.Fatalf("grace until %v", g)
	}
	clk.Advance(time.Minute)
	for k := range before {
		if o := v.Owners(ns, []byte(k)); len(o) != 1 {
			t.Fatalf("%s: after the grace period owners %v", k, o)
		}
	}
	// The namespace is part of the placement key.
	diff := 0
	for i := 0; i < 100; i++ {
		k := []byte(fmt.Sprint("k", i))
		if v.Owners("x", k)[0] != v.Owners("y", k)[0] {
			diff++
		}
	}
	if diff == 0 {
		t.Fatal("namespaces do not change placement")
	}

	ms := v.Members()
	if len(ms) != 3 || ms[0].Name != "n1" || !ms[0].Self || ms[1].Self || ms[1].State != "alive" || ms[1].PeerAddr != "127.0.0.1:12" || ms[2].Zone != "z-n3" || ms[1].GossipAddr != b.Addr() {
		t.Fatalf("members %+v", ms)
	}
	if p, x, ok := v.Addrs("n2"); !ok || p != "127.0.0.1:12" || x != "127.0.0.1:22" {
		t.Fatalf("addrs n2 = %q %q %v", p, x, ok)
	}
	if _, _, ok := v.Addrs("nope"); ok {
		t.Fatal("unknown node resolved")
	}

	// A failed node leaves the ring; its keys' previous owner is listed
	// second during the grace period.
	c.Close()
	poll.Until(t, 10*time.Second, "the failure seen", func() bool { return v.Stats().Members == 2 })
	for _, m := range v.Members() {
		if m.Name == "n3" && m.State != "failed" {
			t.Fatalf("n3 state %q", m.State)
		}
	}
	for k := range before {
		o := v.Owners(ns, []byte(k))
		if o[0] == "n3" || (len(o) == 2 && o[1] != "n3") {
			t.Fatalf("%s: owners %v after n3 failed", k, o)
		}
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestReplicas: R owners, distinct, from a view that was never started
// (the node alone) and then from a started one.
func TestReplicas(t *testing.T) {
	a := startNode(t, "n1")
	startNode(t, "n2", a.Addr())
	startNode(t, "n3", a.Addr())
	rc := cluster.DefaultRingConfig()
	rc.Replicas = 2
	v, err := New(a, Config{Ring: rc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if err := v.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "three members", func() bool { return v.Stats().Members == 3 })
	for i := 0; i < 100; i++ {
		o := v.Owners("ns", []byte(fmt.Sprint(i)))
		if len(o) < 2 || o[0] == o[1] {
			t.Fatalf("owners %v", o)
		}
	}
}

// TestJoinRing: a node that joins a two-node cluster lists, for each key it
// now owns, the owner under the ring before its join (the two others), so
// that a miss asks the node that holds the block; keys that did not move
// list their one owner; the join ring ends with the grace period. A
// previous owner that gossip holds failed is not listed.
func TestJoinRing(t *testing.T) {
	a := startNode(t, "n1")
	startNode(t, "n2", a.Addr())
	c := startNode(t, "n3", a.Addr())
	clk := clock.NewFake(time.Unix(1e9, 0))
	v, err := New(c, Config{Grace: time.Minute, Clock: clk, Resync: 50 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	poll.Until(t, 10*time.Second, "three members and the join ring", func() bool { return v.Stats().Members == 3 && v.Stats().JoinRing == 2 })
	before, err := cluster.NewRing([]string{"n1", "n2"}, cluster.DefaultRingConfig())
	if err != nil {
		t.Fatal(err)
	}
	const ns = "m"
	mine := 0
	var fromN1 [][]byte
	for i := 0; i < 300; i++ {
		k := []byte(fmt.Sprint("k", i))
		o := v.Owners(ns, k)
		prev := before.Owners(ownerKey(ns, k), 1)[0]
		switch {
		case o[0] == "n3":
			// The ring the view built before it saw every member may
			// add candidates; the owner before the join must be listed.
			mine++
			if !slices.Contains(o[1:], prev) {
				t.Fatalf("%s: owners %v, want n3 then %s among them", k, o, prev)
			}
			if prev == "n1" {
				fromN1 = append(fromN1, k)
			}
		case o[0] != prev:
			t.Fatalf("%s: unmoved key lists %v, want %s first", k, o, prev)
		}
	}
	if mine < 50 || mine > 150 || len(fromN1) == 0 {
		t.Fatalf("%d of 300 keys are n3's (%d from n1)", mine, len(fromN1))
	}
	if u := v.Stats().JoinUntil; !u.After(clk.Now()) {
		t.Fatalf("join ring until %v", u)
	}

	// n1 fails: it is no longer listed as a previous owner.
	a.Close()
	poll.Until(t, 10*time.Second, "n1 seen failed", func() bool { return v.Stats().Members == 2 })
	for _, k := range fromN1 {
		if o := v.Owners(ns, k); slices.Contains(o, "n1") {
			t.Fatalf("%s: owners %v list the failed n1", k, o)
		}
	}
	clk.Advance(2 * time.Minute)
	for i := 0; i < 300; i++ {
		if o := v.Owners(ns, []byte(fmt.Sprint("k", i))); len(o) != 1 {
			t.Fatalf("after the grace period owners %v", o)
		}
	}
}

// TestZeroConfigIsDefault: a zero Config is DefaultConfig once the
// defaults are applied, and a partly set Ring keeps its fields and takes
// cluster's defaults for the others (not all or nothing).
func TestZeroConfigIsDefault(t *testing.T) {
	if got, want := (Config{}).withDefaults(), DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Config{} with defaults\n got %+v\nwant %+v", got, want)
	}
	want := cluster.DefaultRingConfig()
	want.Replicas = 2
	if got := (Config{Ring: cluster.RingConfig{Replicas: 2}}).withDefaults().Ring; got != want {
		t.Fatalf("Ring{Replicas: 2} with defaults = %+v, want %+v", got, want)
	}
}

// TestDrainCoalesces: the events queued behind one make a single rebuild,
// and gaps among them are still counted.
func TestDrainCoalesces(t *testing.T) {
	ch := make(chan cluster.Event, 8)
	for _, s := range []uint64{2, 3, 5, 6} {
		ch <- cluster.Event{Seq: s}
	}
	last := uint64(0)
	n, gaps, open := drain(cluster.Event{Seq: 1}, ch, &last)
	if n != 5 || gaps != 1 || !open || last != 6 || len(ch) != 0 {
		t.Fatalf("drain = n %d gaps %d open %v last %d left %d; want 5 1 true 6 0", n, gaps, open, last, len(ch))
	}
	ch <- cluster.Event{Seq: 9}
	close(ch)
	n, gaps, open = drain(cluster.Event{Seq: 7}, ch, &last)
	if n != 2 || gaps != 1 || open {
		t.Fatalf("drain after close = n %d gaps %d open %v; want 2 1 false", n, gaps, open)
	}
}

// TestReadsDuringRebuild: a rebuild builds its ring off the read path and
// publishes it with one swap. While a rebuild after a join is held
// between building and publishing, Owners answers at once from the old
// ring (never the new member); once published, the new member owns keys.
func TestReadsDuringRebuild(t *testing.T) {
	n1 := startNode(t, "n1")
	startNode(t, "n2", n1.Addr())
	v, err := New(n1, Config{Grace: -1, JoinSettle: -1, Resync: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	poll.Until(t, 10*time.Second, "a ring of two", func() bool { return v.Stats().Members == 2 })

	parked, release := make(chan struct{}), make(chan struct{})
	hook := func() {
		parked <- struct{}{}
		<-release
	}
	testHookBeforeSwap.Store(&hook)
	t.Cleanup(func() { testHookBeforeSwap.Store(nil) })
	startNode(t, "n3", n1.Addr())
	<-parked // a rebuild with n3 is built and not yet published
	keys := make([][]byte, 512)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key-%d", i)
		if o := v.Owners("ns", keys[i]); len(o) != 1 || o[0] == "n3" {
			t.Fatalf("Owners during the rebuild = %v; want one of n1, n2", o)
		}
	}
	testHookBeforeSwap.Store(nil)
	close(release)
	poll.Until(t, 10*time.Second, "n3 owns keys", func() bool {
		for _, k := range keys {
			if v.Owners("ns", k)[0] == "n3" {
				return true
			}
		}
		return false
	})
}
