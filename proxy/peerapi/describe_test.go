package peerapi_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/proxy"
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
	ctx := proxy.WithSyncReplicas(context.Background(), 1)
	const ns = "desc"
	desc := func(i uint32) *cache.BlockMeta {
		return &cache.BlockMeta{Tokens: []uint32{i, i + 1, i + 2, 1 << 31}, Parent: []byte{byte(i), 'p'}, BlockSize: 4}
	}

	k1 := keyOwnedBy(t, nodes, ns, "put", "n1")
	if _, err := a.p.Put(ctx, ns, k1, value(1, 4096), cache.PutOptions{Meta: desc(10)}); err != nil {
		t.Fatal(err)
	}
	k2 := keyOwnedBy(t, nodes, ns, "batch", "n1")
	res, err := a.p.BatchPut(ctx, ns, []proxy.PutItem{{Key: k2, Value: value(2, 4096), Opts: cache.PutOptions{Meta: desc(20)}}})
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
