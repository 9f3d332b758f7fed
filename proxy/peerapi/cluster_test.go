package peerapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	kclient "github.com/cloudwego/kitex/client"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cluster"
	"github.com/tidepool-kv/tidepool/internal/poll"
	"github.com/tidepool-kv/tidepool/protocol/gen/peer"
	"github.com/tidepool-kv/tidepool/protocol/gen/peer/tidepoolpeer"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/peerapi"
)

// TestCluster runs three real sidecars on loopback (membership, placement,
// peer API over Kitex, transfers over rdma/tcp) and checks the routed
// paths end to end. The subtests share the cluster and run in order; the
// destructive ones come last.
func TestCluster(t *testing.T) {
	const ns = "llama"
	nodes := newCluster(t, 3, nodeOpts{fetchTimeout: 3 * time.Second})
	a, b, c := nodes[0], nodes[1], nodes[2]
	ctx := context.Background()

	t.Run("PutPushedToOwnerGetOnThird", func(t *testing.T) {
		k := keyOwnedBy(t, nodes, ns, "pushed", b.name)
		v := value(1, 300<<10)
		if _, err := a.p.Put(ctx, ns, k, v, cache.PutOptions{Depth: 3}); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, 5*time.Second, "the push to reach the owner", func() bool {
			_, ok, _ := b.p.Exists(ctx, ns, k, proxy.ScopeLocal)
			return ok
		})
		if _, ok, _ := c.p.Exists(ctx, ns, k, proxy.ScopeLocal); ok {
			t.Fatal("third node holds the block before any read")
		}
		before := c.stats(b.name)
		got, info, err := c.p.Get(ctx, ns, k, proxy.ScopeCluster)
		if err != nil {
			t.Fatalf("cluster get on the third node: %v", err)
		}
		if !bytes.Equal(got, v) || info.Depth != 3 || info.Checksum != cache.Checksum(v) {
			t.Fatalf("got %d bytes depth %d crc %08x, want %d bytes depth 3 crc %08x", len(got), info.Depth, info.Checksum, len(v), cache.Checksum(v))
		}
		after := c.stats(b.name)
		if after.FetchedBlocks-before.FetchedBlocks != 1 || after.FetchedBytes-before.FetchedBytes != int64(len(v)) {
			t.Fatalf("fetch counters: %+v -> %+v", before, after)
		}
		// Now a local copy: a local read needs no peer.
		if got, _, err := c.p.Get(ctx, ns, k, proxy.ScopeLocal); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("local read of the fetched copy: %v", err)
		}
		poll.Until(t, 5*time.Second, "the owner's pin released", func() bool {
			return b.p.ZeroCopyStats().LiveLeases == 0
		})
		// A single-node read on the producer finds its low-priority copy.
		if _, ok, _ := a.p.Exists(ctx, ns, k, proxy.ScopeLocal); !ok {
			t.Fatal("producer lost its local copy")
		}
	})

	// A chain of 12 keys of which the first 9 are stored: synchronously
	// pushed to their owners from a.
	chain := make([][]byte, 12)
	vals := make([][]byte, 12)
	for i := range chain {
		chain[i] = []byte(fmt.Sprintf("chain-%02d", i))
		vals[i] = value(byte(i), 64<<10+i)
	}
	owners := map[string]int{}
	for _, k := range chain[:9] {
		owners[a.view.Owners(ns, k)[0]]++
	}
	items := make([]proxy.PutItem, 9)
	for i := range items {
		items[i] = proxy.PutItem{Key: chain[i], Value: vals[i], Opts: cache.PutOptions{Depth: int32(i), SyncReplicas: 1}}
	}
	res, err := a.p.BatchPut(ctx, ns, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range res {
		if e != nil {
			t.Fatalf("item %d: %v", i, e)
		}
	}

	t.Run("LookupCountsPrefixOverOwners", func(t *testing.T) {
		if len(owners) < 2 {
			t.Fatalf("chain placed on %d nodes only: %v", len(owners), owners)
		}
		local, err := c.p.Lookup(ctx, ns, chain, proxy.ScopeLocal)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			got, err := n.p.Lookup(ctx, ns, chain, proxy.ScopeCluster)
			if err != nil || got != 9 {
				t.Fatalf("%s: cluster lookup = %d, %v; want 9 (local prefix on c: %d, owners %v)", n.name, got, err, local, owners)
			}
		}
		if local == 9 {
			t.Fatalf("c holds the whole prefix locally; the test proves nothing (owners %v)", owners)
		}
	})

	t.Run("BatchGetBatchesPerOwner", func(t *testing.T) {
		before := map[string]proxy.PeerStats{a.name: c.stats(a.name), b.name: c.stats(b.name)}
		// Keys c lacks go in one batch to their first remote owner (one
		// for the keys c owns itself, kept at full priority, one for the
		// others); an absent key is then asked of each further listed
		// owner (the owner before c joined, while c's join ring answers)
		// one by one.
		want := map[string]int64{}
		type group struct {
			node string
			mine bool
		}
		batched := map[group]bool{}
		for i, k := range chain {
			if _, ok, _ := c.p.Exists(ctx, ns, k, proxy.ScopeLocal); ok {
				continue
			}
			var remote []string
			for _, o := range c.view.Owners(ns, k) {
				if o != c.name {
					remote = append(remote, o)
				}
			}
			if len(remote) == 0 {
				continue
			}
			batched[group{remote[0], c.view.Owners(ns, k)[0] == c.name}] = true
			if i >= 9 {
				for _, o := range remote[1:] {
					want[o]++
				}
			}
		}
		for g := range batched {
			want[g.node]++
		}
		out, err := c.p.BatchGet(ctx, ns, chain, proxy.ScopeCluster)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range out {
			switch {
			case i < 9 && (r.Err != nil || !bytes.Equal(r.Value, vals[i])):
				t.Fatalf("key %d: %v (%d bytes)", i, r.Err, len(r.Value))
			case i >= 9 && !errors.Is(r.Err, cache.ErrNotFound):
				t.Fatalf("absent key %d: %v", i, r.Err)
			}
		}
		for node, bs := range before {
			if calls := c.stats(node).Fetches - bs.Fetches; calls != want[node] {
				t.Fatalf("%s: %d fetch calls, want %d (one batch per owner, then one per further owner of an absent key)", node, calls, want[node])
			}
		}
	})

	t.Run("ConcurrentMissesOneFetch", func(t *testing.T) {
		k := keyOwnedBy(t, nodes, ns, "hot", b.name)
		v := value(9, 1<<20)
		if _, err := b.p.PutLocal(ctx, ns, k, v, cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		before := c.stats(b.name).Fetches
		rs0 := c.p.RouteStats()
		const callers = 16
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		for i := 0; i < callers; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				got, _, err := c.p.Get(ctx, ns, k, proxy.ScopeCluster)
				if err == nil && !bytes.Equal(got, v) {
					err = errors.New("wrong bytes")
				}
				errs <- err
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		rs1 := c.p.RouteStats()
		calls := c.stats(b.name).Fetches - before
		t.Logf("fetch calls %d, coalesced misses %d", calls, rs1.CoalescedMisses-rs0.CoalescedMisses)
		if calls != 1 {
			t.Fatalf("%d fetch calls for one key missed by %d callers at once", calls, callers)
		}
	})

	t.Run("AuthMismatchRefused", func(t *testing.T) {
		for _, cred := range []peerapi.Credentials{
			{NodeID: "intruder", Token: "guess"},
			{NodeID: "intruder", Label: "other-cluster"},
		} {
			cli, err := peerapi.NewClient(peerapi.ClientConfig{
				Credentials: cred, Resolve: c.view.Addrs, Transport: c.tr, Regions: c.regions,
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			refused := a.srv.Stats().Refused
			_, err = cli.Lookup(ctx, a.name, ns, chain[:1])
			if !errors.Is(err, peerapi.ErrRefused) || !errors.Is(err, cache.ErrUnavailable) {
				t.Fatalf("%+v: lookup: %v, want ErrRefused", cred, err)
			}
			res, err := cli.Acquire(ctx, a.name, ns, chain[:1], proxy.FetchOptions{}) // a fetch's first call
			if !errors.Is(err, peerapi.ErrRefused) || res != nil {
				t.Fatalf("%+v: fetch: %v %v, want ErrRefused", cred, res, err)
			}
			if _, err := cli.Push(ctx, a.name, ns, []proxy.PutItem{{Key: []byte("evil"), Value: []byte("x")}}); !errors.Is(err, peerapi.ErrRefused) {
				t.Fatalf("%+v: push: %v, want ErrRefused", cred, err)
			}
			if got := a.srv.Stats().Refused - refused; got != 3 {
				t.Fatalf("server counted %d refusals, want 3", got)
			}
			if err := cli.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := cli.Lookup(ctx, a.name, ns, chain[:1]); !errors.Is(err, peerapi.ErrClosed) {
				t.Fatalf("lookup after Close: %v", err)
			}
			if err := cli.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if _, ok, _ := a.p.Exists(ctx, ns, []byte("evil"), proxy.ScopeLocal); ok {
			t.Fatal("a refused push was stored")
		}
	})

	t.Run("PushChecksumVerified", func(t *testing.T) {
		addr, _, _ := c.view.Addrs(a.name)
		kc, err := tidepoolpeer.NewClient("tidepool-peer", kclient.WithHostPorts(addr))
		if err != nil {
			t.Fatal(err)
		}
		// (the generated wrapper has no Close; its connections end with the test)
		good, bad := []byte("good"), []byte("bad")
		res, err := kc.Put(ctx, &peer.PutRequest{
			Auth: &peer.Auth{NodeId: "raw", ProtocolVersion: int32(cluster.ProtocolVersion)}, Ns: ns,
			Items: []*peer.PutItem{
				{Key: []byte("pv-good"), Value: good, Checksum: int32(cache.Checksum(good))},
				{Key: []byte("pv-bad"), Value: bad, Checksum: int32(cache.Checksum(bad) ^ 1)},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Codes) != 2 || res.Codes[0] != 0 || res.Codes[1] != 7 {
			t.Fatalf("codes %v, want [0 7] (OK, CHECKSUM_MISMATCH)", res.Codes)
		}
		if _, ok, _ := a.p.Exists(ctx, ns, []byte("pv-bad"), proxy.ScopeLocal); ok {
			t.Fatal("a block with a wrong checksum was stored")
		}
		// Another protocol version is refused like another label.
		_, err = kc.Lookup(ctx, &peer.LookupRequest{Auth: &peer.Auth{ProtocolVersion: 99}, Ns: ns, Keys: chain[:1]})
		var pe *peer.PeerError
		if !errors.As(err, &pe) || pe.Code != 8 {
			t.Fatalf("lookup with protocol 99: %v, want PeerError code 8", err)
		}
	})

	t.Run("CorruptOwnerBytesAreAMiss", func(t *testing.T) {
		k := keyOwnedBy(t, nodes, ns, "rot", b.name)
		v := value(5, 200<<10)
		if _, err := b.p.PutLocal(ctx, ns, k, v, cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		// Flip a byte of the stored block in the owner's arena.
		acq, err := b.p.Acquire(ctx, ns, [][]byte{k}, time.Second, proxy.ScopeLocal)
		if err != nil || acq[0].Err != nil {
			t.Fatal(err, acq[0].Err)
		}
		s := acq[0].Slot
		b.tier.ArenaMem(s.Arena)[s.Offset+1234] ^= 0x5a
		b.p.Release(ctx, []int64{acq[0].LeaseID})

		before := c.stats(b.name)
		got, _, err := c.p.Get(ctx, ns, k, proxy.ScopeCluster)
		if err == nil || got != nil {
			t.Fatalf("get of a corrupted block returned %d bytes, err %v", len(got), err)
		}
		if !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("get: %v, want a miss", err)
		}
		if d := c.stats(b.name).ChecksumFails - before.ChecksumFails; d != 1 {
			t.Fatalf("checksum failures counted: %d, want 1", d)
		}
		if _, ok, _ := c.p.Exists(ctx, ns, k, proxy.ScopeLocal); ok {
			t.Fatal("the corrupted block was committed locally")
		}
		if st := c.tier.ReserveStats(); st.Open != 0 {
			t.Fatalf("reservations left open: %+v", st)
		}
	})

	t.Run("OwnerClosedMidFetch", func(t *testing.T) {
		const size = 4 << 20
		keys := make([][]byte, 3)
		vs := make([][]byte, 3)
		for i := range keys {
			keys[i] = keyOwnedBy(t, nodes, ns, fmt.Sprintf("big%d", i), b.name)
			vs[i] = value(byte(20+i), size)
			if _, err := b.p.PutLocal(ctx, ns, keys[i], vs[i], cache.PutOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		var mu sync.Mutex
		var ok, failed int
		stop := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					done <- nil
					return
				default:
				}
				j := i % len(keys)
				c.p.Delete(ctx, ns, keys[j], proxy.ScopeLocal)
				got, _, err := c.p.Get(ctx, ns, keys[j], proxy.ScopeCluster)
				mu.Lock()
				if err == nil {
					ok++
				} else {
					failed++
				}
				mu.Unlock()
				if err == nil && !bytes.Equal(got, vs[j]) {
					done <- fmt.Errorf("key %d: wrong bytes after the owner closed", j)
					return
				}
			}
		}()
		poll.Until(t, 10*time.Second, "a few remote reads", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return ok >= 3
		})
		// Break the owner's transfers while reads are in flight, then its
		// API, then everything.
		b.tr.Close()
		poll.Until(t, 10*time.Second, "reads failing", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return failed >= 2
		})
		b.close()
		close(stop)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		c.p.Delete(ctx, ns, keys[0], proxy.ScopeLocal)
		start := time.Now()
		got, _, err := c.p.Get(ctx, ns, keys[0], proxy.ScopeCluster)
		if err == nil || got != nil {
			t.Fatalf("get from a closed owner: %d bytes, %v", len(got), err)
		}
		if took := time.Since(start); took > 3*time.Second+time.Second {
			t.Fatalf("get from a closed owner took %v", took)
		}
		if st := c.tier.ReserveStats(); st.Open != 0 {
			t.Fatalf("reservations left open: %+v", st)
		}
	})
}
