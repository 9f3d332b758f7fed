package proxy

// The rebalancer (DESIGN.md §6): after a membership change, new owners
// fill lazily (a miss asks the previous owner) and, besides, each node
// pushes the hot blocks it holds as an owner to their new owners, at a
// bounded rate, in the background.
//
// Which blocks: the blocks of the DRAM tier (the eviction policy's verdict
// on what is read: cold blocks were demoted to SSD or evicted) that are not
// low-priority copies, whose owner set changed (Cluster.Owners lists
// previous owners after the current ones) and that this node owns or
// owned. Hottest first: by chain depth, shallowest first (in a prefix
// cache a block at depth d is read by every request that reads a deeper
// block of its chain, so reads never grow along a chain), up to
// RebalanceMaxBytes per pass. Each new owner is asked first (one Lookup per
// batch) and only the blocks it lacks are pushed, through the push path
// (Peers.Push, checksummed), paced to RebalanceRate bytes per second. A
// block this node no longer owns is then demoted to a low-priority copy.
//
// Blocks owed to their owners (owed.go: a put's push or a move that
// failed) are planned too, whatever their priority and whether or not
// their owner set changed, to their current owners other than this node.
//
// A pass starts RebalanceDelay after the last MembershipChanged; a newer
// change cancels a running pass and starts over, and DetachCluster cancels
// it. While an owed block has a current owner other than this node, a
// retry pass starts max(RebalanceDelay, PeerDownFor) after a push failed
// or a pass ended, backing off to maxRetryEvery while retries move
// nothing. Passes never hold a lock Gets or Puts take, beyond the store's
// own.

import (
	"context"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
)

// RebalanceStats is the rebalancer's progress. Planned, moved, skipped and
// failed count (block, new owner) moves, over every pass.
type RebalanceStats struct {
	Passes        int64 // passes started
	Cancelled     int64 // passes cut short by a newer change or DetachCluster
	Running       bool  // a pass is running now
	PlannedBlocks int64 // moves planned
	PlannedBytes  int64
	MovedBlocks   int64 // blocks pushed to a new owner
	MovedBytes    int64
	Skipped       int64 // the new owner had the block, or it left this node meanwhile
	Failed        int64 // pushes or lookups that failed
	Demoted       int64 // blocks no longer owned here, now low-priority copies
	Owed          int64 // blocks whose push to an owner failed, to push again (now)
	OwedDropped   int64 // owed blocks given up: owed for owedFor, or past maxOwed
}

// rebalanceBatch is how many planned moves share one Lookup per new owner.
const rebalanceBatch = 64

type rebalancer struct {
	r     *router
	scan  Scanner
	kick  chan struct{} // a membership change
	owedC chan struct{} // a block became owed: arm the retry timer
	owed  owedSet

	passes, cancelled, running                        atomic.Int64
	plannedBlocks, plannedBytes, movedBlocks, movedBy atomic.Int64
	skipped, failed, demoted                          atomic.Int64
}

// startRebalancer starts the rebalancer loop when configured and the proxy
// can enumerate the store's DRAM blocks (sc, Deps.Scan).
func (r *router) startRebalancer(sc Scanner) {
	if r.cfg.RebalanceRate <= 0 {
		return
	}
	if sc == nil {
		r.lg.Info("rebalancer off: the store cannot enumerate its blocks")
		return
	}
	r.rebal = &rebalancer{r: r, scan: sc, kick: make(chan struct{}, 1), owedC: make(chan struct{}, 1)}
	r.workers.Add(1)
	go r.rebal.loop()
}

// MembershipChanged tells the proxy that the cluster's membership changed
// (serve wires it to cluster.OnMembershipChange, which calls it on every
// join, leave and failure): a rebalance pass starts RebalanceDelay after the last call,
// cancelling a running one. It never blocks. No-op on a single node or
// with the rebalancer off.
func (p *Proxy) MembershipChanged() {
	if r := p.router(); r != nil && r.rebal != nil {
		select {
		case r.rebal.kick <- struct{}{}:
		default: // one is pending already
		}
	}
}

// owe records that the push of items of ns to an owner failed: the
// rebalancer pushes them again (owed.go). No-op with the rebalancer off.
func (r *router) owe(ns string, items []PutItem) {
	b := r.rebal
	if b == nil || len(items) == 0 {
		return
	}
	keys := make([][]byte, len(items))
	for i, it := range items {
		keys[i] = it.Key
	}
	if b.owed.add(r.cfg.Clock.Now(), ns, keys) {
		select {
		case b.owedC <- struct{}{}:
		default: // one is pending already
		}
	}
}

// owedDue reports whether an owed block has a current owner other than
// this node to push it to.
func (b *rebalancer) owedDue() bool {
	c := b.r.c
	return b.owed.due(b.r.cfg.Clock.Now(), c.Self(), max(c.Replicas(), 1), c.Owners)
}

func (b *rebalancer) loop() {
	defer b.r.workers.Done()
	base := max(b.r.cfg.RebalanceDelay, b.r.cfg.PeerDownFor)
	every := base // the retry back-off
	retry := time.NewTimer(every)
	retry.Stop()
	defer retry.Stop()
	armed := false
	arm := func() {
		if !armed {
			retry.Reset(every)
			armed = true
		}
	}
	for {
		retrying := false
		select {
		case <-b.r.stop:
			return
		case <-b.owedC:
			arm()
			continue
		case <-retry.C:
			armed = false
			if !b.owedDue() {
				continue // the owners are out of the ring: their return is a change
			}
			retrying = true
		case <-b.kick:
			// Wait until changes stop for RebalanceDelay.
			t := time.NewTimer(b.r.cfg.RebalanceDelay)
		settle:
			for {
				select {
				case <-b.r.stop:
					t.Stop()
					return
				case <-b.kick:
					t.Reset(b.r.cfg.RebalanceDelay)
				case <-t.C:
					break settle
				}
			}
			every = base
		}
		moved := b.movedBlocks.Load()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		b.passes.Add(1)
		b.running.Store(1)
		go func() {
			defer close(done)
			b.pass(ctx)
		}()
		select {
		case <-done:
		case <-b.kick:
			cancel()
			<-done
			b.cancelled.Add(1)
			select { // start over after the delay
			case b.kick <- struct{}{}:
			default:
			}
		case <-b.r.stop:
			cancel()
			<-done
			b.cancelled.Add(1)
			b.running.Store(0)
			return
		}
		cancel()
		b.running.Store(0)
		if b.owedDue() {
			switch {
			case b.movedBlocks.Load() > moved:
				every = base
			case retrying:
				every = min(2*every, maxRetryEvery)
			}
			arm()
		}
	}
}

// move is one planned push: a block and the new owners to ask.
type move struct {
	ns      string
	key     []byte
	size    int64
	depth   int32
	targets []string
	demote  bool // this node no longer owns it
	owed    bool // its push to an owner failed before
}

// plan scans the DRAM tier for the blocks to move, hottest first, within
// RebalanceMaxBytes.
func (b *rebalancer) plan(ctx context.Context) []move {
	c := b.r.c
	self, rep := c.Self(), max(c.Replicas(), 1)
	owed := b.owed.keys(b.r.cfg.Clock.Now())
	var seen map[string]bool // owed blocks still held here
	var moves []move
	b.scan.Scan(func(ref cache.BlockRef) bool {
		if ctx.Err() != nil {
			return false
		}
		owners := c.Owners(ref.Namespace, ref.Key)
		isOwed := false
		if len(owed) > 0 {
			if k := owedKey(ref.Namespace, ref.Key); owed[k] {
				isOwed = true
				if seen == nil {
					seen = map[string]bool{}
				}
				seen[k] = true
			}
		}
		switch {
		case isOwed: // to its current owners, whatever changed
		case ref.LowPriority:
			return true // a copy: its owner moves it
		case len(owners) <= rep || !slices.Contains(owners, self):
			return true // owner set unchanged, or never ours
		}
		cur := owners[:min(rep, len(owners))]
		m := move{ns: ref.Namespace, key: ref.Key, size: ref.Size, depth: ref.Depth,
			demote: !ref.LowPriority && !slices.Contains(cur, self), owed: isOwed}
		for _, n := range cur {
			if n != self {
				m.targets = append(m.targets, n)
			}
		}
		if len(m.targets) > 0 {
			moves = append(moves, m)
		}
		return true
	})
	if ctx.Err() == nil { // owed blocks no longer held here: nothing to push
		var gone []string
		for k := range owed {
			if !seen[k] {
				gone = append(gone, k)
			}
		}
		b.owed.settle(gone)
	}
	sort.SliceStable(moves, func(i, j int) bool { return moves[i].depth < moves[j].depth })
	if max := b.r.cfg.RebalanceMaxBytes; max > 0 {
		var sum int64
		for i, m := range moves {
			if sum += m.size * int64(len(m.targets)); sum > max {
				moves = moves[:i]
				break
			}
		}
	}
	for _, m := range moves {
		b.plannedBlocks.Add(int64(len(m.targets)))
		b.plannedBytes.Add(m.size * int64(len(m.targets)))
	}
	return moves
}

// description is a block's description for its new owners (nil: none
// known).
func (r *router) description(ns string, key []byte) *cache.BlockMeta {
	if r.notes == nil {
		return nil
	}
	return r.notes.Description(ns, key)
}

// pass plans and moves, until done or ctx ends.
func (b *rebalancer) pass(ctx context.Context) {
	moves := b.plan(ctx)
	if len(moves) == 0 {
		return
	}
	b.r.lg.Info("rebalance pass", zap.Int("blocks", len(moves)))
	pace := pacer{rate: b.r.cfg.RebalanceRate, start: time.Now()}
	var buf []byte
	for start := 0; start < len(moves) && ctx.Err() == nil; start += rebalanceBatch {
		batch := moves[start:min(start+rebalanceBatch, len(moves))]
		has := b.lookup(ctx, batch)
		for i, m := range batch {
			pushed, failed := false, false
			for _, node := range m.targets {
				if ctx.Err() != nil {
					return
				}
				if has[i][node] {
					b.skipped.Add(1)
					pushed = true
					continue
				}
				v, info, err := b.r.store.Get(ctx, m.ns, m.key, buf)
				if err != nil {
					b.skipped.Add(1) // evicted or deleted meanwhile: nothing to owe
					continue
				}
				buf = v[:0]
				if !pace.wait(ctx, int64(len(v))) {
					return
				}
				pctx, cancel := context.WithTimeout(ctx, b.r.cfg.FetchTimeout)
				err = b.r.pushNow(pctx, ctx, node, m.ns, []PutItem{{Key: m.key, Value: v,
					Opts: cache.PutOptions{Depth: info.Depth, Checksum: info.Checksum, HasChecksum: true,
						Meta: b.r.description(m.ns, m.key)}}})
				cancel()
				if err != nil {
					b.failed.Add(1) // owed now (pushNow), pushed again later
					failed = true
					continue
				}
				pushed = true
				b.movedBlocks.Add(1)
				b.movedBy.Add(int64(len(v)))
			}
			if m.owed && !failed && ctx.Err() == nil {
				b.owed.settle([]string{owedKey(m.ns, m.key)})
			}
			if pushed && m.demote && ctx.Err() == nil {
				if err := demote(ctx, b.r.store, m.ns, m.key); err == nil {
					b.demoted.Add(1)
				}
			}
		}
	}
}

// lookup asks each new owner of the batch which blocks it holds already:
// has[i][node]. A failed lookup counts as "holds none".
func (b *rebalancer) lookup(ctx context.Context, batch []move) []map[string]bool {
	has := make([]map[string]bool, len(batch))
	type nsNode struct{ ns, node string }
	groups := map[nsNode][]int{}
	for i, m := range batch {
		has[i] = map[string]bool{}
		for _, n := range m.targets {
			g := nsNode{m.ns, n}
			groups[g] = append(groups[g], i)
		}
	}
	for g, idx := range groups {
		keys := make([][]byte, len(idx))
		for j, i := range idx {
			keys[j] = batch[i].key
		}
		lctx, cancel := context.WithTimeout(ctx, b.r.cfg.FetchTimeout)
		res, err := b.r.lookup.Lookup(lctx, g.node, g.ns, keys)
		cancel()
		if err != nil || len(res) != len(keys) {
			b.r.lg.Debug("rebalance lookup failed", zap.String("node", g.node), zap.Error(err))
			continue
		}
		for j, i := range idx {
			has[i][g.node] = res[j]
		}
	}
	return has
}

func (b *rebalancer) stats() RebalanceStats {
	if b == nil {
		return RebalanceStats{}
	}
	return RebalanceStats{
		Passes: b.passes.Load(), Cancelled: b.cancelled.Load(), Running: b.running.Load() == 1,
		PlannedBlocks: b.plannedBlocks.Load(), PlannedBytes: b.plannedBytes.Load(),
		MovedBlocks: b.movedBlocks.Load(), MovedBytes: b.movedBy.Load(),
		Skipped: b.skipped.Load(), Failed: b.failed.Load(), Demoted: b.demoted.Load(),
		Owed: int64(b.owed.len()), OwedDropped: b.owed.dropped.Load(),
	}
}

// pacer keeps a pass at or under rate bytes per second since it started:
// by time t it has let through at most rate·t bytes plus one block.
type pacer struct {
	rate  int64
	start time.Time
	sent  int64
}

// wait returns when n more bytes may go, or false when ctx ends first.
func (p *pacer) wait(ctx context.Context, n int64) bool {
	due := p.start.Add(time.Duration(float64(p.sent) / float64(p.rate) * float64(time.Second)))
	p.sent += n
	d := time.Until(due)
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
