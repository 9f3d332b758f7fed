// Package clusterview adapts cluster membership (cluster.Cluster) to the
// proxy's view of the cluster (proxy.Cluster): it places keys on a
// cluster.Ring over the live members, rebuilt on every membership change,
// and keeps the previous ring for a grace period so that a new owner fills
// lazily (a miss asks the previous owner; DESIGN.md §6).
//
// A node that joins a cluster has no previous ring of its own (it held
// nothing), yet the blocks it now owns are held by their owners before its
// join. For its first JoinSettle after Start it therefore keeps a join
// ring: the ring over the live members other than itself, the placement
// the cluster used before it joined, rebuilt with every change in that
// window (gossip brings the members in over a few events); Owners lists
// its owners after the current and previous owners for Grace.
//
// Previous and join owners that gossip holds failed or left are not
// listed: a read does not wait on a node known to be gone.
//
// Owner key: a block (ns, key) is placed by the ring key ns + "\x00" + key,
// so that one key in two namespaces may land on different nodes and every
// node computes the same placement from the same member names.
package clusterview

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cluster"
	"github.com/tidepool-kv/tidepool/internal/clock"
	"github.com/tidepool-kv/tidepool/proxy"
)

// ErrClosed is returned by Start after Close.
var ErrClosed = errors.New("clusterview: closed")

// Config configures a View.
type Config struct {
	// Ring places keys; Ring.Replicas is R, the number of owners of a block.
	// Zero fields: cluster.DefaultRingConfig()'s (R = 1).
	Ring cluster.RingConfig
	// Grace is how long the ring before a membership change keeps answering
	// Owners after the current owners (the lazy fill). Default 2 min; 0 in a
	// Config passed to New takes the default, a negative value disables it.
	Grace time.Duration
	// Resync is how often the view re-reads the member table even without an
	// event (a safety net for dropped events). Default 1 s.
	Resync time.Duration
	// JoinSettle is how long after Start the view treats membership
	// changes as its own join settling: the join ring (the members other
	// than this node) is rebuilt with them and answers Owners for Grace
	// after the last such rebuild. Default 3 s; negative: no join ring.
	JoinSettle time.Duration
	// Clock times the grace period. Default clock.Real.
	Clock clock.Clock
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{Ring: cluster.DefaultRingConfig(), Grace: 2 * time.Minute, Resync: time.Second, JoinSettle: 3 * time.Second, Clock: clock.Real{}}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	c.Ring = c.Ring.WithDefaults() // per field (cluster's defaults)
	if c.Grace == 0 {
		c.Grace = d.Grace
	}
	if c.Resync == 0 {
		c.Resync = d.Resync
	}
	if c.JoinSettle == 0 {
		c.JoinSettle = d.JoinSettle
	}
	if c.Clock == nil {
		c.Clock = d.Clock
	}
	return c
}

// Validate reports every problem with c (after defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if err := c.Ring.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Resync < 0 {
		errs = append(errs, fmt.Errorf("clusterview: Resync %v is negative", c.Resync))
	}
	return errors.Join(errs...)
}

// Stats is a snapshot of the view's counters.
type Stats struct {
	Members    int       // live members in the current ring
	Rebuilds   uint64    // rings built after a membership change
	Events     uint64    // membership events seen
	Gaps       uint64    // event sequence gaps (missed events)
	GraceUntil time.Time // when the previous ring stops answering (zero: none)
	JoinRing   int       // members of the join ring (0: none answering)
	JoinUntil  time.Time // when the join ring stops answering (zero: none)
}

// View implements proxy.Cluster over a cluster.Cluster. Safe for
// concurrent use.
type View struct {
	c   *cluster.Cluster
	cfg Config
	lg  *zap.Logger

	// pl is what the read path (Owners) reads: an immutable snapshot,
	// replaced whole by rebuild. A read loads one pointer and takes no
	// lock, so a rebuild (tens of milliseconds at 1,000 members) never
	// stalls or delays a read.
	pl atomic.Pointer[placement]

	// rebuildMu serialises rebuilds (New, Start, the loop); mu guards the
	// fields below it. Lock order: rebuildMu, then mu.
	rebuildMu sync.Mutex
	mu        sync.RWMutex
	settleEnd time.Time // end of the join window (zero: not started)
	rebuilds  uint64
	events    uint64
	gaps      uint64
	closed    bool

	startOnce sync.Once
	closeOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
}

// placement is one immutable state of the view's rings.
type placement struct {
	self       string
	cur        *cluster.Ring
	prev       *cluster.Ring // answers after cur until graceUntil
	graceUntil time.Time
	join       *cluster.Ring // the members other than self while joining
	joinUntil  time.Time     // join answers Owners until then
	up         map[string]bool
}

var _ proxy.Cluster = (*View)(nil)

// New makes a view over c and builds the first ring from c's members now
// (c may not be started yet: the ring then holds this node alone).
func New(c *cluster.Cluster, cfg Config, lg *zap.Logger) (*View, error) {
	if c == nil {
		return nil, errors.New("clusterview: nil cluster")
	}
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("clusterview: invalid config: %w", err)
	}
	if lg == nil {
		lg = zap.NewNop()
	}
	v := &View{c: c, cfg: cfg, lg: lg, stop: make(chan struct{}), done: make(chan struct{})}
	if err := v.rebuild(); err != nil {
		return nil, err
	}
	return v, nil
}

// Start follows membership events in the background until Close. Call it
// after the cluster started.
func (v *View) Start(ctx context.Context) error {
	v.mu.RLock()
	closed := v.closed
	v.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	started := false
	v.startOnce.Do(func() {
		started = true
		events, cancel := v.c.Subscribe()
		if v.cfg.JoinSettle > 0 {
			v.mu.Lock()
			v.settleEnd = v.cfg.Clock.Now().Add(v.cfg.JoinSettle)
			v.mu.Unlock()
		}
		if err := v.rebuild(); err != nil {
			v.lg.Warn("ring rebuild failed", zap.Error(err))
		}
		go v.loop(events, cancel)
	})
	if !started {
		return errors.New("clusterview: already started")
	}
	return nil
}

func (v *View) loop(events <-chan cluster.Event, cancel func()) {
	defer close(v.done)
	defer cancel()
	var t *time.Ticker
	var tick <-chan time.Time
	if v.cfg.Resync > 0 {
		t = time.NewTicker(v.cfg.Resync)
		defer t.Stop()
		tick = t.C
	}
	var last uint64
	for {
		select {
		case <-v.stop:
			return
		case ev, ok := <-events:
			if !ok {
				return // the cluster closed
			}
			// A burst of changes (pods rolling, a partition healing)
			// makes one rebuild: take every event already queued
			// first. A rebuild reads the whole member table, so it
			// sees all of them; at 1,000 members one costs tens of
			// milliseconds of CPU (docs/scale.md).
			n, gaps, open := drain(ev, events, &last)
			v.mu.Lock()
			v.events += n
			v.gaps += gaps
			v.mu.Unlock()
			if !open {
				return
			}
			if err := v.rebuild(); err != nil {
				v.lg.Warn("ring rebuild failed", zap.Error(err))
			}
		case <-tick:
			if err := v.rebuild(); err != nil {
				v.lg.Warn("ring rebuild failed", zap.Error(err))
			}
		}
	}
}

// drain counts ev and every event already queued on events behind it
// (without waiting), and the sequence gaps among them after *last; it
// reports whether events is still open.
func drain(ev cluster.Event, events <-chan cluster.Event, last *uint64) (n, gaps uint64, open bool) {
	for {
		n++
		if *last != 0 && ev.Seq != *last+1 {
			gaps++
		}
		*last = ev.Seq
		select {
		case next, ok := <-events:
			if !ok {
				return n, gaps, false
			}
			ev = next
		default:
			return n, gaps, true
		}
	}
}

// Close stops following events. Safe to call twice.
func (v *View) Close() error {
	v.closeOnce.Do(func() {
		v.mu.Lock()
		v.closed = true
		v.mu.Unlock()
		close(v.stop)
		started := true
		v.startOnce.Do(func() { started = false })
		if started {
			<-v.done
		}
	})
	return nil
}

// rebuild places keys on the current live members when they changed; the
// ring it replaces answers as the previous owners for Grace. Within the
// join window it rebuilds the join ring too. The rings are built before
// the new placement is published with one atomic store: reads go on
// against the old one meanwhile.
func (v *View) rebuild() error {
	v.rebuildMu.Lock()
	defer v.rebuildMu.Unlock()
	ms := v.c.Members()
	names := cluster.LiveNames(ms)
	self := ""
	up := make(map[string]bool, len(ms))
	for _, m := range ms {
		if m.Local {
			self = m.Name
		}
		if m.State.Live() || m.State == cluster.StateLeaving {
			up[m.Name] = true
		}
	}
	if self == "" {
		self = v.c.LocalMeta().NodeID
	}
	if len(names) == 0 {
		names = []string{self} // not started yet: this node alone
	}
	others := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == self })
	v.mu.RLock()
	settleEnd := v.settleEnd
	v.mu.RUnlock()
	old := v.pl.Load()
	if old == nil {
		old = &placement{}
	}
	now := v.cfg.Clock.Now()
	same := old.cur != nil && slices.Equal(old.cur.Members(), names) && old.self == self
	settling := v.cfg.Grace > 0 && now.Before(settleEnd) && len(others) > 0 &&
		(old.join == nil || !slices.Equal(old.join.Members(), others))
	next := *old
	next.up = up // who may answer changes without a ring change (leaving)
	if same && !settling {
		v.pl.Store(&next)
		return nil
	}
	if settling {
		join, err := cluster.NewRing(others, v.cfg.Ring)
		if err != nil {
			return fmt.Errorf("clusterview: join ring over %d members: %w", len(others), err)
		}
		next.join, next.joinUntil = join, now.Add(v.cfg.Grace)
		v.lg.Info("join ring built", zap.Int("members", len(others)))
	}
	if !same {
		r, err := cluster.NewRing(names, v.cfg.Ring)
		if err != nil {
			return fmt.Errorf("clusterview: ring over %d members: %w", len(names), err)
		}
		next.self = self
		if old.cur != nil && v.cfg.Grace > 0 {
			next.prev, next.graceUntil = old.cur, now.Add(v.cfg.Grace)
		}
		next.cur = r
		added, removed := diffSorted(old.cur, names)
		v.lg.Info("ring rebuilt", zap.Int("members", len(names)), zap.Strings("added", added), zap.Strings("removed", removed))
	}
	if h := testHookBeforeSwap.Load(); h != nil && !same {
		(*h)()
	}
	v.pl.Store(&next)
	if !same {
		v.mu.Lock()
		v.rebuilds++
		v.mu.Unlock()
	}
	return nil
}

// testHookBeforeSwap, when set (tests only), runs after a rebuild built
// a new ring and before it is published.
var testHookBeforeSwap atomic.Pointer[func()]

// diffSorted returns the names in names and not in old's members, and
// those in old's and not in names, at most 16 of each (a log line, not a
// list of a thousand members).
func diffSorted(old *cluster.Ring, names []string) (added, removed []string) {
	const most = 16
	var prev []string
	if old != nil {
		prev = old.Members()
	}
	i, j := 0, 0
	for i < len(prev) || j < len(names) {
		switch {
		case j == len(names) || i < len(prev) && prev[i] < names[j]:
			if len(removed) < most {
				removed = append(removed, prev[i])
			}
			i++
		case i == len(prev) || names[j] < prev[i]:
			if len(added) < most {
				added = append(added, names[j])
			}
			j++
		default:
			i++
			j++
		}
	}
	return added, removed
}

// ownerKey is the ring key of (ns, key).
func ownerKey(ns string, key []byte) []byte {
	return appendOwnerKey(make([]byte, 0, len(ns)+1+len(key)), ns, key)
}

// appendOwnerKey appends ownerKey(ns, key) to dst.
func appendOwnerKey(dst []byte, ns string, key []byte) []byte {
	dst = append(dst, ns...)
	dst = append(dst, 0)
	return append(dst, key...)
}

// Self is this node's name.
func (v *View) Self() string { return v.pl.Load().self }

// Replicas is R.
func (v *View) Replicas() int { return v.cfg.Ring.Replicas }

// Owners returns the R owners of (ns, key) under the current ring, then,
// during the grace period after a change, the owners under the previous
// ring, and while joining, the owners under the join ring, that are not
// already listed and that gossip does not hold failed or left.
func (v *View) Owners(ns string, key []byte) []string {
	var buf [256]byte // the ring key on the stack for the usual key sizes
	k := appendOwnerKey(buf[:0], ns, key)
	p := v.pl.Load()
	cur, prev, until, join, joinUntil, up := p.cur, p.prev, p.graceUntil, p.join, p.joinUntil, p.up
	r := v.cfg.Ring.Replicas
	out := cur.AppendOwners(make([]string, 0, 3*r), k, r)
	if prev == nil && join == nil {
		return out
	}
	now := v.cfg.Clock.Now()
	for _, old := range [...]struct {
		ring  *cluster.Ring
		until time.Time
	}{{prev, until}, {join, joinUntil}} {
		if old.ring == nil || !now.Before(old.until) {
			continue
		}
		// Appended past the current owners, then kept where new and up.
		n := len(out)
		out = old.ring.AppendOwners(out, k, r)
		keep := n
		for _, m := range out[n:] {
			if up[m] && !slices.Contains(out[:keep], m) {
				out[keep] = m
				keep++
			}
		}
		out = out[:keep]
	}
	return out
}

// Members lists every member this node knows, sorted by name.
func (v *View) Members() []proxy.MemberInfo {
	ms := v.c.Members()
	out := make([]proxy.MemberInfo, len(ms))
	for i, m := range ms {
		out[i] = proxy.MemberInfo{
			Name: m.Name, State: m.State.String(), GossipAddr: m.Addr,
			PeerAddr: m.Meta.PeerAddr, Zone: m.Meta.Zone, Self: m.Local,
		}
	}
	return out
}

// Resolve returns node's metadata (peer API and transfer addresses), if
// the cluster knows the node.
func (v *View) Resolve(node string) (cluster.Meta, bool) {
	m, ok := v.c.Member(node)
	if !ok {
		return cluster.Meta{}, false
	}
	return m.Meta, true
}

// Addrs returns node's peer API and transfer addresses: the shape of
// peerapi.ClientConfig.Resolve. A node that is known but has left or
// failed still resolves (its addresses may still answer for a while).
func (v *View) Addrs(node string) (peerAddr, transferAddr string, ok bool) {
	m, ok := v.Resolve(node)
	if !ok || m.PeerAddr == "" {
		return "", "", false
	}
	return m.PeerAddr, m.TransferAddr, true
}

// Stats returns a snapshot of the counters.
func (v *View) Stats() Stats {
	p := v.pl.Load()
	v.mu.RLock()
	s := Stats{Members: p.cur.Len(), Rebuilds: v.rebuilds, Events: v.events, Gaps: v.gaps}
	v.mu.RUnlock()
	now := v.cfg.Clock.Now()
	if p.prev != nil && now.Before(p.graceUntil) {
		s.GraceUntil = p.graceUntil
	}
	if p.join != nil && now.Before(p.joinUntil) {
		s.JoinRing, s.JoinUntil = p.join.Len(), p.joinUntil
	}
	return s
}
