package cluster

import (
	"slices"
	"time"

	"go.uber.org/zap"
)

// ---- the event loop: the only writer of the member table ----

func (c *Cluster) loop() {
	defer close(c.loopDone)
	reap := time.NewTicker(max(c.cfg.Tombstone/4, time.Second))
	defer reap.Stop()
	for {
		select {
		case <-c.stop:
			return
		case ev := <-c.handoff:
			c.apply(ev)
		case <-c.kick:
		case now := <-reap.C:
			c.reapTombstones(now)
		}
		if c.resync.Swap(false) {
			c.resyncTable()
		}
	}
}

// evUserMsg marks a nodeEvent carrying a user message in meta.
const evUserMsg EventKind = 100

func (c *Cluster) apply(ev nodeEvent) {
	if ev.kind == evUserMsg {
		c.applyUserMsg(ev)
		return
	}
	meta, err := c.decodeMeta(ev.name, ev.meta)
	if err != nil && ev.kind != EventLeft {
		// The alive delegate refuses undecodable metadata, so this is a
		// node we already refused; ignore it.
		c.lg.Debug("ignoring member with bad metadata", zap.String("node", ev.name), zap.Error(err))
		return
	}
	local := ev.name == c.cfg.NodeName
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.members[ev.name]
	switch ev.kind {
	case EventJoin, EventUpdate:
		state := StateAlive
		if meta.Leaving {
			state = StateLeaving
		}
		kind := ev.kind
		if cur == nil || !cur.State.Live() && cur.State != StateLeaving {
			kind = EventJoin
		}
		m := &Member{Name: ev.name, Addr: ev.addr, Meta: meta, State: state, Since: ev.at, Local: local}
		if cur != nil && cur.State == state {
			m.Since = cur.Since
		}
		c.setMemberLocked(ev.name, m)
		c.publishLocked(kind, *m)
	case EventLeft:
		if cur == nil {
			return
		}
		m := *cur
		if cur.State == StateLeft || cur.State == StateFailed {
			return
		}
		kind := EventFailed
		m.State = StateFailed
		if cur.Meta.Leaving || err == nil && meta.Leaving {
			kind, m.State = EventLeft, StateLeft
		}
		m.Since = ev.at
		c.setMemberLocked(ev.name, &m)
		c.publishLocked(kind, m)
	}
}

func (c *Cluster) publishLocked(kind EventKind, m Member) {
	c.seq++
	c.events.Add(1)
	ev := Event{Seq: c.seq, Kind: kind, Member: m}
	c.lg.Debug("member event", zap.Stringer("kind", kind), zap.String("node", m.Name), zap.Stringer("state", m.State))
	for s := range c.subs {
		ev.Member = copyMember(m)
		select {
		case s.ch <- ev:
		default:
			c.dropped.Add(1)
		}
	}
}

// resyncTable rebuilds the table from memberlist after a dropped hand-off.
func (c *Cluster) resyncTable() {
	ml := c.ml.Load()
	if ml == nil {
		return
	}
	now := time.Now()
	seen := map[string]bool{}
	// Only after a dropped hand-off: memberlist may update these nodes while
	// we copy them (it offers no locked accessor), so this path is best
	// effort; the next join/update event corrects any torn read.
	for _, n := range ml.Members() {
		seen[n.Name] = true
		c.apply(nodeEvent{kind: EventUpdate, name: n.Name, addr: n.Address(), meta: slices.Clone(n.Meta), at: now})
	}
	c.mu.RLock()
	var gone []string
	for name, m := range c.members {
		if !seen[name] && m.State != StateLeft && m.State != StateFailed {
			gone = append(gone, name)
		}
	}
	c.mu.RUnlock()
	for _, name := range gone {
		c.apply(nodeEvent{kind: EventLeft, name: name, at: now})
	}
}

func (c *Cluster) reapTombstones(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, m := range c.members {
		if (m.State == StateLeft || m.State == StateFailed) && now.Sub(m.Since) > c.cfg.Tombstone {
			delete(c.members, name)
		}
	}
}
