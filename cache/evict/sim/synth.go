package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"

	"github.com/tidepool-kv/tidepool/internal/trace"
)

// SynthConfig describes a synthetic multi-turn chat workload. Units are
// blocks of trace.BlockTokens tokens unless a field says otherwise.
type SynthConfig struct {
	// Seed makes the workload reproducible. Default 1.
	Seed uint64
	// Requests is the number of requests to generate. Default 12000.
	Requests int
	// SystemPrompts is the number of distinct system prompts shared across
	// users; sessions pick one with Zipf popularity. Default 20.
	SystemPrompts int
	// SystemPromptBlocks bounds a system prompt's length: [min, max].
	// Default [1, 8].
	SystemPromptBlocks [2]int
	// ZipfS is the Zipf exponent (> 1) for system prompt and document
	// popularity. Default 1.2.
	ZipfS float64
	// Documents is the number of shared documents (RAG context, files) a
	// session may attach after its system prompt; DocumentProb is the
	// chance that it does. Default 200 and 0.3.
	Documents    int
	DocumentProb float64
	// DocumentBlocks bounds a document's length. Default [4, 40].
	DocumentBlocks [2]int
	// MeanTurns is the mean number of turns of a session (1 plus a rounded
	// exponential).
	// Default 3.
	MeanTurns float64
	// TurnBlocks bounds the blocks a turn adds (the previous answer plus
	// the new question). Default [1, 8].
	TurnBlocks [2]int
	// OneOffProb is the chance that a session is a single long request of
	// unique content (a pasted document, a batch job). Default 0.1.
	OneOffProb float64
	// OneOffBlocks bounds such a request's unique tail. Default [20, 120].
	OneOffBlocks [2]int
	// Concurrency is the number of sessions open at once (a closed session
	// is replaced at once); each open session is equally likely to send the
	// next request, so a turn follows the previous one of its session
	// about Concurrency requests later. Default 300.
	Concurrency int
}

// DefaultSynthConfig returns the defaults listed on SynthConfig.
func DefaultSynthConfig() SynthConfig {
	return SynthConfig{
		Seed:               1,
		Requests:           12000,
		SystemPrompts:      20,
		SystemPromptBlocks: [2]int{1, 8},
		ZipfS:              1.2,
		Documents:          200,
		DocumentProb:       0.3,
		DocumentBlocks:     [2]int{4, 40},
		MeanTurns:          3,
		TurnBlocks:         [2]int{1, 8},
		OneOffProb:         0.1,
		OneOffBlocks:       [2]int{20, 120},
		Concurrency:        300,
	}
}

// Validate reports every problem with c at once.
func (c SynthConfig) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if c.Requests < 0 {
		bad("Requests %d < 0", c.Requests)
	}
	if c.SystemPrompts < 1 {
		bad("SystemPrompts %d < 1", c.SystemPrompts)
	}
	if c.Documents < 1 {
		bad("Documents %d < 1", c.Documents)
	}
	if !(c.ZipfS > 1) {
		bad("ZipfS %v must be > 1", c.ZipfS)
	}
	if !(c.MeanTurns >= 1) {
		bad("MeanTurns %v must be >= 1", c.MeanTurns)
	}
	if c.Concurrency < 1 {
		bad("Concurrency %d < 1", c.Concurrency)
	}
	for _, p := range []struct {
		name string
		v    float64
	}{{"DocumentProb", c.DocumentProb}, {"OneOffProb", c.OneOffProb}} {
		if !(p.v >= 0 && p.v <= 1) {
			bad("%s %v not in [0, 1]", p.name, p.v)
		}
	}
	for _, r := range []struct {
		name string
		v    [2]int
	}{{"SystemPromptBlocks", c.SystemPromptBlocks}, {"DocumentBlocks", c.DocumentBlocks}, {"TurnBlocks", c.TurnBlocks}, {"OneOffBlocks", c.OneOffBlocks}} {
		if r.v[0] < 1 || r.v[1] < r.v[0] {
			bad("%s %v: want 1 <= min <= max", r.name, r.v)
		}
	}
	return errors.Join(errs...)
}

// synthSession is one open conversation.
type synthSession struct {
	prefix []uint64 // blocks of the conversation so far
	turns  int      // turns left
	oneOff bool     // a single request with a unique tail
}

// Synthesize generates a multi-turn chat workload. Block ids follow the
// traces' rule: equal id means equal prefix, so a block's id is a function
// of its parent's id and its own content; the last block of every request
// is partial and unique (the next turn rewrites it), as in the real traces.
// Timestamps are 100 ms apart.
func Synthesize(c SynthConfig) ([]trace.Request, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x7469646570))
	g := &synthIDs{chain: make(map[[2]uint64]uint64)}
	between := func(r [2]int) int { return r[0] + rng.IntN(r[1]-r[0]+1) }
	promptZipf := newZipf(c.SystemPrompts, c.ZipfS)
	docZipf := newZipf(c.Documents, c.ZipfS)
	promptLen := make([]int, c.SystemPrompts)
	for i := range promptLen {
		promptLen[i] = between(c.SystemPromptBlocks)
	}
	docLen := make([]int, c.Documents)
	for i := range docLen {
		docLen[i] = between(c.DocumentBlocks)
	}
	// Content ids: system prompt p block j, document d block j, and fresh
	// content, in disjoint ranges.
	const promptBase, docBase, freshBase = 1 << 40, 2 << 40, 3 << 40
	fresh := uint64(freshBase)
	newContent := func() uint64 { fresh++; return fresh }

	var open []*synthSession
	out := make([]trace.Request, 0, c.Requests)
	for len(out) < c.Requests {
		// Open sessions until about Concurrency are open.
		for len(open) < c.Concurrency {
			s := &synthSession{}
			p := promptZipf.draw(rng)
			for j := 0; j < promptLen[p]; j++ {
				s.prefix = append(s.prefix, g.id(s.prefix, promptBase+uint64(p)<<16+uint64(j)))
			}
			if rng.Float64() < c.OneOffProb {
				for n := between(c.OneOffBlocks); n > 0; n-- {
					s.prefix = append(s.prefix, g.id(s.prefix, newContent()))
				}
				s.turns = 1
				s.oneOff = true
			} else {
				if rng.Float64() < c.DocumentProb {
					d := docZipf.draw(rng)
					for j := 0; j < docLen[d]; j++ {
						s.prefix = append(s.prefix, g.id(s.prefix, docBase+uint64(d)<<16+uint64(j)))
					}
				}
				s.turns = 1 + int(rng.ExpFloat64()*(c.MeanTurns-1)+0.5)
			}
			open = append(open, s)
		}
		i := rng.IntN(len(open))
		s := open[i]
		// This turn's new content; the request ends with a unique partial
		// block that the next turn replaces.
		if !s.oneOff {
			for n := between(c.TurnBlocks); n > 0; n-- {
				s.prefix = append(s.prefix, g.id(s.prefix, newContent()))
			}
		}
		ids := append(append([]uint64(nil), s.prefix...), g.id(s.prefix, newContent()))
		out = append(out, trace.Request{
			Timestamp:    int64(len(out)) * 100,
			InputLength:  len(ids) * trace.BlockTokens,
			OutputLength: trace.BlockTokens,
			HashIDs:      ids,
		})
		s.turns--
		if s.turns <= 0 {
			open[i] = open[len(open)-1]
			open = open[:len(open)-1]
		}
	}
	return out, nil
}

// synthIDs hands out prefix-block ids: id(parent chain, content) is the
// same for the same parent and content, and ids are small and dense like the
// remapped ids of the real traces.
type synthIDs struct {
	chain map[[2]uint64]uint64
	next  uint64
}

func (g *synthIDs) id(prefix []uint64, content uint64) uint64 {
	parent := uint64(math.MaxUint64)
	if len(prefix) > 0 {
		parent = prefix[len(prefix)-1]
	}
	k := [2]uint64{parent, content}
	if id, ok := g.chain[k]; ok {
		return id
	}
	id := g.next
	g.next++
	g.chain[k] = id
	return id
}

// zipf draws ranks 0..n-1 with P(k) proportional to 1/(k+1)^s by inverting
// the cumulative weights (deterministic given the rng).
type zipf struct{ cdf []float64 }

func newZipf(n int, s float64) zipf {
	cdf := make([]float64, n)
	sum := 0.0
	for k := range n {
		sum += 1 / math.Pow(float64(k+1), s)
		cdf[k] = sum
	}
	for k := range cdf {
		cdf[k] /= sum
	}
	return zipf{cdf: cdf}
}

func (z zipf) draw(rng *rand.Rand) int {
	u := rng.Float64()
	return min(sort.SearchFloat64s(z.cdf, u), len(z.cdf)-1)
}
