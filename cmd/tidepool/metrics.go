package main

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/fdlimit"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/engineapi"
)

// statsCollector exports a store's Stats snapshot at scrape time, so the
// core keeps plain atomic counters and knows nothing of Prometheus.
type statsCollector struct {
	stats func() cache.Stats

	tierCap, tierUsed, tierBlocks                               *prometheus.Desc
	tierHits, tierMisses, tierEvict, tierIn, tierOut, tierCksum *prometheus.Desc
	nsBlocks, nsBytes, nsHits, nsMisses, nsPuts, nsEvict        *prometheus.Desc
}

func newStatsCollector(stats func() cache.Stats) *statsCollector {
	t := []string{"tier"}
	n := []string{"namespace"}
	d := prometheus.NewDesc
	return &statsCollector{
		stats:      stats,
		tierCap:    d("tidepool_tier_capacity_bytes", "Byte budget of the tier.", t, nil),
		tierUsed:   d("tidepool_tier_used_bytes", "Bytes in use in the tier (allocated footprint).", t, nil),
		tierBlocks: d("tidepool_tier_blocks", "Blocks held by the tier.", t, nil),
		tierHits:   d("tidepool_tier_hits_total", "Reads served by the tier.", t, nil),
		tierMisses: d("tidepool_tier_misses_total", "Reads the tier could not serve.", t, nil),
		tierEvict:  d("tidepool_tier_evictions_total", "Blocks evicted from the tier.", t, nil),
		tierIn:     d("tidepool_tier_bytes_in_total", "Value bytes written into the tier.", t, nil),
		tierOut:    d("tidepool_tier_bytes_out_total", "Value bytes read out of the tier.", t, nil),
		tierCksum:  d("tidepool_tier_checksum_failures_total", "Reads whose bytes failed their checksum (served as misses).", t, nil),
		nsBlocks:   d("tidepool_namespace_blocks", "Blocks held for the namespace.", n, nil),
		nsBytes:    d("tidepool_namespace_bytes", "Value bytes held for the namespace.", n, nil),
		nsHits:     d("tidepool_namespace_hits_total", "Reads of the namespace that found their block.", n, nil),
		nsMisses:   d("tidepool_namespace_misses_total", "Reads of the namespace that missed.", n, nil),
		nsPuts:     d("tidepool_namespace_puts_total", "Blocks stored for the namespace.", n, nil),
		nsEvict:    d("tidepool_namespace_evictions_total", "Blocks of the namespace evicted.", n, nil),
	}
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.tierCap, c.tierUsed, c.tierBlocks, c.tierHits, c.tierMisses, c.tierEvict, c.tierIn, c.tierOut, c.tierCksum,
		c.nsBlocks, c.nsBytes, c.nsHits, c.nsMisses, c.nsPuts, c.nsEvict} {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	g, ctr := prometheus.GaugeValue, prometheus.CounterValue
	m := prometheus.MustNewConstMetric
	for _, t := range st.Tiers {
		ch <- m(c.tierCap, g, float64(t.CapacityBytes), t.Name)
		ch <- m(c.tierUsed, g, float64(t.UsedBytes), t.Name)
		ch <- m(c.tierBlocks, g, float64(t.Blocks), t.Name)
		ch <- m(c.tierHits, ctr, float64(t.Hits), t.Name)
		ch <- m(c.tierMisses, ctr, float64(t.Misses), t.Name)
		ch <- m(c.tierEvict, ctr, float64(t.Evictions), t.Name)
		ch <- m(c.tierIn, ctr, float64(t.BytesIn), t.Name)
		ch <- m(c.tierOut, ctr, float64(t.BytesOut), t.Name)
		ch <- m(c.tierCksum, ctr, float64(t.ChecksumFailures), t.Name)
	}
	for _, s := range st.Namespaces {
		ch <- m(c.nsBlocks, g, float64(s.Blocks), s.Namespace)
		ch <- m(c.nsBytes, g, float64(s.Bytes), s.Namespace)
		ch <- m(c.nsHits, ctr, float64(s.Hits), s.Namespace)
		ch <- m(c.nsMisses, ctr, float64(s.Misses), s.Namespace)
		ch <- m(c.nsPuts, ctr, float64(s.Puts), s.Namespace)
		ch <- m(c.nsEvict, ctr, float64(s.Evictions), s.Namespace)
	}
}

// metrics is the process's Prometheus registry and HTTP endpoint.
type metrics struct {
	reg      *prometheus.Registry
	calls    *prometheus.HistogramVec
	ready    atomic.Bool
	notes    func() []string // conditions /readyz reports while ready (nil: none)
	srv      *http.Server
	ln       net.Listener
	lg       *zap.Logger
	serveErr chan error
}

func newMetrics(stats func() cache.Stats, lg *zap.Logger) *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), lg: lg, serveErr: make(chan error, 1)}
	m.calls = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "tidepool_request_duration_seconds",
		Help: "Engine API calls by method and result code.",
		// 10µs to ~10s, doubling.
		Buckets: prometheus.ExponentialBuckets(10e-6, 2, 21),
	}, []string{"method", "code"})
	m.reg.MustRegister(m.calls, newStatsCollector(stats),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// observer feeds the per-call histogram.
func (m *metrics) observer() engineapi.Observer {
	return func(method string, took time.Duration, code string) {
		m.calls.WithLabelValues(method, code).Observe(took.Seconds())
	}
}

// listen binds the metrics address. In a pod it is the pod IP, so that the
// kubelet's probes and Prometheus reach it; it has no authentication, so
// it serves read-only GETs only (/metrics, /healthz, /readyz) and nothing
// that changes state or reveals more (no pprof, no debug handlers): every
// other method is 405, every other path 404.
// inPod reports whether serve runs in a Kubernetes pod: the downward
// API's POD_IP (what the injected sidecar gets, and what serve's pod
// defaults read) or the service host the kubelet gives every container.
func inPod(getenv func(string) string) bool {
	return getenv("POD_IP") != "" || getenv("KUBERNETES_SERVICE_HOST") != ""
}

// warnExposedMetrics warns when the metrics listener is bound to more than
// loopback outside a pod: /metrics, /healthz and /readyz answer anyone who
// reaches the port, without authentication, and the metrics name the
// namespaces (model names, tenants), the members and their addresses. In a
// pod that is the usual setup (Prometheus scrapes $POD_IP:9464 and network
// policy guards the pod network), so nothing is logged there.
func warnExposedMetrics(lg *zap.Logger, configured string, addr net.Addr, pod bool) {
	ta, ok := addr.(*net.TCPAddr)
	if !ok || ta.IP.IsLoopback() || pod {
		return
	}
	lg.Warn("metrics listener reachable beyond this host, without authentication: /metrics exposes namespace names, "+
		"member names and addresses, traffic, capacity and error figures, and /healthz and /readyz the node's state; "+
		"bind metrics_addr to 127.0.0.1 (the default) or firewall the port (docs/security.md)",
		zap.String("metrics_addr", configured), zap.Stringer("listening", addr))
}

func (m *metrics) listen(addr string) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	m.ln = ln
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !m.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
		if m.notes != nil {
			for _, n := range m.notes() {
				w.Write([]byte("degraded: " + n + "\n"))
			}
		}
	})
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { m.serveErr <- m.srv.Serve(ln) }()
	return nil
}

func (m *metrics) close() {
	if m.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		m.srv.Shutdown(ctx)
	}
}

// routeCollector exports the cluster routing, peer and membership counters.
type routeCollector struct {
	p  *proxy.Proxy
	cn *clusterNode

	members, lookups, fetches, remoteHits, fetchFails, pushes, pushFails, pushDrops, queue, coalesced *prometheus.Desc
	readsThrough                                                                                      *prometheus.Desc
	fastFails, downOpens, peersDown, remoteDeletes, remoteDeleteErrs                                  *prometheus.Desc
	peerFetches, peerBytes, peerFails, peerLatency, xferIn, xferOut                                   *prometheus.Desc

	rbPasses, rbCancelled, rbRunning, rbPlanned, rbPlannedBytes, rbMoved, rbMovedBytes, rbSkipped, rbFailed, rbDemoted *prometheus.Desc
	rbOwed, rbOwedDropped                                                                                              *prometheus.Desc
	hotCreated, hotEvicted, hotRefused, hotLive, hotBytes, peerHot, peerNamed                                          *prometheus.Desc
	joinRounds, joinFailures                                                                                           *prometheus.Desc
}

func newRouteCollector(p *proxy.Proxy, cn *clusterNode) *routeCollector {
	d := prometheus.NewDesc
	peer := []string{"peer"}
	return &routeCollector{p: p, cn: cn,
		members:          d("tidepool_cluster_members", "Members of the cluster view by state.", []string{"state"}, nil),
		lookups:          d("tidepool_remote_lookups_total", "Keys asked of their owners by cluster-scope Lookup and Exists.", nil, nil),
		fetches:          d("tidepool_remote_fetches_total", "Keys fetched from other nodes after a local miss.", nil, nil),
		remoteHits:       d("tidepool_remote_hits_total", "Remote fetches that found their block.", nil, nil),
		fetchFails:       d("tidepool_remote_fetch_failures_total", "Remote fetches that failed (node down, transfer error, checksum).", nil, nil),
		readsThrough:     d("tidepool_remote_reads_uncached_total", "Reads of remote blocks served from the owner without a copy here: no room for one.", nil, nil),
		pushes:           d("tidepool_pushes_total", "Blocks pushed to their owners.", nil, nil),
		pushFails:        d("tidepool_push_failures_total", "Pushes to owners that failed.", nil, nil),
		pushDrops:        d("tidepool_pushes_dropped_total", "Pushes dropped because the push queue was full.", nil, nil),
		queue:            d("tidepool_push_queue_depth", "Push batches waiting.", nil, nil),
		coalesced:        d("tidepool_coalesced_misses_total", "Misses that joined another caller's fetch of the same key.", nil, nil),
		fastFails:        d("tidepool_remote_fast_fails_total", "Remote calls not made because the node failed a call within peer_down_for (the read missed at once).", nil, nil),
		downOpens:        d("tidepool_remote_peer_down_total", "Times a node was marked down after a failed or timed-out call.", nil, nil),
		peersDown:        d("tidepool_remote_peers_down", "Nodes marked down now (not asked until peer_down_for has passed).", nil, nil),
		remoteDeletes:    d("tidepool_remote_deletes_total", "Cluster-wide Delete and Clear calls made on other members.", nil, nil),
		remoteDeleteErrs: d("tidepool_remote_delete_failures_total", "Of those, calls that failed or were not made (the member keeps its blocks).", nil, nil),
		peerFetches:      d("tidepool_peer_fetches_total", "Blocks fetched from the peer.", peer, nil),
		peerBytes:        d("tidepool_peer_fetch_bytes_total", "Bytes fetched from the peer.", peer, nil),
		peerFails:        d("tidepool_peer_failures_total", "Failed calls to the peer.", peer, nil),
		peerLatency:      d("tidepool_peer_fetch_seconds_total", "Time spent in successful Fetch calls to the peer.", peer, nil),
		xferIn:           d("tidepool_transfer_bytes_in_total", "Bytes the transfer layer received (pulled by this node or written into it).", nil, nil),
		xferOut:          d("tidepool_transfer_bytes_out_total", "Bytes the transfer layer sent (read by peers or pushed by this node).", nil, nil),

		rbPasses:       d("tidepool_rebalance_passes_total", "Rebalance passes started after membership changes.", nil, nil),
		rbCancelled:    d("tidepool_rebalance_passes_cancelled_total", "Rebalance passes cut short by a newer membership change or shutdown.", nil, nil),
		rbRunning:      d("tidepool_rebalance_running", "1 while a rebalance pass runs.", nil, nil),
		rbPlanned:      d("tidepool_rebalance_planned_blocks_total", "Block moves to new owners planned by rebalance passes.", nil, nil),
		rbPlannedBytes: d("tidepool_rebalance_planned_bytes_total", "Bytes of the planned block moves.", nil, nil),
		rbMoved:        d("tidepool_rebalance_moved_blocks_total", "Blocks pushed to their new owners by the rebalancer.", nil, nil),
		rbMovedBytes:   d("tidepool_rebalance_moved_bytes_total", "Bytes pushed to new owners by the rebalancer.", nil, nil),
		rbSkipped:      d("tidepool_rebalance_skipped_total", "Planned moves skipped: the new owner had the block, or it left this node meanwhile.", nil, nil),
		rbFailed:       d("tidepool_rebalance_failed_total", "Planned moves whose push failed.", nil, nil),
		rbDemoted:      d("tidepool_rebalance_demoted_total", "Moved blocks this node no longer owns, kept as low-priority copies.", nil, nil),
		rbOwed:         d("tidepool_rebalance_owed_blocks", "Blocks whose push to an owner failed, waiting to be pushed again by the rebalancer.", nil, nil),
		rbOwedDropped:  d("tidepool_rebalance_owed_dropped_total", "Owed blocks given up: still owed after 5 minutes, or past the bound on owed blocks.", nil, nil),
		hotCreated:     d("tidepool_hot_replicas_created_total", "Blocks fetched often enough to be kept as full-priority hot replicas.", nil, nil),
		hotEvicted:     d("tidepool_hot_replicas_evicted_total", "Hot replicas ended, by reason: expired (demoted to a low-priority copy after hot_ttl) or lost (evicted or deleted first).", []string{"reason"}, nil),
		hotRefused:     d("tidepool_hot_replicas_refused_total", "Hot promotions refused because hot_max_replicas or hot_max_bytes was reached.", nil, nil),
		hotLive:        d("tidepool_hot_replicas_live", "Hot replicas held now.", nil, nil),
		hotBytes:       d("tidepool_hot_replica_bytes", "Bytes of the hot replicas held now.", nil, nil),
		joinRounds:     d("tidepool_cluster_join_rounds_total", "Rounds of joins made (at start and in the background).", nil, nil),
		joinFailures:   d("tidepool_cluster_join_failures_total", "Join rounds in which no other address answered (name unresolvable, no peer up yet).", nil, nil),
		peerHot:        d("tidepool_peer_hot_fetches_total", "Keys fetched from the peer at full priority (hot replicas, or blocks this node owns).", peer, nil),
		peerNamed:      d("tidepool_peer_named_reads_total", "Keys fetched from the peer by named reads: one exchange each on the transfer port, no Acquire call.", peer, nil),
	}
}

func (c *routeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.members, c.lookups, c.fetches, c.remoteHits, c.fetchFails, c.pushes, c.pushFails, c.pushDrops, c.queue, c.coalesced, c.readsThrough,
		c.fastFails, c.downOpens, c.peersDown, c.remoteDeletes, c.remoteDeleteErrs,
		c.peerFetches, c.peerBytes, c.peerFails, c.peerLatency, c.xferIn, c.xferOut,
		c.rbPasses, c.rbCancelled, c.rbRunning, c.rbPlanned, c.rbPlannedBytes, c.rbMoved, c.rbMovedBytes, c.rbSkipped, c.rbFailed, c.rbDemoted, c.rbOwed, c.rbOwedDropped,
		c.hotCreated, c.hotEvicted, c.hotRefused, c.hotLive, c.hotBytes, c.peerHot, c.peerNamed, c.joinRounds, c.joinFailures} {
		ch <- d
	}
}

func (c *routeCollector) Collect(ch chan<- prometheus.Metric) {
	g, ctr := prometheus.GaugeValue, prometheus.CounterValue
	m := prometheus.MustNewConstMetric
	states := map[string]int{}
	for _, mem := range c.p.Members(context.Background()) {
		states[mem.State]++
	}
	for st, n := range states {
		ch <- m(c.members, g, float64(n), st)
	}
	if c.cn != nil && c.cn.c != nil {
		cs := c.cn.c.Stats()
		ch <- m(c.joinRounds, ctr, float64(cs.JoinRounds))
		ch <- m(c.joinFailures, ctr, float64(cs.JoinFailures))
	}
	rs := c.p.RouteStats()
	ch <- m(c.lookups, ctr, float64(rs.RemoteLookups))
	ch <- m(c.fetches, ctr, float64(rs.RemoteFetches))
	ch <- m(c.remoteHits, ctr, float64(rs.RemoteHits))
	ch <- m(c.fetchFails, ctr, float64(rs.FetchFailures))
	ch <- m(c.readsThrough, ctr, float64(rs.ReadsThrough))
	ch <- m(c.pushes, ctr, float64(rs.Pushes))
	ch <- m(c.pushFails, ctr, float64(rs.PushFailures))
	ch <- m(c.pushDrops, ctr, float64(rs.PushesDropped))
	ch <- m(c.queue, g, float64(rs.PushQueueDepth))
	ch <- m(c.coalesced, ctr, float64(rs.CoalescedMisses))
	ch <- m(c.fastFails, ctr, float64(rs.FastFails))
	ch <- m(c.downOpens, ctr, float64(rs.PeerDownOpens))
	ch <- m(c.peersDown, g, float64(rs.PeersDown))
	ch <- m(c.remoteDeletes, ctr, float64(rs.RemoteDeletes))
	ch <- m(c.remoteDeleteErrs, ctr, float64(rs.RemoteDeleteErr))
	rb, hot := rs.Rebalance, rs.Hot
	running := 0.0
	if rb.Running {
		running = 1
	}
	ch <- m(c.rbPasses, ctr, float64(rb.Passes))
	ch <- m(c.rbCancelled, ctr, float64(rb.Cancelled))
	ch <- m(c.rbRunning, g, running)
	ch <- m(c.rbPlanned, ctr, float64(rb.PlannedBlocks))
	ch <- m(c.rbPlannedBytes, ctr, float64(rb.PlannedBytes))
	ch <- m(c.rbMoved, ctr, float64(rb.MovedBlocks))
	ch <- m(c.rbMovedBytes, ctr, float64(rb.MovedBytes))
	ch <- m(c.rbSkipped, ctr, float64(rb.Skipped))
	ch <- m(c.rbFailed, ctr, float64(rb.Failed))
	ch <- m(c.rbDemoted, ctr, float64(rb.Demoted))
	ch <- m(c.rbOwed, g, float64(rb.Owed))
	ch <- m(c.rbOwedDropped, ctr, float64(rb.OwedDropped))
	ch <- m(c.hotCreated, ctr, float64(hot.Created))
	ch <- m(c.hotEvicted, ctr, float64(hot.Expired), "expired")
	ch <- m(c.hotEvicted, ctr, float64(hot.Lost), "lost")
	ch <- m(c.hotRefused, ctr, float64(hot.Full))
	ch <- m(c.hotLive, g, float64(hot.Live))
	ch <- m(c.hotBytes, g, float64(hot.LiveBytes))
	if c.cn == nil {
		return
	}
	if c.cn.pcli != nil {
		for _, ps := range c.p.PeerStats() {
			ch <- m(c.peerFetches, ctr, float64(ps.FetchedBlocks), ps.Node)
			ch <- m(c.peerBytes, ctr, float64(ps.FetchedBytes), ps.Node)
			ch <- m(c.peerFails, ctr, float64(ps.Failures), ps.Node)
			ch <- m(c.peerLatency, ctr, ps.FetchLatency.Seconds(), ps.Node)
			ch <- m(c.peerHot, ctr, float64(ps.HotFetched), ps.Node)
			ch <- m(c.peerNamed, ctr, float64(ps.NamedReads), ps.Node)
		}
	}
	if c.cn.xt != nil {
		st := c.cn.xt.Stats()
		var in, out uint64
		for _, ps := range st.Peers {
			in += ps.BytesIn
			out += ps.BytesOut
		}
		ch <- m(c.xferIn, ctr, float64(in+st.Serve.BytesIn))
		ch <- m(c.xferOut, ctr, float64(out+st.Serve.BytesOut))
	}
}

// zeroCopyCollector exports the zero-copy counters of the proxy.
type zeroCopyCollector struct {
	p                                                                       *proxy.Proxy
	leasesLive, resLive, resAhead, leaseExp, resReclaimed, leases, releases *prometheus.Desc
	renewals                                                                *prometheus.Desc
	reservations, commits, aborts                                           *prometheus.Desc
}

func newZeroCopyCollector(p *proxy.Proxy) *zeroCopyCollector {
	d := prometheus.NewDesc
	return &zeroCopyCollector{p: p,
		leasesLive:   d("tidepool_zerocopy_leases_live", "Leases (pinned blocks) held by engines now.", nil, nil),
		resLive:      d("tidepool_zerocopy_reservations_live", "Reserved slots not yet committed or aborted.", nil, nil),
		resAhead:     d("tidepool_zerocopy_reservations_ahead_live", "Of the live reservations, slots reserved ahead for a writer's next put (unbound: the key comes with Commit).", nil, nil),
		leaseExp:     d("tidepool_zerocopy_lease_expirations_total", "Leases whose deadline passed before Release (the pin was dropped).", nil, nil),
		resReclaimed: d("tidepool_zerocopy_reservations_reclaimed_total", "Reservations reclaimed because their deadline passed before Commit or Abort.", nil, nil),
		leases:       d("tidepool_zerocopy_leases_total", "Leases granted by Acquire.", nil, nil),
		releases:     d("tidepool_zerocopy_releases_total", "Leases released in time.", nil, nil),
		renewals:     d("tidepool_zerocopy_renewals_total", "Lease renewals.", nil, nil),
		reservations: d("tidepool_zerocopy_reservations_total", "Slots reserved (by Reserve, and ahead by Commit).", nil, nil),
		commits:      d("tidepool_zerocopy_commits_total", "Reservations committed, by result (ok, exists).", []string{"result"}, nil),
		aborts:       d("tidepool_zerocopy_aborts_total", "Reservations aborted by the engine.", nil, nil),
	}
}

func (c *zeroCopyCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.leasesLive, c.resLive, c.resAhead, c.leaseExp, c.resReclaimed, c.leases, c.releases, c.renewals, c.reservations, c.commits, c.aborts} {
		ch <- d
	}
}

func (c *zeroCopyCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.p.ZeroCopyStats()
	g, ctr := prometheus.GaugeValue, prometheus.CounterValue
	m := prometheus.MustNewConstMetric
	ch <- m(c.leasesLive, g, float64(s.LiveLeases))
	ch <- m(c.resLive, g, float64(s.LiveReservations))
	ch <- m(c.resAhead, g, float64(s.ReservedAhead))
	ch <- m(c.leaseExp, ctr, float64(s.LeaseExpirations))
	ch <- m(c.resReclaimed, ctr, float64(s.ReservationsReclaimed))
	ch <- m(c.leases, ctr, float64(s.Acquired))
	ch <- m(c.releases, ctr, float64(s.Released))
	ch <- m(c.renewals, ctr, float64(s.Renewed))
	ch <- m(c.reservations, ctr, float64(s.Reserved))
	ch <- m(c.commits, ctr, float64(s.Committed-s.CommitExists), "ok")
	ch <- m(c.commits, ctr, float64(s.CommitExists), "exists")
	ch <- m(c.aborts, ctr, float64(s.Aborted))
}

// engineConnCollector exports the engine API's connection counters.
type engineConnCollector struct {
	srv                                         *engineapi.Server
	guard                                       *fdlimit.Guard
	active, accepted, refused, idle, acceptErrs *prometheus.Desc
	bufs, fdsRefused, fdLimit, fdReserve        *prometheus.Desc
	fdReserveRefused                            *prometheus.Desc
}

func newEngineConnCollector(srv *engineapi.Server, guard *fdlimit.Guard) *engineConnCollector {
	d := prometheus.NewDesc
	return &engineConnCollector{srv: srv, guard: guard,
		bufs:             d("tidepool_buffer_socket_buffers", "Buffers registered on the buffer socket now, all connections.", nil, nil),
		fdsRefused:       d("tidepool_buffer_socket_descriptors_refused_total", "Descriptors passed to the buffer socket and closed on arrival (more than one with a request, one where the protocol has none, or one that would enter the descriptor reserve).", nil, nil),
		fdLimit:          d("tidepool_fd_limit", "The process's soft RLIMIT_NOFILE, raised to the hard limit at start.", nil, nil),
		fdReserve:        d("tidepool_fd_reserve", "Descriptors kept below the limit for the process's own files; clients cannot take them.", nil, nil),
		fdReserveRefused: d("tidepool_fd_reserve_refused_total", "Client connections and passed descriptors closed at once because they would have entered the descriptor reserve.", nil, nil),
		active:           d("tidepool_engine_connections", "Engine API connections open now.", nil, nil),
		accepted:         d("tidepool_engine_connections_accepted_total", "Engine API connections accepted (refused ones included).", nil, nil),
		refused:          d("tidepool_engine_connections_refused_total", "Engine API connections closed on accept because engine_max_connections were open.", nil, nil),
		idle:             d("tidepool_engine_connections_idle_closed_total", "Engine API connections closed after engine_idle_timeout without a call.", nil, nil),
		acceptErrs:       d("tidepool_engine_accept_errors_total", "Failed accepts on the engine socket (e.g. EMFILE); accepting backs off and continues.", nil, nil),
	}
}

func (c *engineConnCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.active, c.accepted, c.refused, c.idle, c.acceptErrs, c.bufs, c.fdsRefused, c.fdLimit, c.fdReserve, c.fdReserveRefused} {
		ch <- d
	}
}

func (c *engineConnCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.srv.ConnStats()
	g, ctr := prometheus.GaugeValue, prometheus.CounterValue
	m := prometheus.MustNewConstMetric
	ch <- m(c.active, g, float64(s.Active))
	ch <- m(c.accepted, ctr, float64(s.Accepted))
	ch <- m(c.refused, ctr, float64(s.Refused))
	ch <- m(c.idle, ctr, float64(s.IdleClosed))
	ch <- m(c.acceptErrs, ctr, float64(s.AcceptErrors))
	b, fd := c.srv.BufferStats(), c.guard.Stats()
	ch <- m(c.bufs, g, float64(b.Registered))
	ch <- m(c.fdsRefused, ctr, float64(b.DescriptorsRefused))
	ch <- m(c.fdLimit, g, float64(fd.Limit))
	ch <- m(c.fdReserve, g, float64(fd.Reserve))
	ch <- m(c.fdReserveRefused, ctr, float64(fd.Refused))
}
