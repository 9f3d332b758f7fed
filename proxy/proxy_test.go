package proxy

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
)

// mapStore is an in-memory Store for unit tests of the proxy's checks.
type mapStore struct {
	mu    sync.Mutex
	m     map[string][]byte
	calls int
}

func newMapStore() *mapStore { return &mapStore{m: map[string][]byte{}} }

func id(ns string, key []byte) string { return ns + "\x00" + string(key) }

func (s *mapStore) Put(_ context.Context, ns string, key, value []byte, _ cache.PutOptions) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if _, ok := s.m[id(ns, key)]; ok {
		return true, nil
	}
	s.m[id(ns, key)] = append([]byte(nil), value...)
	return false, nil
}

func (s *mapStore) Get(_ context.Context, ns string, key, dst []byte) ([]byte, cache.Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	v, ok := s.m[id(ns, key)]
	if !ok {
		return nil, cache.Info{}, cache.ErrNotFound
	}
	return append(dst[:0], v...), cache.Info{Size: int64(len(v)), Tier: "map"}, nil
}

func (s *mapStore) Stat(_ context.Context, ns string, key []byte) (cache.Info, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	v, ok := s.m[id(ns, key)]
	return cache.Info{Size: int64(len(v)), Tier: "map"}, ok
}

func (s *mapStore) Present(ctx context.Context, ns string, keys [][]byte, present []bool) int {
	n := len(keys)
	for i, k := range keys {
		_, ok := s.Stat(ctx, ns, k)
		if present != nil {
			present[i] = ok
		} else if !ok {
			return i
		}
		if !ok && n == len(keys) {
			n = i
		}
	}
	return n
}

func (s *mapStore) Delete(_ context.Context, ns string, key []byte) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	_, ok := s.m[id(ns, key)]
	delete(s.m, id(ns, key))
	return ok, nil
}

func (s *mapStore) Clear(_ context.Context, ns string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	var n int64
	for k := range s.m {
		if strings.HasPrefix(k, ns+"\x00") {
			delete(s.m, k)
			n++
		}
	}
	return n, nil
}

func (s *mapStore) Stats() cache.Stats { return cache.Stats{} }

func (s *mapStore) callCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

func newTestProxy(t *testing.T, mod func(*Config)) (*Proxy, *mapStore) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.MaxValueBytes = 1024
	cfg.MaxBatch = 4
	cfg.MaxNamespaces = 3
	if mod != nil {
		mod(&cfg)
	}
	st := newMapStore()
	p, err := New(cfg, Deps{Store: st}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p, st
}

// TestBadInputChangesNothing: every rejected request leaves the store
// untouched (no store call at all) and names its problem.
func TestBadInputChangesNothing(t *testing.T) {
	ctx := context.Background()
	long := bytes.Repeat([]byte("k"), 129)
	for _, tc := range []struct {
		name string
		call func(p *Proxy) error
		want error
	}{
		{"empty key", func(p *Proxy) error { _, err := p.Put(ctx, "ns", nil, []byte("v"), cache.PutOptions{}); return err }, ErrInvalidArgument},
		{"long key", func(p *Proxy) error { _, err := p.Put(ctx, "ns", long, []byte("v"), cache.PutOptions{}); return err }, ErrInvalidArgument},
		{"empty namespace", func(p *Proxy) error {
			_, err := p.Put(ctx, "", []byte("k"), []byte("v"), cache.PutOptions{})
			return err
		}, ErrInvalidArgument},
		{"control char namespace", func(p *Proxy) error {
			_, err := p.Put(ctx, "a\nb", []byte("k"), []byte("v"), cache.PutOptions{})
			return err
		}, ErrInvalidArgument},
		{"long namespace", func(p *Proxy) error {
			_, err := p.Put(ctx, strings.Repeat("n", 257), []byte("k"), []byte("v"), cache.PutOptions{})
			return err
		}, ErrInvalidArgument},
		{"value too large", func(p *Proxy) error {
			_, err := p.Put(ctx, "ns", []byte("k"), make([]byte, 1025), cache.PutOptions{})
			return err
		}, cache.ErrTooLarge},
		{"batch put too large", func(p *Proxy) error { _, err := p.BatchPut(ctx, "ns", make([]PutItem, 5)); return err }, ErrBatchTooLarge},
		{"batch get too large", func(p *Proxy) error { _, err := p.BatchGet(ctx, "ns", make([][]byte, 5), ScopeDefault); return err }, ErrBatchTooLarge},
		{"lookup too large", func(p *Proxy) error { _, err := p.Lookup(ctx, "ns", make([][]byte, 5), ScopeDefault); return err }, ErrBatchTooLarge},
		{"lookup bad key", func(p *Proxy) error {
			_, err := p.Lookup(ctx, "ns", [][]byte{[]byte("a"), nil}, ScopeDefault)
			return err
		}, ErrInvalidArgument},
		{"get empty key", func(p *Proxy) error { _, _, err := p.Get(ctx, "ns", nil, ScopeDefault); return err }, ErrInvalidArgument},
		{"delete long key", func(p *Proxy) error { _, err := p.Delete(ctx, "ns", long, ScopeDefault); return err }, ErrInvalidArgument},
		{"clear empty ns", func(p *Proxy) error { _, err := p.Clear(ctx, "", ScopeDefault); return err }, ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, st := newTestProxy(t, nil)
			err := tc.call(p)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if n := st.callCount(); n != 0 {
				t.Fatalf("store was called %d times for a rejected request", n)
			}
		})
	}
}

func TestNamespaces(t *testing.T) {
	ctx := context.Background()
	t.Run("allow-list", func(t *testing.T) {
		p, _ := newTestProxy(t, func(c *Config) { c.Namespaces = []string{"llama/tp8"} })
		if _, err := p.Put(ctx, "llama/tp8", []byte("k"), []byte("v"), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Put(ctx, "other", []byte("k"), []byte("v"), cache.PutOptions{}); !errors.Is(err, ErrUnknownNamespace) {
			t.Fatalf("put to unlisted namespace: %v", err)
		}
		if _, _, err := p.Get(ctx, "other", []byte("k"), ScopeDefault); !errors.Is(err, ErrUnknownNamespace) {
			t.Fatalf("get from unlisted namespace: %v", err)
		}
	})
	t.Run("max namespaces, freed by clear", func(t *testing.T) {
		p, _ := newTestProxy(t, nil)
		for _, ns := range []string{"a", "b", "c"} {
			if _, err := p.Put(ctx, ns, []byte("k"), []byte("v"), cache.PutOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := p.Put(ctx, "d", []byte("k"), []byte("v"), cache.PutOptions{}); !errors.Is(err, ErrUnknownNamespace) {
			t.Fatalf("fourth namespace: %v", err)
		}
		// Reading an unknown namespace is a miss, not an error.
		if _, _, err := p.Get(ctx, "zzz", []byte("k"), ScopeDefault); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("get from never-written namespace: %v", err)
		}
		if _, err := p.Clear(ctx, "a", ScopeDefault); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Put(ctx, "d", []byte("k"), []byte("v"), cache.PutOptions{}); err != nil {
			t.Fatalf("namespace after clear: %v", err)
		}
	})
}

func TestLookupAndBatches(t *testing.T) {
	ctx := context.Background()
	p, _ := newTestProxy(t, nil)
	keys := [][]byte{[]byte("k0"), []byte("k1"), []byte("k2"), []byte("k3")}
	res, err := p.BatchPut(ctx, "ns", []PutItem{{Key: keys[0], Value: []byte("a")}, {Key: keys[1], Value: []byte("b")}, {Key: nil, Value: []byte("x")}, {Key: keys[0], Value: []byte("a")}})
	if err != nil {
		t.Fatal(err)
	}
	if res[0] != nil || res[1] != nil || !errors.Is(res[2], ErrInvalidArgument) || !errors.Is(res[3], cache.ErrExists) {
		t.Fatalf("batch put results %v", res)
	}
	if n, err := p.Lookup(ctx, "ns", keys, ScopeDefault); err != nil || n != 2 {
		t.Fatalf("Lookup = %d, %v; want 2", n, err)
	}
	if n, err := p.Lookup(ctx, "ns", keys[:2], ScopeDefault); err != nil || n != 2 {
		t.Fatalf("Lookup full = %d, %v; want 2", n, err)
	}
	if n, err := p.Lookup(ctx, "ns", nil, ScopeDefault); err != nil || n != 0 {
		t.Fatalf("Lookup empty = %d, %v", n, err)
	}
	got, err := p.BatchGet(ctx, "ns", keys[:3], ScopeDefault)
	if err != nil {
		t.Fatal(err)
	}
	if string(got[0].Value) != "a" || string(got[1].Value) != "b" || !errors.Is(got[2].Err, cache.ErrNotFound) {
		t.Fatalf("batch get %+v", got)
	}
	ex, err := p.BatchExists(ctx, "ns", [][]byte{keys[0], nil, keys[3]}, ScopeDefault)
	if err != nil {
		t.Fatal(err)
	}
	if !ex[0].Present || ex[1].Err == nil || ex[2].Present {
		t.Fatalf("batch exists %+v", ex)
	}
}

func TestConfigValidateReportsAll(t *testing.T) {
	c := Config{Limits: cache.Limits{MaxKeyBytes: -1, MaxValueBytes: -1, MaxBatch: -1, MaxNamespaceBytes: -1}, MaxNamespaces: -1}
	err := c.Validate()
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, want := range []string{"max key bytes", "max value bytes", "max batch", "max namespace bytes", "max namespaces"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error lacks %q: %v", want, err)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}

// parentStore records the Parent each put named.
type parentStore struct {
	*mapStore
	parents map[string]string
}

func (s *parentStore) Put(ctx context.Context, ns string, key, value []byte, o cache.PutOptions) (bool, error) {
	s.parents[string(key)] = string(o.Parent)
	return s.mapStore.Put(ctx, ns, key, value, o)
}

// TestBatchPutNamesParents: a BatchPut item one level deeper than the item
// before it names that item's key as its parent, so that the store's chain
// rule knows the batch's chains exactly; an item that starts a chain, or
// does not follow its predecessor's depth, names none.
func TestBatchPutNamesParents(t *testing.T) {
	st := &parentStore{mapStore: newMapStore(), parents: map[string]string{}}
	p, err := New(DefaultConfig(), Deps{Store: st}, nil)
	if err != nil {
		t.Fatal(err)
	}
	items := []PutItem{
		{Key: []byte("a0"), Opts: cache.PutOptions{Depth: 0}},
		{Key: []byte("a1"), Opts: cache.PutOptions{Depth: 1}},
		{Key: []byte("a2"), Opts: cache.PutOptions{Depth: 2}},
		{Key: []byte("b0"), Opts: cache.PutOptions{Depth: 0}},
		{Key: []byte("c5"), Opts: cache.PutOptions{Depth: 5}},
		{Key: []byte("c6"), Opts: cache.PutOptions{Depth: 6}},
		{Key: []byte("d4"), Opts: cache.PutOptions{Depth: 4}},
	}
	for i := range items {
		items[i].Value = []byte{byte(i)}
	}
	if _, err := p.BatchPut(context.Background(), "ns", items); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a0": "", "a1": "a0", "a2": "a1", "b0": "", "c5": "", "c6": "c5", "d4": ""}
	for k, w := range want {
		if got := st.parents[k]; got != w {
			t.Errorf("%s: parent %q, want %q", k, got, w)
		}
	}
}
