// Package counters holds the atomic counters behind rdma Stats snapshots.
package counters

import (
	"sort"
	"sync/atomic"
	"time"

	"github.com/tidepool-kv/tidepool/rdma"
)

// Peer counts transfers initiated through one peer handle.
type Peer struct {
	Addr      string
	writes    atomic.Uint64
	reads     atomic.Uint64
	failures  atomic.Uint64
	bytesOut  atomic.Uint64
	bytesIn   atomic.Uint64
	latency   atomic.Int64
	conns     atomic.Int64
	dialFails atomic.Uint64
}

// Done records one finished transfer.
func (p *Peer) Done(write bool, n uint64, d time.Duration, err error) {
	if err != nil {
		p.failures.Add(1)
		return
	}
	if write {
		p.writes.Add(1)
		p.bytesOut.Add(n)
	} else {
		p.reads.Add(1)
		p.bytesIn.Add(n)
	}
	p.latency.Add(int64(d))
}

// Conn adds delta to the open-connection gauge.
func (p *Peer) Conn(delta int64) { p.conns.Add(delta) }

// DialFail counts a failed connection attempt.
func (p *Peer) DialFail() { p.dialFails.Add(1) }

// Snapshot returns the counters.
func (p *Peer) Snapshot() rdma.PeerStats {
	return rdma.PeerStats{
		Addr:      p.Addr,
		Writes:    p.writes.Load(),
		Reads:     p.reads.Load(),
		Failures:  p.failures.Load(),
		BytesOut:  p.bytesOut.Load(),
		BytesIn:   p.bytesIn.Load(),
		Latency:   time.Duration(p.latency.Load()),
		Conns:     int(p.conns.Load()),
		DialFails: p.dialFails.Load(),
	}
}

// Serve counts transfers served for remote initiators.
type Serve struct {
	writes   atomic.Uint64
	reads    atomic.Uint64
	errors   atomic.Uint64
	bytesIn  atomic.Uint64
	bytesOut atomic.Uint64
	conns    atomic.Int64
}

// Applied counts n payload bytes written into a local region; a whole
// write request counts once with last set.
func (s *Serve) Applied(n uint64, last bool) {
	s.bytesIn.Add(n)
	if last {
		s.writes.Add(1)
	}
}

// Sent counts n payload bytes read out of a local region; a whole read
// request counts once with last set.
func (s *Serve) Sent(n uint64, last bool) {
	s.bytesOut.Add(n)
	if last {
		s.reads.Add(1)
	}
}

// Reported adds transfers an initiator reports having done one-sided
// (verbs: the owner's CPU does not see them).
func (s *Serve) Reported(writes, reads, bytesIn, bytesOut uint64) {
	s.writes.Add(writes)
	s.reads.Add(reads)
	s.bytesIn.Add(bytesIn)
	s.bytesOut.Add(bytesOut)
}

// Error counts a refused or broken request.
func (s *Serve) Error() { s.errors.Add(1) }

// Conn adds delta to the inbound-connection gauge.
func (s *Serve) Conn(delta int64) { s.conns.Add(delta) }

// Snapshot returns the counters.
func (s *Serve) Snapshot() rdma.ServeStats {
	return rdma.ServeStats{
		Writes:   s.writes.Load(),
		Reads:    s.reads.Load(),
		Errors:   s.errors.Load(),
		BytesIn:  s.bytesIn.Load(),
		BytesOut: s.bytesOut.Load(),
		Conns:    int(s.conns.Load()),
	}
}

// TransportStats assembles a transport's snapshot from its region totals,
// serve counters and per-peer counters (peers sorted by address). The
// caller holds whatever lock guards peers.
func TransportStats(regions int, regionBytes uint64, serve *Serve, peers map[string]*Peer) rdma.Stats {
	s := rdma.Stats{Regions: regions, RegionBytes: regionBytes, Serve: serve.Snapshot()}
	for _, c := range peers {
		s.Peers = append(s.Peers, c.Snapshot())
	}
	sort.Slice(s.Peers, func(i, j int) bool { return s.Peers[i].Addr < s.Peers[j].Addr })
	return s
}
