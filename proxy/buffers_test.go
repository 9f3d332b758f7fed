package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
)

// TestGetIntoFetchesToMemory: a block another node holds lands in the
// caller's memory by a named read and is not kept; one damaged in transit
// is an error (cache.ErrChecksum), never a success, and is not kept
// either; without named reads the block goes through the store.
func TestGetIntoFetchesToMemory(t *testing.T) {
	ctx := context.Background()
	ps, peers := newFakeCluster(t, "a", "b")
	fc := &fakeCluster{nodes: []string{"a", "b"}}
	var keys [][]byte
	for i := 0; len(keys) < 4; i++ {
		if k := []byte(fmt.Sprint("k", i)); fc.Owners("ns", k)[0] == "b" {
			keys = append(keys, k)
		}
	}
	val := bytes.Repeat([]byte("tidepool"), 100)
	for _, k := range keys {
		if _, err := ps["b"].PutLocal(ctx, "ns", k, val, cache.PutOptions{Depth: 3}); err != nil {
			t.Fatal(err)
		}
	}
	dst := make([]byte, 1000)
	peers["a"].named.Store(true)
	n, info, err := ps["a"].GetInto(ctx, "ns", keys[0], dst, ScopeCluster)
	if err != nil || n != int64(len(val)) || !bytes.Equal(dst[:n], val) || info.Depth != 3 || info.Checksum != cache.Checksum(val) {
		t.Fatalf("GetInto: %d bytes, %+v, %v", n, info, err)
	}
	if _, ok, _ := ps["a"].Exists(ctx, "ns", keys[0], ScopeLocal); ok {
		t.Fatal("a block read into the caller's memory was kept")
	}
	// Counted as a fetch from b, with the time it took (the mean per
	// block on the dashboards divides one by the other).
	if st := ps["a"].PeerStats(); len(st) != 1 || st[0].Node != "b" || st[0].Fetches != 1 || st[0].NamedReads != 1 ||
		st[0].FetchedBlocks != 1 || st[0].FetchedBytes != int64(len(val)) || st[0].FetchLatency <= 0 {
		t.Fatalf("peer stats after one read into memory: %+v", st)
	}
	peers["a"].corrupt.Store(true)
	if _, _, err := ps["a"].GetInto(ctx, "ns", keys[1], dst, ScopeCluster); !errors.Is(err, cache.ErrChecksum) {
		t.Fatalf("a block damaged in transit: %v, want ErrChecksum", err)
	}
	peers["a"].corrupt.Store(false)
	if _, ok, _ := ps["a"].Exists(ctx, "ns", keys[1], ScopeLocal); ok {
		t.Fatal("a block damaged in transit was kept")
	}
	peers["a"].named.Store(false)
	if n, _, err := ps["a"].GetInto(ctx, "ns", keys[2], dst, ScopeCluster); err != nil || !bytes.Equal(dst[:n], val) {
		t.Fatalf("GetInto without named reads: %d bytes, %v", n, err)
	}
	if _, ok, _ := ps["a"].Exists(ctx, "ns", keys[2], ScopeLocal); !ok {
		t.Fatal("without named reads the block did not go through the store")
	}
	if n := peers["a"].liveLeases(); n != 0 {
		t.Fatalf("%d owner pins not given back", n)
	}
}

// TestPutFrom: the value is copied into its slot and checksummed as it
// is copied; a checksum sent that differs stores nothing.
func TestPutFrom(t *testing.T) {
	ctx := context.Background()
	ps, _ := newFakeCluster(t, "a")
	p := ps["a"]
	val := bytes.Repeat([]byte("0123456789abcdef"), 60)
	bad := cache.Checksum(val) ^ 1
	if _, err := p.PutFrom(ctx, "ns", []byte("k"), val, cache.PutOptions{}, &bad); !errors.Is(err, cache.ErrChecksum) {
		t.Fatalf("a wrong checksum: %v", err)
	}
	if _, ok, _ := p.Exists(ctx, "ns", []byte("k"), ScopeLocal); ok {
		t.Fatal("a put with a wrong checksum stored the block")
	}
	if existed, err := p.PutFrom(ctx, "ns", []byte("k"), val, cache.PutOptions{Depth: 9}, nil); err != nil || existed {
		t.Fatalf("PutFrom: existed %v, %v", existed, err)
	}
	got, info, err := p.Get(ctx, "ns", []byte("k"), ScopeLocal)
	if err != nil || !bytes.Equal(got, val) || info.Checksum != cache.Checksum(val) || info.Depth != 9 {
		t.Fatalf("Get: %d bytes, %+v, %v", len(got), info, err)
	}
	if existed, err := p.PutFrom(ctx, "ns", []byte("k"), val[:10], cache.PutOptions{}, nil); err != nil || !existed {
		t.Fatalf("second PutFrom: existed %v, %v", existed, err)
	}
}

// TestGetIntoFromStore: a block the store serves (no arenas: a slower
// tier's path) is read straight into dst; one longer than dst is
// ErrTooLarge with dst untouched.
func TestGetIntoFromStore(t *testing.T) {
	ctx := context.Background()
	p, _ := newTestProxy(t, nil)
	val := bytes.Repeat([]byte("ab"), 300)
	if _, err := p.Put(ctx, "ns", []byte("k"), val, cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 1000)
	if n, _, err := p.GetInto(ctx, "ns", []byte("k"), dst, ScopeLocal); err != nil || !bytes.Equal(dst[:n], val) {
		t.Fatalf("GetInto: %d bytes, %v", n, err)
	}
	small := bytes.Repeat([]byte{0x5A}, 100)
	if _, _, err := p.GetInto(ctx, "ns", []byte("k"), small, ScopeLocal); !errors.Is(err, cache.ErrTooLarge) || !bytes.Equal(small, bytes.Repeat([]byte{0x5A}, 100)) {
		t.Fatalf("too large: %v, dst %q", err, small[:8])
	}
	if _, _, err := p.GetInto(ctx, "ns", []byte("absent"), dst, ScopeLocal); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("miss: %v", err)
	}
}
