package peerapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/peerapi"
)

// TestPushCarriesDescription: a block put on a node that does not own it
// reaches its owner with its description (token ids, parent key, block
// size), so that the owner's KV events describe it too, by Put and by
// BatchPut; a pushed description is checked as a put's (a bad one stores
// nothing), and a push without one (a peer that predates them) stores
// the block undescribed.
func TestPushCarriesDescription(t *testing.T) {
	nodes := newCluster(t, 2, nodeOpts{notes: true})
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	const ns = "desc"
	desc := func(i uint32) *cache.BlockMeta {
		return &cache.BlockMeta{Tokens: []uint32{i, i + 1, i + 2, 1 << 31}, Parent: []byte{byte(i), 'p'}, BlockSize: 4}
	}

	k1 := keyOwnedBy(t, nodes, ns, "put", "n1")
	if _, err := a.p.Put(ctx, ns, k1, value(1, 4096), cache.PutOptions{Meta: desc(10), SyncReplicas: 1}); err != nil {
		t.Fatal(err)
	}
	k2 := keyOwnedBy(t, nodes, ns, "batch", "n1")
	res, err := a.p.BatchPut(ctx, ns, []proxy.PutItem{{Key: k2, Value: value(2, 4096), Opts: cache.PutOptions{Meta: desc(20), SyncReplicas: 1}}})
	if err != nil || res[0] != nil {
		t.Fatalf("BatchPut: %v %v", res, err)
	}
	for _, c := range []struct {
		key  []byte
		want *cache.BlockMeta
	}{{k1, desc(10)}, {k2, desc(20)}} {
		if _, ok := b.tier.Stat(ctx, ns, c.key); !ok {
			t.Fatalf("%s not pushed to its owner", c.key)
		}
		if got := b.notes.get(ns, c.key); !reflect.DeepEqual(got, c.want) {
			t.Errorf("owner's description of %s = %+v, want %+v", c.key, got, c.want)
		}
		if got := a.notes.get(ns, c.key); !reflect.DeepEqual(got, c.want) {
			t.Errorf("putter's description of %s = %+v, want %+v", c.key, got, c.want)
		}
	}

	bad := keyOwnedBy(t, nodes, ns, "bad", "n1")
	out, err := a.cli.Push(ctx, "n1", ns, []proxy.PutItem{{Key: bad, Value: value(3, 4096),
		Opts: cache.PutOptions{Meta: &cache.BlockMeta{Tokens: []uint32{1, 2, 3}, BlockSize: 4}}}})
	if err != nil || !errors.Is(out[0], proxy.ErrInvalidArgument) {
		t.Fatalf("push of 3 token ids for a block of 4: %v %v, want INVALID_ARGUMENT", out, err)
	}
	if _, ok := b.tier.Stat(ctx, ns, bad); ok || b.notes.get(ns, bad) != nil {
		t.Fatal("a push with a bad description stored the block or its description")
	}

	plain := keyOwnedBy(t, nodes, ns, "plain", "n1")
	if out, err := a.cli.Push(ctx, "n1", ns, []proxy.PutItem{{Key: plain, Value: value(4, 4096)}}); err != nil || out[0] != nil {
		t.Fatalf("push without a description: %v %v", out, err)
	}
	if _, ok := b.tier.Stat(ctx, ns, plain); !ok || b.notes.get(ns, plain) != nil {
		t.Fatal("a push without a description: not stored, or described")
	}
}

// TestFetchCarriesDescription: a block this node fetches from its owner
// (a cluster read) lands here with the description the owner holds, so
// that this node's own KV events describe its copy: the DRAM tier's
// observer finds the token ids when the fetched block is stored, by the
// Acquire path (the first fetch, and every fetch from a node serving no
// named reads) and by named reads. A description a put could not carry
// (3 token ids for a block of 4) is refused: the read misses, nothing is
// stored or described here.
func TestFetchCarriesDescription(t *testing.T) {
	for _, tc := range []struct {
		name    string
		noNamed bool
	}{{"named reads", false}, {"acquire only", true}} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := newCluster(t, 2, nodeOpts{notes: true, noNamed: tc.noNamed})
			a, owner := nodes[0], nodes[1]
			ctx := context.Background()
			const ns, n = "fetchdesc", 4
			desc := func(i uint32) *cache.BlockMeta {
				return &cache.BlockMeta{Tokens: []uint32{i, i + 1, i + 2, 1 << 31}, Parent: []byte{byte(i), 'p'}, BlockSize: 4}
			}
			keys := make([][]byte, n)
			for i := range keys {
				keys[i] = keyOwnedBy(t, nodes, ns, fmt.Sprint("k", i), owner.name)
				if _, err := owner.p.PutLocal(ctx, ns, keys[i], value(byte(i), 64<<10), cache.PutOptions{Meta: desc(uint32(10 * i))}); err != nil {
					t.Fatal(err)
				}
			}
			for i, k := range keys {
				got, _, err := a.p.Get(ctx, ns, k, proxy.ScopeCluster)
				if err != nil || !bytes.Equal(got, value(byte(i), 64<<10)) {
					t.Fatalf("cluster read %d: %d bytes, %v", i, len(got), err)
				}
				seen, ok := a.notes.storedWith(ns, k)
				if !ok {
					t.Fatalf("fetched block %d was not stored here", i)
				}
				if !reflect.DeepEqual(seen, desc(uint32(10*i))) {
					t.Errorf("fetched block %d stored here with description %+v, want %+v", i, seen, desc(uint32(10*i)))
				}
			}
			checkFetchPaths(t, owner, n, tc.noNamed)

			// The owner's description is bad (as from a faulty peer): the
			// block is refused here.
			bad := keyOwnedBy(t, nodes, ns, "bad", owner.name)
			if _, err := owner.p.PutLocal(ctx, ns, bad, value(9, 4096), cache.PutOptions{}); err != nil {
				t.Fatal(err)
			}
			owner.notes.Describe(ns, bad, &cache.BlockMeta{Tokens: []uint32{1, 2, 3}, BlockSize: 4})
			if _, _, err := a.p.Get(ctx, ns, bad, proxy.ScopeCluster); err == nil {
				t.Fatal("a block described with 3 token ids for a block of 4 was read")
			}
			if _, ok := a.tier.Stat(ctx, ns, bad); ok {
				t.Fatal("a block with a bad description was stored here")
			}
			if m := a.notes.get(ns, bad); m != nil {
				t.Fatalf("a bad description was kept here: %+v", m)
			}
			if _, ok := a.notes.storedWith(ns, bad); ok {
				t.Fatal("a block with a bad description was stored here")
			}
			// The owner is fine otherwise: its next block is read.
			next := keyOwnedBy(t, nodes, ns, "next", owner.name)
			if _, err := owner.p.PutLocal(ctx, ns, next, value(8, 4096), cache.PutOptions{Meta: desc(80)}); err != nil {
				t.Fatal(err)
			}
			if _, _, err := a.p.Get(ctx, ns, next, proxy.ScopeCluster); err != nil {
				t.Fatalf("a read after the refusal: %v", err)
			}
			if seen, _ := a.notes.storedWith(ns, next); !reflect.DeepEqual(seen, desc(80)) {
				t.Errorf("the next block stored with %+v", seen)
			}
		})
	}
}

// TestFetchFromNodeWithoutDescriptions: a rolling upgrade. An owner that
// predates descriptions (it ignores the ask, does not set
// fetch_describe and refuses named reads of version 2) is still read
// from, undescribed, also when it was restarted onto that version after
// this node learnt it describes blocks: its refusal of the version 2
// request sends the read by Acquire, whose answer tells this node to send
// version 1 from then on.
func TestFetchFromNodeWithoutDescriptions(t *testing.T) {
	nodes := newCluster(t, 2, nodeOpts{notes: true})
	a, owner := nodes[0], nodes[1]
	ctx := context.Background()
	const ns = "olddesc"
	keys := make([][]byte, 4)
	for i := range keys {
		keys[i] = keyOwnedBy(t, nodes, ns, fmt.Sprint("k", i), owner.name)
		meta := &cache.BlockMeta{Tokens: []uint32{uint32(i), 1, 2, 3}, BlockSize: 4}
		if _, err := owner.p.PutLocal(ctx, ns, keys[i], value(byte(i), 8192), cache.PutOptions{Meta: meta}); err != nil {
			t.Fatal(err)
		}
	}
	read := func(i int) {
		t.Helper()
		got, _, err := a.p.Get(ctx, ns, keys[i], proxy.ScopeCluster)
		if err != nil || !bytes.Equal(got, value(byte(i), 8192)) {
			t.Fatalf("cluster read %d: %d bytes, %v", i, len(got), err)
		}
	}
	read(0) // by Acquire: this node learns the owner describes blocks
	if seen, _ := a.notes.storedWith(ns, keys[0]); seen == nil {
		t.Fatal("block 0 undescribed from an owner that describes blocks")
	}
	peerapi.AnswerUndescribed(owner.srv, true) // "restarted" on an older version
	read(1)                                    // version 2 refused, then by Acquire
	read(2)                                    // a named read of version 1
	for i := 1; i <= 2; i++ {
		if seen, ok := a.notes.storedWith(ns, keys[i]); !ok || seen != nil {
			t.Fatalf("block %d from an owner without descriptions: stored %v with %+v", i, ok, seen)
		}
	}
	if st := owner.srv.Stats(); st.Acquired != 2 || st.Fetched != 1 || st.Refused != 1 {
		t.Fatalf("owner: %d pinned by Acquire, %d named reads, %d refused; want 2, 1, 1", st.Acquired, st.Fetched, st.Refused)
	}
	peerapi.AnswerUndescribed(owner.srv, false) // upgraded again
	read(3)                                     // by named read v1 still, the last Acquire said so
	if st := owner.srv.Stats(); st.Fetched != 2 {
		t.Fatalf("owner: %d named reads, want 2", st.Fetched)
	}
}
