package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"os/user"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/cache/gpu"
	"github.com/tidepool-kv/tidepool/cache/tiered"
	"github.com/tidepool-kv/tidepool/internal/fdlimit"
	"github.com/tidepool-kv/tidepool/internal/units"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/engineapi"
	"github.com/tidepool-kv/tidepool/proxy/kvevents"
)

// cmdServe runs `tidepool serve` with its parsed flags (newServeCmd):
// vals holds the flags generated from the settings table, configPath the
// --config file.
func cmdServe(fs *pflag.FlagSet, vals map[string]*string, configPath string, stdout, stderr io.Writer) int {
	cfg, err := loadConfig(fs, vals, configPath, os.Environ())
	if err != nil {
		fmt.Fprintf(stderr, "tidepool serve: invalid configuration:\n%v\n", err)
		return 2
	}
	lg, err := newLogger(cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		fmt.Fprintf(stderr, "tidepool serve: logger: %v\n", err)
		return 2
	}
	defer lg.Sync()
	bridgeKitexLogs(lg)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, cfg, lg, stdout); err != nil {
		lg.Error("serve failed", zap.Error(err))
		fmt.Fprintf(stderr, "tidepool serve: %v\n", err)
		return 1
	}
	return 0
}

// stopWatchdog calls exit(1) unless stopped within d: the bound on a stop
// that must end inside the pod's grace period. It logs why first.
func stopWatchdog(d time.Duration, lg *zap.Logger, exit func(int)) *time.Timer {
	return time.AfterFunc(d, func() {
		lg.Error("stop took longer than shutdown_timeout; exiting without finishing it", zap.Duration("shutdown_timeout", d))
		lg.Sync()
		exit(1)
	})
}

// raiseFDLimit sets the soft RLIMIT_NOFILE to the hard limit, logs both,
// and returns the guard that keeps reserve descriptors from clients: at
// least fd_reserve, and with an SSD tier at least the descriptors the tier
// may hold (its MaxOpenFiles follows the raised limit), so that RocksDB
// never meets EMFILE because clients took its share.
func raiseFDLimit(cfg Config, lg *zap.Logger) (*fdlimit.Guard, error) {
	soft, hard, err := fdlimit.Raise()
	if err != nil {
		lg.Warn("could not raise the descriptor limit", zap.Uint64("soft", soft), zap.Uint64("hard", hard), zap.Error(err))
	}
	reserve := cfg.FDReserve
	if cfg.SSDCapacity > 0 && cfg.FDReserve > 0 {
		reserve = max(reserve, cfg.storeConfig(cfg.SSDCapacity).SSD.Descriptors())
	}
	g, gerr := fdlimit.New(reserve)
	if gerr != nil {
		return nil, gerr
	}
	st := g.Stats()
	lg.Info("descriptor limit", zap.Uint64("soft", soft), zap.Uint64("hard", hard), zap.Int("reserve", st.Reserve))
	if st.Reserve < reserve {
		lg.Warn("descriptor limit too low for fd_reserve; reserving a quarter of it", zap.Int("fd_reserve", reserve), zap.Int("reserve", st.Reserve))
	}
	return g, nil
}

// lookupGroup resolves a group name or numeric gid; empty means keep.
func lookupGroup(g string) (int, error) {
	if g == "" {
		return -1, nil
	}
	if n, err := strconv.Atoi(g); err == nil {
		return n, nil
	}
	grp, err := user.LookupGroup(g)
	if err != nil {
		return -1, fmt.Errorf("socket_group: %w", err)
	}
	return strconv.Atoi(grp.Gid)
}

// serve wires the sidecar, runs it until ctx ends, then shuts it down in
// reverse order of construction: stop accepting and drain calls, close the
// store, stop metrics.
func serve(ctx context.Context, cfg Config, lg *zap.Logger, stdout io.Writer) (err error) {
	// The stop's deadline, set when the stop begins; the timer that
	// enforces it is stopped last, after the store closed.
	var stopBy time.Time
	var watchdog *time.Timer
	defer func() {
		if watchdog != nil {
			watchdog.Stop()
		}
	}()
	gid, err := lookupGroup(cfg.SocketGroup)
	if err != nil {
		return err
	}
	// Before any file opens: the descriptor limit the process runs under,
	// and the reserve clients cannot take from it.
	fdGuard, err := raiseFDLimit(cfg, lg)
	if err != nil {
		return err
	}
	// Before anything in the directories is touched; released last.
	dirs, err := prepareDirs(cfg, gid, lg)
	if err != nil {
		return err
	}
	defer dirs.Close()

	// Before the store: the tiers report to it from their first block
	// (the blocks a kept SSD tier holds at start).
	events, err := newKVEvents(cfg, lg)
	if err != nil {
		return err
	}
	var obs cache.Observer
	var desc cache.Descriptions
	if events != nil {
		obs, desc = events, events
	}
	store, err := openObservedStore(cfg, obs, desc, lg)
	if err != nil {
		return err
	}
	defer func() {
		// After the engine API server (closed below, before this runs):
		// the store drains its demotion queue, spills DRAM into SSD, then
		// closes SSD and DRAM.
		if cerr := store.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("closing the store: %w", cerr)
		}
	}()

	// Closed before the store (deferred after it).
	scrub, err := startScrubber(ctx, cfg, store, lg)
	if err != nil {
		return err
	}
	defer scrub.Close()

	// Closed before the store (deferred after it), after the engine API
	// server: its registrations end with the server's connections.
	g, err := openGPU(cfg, store.DRAM(), lg.Named("gpu"))
	if err != nil {
		return err
	}
	defer g.Close()

	deps := storeDeps(store)
	if g.Available() {
		deps.GPU = g
	}
	if events != nil {
		deps.Notes = events
		// Publishes the startup snapshot (what the store holds now), then
		// every change; closed before the store.
		if err := events.Start(ctx); err != nil {
			return err
		}
		defer events.Close()
	}
	p, err := proxy.New(proxyConfig(cfg), deps, lg.Named("proxy"))
	if err != nil {
		return err
	}

	m, err := startMetrics(cfg, store, p, scrub, g, events, lg)
	if err != nil {
		return err
	}
	defer m.close()

	var cn *clusterNode
	if cfg.clustered() {
		if cn, err = startCluster(ctx, cfg, store, p, lg); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
		m.reg.MustRegister(newRouteCollector(p, cn), newGuardCollector(cn), newTransportCollector(cn))
		// Runs before the store closes (deferred earlier): the arenas are
		// deregistered from the transfer layer first. Queued pushes get
		// what is left of the stop's budget, at most drain_timeout.
		defer func() {
			drain := cfg.DrainTimeout
			if !stopBy.IsZero() {
				drain = max(min(drain, time.Until(stopBy)/3), 0)
			}
			cn.close(drain)
		}()
	}

	srv, err := newEngineServer(cfg, gid, p, m, fdGuard, lg)
	if err != nil {
		return err
	}
	m.reg.MustRegister(newEngineConnCollector(srv, fdGuard))
	if err := srv.Start(ctx); err != nil {
		return err
	}
	<-srv.Ready()
	m.ready.Store(true)
	announce(cfg, m, store, lg, stdout)

	select {
	case <-ctx.Done():
	case <-srv.Done():
		err = errors.New("engine API server stopped unexpectedly")
	case merr := <-m.serveErr:
		err = fmt.Errorf("metrics server stopped: %w", merr)
	}
	// The stop is bounded by shutdown_timeout (sized within a pod's grace
	// period): past it the process exits without finishing, rather than
	// being killed mid-write by the kubelet's SIGKILL.
	stopBy = time.Now().Add(cfg.ShutdownTimeout)
	watchdog = stopWatchdog(cfg.ShutdownTimeout, lg, os.Exit)
	// Not ready first, so that probes and the Service stop sending work.
	m.ready.Store(false)
	lg.Info("shutting down: not ready; leaving the cluster, then draining in-flight calls",
		zap.Duration("drain_timeout", cfg.DrainTimeout), zap.Duration("shutdown_timeout", cfg.ShutdownTimeout))
	// A member leaves before it shuts down, so that peers stop routing here
	// and see it left, not failed.
	cn.leave(min(5*time.Second, cfg.ShutdownTimeout/4))
	if cerr := srv.Close(); cerr != nil {
		lg.Warn("engine API server close", zap.Error(cerr))
	}
	lg.Info("tidepool stopped")
	return err
}

// proxyConfig is the proxy's part of the settings.
func proxyConfig(cfg Config) proxy.Config {
	pcfg := proxy.DefaultConfig()
	pcfg.NodeID = cfg.NodeID
	pcfg.Limits = cfg.limits()
	pcfg.Namespaces = cfg.Namespaces
	pcfg.MaxNamespaces = cfg.MaxNamespaces
	return pcfg
}

// startMetrics registers the collectors of the components built so far
// and, unless metrics_addr is empty, serves them; close stops it.
func startMetrics(cfg Config, store *tiered.Store, p *proxy.Proxy, scrub *dram.Scrubber, g *gpu.GPU, events *kvevents.Publisher, lg *zap.Logger) (*metrics, error) {
	m := newMetrics(store.Stats, lg.Named("metrics"))
	m.reg.MustRegister(newMovementCollector(store))
	m.notes = func() []string { return storeNotes(store) }
	m.reg.MustRegister(newZeroCopyCollector(p))
	m.reg.MustRegister(newScrubCollector(scrub))
	m.reg.MustRegister(newSlotIndexCollector(store.DRAM()))
	m.reg.MustRegister(newGPUCollector(g))
	if events != nil {
		m.reg.MustRegister(newKVEventsCollector(events))
	}
	if cfg.MetricsAddr != "" {
		if err := m.listen(cfg.MetricsAddr); err != nil {
			return nil, fmt.Errorf("metrics on %s: %w", cfg.MetricsAddr, err)
		}
		warnExposedMetrics(lg, cfg.MetricsAddr, m.ln.Addr(), inPod(os.Getenv))
	}
	return m, nil
}

// newEngineServer opens the engine API's sockets (the engine socket, and
// the put and buffer sockets where enabled) and builds its server, which
// owns them from then on, also when it fails.
func newEngineServer(cfg Config, gid int, p *proxy.Proxy, m *metrics, fdGuard *fdlimit.Guard, lg *zap.Logger) (*engineapi.Server, error) {
	ln, err := engineapi.Listen(cfg.Socket, cfg.SocketMode, gid)
	if err != nil {
		return nil, err
	}
	scfg := engineapi.DefaultConfig()
	scfg.MaxRequestBytes = int(cfg.MaxRequestSize)
	scfg.DrainTimeout = cfg.DrainTimeout
	scfg.MaxConnections = cfg.EngineMaxConns
	scfg.IdleTimeout = cfg.EngineIdle
	scfg.Observer = m.observer()
	scfg.Build = buildVersion()
	scfg.MaxBuffersPerConn = cfg.BufMaxPerConn
	scfg.MaxBuffers = cfg.BufMax
	scfg.PutReserveAhead = max(cfg.DRAMCapacity/16, 1<<20)
	scfg.FDGuard = fdGuard
	if cfg.PutSocket {
		if scfg.PutListener, err = engineapi.Listen(cfg.Socket+engineapi.PutSocketSuffix, cfg.SocketMode, gid); err != nil {
			ln.Close()
			return nil, fmt.Errorf("put socket: %w", err)
		}
	}
	if cfg.BufferSocket {
		if scfg.BufferListener, err = engineapi.Listen(cfg.Socket+engineapi.BufferSocketSuffix, cfg.SocketMode, gid); err != nil {
			ln.Close()
			if scfg.PutListener != nil {
				scfg.PutListener.Close()
			}
			return nil, fmt.Errorf("buffer socket: %w", err)
		}
	}
	return engineapi.NewServer(scfg, p, ln, lg.Named("engineapi"))
}

// announce logs and prints that the sidecar serves (the first line of
// standard output, which scripts and tests wait for), then what the SSD
// tier recovered.
func announce(cfg Config, m *metrics, store *tiered.Store, lg *zap.Logger, stdout io.Writer) {
	metricsURL := "disabled"
	if m.ln != nil {
		metricsURL = "http://" + m.ln.Addr().String() + "/metrics"
	}
	lg.Info("tidepool serving",
		zap.String("socket", cfg.Socket),
		zap.String("arena_dir", cfg.ArenaDir),
		zap.String("dram_capacity", units.FormatBytes(cfg.DRAMCapacity)),
		zap.String("metrics", metricsURL),
		zap.String("node_name", cfg.NodeID))
	fmt.Fprintf(stdout, "tidepool %s serving on socket %s (metrics %s)\n", buildVersion(), cfg.Socket, metricsURL)
	reportRecovery(store, lg, stdout)
}
