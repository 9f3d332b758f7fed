package replay

import (
	"container/list"
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/tidepool-kv/tidepool/cache/evict/sim"
	"github.com/tidepool-kv/tidepool/internal/trace"
)

// fakeNode is an in-memory sidecar with an exact LRU of capacity blocks
// (0 = unbounded). Fetch touches the fetched blocks; Store touches keys that
// are present and admits the others, evicting at once, block by block.
type fakeNode struct {
	capacity int
	lru      *list.List // front = most recent; values are keys
	m        map[string]*list.Element
	lookups  int
	failKey  string
	// refuseKey is answered PutRefused, as a sidecar refuses a block for room.
	refuseKey string
	// unreadKey, when present, does not read back (UNAVAILABLE).
	unreadKey string
}

func newFakeNode(capacity int) *fakeNode {
	return &fakeNode{capacity: capacity, lru: list.New(), m: map[string]*list.Element{}}
}

func (f *fakeNode) Lookup(_ context.Context, keys [][]byte) (int, error) {
	f.lookups++
	for i, k := range keys {
		if _, ok := f.m[string(k)]; !ok {
			return i, nil
		}
	}
	return len(keys), nil
}

func (f *fakeNode) Fetch(_ context.Context, keys [][]byte) (Fetched, error) {
	var got Fetched
	unread := func(code string) {
		if got.Unread == nil {
			got.Unread = map[string]int64{}
		}
		got.Unread[code]++
	}
	for _, k := range keys {
		e, ok := f.m[string(k)]
		switch {
		case !ok:
			unread("NOT_FOUND")
		case string(k) == f.unreadKey:
			unread("UNAVAILABLE")
		default:
			f.lru.MoveToFront(e)
			got.Blocks++
			got.Bytes += 100
		}
	}
	return got, nil
}

func (f *fakeNode) Store(_ context.Context, keys [][]byte, _ int, _ []byte, out []PutOutcome) error {
	for i, k := range keys {
		if string(k) == f.failKey {
			out[i] = PutFailed
			continue
		}
		if string(k) == f.refuseKey {
			out[i] = PutRefused
			continue
		}
		if e, ok := f.m[string(k)]; ok {
			f.lru.MoveToFront(e)
			out[i] = PutPresent
			continue
		}
		f.m[string(k)] = f.lru.PushFront(string(k))
		out[i] = PutStored
		for f.capacity > 0 && f.lru.Len() > f.capacity {
			last := f.lru.Back()
			delete(f.m, last.Value.(string))
			f.lru.Remove(last)
		}
	}
	return nil
}

// testKey chains ids the way protocol.BlockKey would, without hashing.
func testKey(parent []byte, id uint64) []byte {
	k := append([]byte(nil), parent...)
	return binary.LittleEndian.AppendUint64(k, id)
}

func synth(t *testing.T, n int) []trace.Request {
	t.Helper()
	c := sim.DefaultSynthConfig()
	c.Requests = n
	reqs, err := sim.Synthesize(c)
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

func TestMatchesSimulator(t *testing.T) {
	reqs := synth(t, 2000)
	tests := []struct {
		name     string
		nodes    int
		capacity int // blocks; 0 = unbounded
	}{
		{"one node unbounded", 1, 0},
		{"three nodes unbounded", 3, 0},
		{"one node LRU 300 blocks", 1, 300},
		{"four nodes LRU 200 blocks", 4, 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nodes := make([]Node, tc.nodes)
			for i := range nodes {
				nodes[i] = newFakeNode(tc.capacity)
			}
			cfg := DefaultConfig()
			cfg.Key = testKey
			got, err := Run(context.Background(), cfg, reqs, nodes)
			if err != nil {
				t.Fatal(err)
			}
			scfg := sim.Config{CapacityBlocks: tc.capacity, Nodes: tc.nodes, Scope: sim.ScopeLocal}
			var want sim.Result
			if tc.capacity == 0 {
				want, err = sim.Unbounded(reqs, scfg)
			} else {
				want, err = sim.Run(reqs, scfg, sim.NewRefLRU)
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Requests != want.Requests || got.Blocks != want.Blocks || got.HitBlocks != want.HitBlocks {
				t.Fatalf("replay %d/%d hits over %d requests, simulator %d/%d over %d",
					got.HitBlocks, got.Blocks, got.Requests, want.HitBlocks, want.Blocks, want.Requests)
			}
			if got.ReadBlocks != got.HitBlocks || got.UnreadBlocks != nil || got.ReadHitRate != got.HitRate {
				t.Fatalf("read back %d of %d hit blocks (unread %v)", got.ReadBlocks, got.HitBlocks, got.UnreadBlocks)
			}
			if got.HitRate != want.HitRate() {
				t.Fatalf("hit rate %v, want %v", got.HitRate, want.HitRate())
			}
			var sum NodeResult
			for _, n := range got.Nodes {
				sum.Requests += n.Requests
				sum.Blocks += n.Blocks
				sum.HitBlocks += n.HitBlocks
			}
			if sum.Requests != got.Requests || sum.Blocks != got.Blocks || sum.HitBlocks != got.HitBlocks {
				t.Fatalf("per-node results %+v do not add up to %+v", got.Nodes, got)
			}
			if got.BytesStored != (got.Blocks-got.HitBlocks)*4096 && tc.capacity == 0 && tc.nodes == 1 {
				t.Fatalf("stored %d bytes for %d missed blocks", got.BytesStored, got.Blocks-got.HitBlocks)
			}
		})
	}
}

func TestPrefixRouting(t *testing.T) {
	reqs := synth(t, 1500)
	run := func(route Route) Result {
		nodes := []Node{newFakeNode(0), newFakeNode(0), newFakeNode(0), newFakeNode(0)}
		cfg := DefaultConfig()
		cfg.Key, cfg.Route = testKey, route
		r, err := Run(context.Background(), cfg, reqs, nodes)
		if err != nil {
			t.Fatal(err)
		}
		if route == RoutePrefix {
			for i, n := range r.Nodes {
				if mean := float64(len(reqs)) / 4; float64(n.Requests) > mean*1.25+2 || float64(n.Requests) < mean*0.75-2 {
					t.Fatalf("node %d got %d of %d requests: load band not kept", i, n.Requests, len(reqs))
				}
			}
			for i, n := range nodes {
				if l := n.(*fakeNode).lookups; l != len(reqs) {
					t.Fatalf("node %d got %d lookups, want one per request (%d)", i, l, len(reqs))
				}
			}
		}
		return r
	}
	rr, px := run(RouteRoundRobin), run(RoutePrefix)
	single, err := sim.Unbounded(reqs, sim.Config{Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Unbounded node-local caches can never beat one unbounded cache; routing
	// to the longest prefix must beat blind round-robin on a trace with reuse.
	if px.HitRate > single.HitRate() || px.HitRate <= rr.HitRate {
		t.Fatalf("prefix routing %.4f, round-robin %.4f, single unbounded %.4f", px.HitRate, rr.HitRate, single.HitRate())
	}
}

func TestValidateAndErrors(t *testing.T) {
	c := Config{Route: "random", BlockBytes: 0, Speed: -1}
	err := c.Validate()
	for _, w := range []string{"unknown route", "block bytes 0", "no key function", "speed -1"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Validate() = %v, lacks %q", err, w)
		}
	}
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("not ErrInvalidConfig: %v", err)
	}
	good := DefaultConfig()
	good.Key = testKey
	if _, err := Run(context.Background(), good, nil, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("no nodes: %v", err)
	}
	// A failed put is counted, not fatal.
	reqs := []trace.Request{{HashIDs: []uint64{1, 2, 3}}, {HashIDs: []uint64{1, 2, 3}}}
	n := newFakeNode(0)
	n.failKey = string(testKey(testKey(nil, 1), 2))
	r, err := Run(context.Background(), good, reqs, []Node{n})
	if err != nil || r.FailedPuts != 2 || r.HitBlocks != 1 || r.OrphanPuts != 1 || r.RefusedPuts != 0 {
		t.Fatalf("failed puts (block 3 stored past the failed block 2: an orphan): %+v, %v", r, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, good, reqs, []Node{newFakeNode(0)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestSpeedHonoursTimestamps(t *testing.T) {
	reqs := []trace.Request{{Timestamp: 0, HashIDs: []uint64{1}}, {Timestamp: 200, HashIDs: []uint64{1, 2}}}
	cfg := DefaultConfig()
	cfg.Key, cfg.Speed = testKey, 2 // the second request 100 ms after the first
	r, err := Run(context.Background(), cfg, reqs, []Node{newFakeNode(0)})
	if err != nil || r.HitBlocks != 1 {
		t.Fatalf("%+v, %v", r, err)
	}
	if r.Seconds < 0.1 {
		t.Fatalf("replay at speed 2 took %.3fs, want at least 0.1s", r.Seconds)
	}
	cfg.Speed = 0
	if r, _ = Run(context.Background(), cfg, reqs, []Node{newFakeNode(0)}); r.Seconds >= 0.1 {
		t.Fatalf("replay ignoring timestamps took %.3fs", r.Seconds)
	}
}

// TestPutOutcomes: refused puts are counted apart from failed ones, a block
// stored past a gap counts as an orphan, and CheckChains counts a request
// whose own puts pushed out part of its chain.
func TestPutOutcomes(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Key = testKey
	cfg.CheckChains = true
	reqs := []trace.Request{{HashIDs: []uint64{1, 2, 3, 4}}}
	k := testKey(nil, 1)
	k = testKey(k, 2)

	n := newFakeNode(0) // block 3 refused, 4 refused too: a head of 2
	n.refuseKey = string(testKey(k, 3))
	r, err := Run(context.Background(), cfg, reqs, []Node{n})
	if err != nil || r.RefusedPuts != 1 || r.FailedPuts != 0 || r.OrphanPuts != 1 || r.ChainsCut != 0 {
		t.Fatalf("refused block 3, block 4 stored past it: %+v, %v", r, err)
	}

	small := newFakeNode(3) // 4 blocks into 3: the LRU fake evicts block 1
	r, err = Run(context.Background(), cfg, reqs, []Node{small})
	if err != nil || r.ChainsCut != 1 || r.RefusedPuts != 0 || r.OrphanPuts != 0 {
		t.Fatalf("a chain that pushed out its own head: %+v, %v", r, err)
	}
	cfg.CheckChains = false
	if r, err = Run(context.Background(), cfg, reqs, []Node{newFakeNode(3)}); err != nil || r.ChainsCut != 0 {
		t.Fatalf("chains counted without CheckChains: %+v, %v", r, err)
	}
}

// TestUnreadHits: a hit the lookup counted but the read did not return is
// counted apart, by code, and left out of the read-back hit rate.
func TestUnreadHits(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Key = testKey
	reqs := []trace.Request{{HashIDs: []uint64{1, 2, 3}}, {HashIDs: []uint64{1, 2, 3, 4}}}
	n := newFakeNode(0)
	n.unreadKey = string(testKey(testKey(nil, 1), 2))
	r, err := Run(context.Background(), cfg, reqs, []Node{n})
	if err != nil || r.HitBlocks != 3 || r.ReadBlocks != 2 || r.BytesFetched != 200 || len(r.UnreadBlocks) != 1 || r.UnreadBlocks["UNAVAILABLE"] != 1 {
		t.Fatalf("block 2 looked up but not read back: %+v, %v", r, err)
	}
	if r.HitRate != 3.0/7 || r.ReadHitRate != 2.0/7 {
		t.Fatalf("hit rate %v, read-back hit rate %v; want 3/7, 2/7", r.HitRate, r.ReadHitRate)
	}
	cfg.NoFetch = true
	if r, err = Run(context.Background(), cfg, reqs, []Node{n}); err != nil || r.ReadBlocks != 0 || r.UnreadBlocks != nil {
		t.Fatalf("NoFetch reads nothing: %+v, %v", r, err)
	}
}
