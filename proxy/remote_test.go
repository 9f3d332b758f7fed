package proxy

import (
	"context"
	"errors"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
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
	self       string
	nodes      map[string]*Proxy
	fetches    atomic.Int64  // keys fetched (hot or not)
	hotFetches atomic.Int64  // keys fetched as hot replicas
	pushes     atomic.Int64  // items pushed
	gate       chan struct{} // when set, Fetch waits on it
	onPush     func(PutItem) // when set, called for each pushed item
}

func (f *fakePeers) Lookup(ctx context.Context, node, ns string, keys [][]byte) ([]bool, error) {
	out := make([]bool, len(keys))
	for i, k := range keys {
		_, out[i], _ = f.nodes[node].Exists(ctx, ns, k, ScopeLocal)
	}
	return out, nil
}

func (f *fakePeers) Fetch(ctx context.Context, node, ns string, keys [][]byte) ([]error, error) {
	return f.fetch(ctx, node, ns, keys, true)
}

// FetchHot implements HotFetcher: the copies are kept at full priority.
func (f *fakePeers) FetchHot(ctx context.Context, node, ns string, keys [][]byte) ([]error, error) {
	f.hotFetches.Add(int64(len(keys)))
	return f.fetch(ctx, node, ns, keys, false)
}

func (f *fakePeers) fetch(ctx context.Context, node, ns string, keys [][]byte, low bool) ([]error, error) {
	f.fetches.Add(int64(len(keys)))
	if f.gate != nil {
		<-f.gate
	}
	out := make([]error, len(keys))
	for i, k := range keys {
		v, info, err := f.nodes[node].Get(ctx, ns, k, ScopeLocal)
		if err != nil {
			out[i] = err
			continue
		}
		_, out[i] = f.nodes[f.self].store.Put(ctx, ns, k, v, cache.PutOptions{Depth: info.Depth, LowPriority: low})
	}
	return out, nil
}

func (f *fakePeers) Push(ctx context.Context, node, ns string, items []PutItem) ([]error, error) {
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

func newFakeCluster(t *testing.T, names ...string) (map[string]*Proxy, map[string]*fakePeers) {
	t.Helper()
	proxies := map[string]*Proxy{}
	peers := map[string]*fakePeers{}
	for _, n := range names {
		p, _ := newTestProxy(t, func(c *Config) { c.MaxBatch = 64 })
		proxies[n] = p
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
		if _, err := ps["a"].Put(WithSyncReplicas(ctx, 1), "ns", keys[i], []byte{byte(i)}, cache.PutOptions{Depth: int32(i)}); err != nil {
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
