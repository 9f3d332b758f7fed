// Command tidepool-scale measures tidepool's cluster layer at fleet scale on
// one machine: up to thousands of real cluster members (cluster.Cluster,
// each a real memberlist with its own UDP and TCP sockets on loopback, the
// real node metadata and signatures off) in one process, or spread over
// child processes so that whole processes can be starved with SIGSTOP.
// Placement uses the real cluster.Ring and the real proxy/clusterview.View.
// Nothing else of a sidecar runs: no engine API, no peer API, no transfers,
// no tiers (docs/scale.md says what each figure covers).
//
//	tidepool-scale -nodes 1000 -join-rate 8 -scenario converge,gossip,detect,churn
//	tidepool-scale -nodes 1000 -join-rate 8 -procs 4 -scenario starve
//	tidepool-scale -scenario ring
//
// On a machine of a few cores, start a big fleet with -join-rate: every
// joiner gossips an alive message for each member it learns, so members
// started at full speed saturate the CPU and the fleet collapses into
// suspicions (docs/scale.md).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof" // -pprof
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/tidepool-kv/tidepool/cluster"
)

type options struct {
	nodes     int
	procs     int
	prof      profile
	parallel  int
	kills     int
	window    time.Duration
	starve    time.Duration
	pause     time.Duration
	jsonOut   bool
	childArgs []string // timing overrides passed on to children
	ringSizes []int    // ring scenario: member counts
	ringParts []int    // ring scenario: partition counts
	ringRoll  bool     // ring scenario: rolling restarts too
	nodeBytes int64    // ring scenario: DRAM bytes a node holds (rebalance traffic)
	roll      float64  // churn scenario: the share of the fleet that rolls
	memlimit  int64    // MiB (-memlimit), shared out among children
	gogc      int
}

// dilate multiplies every memberlist timer (-dilate): a harness of few
// cores gives each member k× the CPU time per protocol period. The
// figures it gives are not those of the shipped timings.
var dilate = 1.0

// dilateConfig multiplies c's timers by k.
func dilateConfig(c *cluster.Config, k float64) {
	if k == 1 {
		return
	}
	for _, d := range []*time.Duration{&c.ProbeInterval, &c.ProbeTimeout, &c.GossipInterval, &c.PushPullInterval, &c.TCPTimeout} {
		*d = time.Duration(float64(*d) * k)
	}
}

// ints parses "100,1000" (-ring-sizes, -ring-partitions).
func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		var v int
		if _, err := fmt.Sscan(strings.TrimSpace(f), &v); err != nil || v <= 0 {
			return nil, fmt.Errorf("%q is not a list of positive integers", s)
		}
		out = append(out, v)
	}
	return out, nil
}

func main() {
	var o options
	var scen, prof string
	var child bool
	var join string
	flag.IntVar(&o.nodes, "nodes", 1000, "cluster members")
	flag.IntVar(&o.procs, "procs", 4, "child processes hosting the members (starve scenario)")
	flag.StringVar(&prof, "profile", string(profShipped), "gossip timings: shipped (cluster.DefaultConfig), lan (memberlist's LAN defaults, tidepool's before 2026-12-06), local (the tests')")
	flag.IntVar(&o.parallel, "parallel", 8, "members started at once")
	flag.IntVar(&o.kills, "kills", 5, "members killed one after another (detect scenario)")
	flag.DurationVar(&o.window, "window", 10*time.Second, "steady-state window for the gossip byte count")
	flag.DurationVar(&o.starve, "starve-for", 30*time.Second, "how long the starve scenario stops processes")
	flag.DurationVar(&o.pause, "pause", 300*time.Millisecond, "how long each SIGSTOP lasts (starve scenario)")
	flag.StringVar(&scen, "scenario", "converge,detect,gossip", "comma-separated: converge, detect, gossip, starve, ring, churn")
	flag.BoolVar(&o.jsonOut, "json", false, "one JSON object per figure instead of text")
	flag.Float64Var(&joinRate, "join-rate", 0, "start at most this many members a second (0: as fast as -parallel allows)")
	var compress string
	flag.StringVar(&compress, "compress", "", "on or off: override the profile's gossip compression (cluster.Config.Compression)")
	flag.BoolVar(&progress, "v", false, "report progress on stderr while waiting for views to converge")
	flag.BoolVar(&child, "child", false, "internal: host members for a parent process")
	flag.StringVar(&join, "join", "", "internal: a member to join (child)")
	var pi, pt, gi, pp time.Duration
	var sm, smax, gn int
	flag.DurationVar(&pi, "probe-interval", 0, "override the profile's ProbeInterval")
	flag.DurationVar(&pt, "probe-timeout", 0, "override the profile's ProbeTimeout")
	flag.DurationVar(&gi, "gossip-interval", 0, "override the profile's GossipInterval")
	flag.DurationVar(&pp, "push-pull-interval", 0, "override the profile's PushPullInterval")
	flag.IntVar(&sm, "suspicion-mult", 0, "override the profile's SuspicionMult")
	flag.IntVar(&smax, "suspicion-max-mult", 0, "override the profile's SuspicionMaxTimeoutMult")
	flag.IntVar(&gn, "gossip-nodes", 0, "override the profile's GossipNodes")
	var ringSizes, ringParts string
	var nodeGiB int64
	flag.StringVar(&ringSizes, "ring-sizes", "100,1000,5000", "ring scenario: member counts")
	flag.StringVar(&ringParts, "ring-partitions", "8192,65536", "ring scenario: partition counts")
	flag.BoolVar(&o.ringRoll, "ring-roll", true, "ring scenario: also roll 10% of the members one at a time (a rebuild each)")
	flag.Int64Var(&nodeGiB, "node-gib", 64, "ring scenario: GiB of DRAM blocks a node holds, for the rebalance traffic a join causes")
	var cpuprofile, pprofAddr string
	flag.StringVar(&cpuprofile, "cpuprofile", "", "write a CPU profile of this process to this file")
	flag.StringVar(&pprofAddr, "pprof", "", "serve net/http/pprof on this loopback address (e.g. 127.0.0.1:6060)")
	gogc := flag.Int("gogc", 400, "the harness's GOGC: its collector works for all members at once (a real member has a heap of its own); -1: off, collect only near -memlimit")
	memlimit := flag.Int64("memlimit", 0, "the harness's soft memory limit in MiB (debug.SetMemoryLimit; 0: none), shared out among -procs children; with -gogc -1 the collector runs only near it")
	flag.Float64Var(&dilate, "dilate", 1, "time dilation k: every memberlist timer (probe interval and timeout, gossip, push/pull, TCP timeout) × k, after the profile and overrides. Not a shipped timing: each member gets k× the CPU time per protocol period")
	flag.Float64Var(&o.roll, "roll", 0.10, "churn scenario: the share of the fleet that rolls at once")
	flag.Parse()
	if *gogc < 0 && *memlimit <= 0 {
		fatal(errors.New("-gogc -1 needs -memlimit: without a limit the heap grows until the machine runs out"))
	}
	if dilate < 1 || o.roll <= 0 || o.roll > 0.5 {
		fatal(fmt.Errorf("-dilate %g (want >= 1) or -roll %g (want in (0, 0.5])", dilate, o.roll))
	}
	o.memlimit = *memlimit
	o.gogc = *gogc
	debug.SetGCPercent(*gogc)
	if *memlimit > 0 {
		debug.SetMemoryLimit(*memlimit << 20)
	}
	if pprofAddr != "" {
		if h, _, err := net.SplitHostPort(pprofAddr); err != nil || net.ParseIP(h) == nil || !net.ParseIP(h).IsLoopback() {
			fatal(fmt.Errorf("-pprof %q: want a loopback ip:port", pprofAddr))
		}
		go func() { fmt.Fprintln(os.Stderr, "tidepool-scale: pprof:", http.ListenAndServe(pprofAddr, nil)) }()
	}
	if cpuprofile != "" {
		pf, err := os.Create(cpuprofile)
		if err != nil {
			fatal(err)
		}
		if err := pprof.StartCPUProfile(pf); err != nil {
			fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	var childArgs []string
	flag.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "compress", "probe-interval", "probe-timeout", "gossip-interval", "push-pull-interval", "suspicion-mult", "suspicion-max-mult", "gossip-nodes", "dilate":
			childArgs = append(childArgs, "-"+f.Name, f.Value.String())
		}
	})
	o.childArgs = childArgs
	switch compress {
	case "", "on", "off":
	default:
		fatal(fmt.Errorf("-compress %q: want on or off", compress))
	}
	overrides = func(c *cluster.Config) {
		if compress != "" {
			c.Compression = compress == "on"
		}
		for _, d := range []struct {
			p *time.Duration
			v time.Duration
		}{{&c.ProbeInterval, pi}, {&c.ProbeTimeout, pt}, {&c.GossipInterval, gi}, {&c.PushPullInterval, pp}} {
			if d.v > 0 {
				*d.p = d.v
			}
		}
		for _, d := range []struct {
			p *int
			v int
		}{{&c.SuspicionMult, sm}, {&c.SuspicionMaxTimeoutMult, smax}, {&c.GossipNodes, gn}} {
			if d.v > 0 {
				*d.p = d.v
			}
		}
		dilateConfig(c, dilate)
	}
	o.nodeBytes = nodeGiB << 30
	var err error
	if o.ringSizes, err = ints(ringSizes); err != nil {
		fatal(fmt.Errorf("-ring-sizes: %w", err))
	}
	if o.ringParts, err = ints(ringParts); err != nil {
		fatal(fmt.Errorf("-ring-partitions: %w", err))
	}
	o.prof = profile(prof)
	if _, err := o.prof.config("x"); err != nil {
		fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// Closing a thousand members of a starved fleet can take
		// minutes: an interrupted run gets 10 s to finish, then ends.
		<-ctx.Done()
		time.Sleep(10 * time.Second)
		fatal(errors.New("interrupted"))
	}()
	if child {
		if err := runChild(ctx, o, join); err != nil {
			fatal(err)
		}
		return
	}
	r := &reporter{json: o.jsonOut}
	r.note("profile", string(o.prof))
	if dilate != 1 {
		r.note("dilate", fmt.Sprintf("%g: every memberlist timer × %g, NOT the shipped timings", dilate, dilate))
	}
	for _, s := range strings.Split(scen, ",") {
		var err error
		switch strings.TrimSpace(s) {
		case "converge", "detect", "gossip", "churn":
			// run together on one fleet, below
			continue
		case "starve":
			err = runStarve(ctx, o, r)
		case "ring":
			err = runRing(o, r)
		default:
			err = fmt.Errorf("unknown scenario %q", s)
		}
		if err != nil {
			fatal(err)
		}
	}
	if want := fleetScenarios(scen); len(want) > 0 {
		if err := runFleet(ctx, o, want, r); err != nil {
			fatal(err)
		}
	}
}

func fleetScenarios(scen string) map[string]bool {
	out := map[string]bool{}
	for _, s := range strings.Split(scen, ",") {
		switch s = strings.TrimSpace(s); s {
		case "converge", "detect", "gossip", "churn":
			out[s] = true
		}
	}
	return out
}

func fatal(err error) {
	pprof.StopCPUProfile() // a profile of a failed run is the one most wanted
	fmt.Fprintln(os.Stderr, "tidepool-scale:", err)
	os.Exit(1)
}

// reporter prints figures as aligned text or JSON lines.
type reporter struct{ json bool }

func (r *reporter) note(k, v string) {
	if r.json {
		b, _ := json.Marshal(map[string]string{k: v})
		fmt.Println(string(b))
		return
	}
	fmt.Printf("# %s: %s\n", k, v)
}

func (r *reporter) fig(name string, v float64, unit string, extra ...any) {
	if r.json {
		m := map[string]any{"figure": name, "value": v, "unit": unit}
		for i := 0; i+1 < len(extra); i += 2 {
			m[fmt.Sprint(extra[i])] = extra[i+1]
		}
		b, _ := json.Marshal(m)
		fmt.Println(string(b))
		return
	}
	var sb strings.Builder
	for i := 0; i+1 < len(extra); i += 2 {
		fmt.Fprintf(&sb, " %v=%v", extra[i], extra[i+1])
	}
	fmt.Printf("%-44s %12.4g %-8s%s\n", name, v, unit, sb.String())
}

// childStatus is what a child prints, one JSON line every 250 ms.
type childStatus struct {
	Seed          string `json:"seed,omitempty"`
	Members       int    `json:"members"`
	LiveMin       int    `json:"live_min"`
	RefuteSuspect int64  `json:"refute_suspect"`
	RefuteDead    int64  `json:"refute_dead"`
	MarkedFailed  int64  `json:"marked_failed"`
	Failed        int    `json:"failed"` // members some member of this child holds failed
}

// runChild hosts o.nodes members, joined to join (or seeding the fleet),
// and reports on stdout until stdin closes or a signal arrives.
func runChild(ctx context.Context, o options, join string) error {
	f := newFleet(o.prof, fmt.Sprintf("p%d-", os.Getpid()))
	defer f.close()
	var seeds []string
	if join != "" {
		seeds = []string{join}
	}
	first, err := f.add(ctx, 1, 1, seeds)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	_ = enc.Encode(childStatus{Seed: first[0].c.Addr()})
	if _, err := f.add(ctx, o.nodes-1, o.parallel, seeds); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
		}
		close(done)
	}()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	failedNow := 0
	for tick := 0; ; tick++ {
		ns := f.all()
		st := childStatus{Members: len(ns), LiveMin: liveMin(ns)}
		// Copying every member's table is O(N²): every 2 s only.
		full := tick%8 == 0
		failed := map[string]bool{}
		for _, nd := range ns {
			st.RefuteSuspect += nd.log.refuteSuspect.Load()
			st.RefuteDead += nd.log.refuteDead.Load()
			st.MarkedFailed += nd.log.markedFailed.Load()
			if !full {
				continue
			}
			for _, m := range nd.c.Members() {
				if m.State == cluster.StateFailed {
					failed[m.Name] = true
				}
			}
		}
		if full {
			failedNow = len(failed)
		}
		st.Failed = failedNow
		if err := enc.Encode(st); err != nil {
			return nil // the parent went away
		}
		select {
		case <-ctx.Done():
			return nil
		case <-done:
			return nil
		case <-t.C:
		}
	}
}
