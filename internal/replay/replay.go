// Package replay drives real sidecars with a Mooncake-format request trace
// (internal/trace) the way inference engines would, and measures the prefix
// hit rate exactly as the traces README defines it: per request, the blocks
// of the longest prefix already cached count as hits; the rate is hit
// blocks over all blocks.
//
// Per request, on the node the router picks: Lookup the request's chained
// block keys; count the matched prefix as hits; Fetch the matched blocks
// (an engine loads the cached prefix, which is also what tells the
// sidecar's eviction policy the blocks were used); then Store the missing
// blocks with their depth, as an engine does after prefill. Requests run one
// after another, so a run is deterministic for a given cluster state.
//
// The package knows nothing of the wire: a Node is an adapter over the
// engine API client (cmd/tidepool builds it), and the block key function is
// injected (protocol.BlockKey in the CLI).
package replay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tidepool-kv/tidepool/internal/trace"
)

// ErrInvalidConfig is wrapped by every Config.Validate error.
var ErrInvalidConfig = errors.New("replay: invalid config")

// Node is one sidecar as the replay uses it.
type Node interface {
	// Lookup returns how many leading keys are present.
	Lookup(ctx context.Context, keys [][]byte) (int, error)
	// Fetch reads the blocks of keys and says what it read (Fetched). A
	// block that does not read back is counted there by why, not
	// returned as err: err is for a call that failed as a whole.
	Fetch(ctx context.Context, keys [][]byte) (Fetched, error)
	// Store writes value under each key, keys[i] at chain depth
	// firstDepth+i, in order, and sets out[i] (len(out) == len(keys)) to
	// what became of keys[i]. Keys already present are no-ops.
	Store(ctx context.Context, keys [][]byte, firstDepth int, value []byte, out []PutOutcome) error
}

// Fetched is what a Fetch read.
type Fetched struct {
	// Blocks counts the blocks read back whole; Bytes their bytes;
	// Remote the part of Bytes that came from another node.
	Blocks, Bytes, Remote int64
	// Unread counts the blocks that did not read back, by the sidecar's
	// error code (NOT_FOUND, UNAVAILABLE, ...).
	Unread map[string]int64
}

// PutOutcome is what a Store did with one key.
type PutOutcome uint8

// The outcomes.
const (
	// PutStored: stored by this put.
	PutStored PutOutcome = iota
	// PutPresent: already present (a no-op).
	PutPresent
	// PutRefused: refused for room (NO_SPACE). A sidecar keeps the head of
	// a chain larger than the room it may take and refuses its tail.
	PutRefused
	// PutFailed: any other error.
	PutFailed
)

// Route is how a request picks its node.
type Route string

// The routes.
const (
	// RouteRoundRobin sends request i to node i mod N.
	RouteRoundRobin Route = "round-robin"
	// RoutePrefix asks every node for its longest cached prefix and sends
	// the request to the longest among the nodes whose request count is
	// within LoadSlack of the mean so far; a node below that band gets the
	// request first (among such nodes, the longest prefix). Ties go in
	// round-robin order. Without the band every request sharing a system
	// prompt would go to the first node that cached it, and a node that
	// missed the start would never warm up.
	RoutePrefix Route = "prefix"
)

// KeyFunc returns the key of a block from its parent's key (nil for the
// first block) and its trace id.
type KeyFunc func(parent []byte, id uint64) []byte

// Config configures a replay.
type Config struct {
	// Route picks each request's node. Default RouteRoundRobin.
	Route Route
	// BlockBytes is the payload stored per block. Default 4096.
	BlockBytes int
	// Key makes the chained block keys. Required.
	Key KeyFunc
	// NoFetch skips reading the hit prefix (then only puts tell the
	// sidecars' policies about use). Default false.
	NoFetch bool
	// Speed honours the trace timestamps scaled by 1/Speed (2 = twice as
	// fast); 0 ignores them and replays back to back. Default 0.
	Speed float64
	// LoadSlack is the load band of RoutePrefix: a node more than this
	// fraction above the mean request count gets no request, one more than
	// this fraction below it gets the next (0.25 = 25 %). Default 0.25.
	LoadSlack float64
	// CheckChains looks each request's keys up again after its puts and
	// counts the requests whose chain lost a block it had just read or
	// stored (Result.ChainsCut): a put that pushed out its own chain. It
	// adds one Lookup per request. Default false.
	CheckChains bool
	// Progress, if set, is called after each request with the count done.
	Progress func(done, total int)
}

// DefaultConfig returns round-robin routing, 4 KiB blocks, timestamps
// ignored; Key must still be set.
func DefaultConfig() Config {
	return Config{Route: RouteRoundRobin, BlockBytes: 4096, LoadSlack: 0.25}
}

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(f string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+f, append([]any{ErrInvalidConfig}, a...)...))
	}
	if c.Route != RouteRoundRobin && c.Route != RoutePrefix {
		bad("unknown route %q (want %q or %q)", c.Route, RouteRoundRobin, RoutePrefix)
	}
	if c.BlockBytes < 1 {
		bad("block bytes %d < 1", c.BlockBytes)
	}
	if c.Key == nil {
		bad("no key function")
	}
	if c.LoadSlack < 0 {
		bad("load slack %g < 0", c.LoadSlack)
	}
	if c.Speed < 0 {
		bad("speed %g < 0", c.Speed)
	}
	return errors.Join(errs...)
}

// NodeResult is one node's share of a replay.
type NodeResult struct {
	Requests  int64   `json:"requests"`
	Blocks    int64   `json:"blocks"`
	HitBlocks int64   `json:"hit_blocks"`
	HitRate   float64 `json:"hit_rate"`
}

// Result is the outcome of a replay. The JSON names are the stable
// interface of `tidepool replay --json`.
type Result struct {
	Requests  int64   `json:"requests"`
	Blocks    int64   `json:"blocks"`
	HitBlocks int64   `json:"hit_blocks"`
	HitRate   float64 `json:"hit_rate"`
	// ReadBlocks counts the hit blocks read back whole (without
	// Config.NoFetch): a hit a Lookup counted but a read did not return
	// is in UnreadBlocks instead, by the sidecar's error code;
	// ReadHitRate is ReadBlocks over all blocks.
	ReadBlocks   int64            `json:"read_blocks"`
	ReadHitRate  float64          `json:"read_hit_rate"`
	UnreadBlocks map[string]int64 `json:"unread_blocks,omitempty"`
	// BytesFetched is what the hit prefixes read; BytesRemote the part of
	// it that crossed between nodes; BytesStored what the puts added.
	BytesFetched int64 `json:"bytes_fetched"`
	BytesRemote  int64 `json:"bytes_between_nodes"`
	BytesStored  int64 `json:"bytes_stored"`
	// FailedPuts counts puts that failed, other than for room;
	// RefusedPuts those refused for room (NO_SPACE: a chain larger than
	// the room keeps its head); OrphanPuts the blocks stored after a block
	// of the same request that was not (a gap no lookup passes).
	FailedPuts  int64 `json:"failed_puts"`
	RefusedPuts int64 `json:"refused_puts"`
	OrphanPuts  int64 `json:"orphan_puts"`
	// ChainsCut counts, with Config.CheckChains, the requests whose hit
	// blocks and stored head were not all present right after their puts.
	ChainsCut int64        `json:"chains_cut"`
	Seconds   float64      `json:"seconds"`
	Nodes     []NodeResult `json:"nodes"`
}

// tally adds one request's put outcomes to res and returns its head: how
// many leading keys are stored or present.
func tally(res *Result, outs []PutOutcome, blockBytes int64) (head int) {
	head = -1
	for j, o := range outs {
		switch o {
		case PutStored:
			res.BytesStored += blockBytes
			if head >= 0 {
				res.OrphanPuts++
			}
		case PutPresent:
		case PutRefused:
			res.RefusedPuts++
		default:
			res.FailedPuts++
		}
		if o != PutStored && o != PutPresent && head < 0 {
			head = j
		}
	}
	if head < 0 {
		head = len(outs)
	}
	return head
}

func rate(hit, all int64) float64 {
	if all == 0 {
		return 0
	}
	return float64(hit) / float64(all)
}

// ChainKeys returns the chained keys of ids, appending to buf.
func ChainKeys(key KeyFunc, ids []uint64, buf [][]byte) [][]byte {
	buf = buf[:0]
	var parent []byte
	for _, id := range ids {
		k := key(parent, id)
		buf = append(buf, k)
		parent = k
	}
	return buf
}

// Run replays reqs against nodes and returns the measured hit rates. Any
// call error ends the replay (failed puts of single blocks are counted, not
// fatal); the partial result is returned with it.
func Run(ctx context.Context, cfg Config, reqs []trace.Request, nodes []Node) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	if len(nodes) == 0 {
		return Result{}, fmt.Errorf("%w: no nodes", ErrInvalidConfig)
	}
	res := Result{Nodes: make([]NodeResult, len(nodes))}
	value := make([]byte, cfg.BlockBytes)
	for i := range value {
		value[i] = byte(i*131 + 7)
	}
	var keys [][]byte
	var outs []PutOutcome
	matched := make([]int, len(nodes))
	start := time.Now()
	finish := func(err error) (Result, error) {
		res.Seconds = time.Since(start).Seconds()
		res.HitRate = rate(res.HitBlocks, res.Blocks)
		res.ReadHitRate = rate(res.ReadBlocks, res.Blocks)
		for i := range res.Nodes {
			res.Nodes[i].HitRate = rate(res.Nodes[i].HitBlocks, res.Nodes[i].Blocks)
		}
		return res, err
	}
	for i, r := range reqs {
		if err := ctx.Err(); err != nil {
			return finish(err)
		}
		if cfg.Speed > 0 {
			at := start.Add(time.Duration(float64(r.Timestamp) * float64(time.Millisecond) / cfg.Speed))
			if d := time.Until(at); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-ctx.Done():
					t.Stop()
					return finish(ctx.Err())
				case <-t.C:
				}
			}
		}
		keys = ChainKeys(cfg.Key, r.HashIDs, keys)
		at := i % len(nodes)
		var hit int
		if len(keys) > 0 {
			if cfg.Route == RoutePrefix && len(nodes) > 1 {
				// Longest prefix among the nodes within the load band; a node
				// below the band (a cold one) is served first.
				mean := float64(res.Requests) / float64(len(nodes))
				hiLoad, loLoad := mean*(1+cfg.LoadSlack)+1, mean*(1-cfg.LoadSlack)-1
				best, bestCold := -1, -1
				for j := range nodes {
					n := (at + j) % len(nodes)
					m, err := nodes[n].Lookup(ctx, keys)
					if err != nil {
						return finish(fmt.Errorf("replay: request %d: lookup on node %d: %w", i, n, err))
					}
					matched[n] = m
					load := float64(res.Nodes[n].Requests)
					if load < loLoad && (bestCold < 0 || m > matched[bestCold]) {
						bestCold = n
					}
					if load <= hiLoad && (best < 0 || m > matched[best]) {
						best = n
					}
				}
				if bestCold >= 0 {
					best = bestCold
				}
				if best < 0 {
					best = at
				}
				at, hit = best, matched[best]
			} else {
				m, err := nodes[at].Lookup(ctx, keys)
				if err != nil {
					return finish(fmt.Errorf("replay: request %d: lookup on node %d: %w", i, at, err))
				}
				hit = m
			}
		}
		nr := &res.Nodes[at]
		nr.Requests++
		nr.Blocks += int64(len(keys))
		nr.HitBlocks += int64(hit)
		res.Requests++
		res.Blocks += int64(len(keys))
		res.HitBlocks += int64(hit)
		if hit > 0 && !cfg.NoFetch {
			f, err := nodes[at].Fetch(ctx, keys[:hit])
			if err != nil {
				return finish(fmt.Errorf("replay: request %d: fetch on node %d: %w", i, at, err))
			}
			res.ReadBlocks += f.Blocks
			res.BytesFetched += f.Bytes
			res.BytesRemote += f.Remote
			for code, n := range f.Unread {
				if res.UnreadBlocks == nil {
					res.UnreadBlocks = map[string]int64{}
				}
				res.UnreadBlocks[code] += n
			}
		}
		if hit < len(keys) {
			outs = slices.Grow(outs[:0], len(keys)-hit)[:len(keys)-hit]
			if err := nodes[at].Store(ctx, keys[hit:], hit, value, outs); err != nil {
				return finish(fmt.Errorf("replay: request %d: store on node %d: %w", i, at, err))
			}
			head := tally(&res, outs, int64(len(value)))
			if cfg.CheckChains {
				m, err := nodes[at].Lookup(ctx, keys)
				if err != nil {
					return finish(fmt.Errorf("replay: request %d: lookup after the puts on node %d: %w", i, at, err))
				}
				if m < hit+head {
					res.ChainsCut++
				}
			}
		}
		if cfg.Progress != nil {
			cfg.Progress(i+1, len(reqs))
		}
	}
	return finish(nil)
}
