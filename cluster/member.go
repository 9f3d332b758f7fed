package cluster

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"
)

// State is a member's state as this node sees it.
type State uint8

// States.
const (
	// StateAlive: a member in good standing.
	StateAlive State = iota + 1
	// StateSuspect: reserved. memberlist v0.7.0 has no suspicion event, so
	// a suspected member reads as alive until it is declared failed.
	StateSuspect
	// StateLeaving: announced a graceful leave (Meta.Leaving) and is
	// draining; route nothing new to it.
	StateLeaving
	// StateLeft: left gracefully.
	StateLeft
	// StateFailed: stopped answering (crash, kill, partition) without
	// announcing a leave.
	StateFailed
)

// String names a state.
func (s State) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateSuspect:
		return "suspect"
	case StateLeaving:
		return "leaving"
	case StateLeft:
		return "left"
	case StateFailed:
		return "failed"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Live reports whether a member in this state should own keys.
func (s State) Live() bool { return s == StateAlive || s == StateSuspect }

// Member is one node as this node sees it.
type Member struct {
	Name  string
	Addr  string // gossip host:port
	Meta  Meta
	State State
	Since time.Time // when State last changed, by this node's clock
	Local bool      // this node
}

// EventKind says what changed.
type EventKind uint8

// Event kinds.
const (
	EventJoin   EventKind = iota + 1 // a member appeared (or came back)
	EventUpdate                      // a member's metadata changed (incl. Leaving)
	EventLeft                        // a member left gracefully
	EventFailed                      // a member failed
)

// String names an event kind.
func (k EventKind) String() string {
	switch k {
	case EventJoin:
		return "join"
	case EventUpdate:
		return "update"
	case EventLeft:
		return "left"
	case EventFailed:
		return "failed"
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// Event is a change of one member. Seq increases by one per event the
// cluster publishes; a subscriber that sees a gap missed events (its buffer
// was full) and should re-read Members.
type Event struct {
	Seq    uint64
	Kind   EventKind
	Member Member
}

// Stats counts membership activity.
type Stats struct {
	Members      int    // members in the table (all states)
	Live         int    // members with State.Live
	Events       uint64 // events published
	Dropped      uint64 // events dropped by full subscriber buffers
	HandoffDrops uint64 // delegate notifications dropped (table resynced)
	RefusedPeers uint64 // alive messages or merges refused (label, protocol, metadata)
	JoinRounds   uint64 // join rounds made (Start and the background join)
	JoinFailures uint64 // of those, rounds where no address answered
	MetaUpdates  uint64 // local metadata updates
}

// Members returns every member this node knows, itself included, sorted by
// name: live ones and, for Config.Tombstone, left and failed ones.
func (c *Cluster) Members() []Member {
	c.mu.RLock()
	out := make([]Member, 0, len(c.members))
	for _, m := range c.members {
		out = append(out, copyMember(*m))
	}
	c.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Member returns the member called name, if this node knows it (in any
// state, itself included).
func (c *Cluster) Member(name string) (Member, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	m, ok := c.members[name]
	if !ok {
		return Member{}, false
	}
	return copyMember(*m), true
}

// Ring places keys on the current live members (LiveNames of Members).
// Build a new one after each membership event.
func (c *Cluster) Ring(cfg RingConfig) (*Ring, error) {
	return NewRing(LiveNames(c.Members()), cfg)
}

// LiveNames returns the sorted names of the members that should own keys
// (State.Live), the input NewRing wants.
func LiveNames(ms []Member) []string {
	var out []string
	for _, m := range ms {
		if m.State.Live() {
			out = append(out, m.Name)
		}
	}
	sort.Strings(out)
	return out
}

// MovesKeys reports whether e changes the live member set: a join, a
// leave, a failure, a member announcing its leave. Metadata updates of live
// members (tier usage, addresses) do not.
func (e Event) MovesKeys() bool {
	return e.Kind != EventUpdate || !e.Member.State.Live()
}

// OnMembershipChange calls fn, from one goroutine, after every event that
// moves keys (Event.MovesKeys) and after a gap in the event sequence
// (events were missed). It returns a stop function (safe to call twice);
// the watch also ends when c closes.
func (c *Cluster) OnMembershipChange(fn func()) (stop func()) {
	events, cancel := c.Subscribe()
	go func() {
		var last uint64
		for ev := range events {
			gap := last != 0 && ev.Seq != last+1
			last = ev.Seq
			if gap || ev.MovesKeys() {
				fn()
			}
		}
	}()
	return cancel
}

// Subscribe returns a channel of membership events and a cancel function.
// The channel holds Config.EventBuffer events; when it is full further
// events for it are dropped (see Event.Seq). It is closed by cancel or
// Close.
func (c *Cluster) Subscribe() (<-chan Event, func()) {
	s := &subscriber{ch: make(chan Event, c.cfg.EventBuffer)}
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		close(s.ch)
		return s.ch, func() {}
	}
	c.subs[s] = struct{}{}
	c.mu.Unlock()
	var once sync.Once
	return s.ch, func() {
		once.Do(func() {
			c.mu.Lock()
			if _, ok := c.subs[s]; ok {
				delete(c.subs, s)
				close(s.ch)
			}
			c.mu.Unlock()
		})
	}
}

// Stats returns a snapshot of the counters.
func (c *Cluster) Stats() Stats {
	c.mu.RLock()
	s := Stats{Members: len(c.members), Live: c.live}
	c.mu.RUnlock()
	s.Events = c.events.Load()
	s.Dropped = c.dropped.Load()
	s.HandoffDrops = c.handoffDrops.Load()
	s.RefusedPeers = c.refused.Load()
	s.MetaUpdates = c.metaUpdates.Load()
	s.JoinRounds = c.joinRounds.Load()
	s.JoinFailures = c.joinFailures.Load()
	return s
}

// setMemberLocked stores m as the member called name and keeps the live
// count, so that Stats is O(1) however large the table (c.mu held).
func (c *Cluster) setMemberLocked(name string, m *Member) {
	if cur := c.members[name]; cur != nil && cur.State.Live() {
		c.live--
	}
	if m.State.Live() {
		c.live++
	}
	c.members[name] = m
}

func copyMember(m Member) Member {
	m.Meta.Tiers = slices.Clone(m.Meta.Tiers)
	if m.Meta.RDMA != nil {
		r := *m.Meta.RDMA
		m.Meta.RDMA = &r
	}
	return m
}
