// Package clusterview adapts cluster membership (cluster.Cluster) to the
// proxy's view of the cluster (proxy.Cluster): it places keys on a
// cluster.Ring over the live members, rebuilt on every membership change,
// and keeps the previous ring for a grace period so that a new owner fills
// lazily (a miss asks the previous owner; DESIGN.md §6).
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
	// Default cluster.DefaultRingConfig() (R = 1).
	Ring cluster.RingConfig
	// Grace is how long the ring before a membership change keeps answering
	// Owners after the current owners (the lazy fill). Default 2 min; 0 in a
	// Config passed to New takes the default, a negative value disables it.
	Grace time.Duration
	// Resync is how often the view re-reads the member table even without an
	// event (a safety net for dropped events). Default 1 s.
	Resync time.Duration
	// Clock times the grace period. Default clock.Real.
	Clock clock.Clock
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{Ring: cluster.DefaultRingConfig(), Grace: 2 * time.Minute, Resync: time.Second, Clock: clock.Real{}}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Ring == (cluster.RingConfig{}) {
		c.Ring = d.Ring
	}
	if c.Grace == 0 {
		c.Grace = d.Grace
	}
	if c.Resync == 0 {
		c.Resync = d.Resync
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
}

// View implements proxy.Cluster over a cluster.Cluster. Safe for
// concurrent use.
type View struct {
	c   *cluster.Cluster
	cfg Config
	lg  *zap.Logger

	mu         sync.RWMutex
	self       string
	cur        *cluster.Ring
	prev       *cluster.Ring
	graceUntil time.Time
	rebuilds   uint64
	events     uint64
	gaps       uint64

	startOnce sync.Once
	closeOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
	closed    bool
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
			v.mu.Lock()
			v.events++
			if last != 0 && ev.Seq != last+1 {
				v.gaps++
			}
			v.mu.Unlock()
			last = ev.Seq
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
// ring it replaces answers as the previous owners for Grace.
func (v *View) rebuild() error {
	ms := v.c.Members()
	names := cluster.LiveNames(ms)
	self := ""
	for _, m := range ms {
		if m.Local {
			self = m.Name
		}
	}
	if self == "" {
		self = v.c.LocalMeta().NodeID
	}
	if len(names) == 0 {
		names = []string{self} // not started yet: this node alone
	}
	v.mu.RLock()
	same := v.cur != nil && slices.Equal(v.cur.Members(), names) && v.self == self
	v.mu.RUnlock()
	if same {
		return nil
	}
	r, err := cluster.NewRing(names, v.cfg.Ring)
	if err != nil {
		return fmt.Errorf("clusterview: ring over %d members: %w", len(names), err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.self = self
	if v.cur != nil && v.cfg.Grace > 0 {
		v.prev, v.graceUntil = v.cur, v.cfg.Clock.Now().Add(v.cfg.Grace)
	}
	v.cur = r
	v.rebuilds++
	v.lg.Info("ring rebuilt", zap.Int("members", len(names)), zap.Strings("names", names))
	return nil
}

// ownerKey is the ring key of (ns, key).
func ownerKey(ns string, key []byte) []byte {
	k := make([]byte, 0, len(ns)+1+len(key))
	k = append(k, ns...)
	k = append(k, 0)
	return append(k, key...)
}

// Self is this node's name.
func (v *View) Self() string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.self
}

// Replicas is R.
func (v *View) Replicas() int { return v.cfg.Ring.Replicas }

// Owners returns the R owners of (ns, key) under the current ring, then,
// during the grace period after a change, the owners under the previous
// ring that are not already listed.
func (v *View) Owners(ns string, key []byte) []string {
	k := ownerKey(ns, key)
	v.mu.RLock()
	cur, prev, until := v.cur, v.prev, v.graceUntil
	v.mu.RUnlock()
	r := v.cfg.Ring.Replicas
	out := cur.AppendOwners(make([]string, 0, 2*r), k, r)
	if prev != nil && v.cfg.Clock.Now().Before(until) {
		for _, n := range prev.AppendOwners(nil, k, r) {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
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
	v.mu.RLock()
	defer v.mu.RUnlock()
	s := Stats{Members: v.cur.Len(), Rebuilds: v.rebuilds, Events: v.events, Gaps: v.gaps}
	if v.prev != nil && v.cfg.Clock.Now().Before(v.graceUntil) {
		s.GraceUntil = v.graceUntil
	}
	return s
}
