package peerapi_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/cluster"
	"github.com/tidepool-kv/tidepool/internal/peerauth"
	"github.com/tidepool-kv/tidepool/internal/poll"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/clusterview"
	"github.com/tidepool-kv/tidepool/proxy/peerapi"
	"github.com/tidepool-kv/tidepool/rdma"
	"github.com/tidepool-kv/tidepool/rdma/tcp"
)

// node is one sidecar assembled from real components on loopback: a DRAM
// tier, a proxy, gossip membership, the cluster view, the rdma/tcp
// transport with the arenas registered, and the peer API server and client.
type node struct {
	name    string
	tier    *dram.Tier
	p       *proxy.Proxy
	c       *cluster.Cluster
	view    *clusterview.View
	tr      *tcp.Transport
	regions []rdma.RegionDesc
	dereg   func()
	srv     *peerapi.Server
	cli     *peerapi.Client
	cred    peerapi.Credentials
	notes   *notesLog // with nodeOpts.notes
	unwatch func()
	closed  bool
}

type nodeOpts struct {
	label, token string
	// secret, when set, authenticates every connection and member
	// (peerauth) with this cluster secret.
	secret       string
	encrypt      bool // with secret: connections are encrypted too
	fetchTimeout time.Duration
	capacity     int64
	prefault     bool // fault the arena pages in at start
	// route, when set, is the routing config (rebalancer, hot replicas);
	// fetchTimeout still applies.
	route *proxy.RouteConfig
	// noNamed: the node serves no named reads (peers fetch from it by
	// Acquire and a one-sided read).
	noNamed bool
	// notes, when set, is given a notes of its own per node (n.notes):
	// the block descriptions the node's proxy hands to its KV events.
	notes bool
	// maxMessage, when set, bounds one peer API message both ways (the
	// server's MaxRequestBytes, the client's MaxMessageBytes).
	maxMessage int
	// settled: the view keeps no ring from before the last membership
	// change (no grace period, no join ring), as a cluster long formed.
	settled bool
}

func newNode(t testing.TB, name string, o nodeOpts, join ...string) *node {
	t.Helper()
	ctx := context.Background()
	if o.capacity == 0 {
		o.capacity = 64 << 20
	}
	if o.fetchTimeout == 0 {
		o.fetchTimeout = 3 * time.Second
	}
	n := &node{name: name, cred: peerapi.Credentials{NodeID: name, Label: o.label, Token: o.token}}
	var err error
	if o.secret != "" {
		if n.cred.Key, err = peerauth.NewKey([]byte(o.secret), o.label); err != nil {
			t.Fatal(err)
		}
		if o.encrypt {
			n.cred.Key = n.cred.Key.Encrypting()
		}
	}
	dcfg := dram.Config{Dir: t.TempDir(), Capacity: o.capacity, ArenaSize: 16 << 20, MaxValueSize: 4 << 20, LazyFault: !o.prefault}
	if o.notes {
		n.notes = &notesLog{meta: map[string]*cache.BlockMeta{}, stored: map[string]*cache.BlockMeta{}}
		dcfg.Observer = n.notes
	}
	n.tier, err = dram.New(dcfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	pcfg := proxy.DefaultConfig()
	pcfg.NodeID = name
	deps := proxy.Deps{Store: n.tier, ZeroCopy: n.tier, Scan: n.tier}
	if o.notes {
		deps.Notes = n.notes
	}
	if n.p, err = proxy.New(pcfg, deps, nil); err != nil {
		t.Fatal(err)
	}
	tcfg := tcp.DefaultLocalConfig()
	tcfg.Key = n.cred.Key
	if n.tr, err = tcp.New(tcfg, nil); err != nil {
		t.Fatal(err)
	}
	if n.regions, n.dereg, err = peerapi.RegisterTestArenas(n.tr, n.tier); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ccfg := cluster.DefaultLocalConfig(name)
	ccfg.Label = o.label
	ccfg.Auth = n.cred.Key
	ccfg.Join = join
	ccfg.Meta = cluster.Meta{PeerAddr: ln.Addr().String(), TransferAddr: n.tr.Addr()}
	if n.c, err = cluster.New(ccfg, nil); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := n.c.Start(sctx); err != nil {
		t.Fatal(err)
	}
	vcfg := clusterview.DefaultConfig()
	if o.settled {
		vcfg.Grace, vcfg.JoinSettle = -1, -1
	}
	if n.view, err = clusterview.New(n.c, vcfg, nil); err != nil {
		t.Fatal(err)
	}
	if err := n.view.Start(ctx); err != nil {
		t.Fatal(err)
	}
	scfg := peerapi.ServerConfig{Credentials: n.cred, Transport: n.tr, Regions: n.regions, MaxRequestBytes: o.maxMessage}
	if !o.noNamed {
		scfg.Fetch = n.tr
	}
	n.srv, err = peerapi.NewServer(scfg, n.p, ln, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-n.srv.Ready()
	n.cli, err = peerapi.NewClient(peerapi.ClientConfig{
		Credentials: n.cred, Resolve: n.view.Addrs, Transport: n.tr, Fetch: n.tr, Regions: n.regions,
		MaxMessageBytes: o.maxMessage,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rcfg := proxy.RouteConfig{RebalanceRate: proxy.Off, HotThreshold: proxy.Off}
	if o.route != nil {
		rcfg = *o.route
	}
	rcfg.FetchTimeout = o.fetchTimeout
	if err := n.p.AttachCluster(n.view, n.cli, rcfg); err != nil {
		t.Fatal(err)
	}
	n.unwatch = n.c.OnMembershipChange(n.p.MembershipChanged)
	t.Cleanup(n.close)
	return n
}

// close shuts the node down in the documented order: routing, API server
// and client, the view and membership, the arenas' registrations, the
// transport, then the tier.
func (n *node) close() {
	if n.closed {
		return
	}
	n.closed = true
	n.unwatch()
	n.p.DetachCluster(time.Second)
	n.srv.Close()
	n.cli.Close()
	n.view.Close()
	n.c.Close()
	n.dereg()
	n.tr.Close()
	n.tier.Close()
}

// newCluster starts size nodes joined to the first and waits until every
// view places keys on all of them.
func newCluster(t testing.TB, size int, o nodeOpts) []*node {
	t.Helper()
	if testing.Short() {
		t.Skip("a cluster of real memberlist nodes: not in -short")
	}
	nodes := []*node{newNode(t, "n0", o)}
	for i := 1; i < size; i++ {
		nodes = append(nodes, newNode(t, fmt.Sprintf("n%d", i), o, nodes[0].c.Addr()))
	}
	poll.Until(t, 10*time.Second, "views converge", func() bool {
		for _, n := range nodes {
			if n.view.Stats().Members != size {
				return false
			}
		}
		return true
	})
	return nodes
}

// keyOwnedBy returns a key (with the prefix) whose first owner is owner,
// by every node's view.
func keyOwnedBy(t testing.TB, nodes []*node, ns, prefix, owner string) []byte {
	t.Helper()
	for i := 0; i < 10000; i++ {
		k := []byte(fmt.Sprintf("%s-%d", prefix, i))
		ok := true
		for _, n := range nodes {
			if n.view.Owners(ns, k)[0] != owner {
				ok = false
				break
			}
		}
		if ok {
			return k
		}
	}
	t.Fatalf("no key owned by %s", owner)
	return nil
}

func (n *node) stats(node string) proxy.PeerStats {
	for _, s := range n.p.PeerStats() {
		if s.Node == node {
			return s
		}
	}
	return proxy.PeerStats{Node: node}
}

func value(seed byte, size int) []byte {
	v := make([]byte, size)
	for i := range v {
		v[i] = seed + byte(i*7) + byte(i>>9)
	}
	return v
}

// notesLog is a proxy.BlockNotes that records the last description given
// for each block and, as the DRAM tier's cache.Observer, the description
// it held when the tier stored the block (what a KV-event publisher's
// BlockStored would carry).
type notesLog struct {
	mu     sync.Mutex
	meta   map[string]*cache.BlockMeta // ns/key →
	stored map[string]*cache.BlockMeta // ns/key → the description at Stored (nil: none)
}

func (l *notesLog) Stored(ns string, key []byte, tier string, _ *cache.BlockMeta) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stored[ns+"/"+string(key)] = l.meta[ns+"/"+string(key)].Clone()
}

func (l *notesLog) Removed(ns string, key []byte, tier string) {}
func (l *notesLog) Cleared(ns string, tier string)             {}

// storedWith reports whether the tier stored the block, and the
// description it was stored with.
func (l *notesLog) storedWith(ns string, key []byte) (*cache.BlockMeta, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m, ok := l.stored[ns+"/"+string(key)]
	return m, ok
}

func (l *notesLog) Describe(ns string, key []byte, m *cache.BlockMeta) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.meta[ns+"/"+string(key)] = m.Clone()
}

func (l *notesLog) Forget(ns string, key []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.meta, ns+"/"+string(key))
}

func (l *notesLog) Description(ns string, key []byte) *cache.BlockMeta { return l.get(ns, key) }

func (l *notesLog) get(ns string, key []byte) *cache.BlockMeta {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.meta[ns+"/"+string(key)]
}
