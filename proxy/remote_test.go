package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
)

// fakeCluster places keys on nodes by a hash; fakePeers calls the other
// in-process proxies directly. Unit tests of the routing decisions only;
// proxy/peerapi tests the real transport.
type fakeCluster struct {
	self  string
	nodes []string
}

func (c *fakeCluster) Self() string  { return c.self }
func (c *fakeCluster) Replicas() int { return 1 }
func (c *fakeCluster) Owners(ns string, key []byte) []string {
	h := fnv.New32a()
	h.Write([]byte(ns))
	h.Write(key)
	return []string{c.nodes[int(h.Sum32())%len(c.nodes)]}
}
func (c *fakeCluster) Members() []MemberInfo {
	var out []MemberInfo
	for _, n := range c.nodes {
		out = append(out, MemberInfo{Name: n, State: "alive", Self: n == c.self})
	}
	return out
}

type fakePeers struct {
	self    string
	nodes   map[string]*Proxy
	fetches atomic.Int64  // keys fetched (hot or not)
	pushes  atomic.Int64  // items pushed
	gate    chan struct{} // when set, Acquire waits on it
	onPush  func(PutItem) // when set, called for each pushed item
	corrupt atomic.Bool   // when set, Pull and Fetch damage the bytes in transit
	named   atomic.Bool   // when set, Fetch serves named reads (else ErrNoFetch)
	nameds  atomic.Int64  // named reads made
	down    sync.Map      // node → struct{}: Lookup and Push to it fail as a whole (unreachable)
	asked   atomic.Int64  // keys asked by Lookup

	mu    sync.Mutex
	lease int64
	held  map[int64][]byte // the bytes of each lease Acquire granted
}

// errFakeDown is what calls to a node in fakePeers.down fail with.
var errFakeDown = fmt.Errorf("%w: fake node down", cache.ErrUnavailable)

func (f *fakePeers) Lookup(ctx context.Context, node, ns string, keys [][]byte) ([]bool, error) {
	if _, down := f.down.Load(node); down {
		return nil, errFakeDown
	}
	f.asked.Add(int64(len(keys)))
	out := make([]bool, len(keys))
	for i, k := range keys {
		_, out[i], _ = f.nodes[node].Exists(ctx, ns, k, ScopeLocal)
	}
	return out, nil
}

// Acquire reads the blocks from the node's proxy and holds their bytes
// under a lease until Release (the owner's pin).
func (f *fakePeers) Acquire(ctx context.Context, node, ns string, keys [][]byte, _ FetchOptions) ([]RemoteBlock, error) {
	f.fetches.Add(int64(len(keys)))
	if f.gate != nil {
		<-f.gate
	}
	out := make([]RemoteBlock, len(keys))
	for i, k := range keys {
		v, info, err := f.nodes[node].Get(ctx, ns, k, ScopeLocal)
		if err != nil {
			out[i].Err = err
			continue
		}
		f.mu.Lock()
		f.lease++
		if f.held == nil {
			f.held = map[int64][]byte{}
		}
		f.held[f.lease] = append([]byte(nil), v...)
		out[i] = RemoteBlock{Lease: f.lease, Length: int64(len(v)), Checksum: info.Checksum, Depth: info.Depth}
		f.mu.Unlock()
	}
	return out, nil
}

// Pull copies the held bytes into the local slot, checked as the
// transfer layer checks them.
func (f *fakePeers) Pull(_ context.Context, node string, b RemoteBlock, into cache.Reservation) error {
	f.mu.Lock()
	v, ok := f.held[b.Lease]
	f.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: lease %d not held", cache.ErrUnavailable, b.Lease)
	}
	return f.deliver(into, v, b.Checksum, "pull from "+node)
}

// namedRead is what the owner does for a named read: the block's bytes
// and metadata, or ErrNoFetch where named reads are off.
func (f *fakePeers) namedRead(ctx context.Context, node, ns string, key []byte) ([]byte, cache.Info, error) {
	if !f.named.Load() {
		return nil, cache.Info{}, ErrNoFetch
	}
	f.fetches.Add(1)
	f.nameds.Add(1)
	return f.nodes[node].Get(ctx, ns, key, ScopeLocal)
}

// FetchTo is Fetch into plain memory.
func (f *fakePeers) FetchTo(ctx context.Context, node, ns string, key []byte, _ FetchOptions, land func(RemoteBlock) ([]byte, error)) error {
	v, info, err := f.namedRead(ctx, node, ns, key)
	if err != nil {
		return err
	}
	dst, err := land(RemoteBlock{Length: int64(len(v)), Checksum: info.Checksum, Depth: info.Depth})
	if err != nil {
		return err
	}
	copy(dst, v)
	if f.corrupt.Load() && len(v) > 0 {
		dst[0] ^= 0xff
	}
	if cache.Checksum(dst) != info.Checksum {
		return fmt.Errorf("fake fetch from %s: %w", node, cache.ErrChecksum)
	}
	return nil
}

// deliver copies v into the slot (damaged when corrupt is set) and checks
// it against sum, as the transfer layer checks what lands.
func (f *fakePeers) deliver(into cache.Reservation, v []byte, sum uint32, what string) error {
	copy(into.Bytes(), v)
	if f.corrupt.Load() && len(v) > 0 {
		into.Bytes()[0] ^= 0xff
	}
	if cache.Checksum(into.Bytes()) != sum {
		return fmt.Errorf("fake %s: %w", what, cache.ErrChecksum)
	}
	return nil
}

// Fetch is a named read when named is set: the owner's bytes go straight
// into the slot land reserves, checked as the transfer layer checks them.
func (f *fakePeers) Fetch(ctx context.Context, node, ns string, key []byte, _ FetchOptions, land func(RemoteBlock) (cache.Reservation, error)) error {
	v, info, err := f.namedRead(ctx, node, ns, key)
	if err != nil {
		return err
	}
	into, err := land(RemoteBlock{Length: int64(len(v)), Checksum: info.Checksum, Depth: info.Depth})
	if err != nil {
		return err
	}
	return f.deliver(into, v, info.Checksum, "fetch from "+node)
}

func (f *fakePeers) Release(_ string, leases []int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range leases {
		delete(f.held, id)
	}
}

// liveLeases is how many leases Acquire granted and Release has not
// given back.
func (f *fakePeers) liveLeases() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.held)
}

func (f *fakePeers) Push(ctx context.Context, node, ns string, items []PutItem) ([]error, error) {
	if _, down := f.down.Load(node); down {
		return nil, errFakeDown
	}
	f.pushes.Add(int64(len(items)))
	if f.onPush != nil {
		for _, it := range items {
			f.onPush(it)
		}
	}
	out := make([]error, len(items))
	for i, it := range items {
		_, out[i] = f.nodes[node].PutLocal(ctx, ns, it.Key, it.Value, it.Opts)
	}
	return out, nil
}

func (f *fakePeers) Delete(ctx context.Context, node, ns string, keys [][]byte) ([]bool, error) {
	out := make([]bool, len(keys))
	for i, k := range keys {
		var err error
		if out[i], err = f.nodes[node].Delete(ctx, ns, k, ScopeLocal); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (f *fakePeers) Clear(ctx context.Context, node, ns string) (int64, error) {
	return f.nodes[node].Clear(ctx, ns, ScopeLocal)
}

// newRouteProxy is a proxy over a DRAM tier (fetched blocks land in its
// arenas) with room for batches of 64.
func newRouteProxy(t *testing.T) *Proxy {
	t.Helper()
	tier := newRouteTier(t)
	return newRouteProxyOn(t, tier, tier)
}

// newRouteTier is the DRAM tier of newRouteProxy (16 MiB).
func newRouteTier(t *testing.T) *dram.Tier {
	t.Helper()
	dcfg := dram.DefaultConfig()
	dcfg.Dir = t.TempDir()
	dcfg.Capacity, dcfg.ArenaSize, dcfg.MaxValueSize, dcfg.LazyFault = 16<<20, 4<<20, 1<<20, true
	tier, err := dram.New(dcfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tier.Close() })
	return tier
}

// newRouteProxyOn is newRouteProxy over store and zc.
func newRouteProxyOn(t *testing.T, store Store, zc ZeroCopyStore) *Proxy {
	t.Helper()
	cfg := DefaultConfig()
	cfg.MaxValueBytes = 1024
	cfg.MaxBatch = 64
	p, err := New(cfg, Deps{Store: store, ZeroCopy: zc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// hotFetched is how many keys p fetched to keep at full priority.
func hotFetched(p *Proxy) int64 {
	var n int64
	for _, s := range p.PeerStats() {
		n += s.HotFetched
	}
	return n
}

func newFakeCluster(t *testing.T, names ...string) (map[string]*Proxy, map[string]*fakePeers) {
	t.Helper()
	proxies := map[string]*Proxy{}
	peers := map[string]*fakePeers{}
	for _, n := range names {
		proxies[n] = newRouteProxy(t)
	}
	for _, n := range names {
		fp := &fakePeers{self: n, nodes: proxies}
		peers[n] = fp
		if err := proxies[n].AttachCluster(&fakeCluster{self: n, nodes: names}, fp, RouteConfig{RebalanceRate: Off, HotThreshold: Off}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { proxies[n].DetachCluster(0) })
	}
	return proxies, peers
}

func TestRoutePutPushesAndGetFetches(t *testing.T) {
	ctx := context.Background()
	ps, _ := newFakeCluster(t, "a", "b", "c")
	keys := make([][]byte, 30)
	for i := range keys {
		keys[i] = []byte{byte(i), 'k'}
		// Synchronous pushes, so the owners hold the blocks when Put returns.
		if _, err := ps["a"].Put(ctx, "ns", keys[i], []byte{byte(i)}, cache.PutOptions{Depth: int32(i), SyncReplicas: 1}); err != nil {
			t.Fatal(err)
		}
	}
	for i, k := range keys {
		v, _, err := ps["c"].Get(ctx, "ns", k, ScopeCluster)
		if err != nil || len(v) != 1 || v[0] != byte(i) {
			t.Fatalf("cluster Get of key %d on c: %v %v", i, v, err)
		}
	}
	// Local scope on b sees only what b owns or copied.
	n, err := ps["b"].Lookup(ctx, "ns", keys, ScopeCluster)
	if err != nil || n != len(keys) {
		t.Fatalf("cluster Lookup on b = %d, %v; want %d", n, err, len(keys))
	}
	ln, _ := ps["b"].Lookup(ctx, "ns", keys, ScopeLocal)
	if ln == len(keys) {
		t.Fatal("local lookup on b should miss keys owned elsewhere")
	}
	// A key nobody has is a miss everywhere.
	if _, _, err := ps["b"].Get(ctx, "ns", []byte("none"), ScopeCluster); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("missing key: %v", err)
	}
	res, err := ps["b"].BatchExists(ctx, "ns", append(keys[:3:3], []byte("none")), ScopeCluster)
	if err != nil || !res[0].Present || !res[2].Present || res[3].Present {
		t.Fatalf("BatchExists = %+v, %v", res, err)
	}
	st := ps["c"].RouteStats()
	if st.RemoteFetches == 0 || st.RemoteHits == 0 {
		t.Fatalf("route stats %+v", st)
	}
}

func TestRouteConcurrentMissesFetchOnce(t *testing.T) {
	ctx := context.Background()
	ps, peers := newFakeCluster(t, "a", "b")
	// Find a key owned by b, store it there only.
	var key []byte
	for i := 0; ; i++ {
		key = []byte{byte(i)}
		if (&fakeCluster{nodes: []string{"a", "b"}}).Owners("ns", key)[0] == "b" {
			break
		}
	}
	if _, err := ps["b"].PutLocal(ctx, "ns", key, []byte("v"), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	peers["a"].gate = make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, _, err := ps["a"].Get(ctx, "ns", key, ScopeDefault)
			if err == nil && string(v) != "v" {
				err = errors.New("wrong bytes")
			}
			errs <- err
		}()
	}
	// Let the first fetch through once every other caller joined it.
	deadline := time.Now().Add(10 * time.Second)
	for ps["a"].RouteStats().CoalescedMisses < 7 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(peers["a"].gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := peers["a"].fetches.Load(); n != 1 {
		t.Fatalf("%d fetches for 8 concurrent misses of one key, want 1", n)
	}
}

// TestFetchLandsOrLeavesNothing: a remote read lands the block in the
// local arenas through a reserved slot and gives the owner's pin back; a
// transfer whose bytes fail their checksum aborts the slot (nothing is
// stored, the key is not left reserved) and still gives the pin back.
func TestFetchLandsOrLeavesNothing(t *testing.T) {
	t.Run("acquire and pull", func(t *testing.T) { testFetchLandsOrLeavesNothing(t, false) })
	t.Run("named read", func(t *testing.T) { testFetchLandsOrLeavesNothing(t, true) })
}

func testFetchLandsOrLeavesNothing(t *testing.T, named bool) {
	ctx := context.Background()
	ps, peers := newFakeCluster(t, "a", "b")
	peers["a"].named.Store(named)
	fc := &fakeCluster{nodes: []string{"a", "b"}}
	var keys [][]byte
	for i := 0; len(keys) < 2; i++ {
		if k := []byte(fmt.Sprint("k", i)); fc.Owners("ns", k)[0] == "b" {
			keys = append(keys, k)
		}
	}
	val := []byte("a block on its owner")
	for _, k := range keys {
		if _, err := ps["b"].PutLocal(ctx, "ns", k, val, cache.PutOptions{Depth: 2}); err != nil {
			t.Fatal(err)
		}
	}
	stats := func() PeerStats {
		for _, s := range ps["a"].PeerStats() {
			if s.Node == "b" {
				return s
			}
		}
		return PeerStats{}
	}

	got, info, err := ps["a"].Get(ctx, "ns", keys[0], ScopeCluster)
	if err != nil || string(got) != string(val) || info.Depth != 2 {
		t.Fatalf("cluster get: %q depth %d, %v", got, info.Depth, err)
	}
	if _, ok, _ := ps["a"].Exists(ctx, "ns", keys[0], ScopeLocal); !ok {
		t.Fatal("the fetched block did not land locally")
	}
	if s := stats(); s.Fetches != 1 || s.FetchedBlocks != 1 || s.FetchedBytes != int64(len(val)) || s.ChecksumFails != 0 {
		t.Fatalf("peer stats %+v", s)
	}
	if n := peers["a"].liveLeases(); n != 0 {
		t.Fatalf("%d owner pins not given back", n)
	}

	peers["a"].corrupt.Store(true)
	if _, _, err := ps["a"].Get(ctx, "ns", keys[1], ScopeCluster); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("get of a block damaged in transit: %v, want a miss", err)
	}
	if _, ok, _ := ps["a"].Exists(ctx, "ns", keys[1], ScopeLocal); ok {
		t.Fatal("a block damaged in transit was stored")
	}
	if s := stats(); s.ChecksumFails != 1 || s.FetchedBlocks != 1 {
		t.Fatalf("peer stats after the damaged transfer %+v", s)
	}
	if n := peers["a"].liveLeases(); n != 0 {
		t.Fatalf("%d owner pins not given back after a failed transfer", n)
	}
	// The slot was aborted: the next fetch of the key reserves it anew.
	peers["a"].corrupt.Store(false)
	if got, _, err := ps["a"].Get(ctx, "ns", keys[1], ScopeCluster); err != nil || string(got) != string(val) {
		t.Fatalf("fetch after the failed one: %q, %v", got, err)
	}
	if n, want := peers["a"].nameds.Load(), map[bool]int64{false: 0, true: 3}[named]; n != want {
		t.Fatalf("%d named reads, want %d", n, want)
	}
}

// TestAttachClusterNeedsArenas: fetched blocks land in the store's arenas,
// so a proxy without them cannot route across the cluster.
func TestAttachClusterNeedsArenas(t *testing.T) {
	p, _ := newTestProxy(t, nil)
	if err := p.AttachCluster(&fakeCluster{self: "a", nodes: []string{"a"}}, &fakePeers{self: "a"}, RouteConfig{}); err == nil {
		t.Fatal("attached a cluster to a proxy without arenas")
	}
}

// TestBatchFetchByNamedReads: a cluster BatchGet fetches every block an
// owner serving named reads holds with one named read each (no Acquire),
// and falls back to one Acquire for the lot where it serves none.
func TestBatchFetchByNamedReads(t *testing.T) {
	for _, named := range []bool{true, false} {
		t.Run(fmt.Sprint("named=", named), func(t *testing.T) {
			ctx := context.Background()
			ps, peers := newFakeCluster(t, "a", "b")
			peers["a"].named.Store(named)
			fc := &fakeCluster{nodes: []string{"a", "b"}}
			var keys [][]byte
			for i := 0; len(keys) < 20; i++ {
				if k := []byte(fmt.Sprint("k", i)); fc.Owners("ns", k)[0] == "b" {
					keys = append(keys, k)
				}
			}
			for i, k := range keys[:19] { // the last one is nowhere
				if _, err := ps["b"].PutLocal(ctx, "ns", k, []byte(fmt.Sprint("value ", i)), cache.PutOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			res, err := ps["a"].BatchGet(ctx, "ns", keys, ScopeCluster)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range res[:19] {
				if r.Err != nil || string(r.Value) != fmt.Sprint("value ", i) {
					t.Fatalf("key %d: %q %v", i, r.Value, r.Err)
				}
			}
			if !errors.Is(res[19].Err, cache.ErrNotFound) {
				t.Fatalf("absent key: %v, want a miss", res[19].Err)
			}
			wantNamed := map[bool]int64{true: 20, false: 0}[named]
			if n := peers["a"].nameds.Load(); n != wantNamed {
				t.Fatalf("%d named reads, want %d", n, wantNamed)
			}
			var st PeerStats
			for _, s := range ps["a"].PeerStats() {
				if s.Node == "b" {
					st = s
				}
			}
			if st.NamedReads != wantNamed || st.FetchedBlocks != 19 || st.Misses != 1 || st.Failures != 0 {
				t.Fatalf("peer stats %+v", st)
			}
			if n := peers["a"].liveLeases(); n != 0 {
				t.Fatalf("%d owner pins not given back", n)
			}
		})
	}
}

// TestQueuedPushKeepsItsOwnCopy: a Put whose block is pushed to its owner
// in the background returns before the push is made; the push must send
// the bytes as they were put, though the caller (the engine API, whose
// inline put values are the request's buffer, lent only until the call
// returns) reuses its buffer at once.
func TestQueuedPushKeepsItsOwnCopy(t *testing.T) {
	ctx := context.Background()
	ps, peers := newFakeCluster(t, "a", "b")
	var key []byte
	for i := 0; ; i++ {
		key = []byte{byte(i), 'q'}
		if (&fakeCluster{nodes: []string{"a", "b"}}).Owners("ns", key)[0] == "b" {
			break
		}
	}
	release := make(chan struct{})
	pushed := make(chan []byte, 1)
	peers["a"].onPush = func(it PutItem) {
		<-release
		pushed <- bytes.Clone(it.Value)
	}
	value := bytes.Repeat([]byte("original"), 64)
	buf := bytes.Clone(value)
	if _, err := ps["a"].Put(ctx, "ns", key, buf, cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		buf[i] = 'x'
	}
	close(release)
	select {
	case got := <-pushed:
		if !bytes.Equal(got, value) {
			t.Fatalf("the queued push sent the caller's reused buffer (%q...), not the bytes put", got[:16])
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no push")
	}
}

// TestLookupAsksUpToItsOwnMiss: a cluster Lookup counts blocks held here
// past the first local miss, asks the other owners about the rest in one
// call, and asks nothing past the first key absent here that this node
// alone owns (the prefix cannot pass it).
func TestLookupAsksUpToItsOwnMiss(t *testing.T) {
	ctx := context.Background()
	ps, peers := newFakeCluster(t, "a", "b")
	owned := map[string][][]byte{}
	c := &fakeCluster{self: "a", nodes: []string{"a", "b"}}
	for i := 0; len(owned["a"]) < 4 || len(owned["b"]) < 6; i++ {
		k := []byte(fmt.Sprint("chain-", i))
		owned[c.Owners("ns", k)[0]] = append(owned[c.Owners("ns", k)[0]], k)
	}
	put := func(node string, k []byte) {
		t.Helper()
		if _, err := ps[node].Put(ctx, "ns", k, []byte("v"), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	a, b := owned["a"], owned["b"]
	for _, k := range b[:5] {
		put("b", k)
	}
	for _, k := range a[:2] {
		put("a", k)
	}
	put("a", b[4]) // a copy of b's block here
	cases := []struct {
		name  string
		keys  [][]byte
		want  int
		asked int64 // keys asked of b
	}{
		{"all held, b's asked", [][]byte{b[0], a[0], b[1], a[1], b[2]}, 5, 3},
		{"a copy here is not asked", [][]byte{b[0], b[4], a[0]}, 3, 1},
		{"stops at a's own miss", [][]byte{b[0], a[0], b[1], a[2], b[2], b[3]}, 3, 2},
		{"b lacks one", [][]byte{b[0], b[5], a[0], b[1]}, 1, 3},
		{"a's own miss first", [][]byte{a[0], a[3], b[0]}, 1, 0},
	}
	for _, tc := range cases {
		before := peers["a"].asked.Load()
		n, err := ps["a"].Lookup(ctx, "ns", tc.keys, ScopeCluster)
		if asked := peers["a"].asked.Load() - before; err != nil || n != tc.want || asked != tc.asked {
			t.Errorf("%s: Lookup = %d, %v, %d keys asked; want %d, %d asked", tc.name, n, err, asked, tc.want, tc.asked)
		}
	}
}

// fullOfOwned is a store with no room for copies of blocks owned
// elsewhere (LowPriority puts are refused for room), as a DRAM tier full
// of owned blocks refuses them, and that refuses the key refuse too.
type fullOfOwned struct {
	*dram.Tier
	refuse string
}

func (s *fullOfOwned) Put(ctx context.Context, ns string, key, value []byte, o cache.PutOptions) (bool, error) {
	if o.LowPriority || string(key) == s.refuse {
		return false, fmt.Errorf("test: %w", cache.ErrNoSpace)
	}
	return s.Tier.Put(ctx, ns, key, value, o)
}

// TestBatchPutThroughAFullNode: a chain put through a node with no room
// for copies reaches every owner: the blocks the other node owns are
// pushed to it although no copy was kept here, and a block owned here
// whose parent the other node owns is not refused as an orphan. Only a
// block its owner refuses cuts the chain: the deeper blocks are then
// neither stored nor pushed.
func TestBatchPutThroughAFullNode(t *testing.T) {
	ctx := context.Background()
	names := []string{"a", "b"}
	tierA := newRouteTier(t)
	storeA := &fullOfOwned{Tier: tierA}
	ps := map[string]*Proxy{"a": newRouteProxyOn(t, storeA, tierA), "b": newRouteProxy(t)}
	for _, n := range names {
		if err := ps[n].AttachCluster(&fakeCluster{self: n, nodes: names}, &fakePeers{self: n, nodes: ps},
			RouteConfig{RebalanceRate: Off, HotThreshold: Off}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ps[n].DetachCluster(0) })
	}
	fc := &fakeCluster{nodes: names}
	chain := func(prefix string) ([]PutItem, []string) {
		var items []PutItem
		var owners []string
		for i := 0; len(items) < 12; i++ {
			k := []byte(fmt.Sprint(prefix, i))
			o := fc.Owners("ns", k)[0]
			if len(items) == 0 && o != "b" {
				continue // the chain starts with a block b owns
			}
			items = append(items, PutItem{Key: k, Value: bytes.Repeat(k, 20),
				Opts: cache.PutOptions{Depth: int32(len(items)), SyncReplicas: 1}})
			owners = append(owners, o)
		}
		return items, owners
	}
	held := func(node string, k []byte) bool {
		_, ok, _ := ps[node].Exists(ctx, "ns", k, ScopeLocal)
		return ok
	}

	items, owners := chain("x")
	res, err := ps["a"].BatchPut(ctx, "ns", items)
	if err != nil {
		t.Fatal(err)
	}
	for i, it := range items {
		if res[i] != nil || !held(owners[i], it.Key) {
			t.Errorf("block %d (owner %s): result %v, held by its owner %v", i, owners[i], res[i], held(owners[i], it.Key))
		}
	}
	if n, err := ps["b"].Lookup(ctx, "ns", keysOf(items), ScopeCluster); err != nil || n != len(items) {
		t.Fatalf("cluster lookup of the chain: %d of %d, %v", n, len(items), err)
	}

	items, owners = chain("y")
	cutAt := -1
	for i := 2; i < len(items); i++ {
		if owners[i] == "a" {
			cutAt = i
			break
		}
	}
	if cutAt < 0 {
		t.Fatal("no block of a's past the chain's head")
	}
	storeA.refuse = string(items[cutAt].Key)
	if res, err = ps["a"].BatchPut(ctx, "ns", items); err != nil {
		t.Fatal(err)
	}
	for i, it := range items {
		if i < cutAt {
			if res[i] != nil || !held(owners[i], it.Key) {
				t.Errorf("block %d before the cut: result %v, held %v", i, res[i], held(owners[i], it.Key))
			}
			continue
		}
		if !errors.Is(res[i], cache.ErrNoSpace) || held("a", it.Key) || held("b", it.Key) {
			t.Errorf("block %d past the cut (at %d): result %v, held by a %v, by b %v", i, cutAt, res[i], held("a", it.Key), held("b", it.Key))
		}
	}

	// A single put (the buffer socket's puts, a zero-copy put without a
	// slot here) of a block b owns: pushed to b without a copy here,
	// unless it names a parent a owns and does not hold (an orphan).
	var bKeys, aKeys [][]byte
	for i := 0; len(bKeys) < 2 || len(aKeys) < 1; i++ {
		k := []byte(fmt.Sprint("z", i))
		if fc.Owners("ns", k)[0] == "b" {
			bKeys = append(bKeys, k)
		} else {
			aKeys = append(aKeys, k)
		}
	}
	if _, err := ps["a"].Put(ctx, "ns", bKeys[0], []byte("v"), cache.PutOptions{Depth: 3, SyncReplicas: 1}); err != nil || !held("b", bKeys[0]) {
		t.Fatalf("Put of b's block through a: %v, held by b %v", err, held("b", bKeys[0]))
	}
	orphan := cache.PutOptions{Depth: 4, Parent: aKeys[0], SyncReplicas: 1}
	if _, err := ps["a"].Put(ctx, "ns", bKeys[1], []byte("v"), orphan); !errors.Is(err, cache.ErrNoSpace) || held("b", bKeys[1]) {
		t.Fatalf("Put of an orphan through a: %v, held by b %v", err, held("b", bKeys[1]))
	}
}

func keysOf(items []PutItem) [][]byte {
	keys := make([][]byte, len(items))
	for i, it := range items {
		keys[i] = it.Key
	}
	return keys
}

// leavingCluster is fakeCluster whose other members leave when gone is
// set: Owners then answers this node alone.
type leavingCluster struct {
	fakeCluster
	gone atomic.Bool
}

func (c *leavingCluster) Owners(ns string, key []byte) []string {
	if c.gone.Load() {
		return []string{c.self}
	}
	return c.fakeCluster.Owners(ns, key)
}

// A key its owner lacks is tried at the key's other owners as the ring
// stands after the fetch; when the owner left meanwhile and no other node
// owns the key, the fetch is a miss (it used to index past the end of the
// owners, a panic in the Get handler that TestPeerLeavesUnderTraffic saw).
func TestFetchRetryAfterTheOwnerLeft(t *testing.T) {
	ctx := context.Background()
	a, b := newRouteProxy(t), newRouteProxy(t)
	ring := &leavingCluster{fakeCluster: fakeCluster{self: "a", nodes: []string{"a", "b"}}}
	fp := &fakePeers{self: "a", nodes: map[string]*Proxy{"a": a, "b": b}, gate: make(chan struct{})}
	if err := a.AttachCluster(ring, fp, RouteConfig{RebalanceRate: Off, HotThreshold: Off}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.DetachCluster(0) })
	var key []byte
	for i := 0; ; i++ {
		key = fmt.Appendf(nil, "k%d", i)
		if ring.Owners("ns", key)[0] == "b" {
			break
		}
	}
	go func() {
		for fp.fetches.Load() == 0 { // b is asked: the keys are grouped
			time.Sleep(time.Millisecond)
		}
		ring.gone.Store(true) // b leaves before it answers
		close(fp.gate)
	}()
	if _, _, err := a.Get(ctx, "ns", key, ScopeCluster); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("Get of a key whose owner left during the fetch: %v, want a miss", err)
	}
}
