// Package sim is an offline prefix-cache simulator. It replays a request
// trace against one node or a cluster of nodes, each with a fixed capacity in
// blocks and its own evict.Policy, and measures the prefix hit rate the way
// the Mooncake traces README defines it: per request, the blocks of the
// longest prefix already present count as hits; the rate is hit blocks over
// all blocks.
//
// Per request the simulator does what an engine and its sidecar would do:
// look up the longest present prefix, Touch the present blocks, then Admit
// the missing ones (as after prefill), asking the policy for victims until
// the node is back within capacity. The run is deterministic.
//
// Besides any policy it computes two references: the offline optimum
// (Belady: evict the block whose next use is farthest away) and the hit rate
// of an unbounded cache.
package sim

import (
	"errors"
	"fmt"

	"github.com/tidepool-kv/tidepool/cache/evict"
	"github.com/tidepool-kv/tidepool/internal/trace"
)

// ErrInvalidConfig is wrapped by every Config.Validate error.
var ErrInvalidConfig = errors.New("sim: invalid config")

// ErrPolicy is wrapped when a policy misbehaves (a victim that is not
// present).
var ErrPolicy = errors.New("sim: policy misbehaved")

// Scope says where a node looks for prefix blocks.
type Scope int

const (
	// ScopeLocal: a node sees only its own cache; blocks are admitted at the
	// node that computed them.
	ScopeLocal Scope = iota
	// ScopeCluster: each block is cached at its owner (hash of the block id
	// over the nodes) and every node sees every owner's cache.
	ScopeCluster
)

func (s Scope) String() string {
	switch s {
	case ScopeLocal:
		return "local"
	case ScopeCluster:
		return "cluster"
	}
	return fmt.Sprintf("Scope(%d)", int(s))
}

// Copies says whether, in ScopeCluster, the producing node also keeps a copy
// of the blocks it computed or read that another node owns.
type Copies int

const (
	// CopiesNone: each block is cached only at its owner.
	CopiesNone Copies = iota
	// CopiesLowPriority: the producing node keeps a copy admitted with
	// Entry.LowPriority set.
	CopiesLowPriority
	// CopiesFull: the producing node keeps a copy at full priority.
	CopiesFull
)

func (c Copies) String() string {
	switch c {
	case CopiesNone:
		return "owner-only"
	case CopiesLowPriority:
		return "owner+low-priority-copy"
	case CopiesFull:
		return "owner+full-copy"
	}
	return fmt.Sprintf("Copies(%d)", int(c))
}

// TokensToBlocks converts a capacity in tokens to whole trace blocks
// (trace.BlockTokens tokens each), rounding down: 1M tokens = 1953 blocks.
func TokensToBlocks(tokens int) int { return tokens / trace.BlockTokens }

// Config describes a simulated deployment.
type Config struct {
	// CapacityBlocks is each node's cache capacity in blocks. Default 5859
	// (3M tokens, the FAST'25 per-node figure).
	CapacityBlocks int
	// Nodes is the number of nodes; requests are routed round-robin
	// (request i goes to node i mod Nodes). Default 1.
	Nodes int
	// Scope is where nodes look for blocks. Default ScopeLocal.
	Scope Scope
	// Copies applies to ScopeCluster only. Default CopiesNone.
	Copies Copies
}

// DefaultConfig returns one node of 3M tokens, local scope.
func DefaultConfig() Config {
	return Config{CapacityBlocks: TokensToBlocks(3_000_000), Nodes: 1, Scope: ScopeLocal, Copies: CopiesNone}
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	if c.CapacityBlocks < 1 {
		errs = append(errs, fmt.Errorf("%w: CapacityBlocks %d < 1", ErrInvalidConfig, c.CapacityBlocks))
	}
	if c.Nodes < 1 {
		errs = append(errs, fmt.Errorf("%w: Nodes %d < 1", ErrInvalidConfig, c.Nodes))
	}
	if c.Scope != ScopeLocal && c.Scope != ScopeCluster {
		errs = append(errs, fmt.Errorf("%w: unknown Scope %d", ErrInvalidConfig, int(c.Scope)))
	}
	if c.Copies < CopiesNone || c.Copies > CopiesFull {
		errs = append(errs, fmt.Errorf("%w: unknown Copies %d", ErrInvalidConfig, int(c.Copies)))
	}
	if c.Copies != CopiesNone && c.Scope != ScopeCluster {
		errs = append(errs, fmt.Errorf("%w: Copies %v needs ScopeCluster, not %v", ErrInvalidConfig, c.Copies, c.Scope))
	}
	return errors.Join(errs...)
}

// Result is the outcome of one simulation.
type Result struct {
	// Requests and Blocks count the requests and blocks replayed.
	Requests, Blocks int64
	// HitBlocks counts blocks in each request's longest present prefix.
	HitBlocks int64
	// Admits and Evictions count policy admissions and evictions over all
	// nodes.
	Admits, Evictions int64
}

// HitRate is HitBlocks / Blocks (0 for an empty trace).
func (r Result) HitRate() float64 {
	if r.Blocks == 0 {
		return 0
	}
	return float64(r.HitBlocks) / float64(r.Blocks)
}

// Owner returns the node that owns block id among n nodes (a fixed 64-bit
// mix of the id, modulo n).
func Owner(id uint64, n int) int { return int(mix64(id) % uint64(n)) }

// mix64 is the SplitMix64 finalizer.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// node is one simulated cache.
type node struct {
	pol     evict.Policy
	present map[uint64]struct{}
	// oracle is set when pol is the Belady reference.
	oracle *belady
}

// noSkip is the Victim filter: the simulator pins nothing.
func noSkip(uint64) bool { return false }

// Run replays reqs against cfg, giving each node a policy from f. Per
// request it counts the longest present prefix as hits, then walks the
// request's blocks in depth order: a present block is touched (also when it
// lies beyond the first miss, as an engine's put of an existing block
// would), a missing one is admitted and victims are evicted until the node
// is within capacity. Nothing is pinned: Victim gets a skip function that
// rejects nothing.
func Run(reqs []trace.Request, cfg Config, f evict.Factory) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	if f == nil {
		return Result{}, fmt.Errorf("%w: nil policy factory", ErrInvalidConfig)
	}
	nodes := make([]*node, cfg.Nodes)
	for i := range nodes {
		nodes[i] = &node{pol: f(), present: make(map[uint64]struct{})}
	}
	return run(reqs, cfg, nodes, nil)
}

// target is one cache a block access goes to.
type target struct {
	node int
	low  bool
}

// targets lists the caches that request node at gets block id, owner
// first.
func targets(cfg Config, at int, id uint64, buf []target) []target {
	buf = buf[:0]
	if cfg.Scope == ScopeLocal {
		return append(buf, target{node: at})
	}
	own := Owner(id, cfg.Nodes)
	buf = append(buf, target{node: own})
	if cfg.Copies != CopiesNone && own != at {
		buf = append(buf, target{node: at, low: cfg.Copies == CopiesLowPriority})
	}
	return buf
}

// chainedAt reports whether node n, storing block id for a request at node
// at, holds the block's parent as its chain parent: the parent went to n
// too in this request, and, when n owns the block, n owns the parent (a
// copy's rank reflects only the requests at n, the owned block's those of
// the whole cluster).
func chainedAt(cfg Config, at int, id, parent uint64, n int) bool {
	if cfg.Scope == ScopeLocal {
		return true
	}
	ownsParent := Owner(parent, cfg.Nodes) == n
	if Owner(id, cfg.Nodes) == n {
		return ownsParent
	}
	return ownsParent || (cfg.Copies != CopiesNone && at == n)
}

// run is the replay loop. next, when set, holds the next-use position of
// every access in event order (see nextUses) and feeds the Belady oracles.
func run(reqs []trace.Request, cfg Config, nodes []*node, next []int64) (Result, error) {
	var res Result
	var tg []target
	ev := 0
	for i, r := range reqs {
		at := i % cfg.Nodes
		res.Requests++
		res.Blocks += int64(len(r.HashIDs))
		// Longest present prefix.
		for _, id := range r.HashIDs {
			found := false
			tg = targets(cfg, at, id, tg)
			for _, t := range tg {
				if _, ok := nodes[t.node].present[id]; ok {
					found = true
					break
				}
			}
			if !found {
				break
			}
			res.HitBlocks++
		}
		// Touch what is present, admit what is missing, in depth order.
		for depth, id := range r.HashIDs {
			tg = targets(cfg, at, id, tg)
			for _, t := range tg {
				n := nodes[t.node]
				if n.oracle != nil {
					n.oracle.setNext(next[ev])
				}
				ev++
				if _, ok := n.present[id]; ok {
					n.pol.Touch(id)
					continue
				}
				e := evict.Entry{ID: id, Size: trace.BlockTokens, Depth: int32(depth), LowPriority: t.low}
				// Name the parent when this node holds it as the block's
				// chain parent (see chainedAt); else the chain starts here
				// for this node.
				e.ParentKind = evict.ParentNone
				if depth > 0 && chainedAt(cfg, at, id, r.HashIDs[depth-1], t.node) {
					e.Parent, e.ParentKind = r.HashIDs[depth-1], evict.ParentKnown
				}
				n.pol.Admit(e)
				n.present[id] = struct{}{}
				res.Admits++
				for len(n.present) > cfg.CapacityBlocks {
					v, ok := n.pol.Victim(noSkip)
					if !ok {
						return res, fmt.Errorf("%w: no victim with %d of %d blocks tracked (request %d)", ErrPolicy, n.pol.Len(), len(n.present), i)
					}
					if _, ok := n.present[v]; !ok {
						return res, fmt.Errorf("%w: victim %d is not present (request %d)", ErrPolicy, v, i)
					}
					n.pol.Remove(v)
					delete(n.present, v)
					res.Evictions++
				}
			}
		}
	}
	return res, nil
}

// Unbounded returns the result of an unbounded cache under cfg's routing and
// scope (CapacityBlocks is ignored): every block ever computed stays.
func Unbounded(reqs []trace.Request, cfg Config) (Result, error) {
	cfg.CapacityBlocks = 1
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	cfg.CapacityBlocks = int(^uint(0) >> 1)
	nodes := make([]*node, cfg.Nodes)
	for i := range nodes {
		nodes[i] = &node{pol: nopPolicy{}, present: make(map[uint64]struct{})}
	}
	return run(reqs, cfg, nodes, nil)
}

// nopPolicy tracks nothing; it serves the unbounded cache, which never asks
// for a victim.
type nopPolicy struct{}

func (nopPolicy) Admit(evict.Entry)                       {}
func (nopPolicy) Touch(uint64)                            {}
func (nopPolicy) Remove(uint64)                           {}
func (nopPolicy) Victim(func(uint64) bool) (uint64, bool) { return 0, false }
func (nopPolicy) Len() int                                { return 0 }
