package sim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tidepool-kv/tidepool/cache/evict"
	"github.com/tidepool-kv/tidepool/internal/trace"
)

func reqs(chains ...[]uint64) []trace.Request {
	out := make([]trace.Request, len(chains))
	for i, c := range chains {
		out[i] = trace.Request{Timestamp: int64(i), InputLength: len(c) * trace.BlockTokens, HashIDs: c}
	}
	return out
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string // substrings of the error; nil = valid
	}{
		{name: "default", cfg: DefaultConfig()},
		{name: "cluster with copies", cfg: Config{CapacityBlocks: 10, Nodes: 8, Scope: ScopeCluster, Copies: CopiesLowPriority}},
		{name: "everything wrong", cfg: Config{CapacityBlocks: 0, Nodes: 0, Scope: 7, Copies: 9},
			want: []string{"CapacityBlocks 0", "Nodes 0", "unknown Scope 7", "unknown Copies 9"}},
		{name: "copies need cluster scope", cfg: Config{CapacityBlocks: 1, Nodes: 2, Copies: CopiesFull},
			want: []string{"needs ScopeCluster"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate = %v, want ErrInvalidConfig", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate = %q, missing %q", err, w)
				}
			}
		})
	}
}

func TestRunSmall(t *testing.T) {
	tests := []struct {
		name     string
		cfg      Config
		reqs     []trace.Request
		wantHits int64
		wantEvs  int64
	}{
		{
			name:     "prefix counts up to the first miss",
			cfg:      Config{CapacityBlocks: 10, Nodes: 1},
			reqs:     reqs([]uint64{1, 2, 3}, []uint64{1, 2, 4}, []uint64{1, 5, 3}),
			wantHits: 0 + 2 + 1, // block 3 of the last request is present but beyond a miss
		},
		{
			name:     "LRU evicts the oldest",
			cfg:      Config{CapacityBlocks: 3, Nodes: 1},
			reqs:     reqs([]uint64{1, 2}, []uint64{3, 4}, []uint64{1, 2}),
			wantHits: 0, // 1 was evicted when 4 came in
			wantEvs:  3, // 1 at 4; 2 and 3 when 1, 2 are readmitted
		},
		{
			name:     "round robin local scope does not share",
			cfg:      Config{CapacityBlocks: 10, Nodes: 2},
			reqs:     reqs([]uint64{1, 2}, []uint64{1, 2}, []uint64{1, 2}),
			wantHits: 2, // only the third request, back on node 0
		},
		{
			name:     "cluster scope shares through the owner",
			cfg:      Config{CapacityBlocks: 10, Nodes: 2, Scope: ScopeCluster},
			reqs:     reqs([]uint64{1, 2}, []uint64{1, 2}, []uint64{1, 2}),
			wantHits: 4,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Run(tt.reqs, tt.cfg, NewRefLRU)
			if err != nil {
				t.Fatal(err)
			}
			if res.HitBlocks != tt.wantHits || res.Evictions != tt.wantEvs {
				t.Fatalf("hits %d evictions %d, want %d and %d", res.HitBlocks, res.Evictions, tt.wantHits, tt.wantEvs)
			}
		})
	}
}

// badPolicy names a victim it was never given.
type badPolicy struct{ evict.Policy }

func (badPolicy) Victim(func(uint64) bool) (uint64, bool) { return 999, true }

func TestRunCatchesBadPolicy(t *testing.T) {
	_, err := Run(reqs([]uint64{1, 2}), Config{CapacityBlocks: 1, Nodes: 1}, func() evict.Policy { return badPolicy{NewRefLRU()} })
	if !errors.Is(err, ErrPolicy) {
		t.Fatalf("Run = %v, want ErrPolicy", err)
	}
}

func TestBeladyAndUnboundedBoundLRU(t *testing.T) {
	cfg := DefaultSynthConfig()
	cfg.Requests = 2000
	syn, err := Synthesize(cfg)
	if err != nil {
		t.Fatal(err)
	}
	un, err := Unbounded(syn, Config{Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, capBlocks := range []int{200, 1000, 4000} {
		c := Config{CapacityBlocks: capBlocks, Nodes: 1}
		lru, err := Run(syn, c, NewRefLRU)
		if err != nil {
			t.Fatal(err)
		}
		opt, err := Belady(syn, c)
		if err != nil {
			t.Fatal(err)
		}
		if !(lru.HitRate() <= opt.HitRate() && opt.HitRate() <= un.HitRate()) {
			t.Errorf("capacity %d: LRU %.4f, Belady %.4f, unbounded %.4f: want LRU <= Belady <= unbounded",
				capBlocks, lru.HitRate(), opt.HitRate(), un.HitRate())
		}
	}
}

func TestSynthesize(t *testing.T) {
	a, err := Synthesize(DefaultSynthConfig())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Synthesize(DefaultSynthConfig())
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same seed, different workloads")
	}
	other := DefaultSynthConfig()
	other.Seed = 2
	c, _ := Synthesize(other)
	if reflect.DeepEqual(a, c) {
		t.Fatal("different seeds, same workload")
	}
	if len(a) != DefaultSynthConfig().Requests {
		t.Fatalf("%d requests, want %d", len(a), DefaultSynthConfig().Requests)
	}
	// The prefix rule: an id always sits behind the same parent.
	parent := map[uint64]uint64{}
	for i, r := range a {
		for j, id := range r.HashIDs {
			p := ^uint64(0)
			if j > 0 {
				p = r.HashIDs[j-1]
			}
			if q, ok := parent[id]; ok && q != p {
				t.Fatalf("request %d: id %d behind %d, earlier behind %d", i, id, p, q)
			}
			parent[id] = p
		}
	}
	if _, err := Synthesize(SynthConfig{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("zero SynthConfig: %v, want ErrInvalidConfig", err)
	}
}

func TestFindTrace(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x.jsonl")
	if err := os.WriteFile(p, []byte(`{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TIDEPOOL_TRACE", dir)
	if got, err := FindTrace("x.jsonl"); err != nil || got != p {
		t.Fatalf("FindTrace with a folder = %q, %v; want %q", got, err, p)
	}
	t.Setenv("TIDEPOOL_TRACE", p)
	if got, err := FindTrace("x.jsonl"); err != nil || got != p {
		t.Fatalf("FindTrace with a file = %q, %v; want %q", got, err, p)
	}
	t.Setenv("TIDEPOOL_TRACE", dir)
	if _, err := FindTrace("no-such-trace.jsonl"); !errors.Is(err, ErrNoTrace) || !strings.Contains(err.Error(), "TIDEPOOL_TRACE") {
		t.Fatalf("FindTrace of a missing file = %v; want ErrNoTrace naming TIDEPOOL_TRACE", err)
	}
	got, err := LoadTrace("x.jsonl")
	if err != nil || len(got) != 1 {
		t.Fatalf("LoadTrace = %v, %v", got, err)
	}
}

// loadConversation returns the conversation trace or skips the test.
func loadConversation(t *testing.T) []trace.Request {
	t.Helper()
	reqs, err := LoadTrace(ConversationTrace)
	if errors.Is(err, ErrNoTrace) {
		t.Skipf("conversation trace absent, skipping: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

// TestTraceHitRates reproduces the traces README's reference figures with
// textbook LRU and, with -v, prints the comparison tables of
// docs/policy.md.
func TestTraceHitRates(t *testing.T) {
	reqs := loadConversation(t)
	const tol = 0.005
	check := func(name string, got, want float64) {
		t.Helper()
		if got < want-tol || got > want+tol {
			t.Errorf("%s: hit rate %.4f, README says %.3f (±%.3f)", name, got, want, tol)
		}
	}
	un, err := Unbounded(reqs, Config{Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	check("unbounded", un.HitRate(), 0.366)
	refs := []struct {
		name string
		cfg  Config
		want float64
	}{
		{"LRU 1M tokens", Config{CapacityBlocks: 1953, Nodes: 1}, 0.053},
		{"LRU 3M tokens", Config{CapacityBlocks: 5859, Nodes: 1}, 0.136},
		{"LRU 10M tokens", Config{CapacityBlocks: 19531, Nodes: 1}, 0.285},
		{"8x3M local", Config{CapacityBlocks: 5859, Nodes: 8, Scope: ScopeLocal}, 0.113},
		{"8x3M cluster owner-only", Config{CapacityBlocks: 5859, Nodes: 8, Scope: ScopeCluster}, 0.353},
		{"8x3M cluster owner+full copy", Config{CapacityBlocks: 5859, Nodes: 8, Scope: ScopeCluster, Copies: CopiesFull}, 0.297},
	}
	for _, r := range refs {
		res, err := Run(reqs, r.cfg, NewRefLRU)
		if err != nil {
			t.Fatal(err)
		}
		check(r.name, res.HitRate(), r.want)
	}
	if raceEnabled || !testing.Verbose() {
		t.Log("comparison table skipped: run with -v (and without -race) to print it")
		return
	}
	syn, err := Synthesize(DefaultSynthConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", hitRateTable(reqs, syn))
}

// hitRateTable renders the tables of docs/policy.md: per workload and
// capacity, one node, the hit rates of textbook LRU, evict.NewLRU,
// evict.NewPrefix, Belady and an unbounded cache; then 8 nodes of 3M tokens
// on the conversation trace, per scope.
func hitRateTable(conv, syn []trace.Request) string {
	policies := []evict.Factory{NewRefLRU, evict.NewLRU, evict.NewPrefix}
	var b strings.Builder
	row := func(label string, reqs []trace.Request, cfg Config, un Result) {
		fmt.Fprintf(&b, "| %s", label)
		for _, f := range policies {
			res, err := Run(reqs, cfg, f)
			if err != nil {
				fmt.Fprintf(&b, " | %v", err)
				continue
			}
			fmt.Fprintf(&b, " | %.3f", res.HitRate())
		}
		opt, err := Belady(reqs, cfg)
		if err != nil {
			fmt.Fprintf(&b, " | %v", err)
		}
		fmt.Fprintf(&b, " | %.3f | %.3f |\n", opt.HitRate(), un.HitRate())
	}
	b.WriteString("\n| workload, one node | LRU (textbook) | evict.NewLRU | evict.NewPrefix | Belady | unbounded |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, w := range []struct {
		name   string
		reqs   []trace.Request
		tokens []int
	}{
		{"conversation", conv, []int{1_000_000, 3_000_000, 10_000_000, 20_000_000}},
		{"synthetic", syn, []int{1_000_000, 3_000_000, 10_000_000}},
	} {
		un, _ := Unbounded(w.reqs, Config{Nodes: 1})
		for _, tokens := range w.tokens {
			cfg := Config{CapacityBlocks: TokensToBlocks(tokens), Nodes: 1}
			row(fmt.Sprintf("%s, %dM tokens (%d blocks)", w.name, tokens/1_000_000, cfg.CapacityBlocks), w.reqs, cfg, un)
		}
	}
	b.WriteString("\n| conversation, 8 nodes x 3M tokens, round-robin | LRU (textbook) | evict.NewLRU | evict.NewPrefix | Belady | unbounded |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, c := range []struct {
		scope  Scope
		copies Copies
	}{{ScopeLocal, CopiesNone}, {ScopeCluster, CopiesNone}, {ScopeCluster, CopiesFull}, {ScopeCluster, CopiesLowPriority}} {
		cfg := Config{CapacityBlocks: TokensToBlocks(3_000_000), Nodes: 8, Scope: c.scope, Copies: c.copies}
		un, _ := Unbounded(conv, cfg)
		label := c.scope.String()
		if c.scope == ScopeCluster {
			label += ", " + c.copies.String()
		}
		row(label, conv, cfg, un)
	}
	return b.String()
}
