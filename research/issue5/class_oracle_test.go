//go:build research

// Experiment for issue 5 (2026-12-02, third round): how far can a policy
// get at 3M tokens when it ranks blocks by the trace's own reuse statistics?
//
// The "class oracle" keeps, for each block, a class (how often the block was
// used so far, capped at 8, optionally crossed with one feature of the
// request that last used it: depth, blocks to the request's end, request
// length, output length, or length and output together) and its age
// (accesses since that use). Its tables come from the trace: for each class
// and age bucket, the best hit density the block can still reach, max over a
// horizon E of P(next use in (a, E]) / E[space-time held until the next use
// or E] (LHD's hit density over the concave hull, so that the quiet period
// before a likely reuse does not doom a block). Victim is the block with the
// lowest density, deeper first on ties (then the lower id, so that runs
// repeat exactly). It remembers every block's use count, also across
// evictions. Only uses whose next 60,000 accesses lie inside the fitting
// window count (no false "never used again" at its end).
//
// Not a shippable policy (it re-ranks every resident block), and tables
// fitted on the trace it replays leak the future in aggregate. The honest
// checks fit on one part and score another: TestClassOracleSplit (first half
// of the trace -> second half) and TestClassOracleFold (two folds by
// conversation, i.e. by the request's second block). TestClassOracleOnline
// refits the tables as the replay goes, from what it has seen so far.
//
// Run (about 14 minutes on 2 vCPUs; COFEAT picks features, default all):
//
//	COFEAT=none,len,out,outlen go test -tags research -timeout 30m -count=1 -v -run 'TestClassOracle' ./research/issue5/ | grep tokens
//
// Without the research build tag this file is not compiled; `make test`
// vets it with the tag so that a change to cache/evict or its simulator
// that breaks it is caught.

package issue5

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/tidepool-kv/tidepool/cache/evict"
	"github.com/tidepool-kv/tidepool/cache/evict/sim"
	"github.com/tidepool-kv/tidepool/internal/trace"
)

const (
	coBuckets = 80 // age buckets, geometric (factor 1.18) in accesses
	coMaxUses = 8
	coFeats   = 49 // feature values per use count
	coClasses = (coMaxUses + 1) * coFeats
	coHorizon = 60_000 // accesses, about 2,500 requests
)

func coBucket(a int64) int {
	if a < 1 {
		return 0
	}
	b := int(math.Log(float64(a))/math.Log(1.18)) + 1
	return min(b, coBuckets-1)
}

func coBucketAge(b int) float64 {
	if b == 0 {
		return 0
	}
	return math.Pow(1.18, float64(b)-0.5)
}

// log2ish buckets 0..6 for depths and lengths.
func coLenBucket(d int) int {
	switch {
	case d <= 1:
		return 0
	case d < 4:
		return 1
	case d < 8:
		return 2
	case d < 16:
		return 3
	case d < 32:
		return 4
	case d < 64:
		return 5
	}
	return 6
}

func coOutBucket(o int) int {
	for i, lim := range []int{50, 150, 300, 500, 800, 1500} {
		if o < lim {
			return i
		}
	}
	return 6
}

// coFeature is the extra class feature of a block used at depth d of r.
func coFeature(feat string, r trace.Request, d int) int {
	switch feat {
	case "depth":
		return coLenBucket(d)
	case "tail": // blocks between this one and the request's end
		return coLenBucket(len(r.HashIDs) - d)
	case "len": // request length in blocks
		return coLenBucket(len(r.HashIDs))
	case "out": // the request's output length in tokens
		return coOutBucket(r.OutputLength)
	case "outlen":
		return coOutBucket(r.OutputLength)*7 + coLenBucket(len(r.HashIDs))
	}
	return 0
}

// coEvents lists the feature of every access event, in replay order (one
// event per request block: a single node touches or admits each).
func coEvents(reqs []trace.Request, feat string) []int {
	var ev []int
	for _, r := range reqs {
		for d := range r.HashIDs {
			ev = append(ev, coFeature(feat, r, d))
		}
	}
	return ev
}

func coClass(uses, f int) int { return min(uses, coMaxUses) + (coMaxUses+1)*f }

// coFit returns the hull hit density per class and age bucket, from the
// gaps between consecutive uses of each block in reqs.
func coFit(reqs []trace.Request, ev []int) *[coClasses][coBuckets]float64 {
	return coFitWith(reqs, ev, func(int) bool { return true })
}

// coFitWith is coFit on the requests keep reports; the others still take
// their place in time (their accesses count toward ages and gaps).
func coFitWith(reqs []trace.Request, ev []int, keep func(int) bool) *[coClasses][coBuckets]float64 {
	uses := map[uint64][]int64{}
	var e int64
	for i, r := range reqs {
		for _, id := range r.HashIDs {
			if keep(i) {
				uses[id] = append(uses[id], e)
			}
			e++
		}
	}
	// Only uses whose next coHorizon accesses lie inside reqs count, so that
	// the end of the fitting window does not pass for "never used again";
	// a gap longer than coHorizon counts as never.
	var cnt, sum [coClasses][coBuckets + 1]float64 // last bucket: never used again
	for _, u := range uses {
		for j := range u {
			if u[j]+coHorizon > e {
				break
			}
			c := coClass(j+1, ev[u[j]])
			if j+1 < len(u) && u[j+1]-u[j] <= coHorizon {
				g := float64(u[j+1] - u[j])
				b := coBucket(int64(g))
				cnt[c][b]++
				sum[c][b] += g
			} else {
				cnt[c][coBuckets]++
			}
		}
	}
	var hd [coClasses][coBuckets]float64
	for c := range coClasses {
		for b := range coBuckets {
			ab := coBucketAge(b)
			for e := b; e < coBuckets; e++ {
				ae := coBucketAge(e + 1)
				hits, occ := 0.0, 0.0
				for k := b; k <= coBuckets; k++ {
					if k < coBuckets && k <= e {
						hits += cnt[c][k]
						occ += sum[c][k] - cnt[c][k]*ab
					} else {
						occ += cnt[c][k] * (ae - ab)
					}
				}
				if occ > 0 {
					hd[c][b] = max(hd[c][b], hits/occ)
				}
			}
		}
	}
	return &hd
}

type coEntry struct {
	class int
	last  int64
	depth int32
}

// classOracle is the policy. Its clock counts Admit and Touch calls, which
// the single-node replay issues once per request block, so the clock is the
// event index into ev.
type classOracle struct {
	hd    *[coClasses][coBuckets]float64
	ev    []int
	clock int64
	m     map[uint64]*coEntry
	uses  map[uint64]int // every block ever seen: its use count
	ready []uint64       // the lowest-ranked blocks, recomputed once per ~request
	at    int64
}

func newClassOracle(hd *[coClasses][coBuckets]float64, ev []int) *classOracle {
	return &classOracle{hd: hd, ev: ev, m: map[uint64]*coEntry{}, uses: map[uint64]int{}}
}

// use counts a use of id and returns its class after it.
func (p *classOracle) use(id uint64) int {
	p.uses[id]++
	c := coClass(p.uses[id], p.ev[p.clock])
	p.clock++
	return c
}

func (p *classOracle) Admit(e evict.Entry) {
	c := p.use(e.ID) // moves the clock: last is the clock after the use
	p.m[e.ID] = &coEntry{class: c, last: p.clock, depth: e.Depth}
}

func (p *classOracle) Touch(id uint64) {
	x := p.m[id]
	x.class = p.use(id)
	x.last = p.clock
}

func (p *classOracle) Remove(id uint64) { delete(p.m, id) }
func (p *classOracle) Len() int         { return len(p.m) }

func (p *classOracle) Victim(func(uint64) bool) (uint64, bool) {
	for len(p.ready) > 0 && p.clock-p.at < 24 {
		if _, ok := p.m[p.ready[0]]; ok {
			return p.ready[0], true
		}
		p.ready = p.ready[1:]
	}
	type scored struct {
		id    uint64
		hd    float64
		depth int32
	}
	all := make([]scored, 0, len(p.m))
	for id, x := range p.m {
		all = append(all, scored{id, p.hd[x.class][coBucket(p.clock-x.last)], x.depth})
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].hd != all[j].hd {
			return all[i].hd < all[j].hd
		}
		if all[i].depth != all[j].depth {
			return all[i].depth > all[j].depth
		}
		return all[i].id < all[j].id // map order would make runs differ
	})
	p.ready, p.at = p.ready[:0], p.clock
	for i := 0; i < len(all) && i < 32; i++ {
		p.ready = append(p.ready, all[i].id)
	}
	if len(p.ready) == 0 {
		return 0, false
	}
	return p.ready[0], true
}

// coReplay replays reqs on one node of capB blocks, as sim.Run does, and
// returns the hit rate of the requests from index `from` on.
func coReplay(reqs []trace.Request, capB int, pol evict.Policy, from int) float64 {
	return coReplayWith(reqs, capB, pol, func(i int, _ trace.Request) bool { return i >= from }, nil)
}

// coReplayWith is coReplay scoring the requests scored reports, and calling
// before (when set) ahead of each request.
func coReplayWith(reqs []trace.Request, capB int, pol evict.Policy, scored func(int, trace.Request) bool, before func(int)) float64 {
	present := map[uint64]bool{}
	var hits, blocks int64
	for i, r := range reqs {
		if before != nil {
			before(i)
		}
		if scored(i, r) {
			blocks += int64(len(r.HashIDs))
			for _, id := range r.HashIDs {
				if !present[id] {
					break
				}
				hits++
			}
		}
		for d, id := range r.HashIDs {
			if present[id] {
				pol.Touch(id)
				continue
			}
			pol.Admit(evict.Entry{ID: id, Depth: int32(d), Size: trace.BlockTokens})
			present[id] = true
			for len(present) > capB {
				v, _ := pol.Victim(noSkip)
				pol.Remove(v)
				delete(present, v)
			}
		}
	}
	return float64(hits) / float64(blocks)
}

// noSkip is a Victim argument that skips nothing.
func noSkip(uint64) bool { return false }

var coFeatures = strings.Split(cmp.Or(os.Getenv("COFEAT"), "none,depth,tail,len,out,outlen"), ",")

// TestClassOracle: tables fitted on the whole trace, whole trace scored.
func TestClassOracle(t *testing.T) {
	reqs, err := sim.LoadTrace(sim.ConversationTrace)
	if err != nil {
		t.Skip(err)
	}
	for _, capT := range []int{1_000_000, 3_000_000} {
		capB := sim.TokensToBlocks(capT)
		fmt.Printf("%dM tokens: NewPrefix %.4f\n", capT/1_000_000, coReplay(reqs, capB, evict.NewPrefix(), 0))
		for _, f := range coFeatures {
			ev := coEvents(reqs, f)
			fmt.Printf("%dM tokens: class oracle, uses x %s, fitted on all: %.4f\n",
				capT/1_000_000, f, coReplay(reqs, capB, newClassOracle(coFit(reqs, ev), ev), 0))
		}
	}
}

// TestClassOracleSplit: the second half of the trace scored, tables fitted
// on the first half (honest) or on all of it (leaks the future).
func TestClassOracleSplit(t *testing.T) {
	reqs, err := sim.LoadTrace(sim.ConversationTrace)
	if err != nil {
		t.Skip(err)
	}
	half := len(reqs) / 2
	for _, capT := range []int{1_000_000, 3_000_000} {
		capB := sim.TokensToBlocks(capT)
		fmt.Printf("%dM tokens, second half: NewPrefix %.4f, LRU %.4f\n", capT/1_000_000,
			coReplay(reqs, capB, evict.NewPrefix(), half), coReplay(reqs, capB, sim.NewRefLRU(), half))
		for _, f := range coFeatures {
			ev := coEvents(reqs, f)
			first := coReplay(reqs, capB, newClassOracle(coFit(reqs[:half], ev), ev), half)
			all := coReplay(reqs, capB, newClassOracle(coFit(reqs, ev), ev), half)
			fmt.Printf("%dM tokens, second half: class oracle, uses x %s: fitted on first half %.4f, on all %.4f\n",
				capT/1_000_000, f, first, all)
		}
	}
}

// TestClassOracleFold: two-fold by conversation. Requests are split by the
// parity of their second block (the first one that tells conversations
// apart; every request starts at the same root block). The tables are fitted
// on the events of one fold and only the other fold's requests are scored;
// the whole trace is replayed either way.
func TestClassOracleFold(t *testing.T) {
	reqs, err := sim.LoadTrace(sim.ConversationTrace)
	if err != nil {
		t.Skip(err)
	}
	fold := func(r trace.Request) int {
		if len(r.HashIDs) < 2 {
			return 0
		}
		return sim.Owner(r.HashIDs[1], 2)
	}
	inFold := func(k int) func(int, trace.Request) bool {
		return func(_ int, r trace.Request) bool { return fold(r) == k }
	}
	for _, capT := range []int{1_000_000, 3_000_000} {
		capB := sim.TokensToBlocks(capT)
		var base [2]float64
		for k := range 2 {
			base[k] = coReplayWith(reqs, capB, evict.NewPrefix(), inFold(k), nil)
		}
		fmt.Printf("%dM tokens, folds: NewPrefix %.4f %.4f\n", capT/1_000_000, base[0], base[1])
		for _, f := range coFeatures {
			ev := coEvents(reqs, f)
			var got [2]float64
			for k := range 2 {
				other := func(i int) bool { return fold(reqs[i]) != k }
				got[k] = coReplayWith(reqs, capB, newClassOracle(coFitWith(reqs, ev, other), ev), inFold(k), nil)
			}
			fmt.Printf("%dM tokens, folds: class oracle, uses x %s, fitted on the other fold: %.4f %.4f\n",
				capT/1_000_000, f, got[0], got[1])
		}
	}
}

// TestClassOracleOnline: the tables are refitted every 500 requests from
// the requests replayed so far, as a policy learning from its own history
// would (before the first fit, at request 2,500, every density is 0 and
// victims go deepest first). Whole trace and second half scored.
func TestClassOracleOnline(t *testing.T) {
	reqs, err := sim.LoadTrace(sim.ConversationTrace)
	if err != nil {
		t.Skip(err)
	}
	ev := coEvents(reqs, "none")
	for _, capT := range []int{1_000_000, 3_000_000, 10_000_000} {
		capB := sim.TokensToBlocks(capT)
		var empty [coClasses][coBuckets]float64
		learn := func(p *classOracle) func(int) {
			return func(i int) {
				if i >= 2500 && i%500 == 0 {
					p.hd = coFit(reqs[:i], ev)
					p.ready = p.ready[:0]
				}
			}
		}
		p1 := newClassOracle(&empty, ev)
		w := coReplayWith(reqs, capB, p1, func(int, trace.Request) bool { return true }, learn(p1))
		p2 := newClassOracle(&empty, ev)
		h2 := coReplayWith(reqs, capB, p2, func(i int, _ trace.Request) bool { return i >= len(reqs)/2 }, learn(p2))
		fmt.Printf("%dM tokens: class oracle, uses x age, refitted online every 500 requests: whole %.4f, second half %.4f (NewPrefix %.4f, %.4f)\n",
			capT/1_000_000, w, h2,
			coReplay(reqs, capB, evict.NewPrefix(), 0), coReplay(reqs, capB, evict.NewPrefix(), len(reqs)/2))
	}
}
