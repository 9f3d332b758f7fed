package dram

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/evict"
)

// putChain puts blocks prefix0..prefix(n-1) of one chain in depth order,
// each with put, and returns each one's error.
func putChain(n int, put func(key string, depth int32) error) []error {
	errs := make([]error, n)
	for d := range n {
		errs[d] = put(fmt.Sprintf("c%d", d), int32(d))
	}
	return errs
}

// checkHead fails unless the chain's puts stored blocks 0..k-1 (k ≥ min)
// and refused the rest with cache.ErrNoSpace, and the tier holds exactly
// that head: no block past it. It returns k.
func checkHead(t *testing.T, tr *Tier, errs []error, least int) int {
	t.Helper()
	k := 0
	for k < len(errs) && errs[k] == nil {
		k++
	}
	if k < least {
		t.Fatalf("stored a head of %d blocks, want at least %d: %v", k, least, errs)
	}
	for d := k; d < len(errs); d++ {
		if !errors.Is(errs[d], cache.ErrNoSpace) {
			t.Errorf("block %d after the head: %v, want no space", d, errs[d])
		}
	}
	keys := make([][]byte, len(errs))
	for d := range keys {
		keys[d] = fmt.Appendf(nil, "c%d", d)
	}
	if n := tr.Present(ctx, "ns", keys, nil); n != k {
		t.Errorf("present prefix %d, want the head of %d", n, k)
	}
	for d := k; d < len(errs); d++ {
		if _, ok := tr.Stat(ctx, "ns", keys[d]); ok {
			t.Errorf("block %d stored past the head: an orphan", d)
		}
	}
	return k
}

// TestChainKeepsItsHead: a chain put in depth order into a tier smaller
// than the chain stores a contiguous head and refuses the rest, with either
// policy, by Put and by reserve-and-commit falling back to Put (the put
// socket's path: the second try must not get past the rule). Before
// the chain rule each block pushed out the one stored before it and the
// chain kept its head minus one block plus its last block.
func TestChainKeepsItsHead(t *testing.T) {
	const block = 128 << 10
	for _, pol := range []struct {
		name string
		f    evict.Factory
	}{{"lru", evict.NewLRU}, {"prefix", evict.NewPrefix}} {
		for _, how := range []string{"put", "reserve"} {
			t.Run(pol.name+"/"+how, func(t *testing.T) {
				cfg, _ := testConfig(t, 8*block) // 8 blocks
				cfg.Policy = pol.f
				got := recordEvictions(&cfg)
				tr := newTier(t, cfg)
				errs := putChain(16, func(key string, depth int32) error {
					opts := cache.PutOptions{Depth: depth}
					if how == "put" {
						_, err := tr.Put(ctx, "ns", []byte(key), pattern(key, block), opts)
						return err
					}
					// The put socket's path: a slot, or else a whole put.
					r, err := tr.Reserve(ctx, "ns", []byte(key), block, opts, 0)
					if err != nil {
						_, err = tr.Put(ctx, "ns", []byte(key), pattern(key, block), opts)
						return err
					}
					copy(r.Bytes(), pattern(key, block))
					_, err = r.Commit(ctx, 0, false)
					return err
				})
				if k := checkHead(t, tr, errs, 8); k != 8 {
					t.Errorf("head of %d blocks in a tier of 8", k)
				}
				if len(*got) != 0 {
					t.Errorf("evicted %v for its own chain", keysOf(*got))
				}
			})
		}
	}
}

// TestChainSparesProtectedBlocks: a fresh chain into a full tier whose
// other blocks the prefix policy ranks above it (read often) takes the free
// room and stops there: none of the read blocks is lost for it, and no
// orphan is kept. A block that starts another chain afterwards is stored
// as usual (the refusal covers one chain).
func TestChainSparesProtectedBlocks(t *testing.T) {
	const block = 128 << 10
	cfg, _ := testConfig(t, 8*block)
	cfg.Policy = evict.NewPrefix
	tr := newTier(t, cfg)
	for i := range 4 {
		k := fmt.Sprintf("hot%d", i)
		if _, err := tr.Put(ctx, "ns", []byte(k), pattern(k, block), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if _, _, err := tr.Get(ctx, "ns", []byte(k), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	errs := putChain(16, func(key string, depth int32) error {
		_, err := tr.Put(ctx, "ns", []byte(key), pattern(key, block), cache.PutOptions{Depth: depth})
		return err
	})
	checkHead(t, tr, errs, 4)
	for i := range 4 {
		if _, ok := tr.Stat(ctx, "ns", fmt.Appendf(nil, "hot%d", i)); !ok {
			t.Errorf("hot%d evicted for the chain", i)
		}
	}
	// Another chain's first block is not refused: it evicts the lowest
	// block, the first chain's tail.
	if _, err := tr.Put(ctx, "ns", []byte("other"), pattern("other", block), cache.PutOptions{}); err != nil {
		t.Fatalf("a new chain after a refused one: %v", err)
	}
}

// TestChainRuleScope: the rule ties blocks only within one namespace and
// class; a LowPriority copy, a block of another namespace, or one that
// skips a level evicts as before.
func TestChainRuleScope(t *testing.T) {
	const block = 512 << 10
	for _, tc := range []struct {
		name string
		ns   string
		opts cache.PutOptions
	}{
		{"other namespace", "other", cache.PutOptions{Depth: 2}},
		{"low priority", "ns", cache.PutOptions{Depth: 2, LowPriority: true}},
		{"skips a level", "ns", cache.PutOptions{Depth: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _ := testConfig(t, 2*block)
			cfg.Policy = evict.NewLRU
			tr := newTier(t, cfg)
			errs := putChain(2, func(key string, depth int32) error {
				_, err := tr.Put(ctx, "ns", []byte(key), pattern(key, block), cache.PutOptions{Depth: depth})
				return err
			})
			if errs[0] != nil || errs[1] != nil {
				t.Fatal(errs)
			}
			if _, err := tr.Put(ctx, tc.ns, []byte("x"), pattern("x", block), tc.opts); err != nil {
				t.Fatalf("put: %v", err)
			}
		})
	}
}

// TestChainNamedParent: puts that name their parent (a BatchPut's items)
// keep their chain's head even when another block is admitted between two
// of them, which ends the tier's guess of the chain: a block whose parent
// would be the victim, or is gone, is refused.
func TestChainNamedParent(t *testing.T) {
	const block = 128 << 10
	cfg, _ := testConfig(t, 8*block)
	cfg.Policy = evict.NewLRU
	tr := newTier(t, cfg)
	put := func(key string, depth int32, parent string) error {
		opts := cache.PutOptions{Depth: depth}
		if parent != "" {
			opts.Parent = []byte(parent)
		}
		_, err := tr.Put(ctx, "ns", []byte(key), pattern(key, block), opts)
		return err
	}
	errs := make([]error, 16)
	for d := range 16 {
		parent := ""
		if d > 0 {
			parent = fmt.Sprintf("c%d", d-1)
		}
		errs[d] = put(fmt.Sprintf("c%d", d), int32(d), parent)
		if d >= 7 {
			// Another client's block between two items: it takes the
			// room of the chain's tail, or is refused nothing.
			if err := put(fmt.Sprintf("x%d", d), 0, ""); err != nil {
				t.Fatalf("other client's block: %v", err)
			}
		}
	}
	k := 0
	for k < len(errs) && errs[k] == nil {
		k++
	}
	for d := k; d < len(errs); d++ {
		if !errors.Is(errs[d], cache.ErrNoSpace) {
			t.Errorf("block %d after the head of %d: %v", d, k, errs[d])
		}
	}
	keys := make([][]byte, 16)
	for d := range keys {
		keys[d] = fmt.Appendf(nil, "c%d", d)
	}
	n := tr.Present(ctx, "ns", keys, nil)
	for d := n; d < 16; d++ {
		if _, ok := tr.Stat(ctx, "ns", keys[d]); ok {
			t.Errorf("block %d held past a missing block %d: an orphan (head %d, stored %d)", d, n, n, k)
		}
	}
	if k == 16 {
		t.Errorf("all 16 blocks stored into 8 slots")
	}
}

// countingPolicy counts Admit calls.
type countingPolicy struct {
	evict.Policy
	admits int
}

func (p *countingPolicy) Admit(e evict.Entry) {
	p.admits++
	p.Policy.Admit(e)
}

// TestChainRefusedSeenOnce: every block of a chain is shown to the policy
// once, stored or refused, even when a refused block is put again (the
// put socket's reservation, then its whole put): a retry must not count
// as a second use.
func TestChainRefusedSeenOnce(t *testing.T) {
	const block = 128 << 10
	cfg, _ := testConfig(t, 8*block)
	pol := &countingPolicy{Policy: evict.NewPrefix()}
	cfg.Policy = func() evict.Policy { return pol }
	for _, parent := range []bool{false, true} {
		tr := newTier(t, cfg)
		pol.admits = 0
		errs := putChain(16, func(key string, depth int32) error {
			opts := cache.PutOptions{Depth: depth}
			if parent && depth > 0 {
				opts.Parent = fmt.Appendf(nil, "c%d", depth-1)
			}
			r, err := tr.Reserve(ctx, "ns", []byte(key), block, opts, 0)
			if err == nil {
				copy(r.Bytes(), pattern(key, block))
				_, err = r.Commit(ctx, 0, false)
				return err
			}
			_, err = tr.Put(ctx, "ns", []byte(key), pattern(key, block), opts)
			return err
		})
		checkHead(t, tr, errs, 8)
		if pol.admits != 16 {
			t.Errorf("parent named %v: the policy saw %d admissions of 16 blocks", parent, pol.admits)
		}
		pol.Policy = evict.NewPrefix()
	}
}

// TestChainRuleOffWhileEvictionsKeep: while KeepsEvicted reports that
// OnEvict keeps what it is handed, evicting a chain's parent is a move, not
// a loss, and the rule does not refuse; once it reports false, it does.
func TestChainRuleOffWhileEvictionsKeep(t *testing.T) {
	const block = 128 << 10
	cfg, _ := testConfig(t, 8*block)
	got := recordEvictions(&cfg)
	keeps := true
	cfg.KeepsEvicted = func() bool { return keeps }
	tr := newTier(t, cfg)
	put := func(key string, depth int32) error {
		_, err := tr.Put(ctx, "ns", []byte(key), pattern(key, block), cache.PutOptions{Depth: depth})
		return err
	}
	for d, err := range putChain(12, put) {
		if err != nil {
			t.Fatalf("block %d refused while evictions keep their blocks: %v", d, err)
		}
	}
	if len(*got) != 4 {
		t.Fatalf("evicted %v, want 4 blocks handed below", keysOf(*got))
	}
	keeps = false // another chain, of 12: it evicts the older one, then stops
	for d := range 12 {
		err := put(fmt.Sprintf("e%d", d), int32(d))
		if (d < 8) != (err == nil) || (d >= 8 && !errors.Is(err, ErrChainRule)) {
			t.Errorf("block e%d: %v", d, err)
		}
	}
}
