package main

import (
	"github.com/tidepool-kv/tidepool/cluster"
	"github.com/tidepool-kv/tidepool/proxy"
)

// watchMembership calls p.MembershipChanged on every membership change
// that moves keys: a join, a leave, a failure, a member announcing its
// leave, and a gap in the event sequence (events were missed). Metadata
// updates of live members (tier usage, addresses) do not count. It returns
// a stop function (safe to call twice); the watch also ends when c closes.
// The proxy's rebalancer waits RebalanceDelay after the last change, so
// the placement view (which rebuilds its ring on the same events) is up to
// date when a pass starts.
func watchMembership(c *cluster.Cluster, p *proxy.Proxy) (stop func()) {
	events, cancel := c.Subscribe()
	go func() {
		var last uint64
		for ev := range events {
			gap := last != 0 && ev.Seq != last+1
			last = ev.Seq
			if gap || movesKeys(ev) {
				p.MembershipChanged()
			}
		}
	}()
	return cancel
}

// movesKeys reports whether ev changes the live member set.
func movesKeys(ev cluster.Event) bool {
	return ev.Kind != cluster.EventUpdate || !ev.Member.State.Live()
}
