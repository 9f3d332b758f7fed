package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidepool-kv/tidepool/internal/peerauth"
)

// guardCollector exports what the cluster ports (peer API, transfer) and
// membership refused: connections over the cap, failed handshakes, accept
// errors survived, wrong region keys, unsigned members.
type guardCollector struct {
	cn *clusterNode

	conns, handshakes, accepted, refused, acceptErrs, keyFails, keyCutoffs, members *prometheus.Desc
}

func newGuardCollector(cn *clusterNode) *guardCollector {
	d := prometheus.NewDesc
	port := []string{"port"}
	return &guardCollector{cn: cn,
		conns:      d("tidepool_port_connections", "Authenticated connections open now on a cluster port (peer_api, transfer), capped by peer_max_conns.", port, nil),
		handshakes: d("tidepool_port_handshakes", "Connections in their authentication handshake now on a cluster port, capped by peer_max_handshakes apart from peer_max_conns.", port, nil),
		accepted:   d("tidepool_port_accepted_total", "Connections a cluster port authenticated and served.", port, nil),
		refused:    d("tidepool_port_refused_total", "Connections a cluster port closed: reason limit (peer_max_conns open), auth (failed or timed-out handshake) or displaced (over the handshake budget, closed for a newer connection).", []string{"port", "reason"}, nil),
		acceptErrs: d("tidepool_port_accept_errors_total", "Accept errors a cluster port survived (too many open files, ...), each followed by a back-off.", port, nil),
		keyFails:   d("tidepool_transfer_key_failures_total", "Transfer requests refused for an unknown region, a wrong region key or an address outside the region (each throttled).", nil, nil),
		keyCutoffs: d("tidepool_transfer_key_cutoffs_total", "Transfer connections closed after too many such requests.", nil, nil),
		members:    d("tidepool_cluster_refused_total", "Gossip members refused: metadata not signed with the cluster secret, another protocol, undecodable.", nil, nil),
	}
}

func (c *guardCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.conns, c.handshakes, c.accepted, c.refused, c.acceptErrs, c.keyFails, c.keyCutoffs, c.members} {
		ch <- d
	}
}

func (c *guardCollector) Collect(ch chan<- prometheus.Metric) {
	g, ctr := prometheus.GaugeValue, prometheus.CounterValue
	m := prometheus.MustNewConstMetric
	var papi, xfer peerauth.ListenerStats
	var keyFails, keyCutoffs int64
	var refused uint64
	if c.cn != nil && c.cn.psrv != nil {
		papi = c.cn.psrv.ListenerStats()
	}
	if c.cn != nil && c.cn.tr != nil {
		gs := c.cn.tr.GuardStats()
		xfer, keyFails, keyCutoffs = gs.Listener, gs.KeyFails, gs.KeyCutoffs
	}
	if c.cn != nil && c.cn.c != nil {
		refused = c.cn.c.Stats().RefusedPeers
	}
	for _, p := range []struct {
		name string
		s    peerauth.ListenerStats
	}{{"peer_api", papi}, {"transfer", xfer}} {
		ch <- m(c.conns, g, float64(p.s.Active), p.name)
		ch <- m(c.handshakes, g, float64(p.s.Handshaking), p.name)
		ch <- m(c.accepted, ctr, float64(p.s.Accepted), p.name)
		ch <- m(c.refused, ctr, float64(p.s.OverLimit), p.name, "limit")
		ch <- m(c.refused, ctr, float64(p.s.AuthFailures), p.name, "auth")
		ch <- m(c.refused, ctr, float64(p.s.Displaced), p.name, "displaced")
		ch <- m(c.acceptErrs, ctr, float64(p.s.AcceptErrors), p.name)
	}
	ch <- m(c.keyFails, ctr, float64(keyFails))
	ch <- m(c.keyCutoffs, ctr, float64(keyCutoffs))
	ch <- m(c.members, ctr, float64(refused))
}
