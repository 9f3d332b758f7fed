package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tidepool-kv/tidepool/cluster"
	"github.com/tidepool-kv/tidepool/internal/hdr"
	"github.com/tidepool-kv/tidepool/proxy/clusterview"
)

// runFleet starts o.nodes members in this process and measures the cold
// start, a join, the steady-state gossip bytes and failure detection.
func runFleet(ctx context.Context, o options, want map[string]bool, r *reporter) error {
	f := newFleet(o.prof, "n")
	defer f.close()
	t0, cpu0, rcv0 := time.Now(), cpuTime(), udpRcvbufErrors()
	if _, err := f.add(ctx, 1, 1, nil); err != nil {
		return err
	}
	if _, err := f.add(ctx, o.nodes-1, o.parallel, nil); err != nil {
		return err
	}
	started := time.Since(t0)
	r.fig("cold start: all members started", started.Seconds(), "s", "members", o.nodes)
	conv, err := waitConverged(ctx, f.all(), o.nodes, 3*time.Minute)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		// A view a member short (an alive message lost) completes only
		// at a push/pull, minutes later at 1,000 members: say so and
		// measure the rest on the fleet as it is.
		r.note("cold start", err.Error())
	} else {
		r.fig("cold start: then every member sees all", conv.Seconds(), "s", "members", o.nodes)
	}
	wall := time.Since(t0)
	r.fig("cold start: harness CPU used", (cpuTime() - cpu0).Seconds(), "s",
		"cores_busy", fmt.Sprintf("%.2f", (cpuTime()-cpu0).Seconds()/wall.Seconds()), "of", runtime.NumCPU(),
		"udp_rcvbuf_drops", udpRcvbufErrors()-rcv0, "handler_queue_drops", queueDrops(f.all()),
		"failed_starts", f.failed.Load())
	if want["converge"] {
		t := time.Now()
		added, err := f.add(ctx, 1, 1, nil)
		if err != nil {
			return err
		}
		if d, err := waitSeen(ctx, f.all(), added[0].name, time.Minute); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.note("join", err.Error()) // the rest is measured on the fleet as it is
		} else {
			r.fig("join: every member sees the new one", time.Since(t).Seconds(), "s", "after_start_s", fmt.Sprintf("%.3f", d.Seconds()))
		}
	}
	if want["gossip"] {
		// Let the join's broadcasts die down first.
		time.Sleep(2 * time.Second)
		n := len(f.all())
		s0, c0, d0 := sink.snapshot(), cpuTime(), udpRcvbufErrors()
		time.Sleep(o.window)
		s1, c1, d1 := sink.snapshot(), cpuTime(), udpRcvbufErrors()
		u0, t0 := gossipBytes(s0)
		u1, t1 := gossipBytes(s1)
		secs := o.window.Seconds()
		r.fig("gossip: UDP bytes sent per member per second", (u1-u0)/float64(n)/secs, "B/s", "members", n)
		r.fig("gossip: TCP bytes sent per member per second", (t1-t0)/float64(n)/secs, "B/s", "members", n)
		// What a member costs in CPU when nothing changes: probes, acks
		// and the process's share of GC. A real member has a machine of
		// its own; the harness has runtime.NumCPU() cores for all.
		perMember := (c1 - c0).Seconds() / float64(n) / secs
		r.fig("gossip: CPU per member (steady state)", perMember*1000, "ms/s",
			"harness_cores_busy", fmt.Sprintf("%.2f", perMember*float64(n)), "udp_rcvbuf_drops", d1-d0)
		var ru runtime.MemStats
		runtime.ReadMemStats(&ru)
		r.fig("harness heap in use per member", float64(ru.HeapInuse)/float64(n)/1024, "KiB")
	}
	if want["detect"] {
		if err := detect(ctx, f, o, r); err != nil {
			return err
		}
	}
	if want["churn"] {
		if err := runChurn(ctx, f, o, r); err != nil {
			return err
		}
	}
	return nil
}

// detect kills o.kills members one at a time (their sockets close with no
// leave: a crash as peers see it) and records, for every other member,
// when it held the killed one failed (Member.Since, its own clock).
func detect(ctx context.Context, f *fleet, o options, r *reporter) error {
	var all, firsts, lasts []float64
	for k := range o.kills {
		ns := f.all()
		victim := ns[rand.IntN(len(ns))]
		lm0 := liveMin(ns)
		s0 := sink.snapshot()
		t0 := time.Now()
		// The observers are the members that knew the victim alive.
		var obs []*node
		for _, nd := range ns {
			if m, ok := nd.c.Member(victim.name); ok && m.State.Live() && nd != victim {
				obs = append(obs, nd)
			}
		}
		f.remove(victim, false)
		seen := make([]float64, len(obs))
		for i := range seen {
			seen[i] = -1
		}
		deadline := time.Now().Add(2 * time.Minute)
		for left := len(obs); left > 0; {
			if time.Now().After(deadline) {
				return fmt.Errorf("kill %d: %d of %d members still hold %s live after 2 min", k, left, len(obs), victim.name)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
			for i, nd := range obs {
				if seen[i] >= 0 {
					continue
				}
				if m, ok := nd.c.Member(victim.name); ok && (m.State == cluster.StateFailed || m.State == cluster.StateLeft) {
					seen[i] = m.Since.Sub(t0).Seconds()
					left--
				}
			}
		}
		s1 := sink.snapshot()
		slices.Sort(seen)
		all = append(all, seen...)
		firsts = append(firsts, seen[0])
		lasts = append(lasts, seen[len(seen)-1])
		r.fig(fmt.Sprintf("detect kill %d: first / median / last member", k+1), seen[len(seen)/2], "s",
			"first", fmt.Sprintf("%.2f", seen[0]), "last", fmt.Sprintf("%.2f", seen[len(seen)-1]),
			"suspect_msgs", s1["memberlist.msg.suspect"]-s0["memberlist.msg.suspect"])
		// Settle before the next kill: every view back to its size
		// before this one, less the victim.
		if _, err := waitConverged(ctx, obs, lm0-1, time.Minute); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.note(fmt.Sprintf("after kill %d", k+1), err.Error())
		}
	}
	slices.Sort(all)
	slices.Sort(firsts)
	slices.Sort(lasts)
	q := func(v []float64, p float64) float64 { return v[min(len(v)-1, int(p*float64(len(v))))] }
	r.fig("detect: first member to know (median of kills)", q(firsts, 0.5), "s", "kills", o.kills)
	r.fig("detect: every member knows (median of kills)", q(lasts, 0.5), "s", "max", fmt.Sprintf("%.2f", lasts[len(lasts)-1]))
	r.fig("detect: all (member, kill) pairs p50", q(all, 0.5), "s", "p99", fmt.Sprintf("%.2f", q(all, 0.99)))
	return nil
}

// runStarve spreads o.nodes members over o.procs child processes, then,
// for o.starve, stops a random child for o.pause (SIGSTOP, SIGCONT) again
// and again: every member of that process is starved at once. A control
// window of the same length with no stops comes first. False suspicions
// are counted where they are certain: a member that hears it is suspected
// (or declared dead) while it is alive refutes it, and memberlist logs
// the refutation; a member some member holds failed at the end was
// falsely declared dead (nothing was killed).
func runStarve(ctx context.Context, o options, r *reporter) error {
	if o.procs < 2 {
		return fmt.Errorf("starve needs -procs >= 2")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	per := o.nodes / o.procs
	type kid struct {
		cmd  *exec.Cmd
		last atomic.Pointer[childStatus]
	}
	kids := make([]*kid, o.procs)
	seed := ""
	seedCh := make(chan string, 1)
	defer func() {
		for _, k := range kids {
			if k != nil && k.cmd.Process != nil {
				_ = k.cmd.Process.Signal(syscall.SIGCONT)
				_ = k.cmd.Process.Kill()
				_ = k.cmd.Wait()
			}
		}
	}()
	for i := range kids {
		args := []string{"-child", "-nodes", fmt.Sprint(per), "-profile", string(o.prof), "-parallel", fmt.Sprint(o.parallel), "-gogc", fmt.Sprint(o.gogc)}
		if o.memlimit > 0 {
			args = append(args, "-memlimit", fmt.Sprint(max(1, o.memlimit/int64(o.procs))))
		}
		args = append(args, o.childArgs...)
		if joinRate > 0 { // the fleet's rate, shared by the children
			args = append(args, "-join-rate", fmt.Sprint(joinRate/float64(o.procs)))
		}
		if seed != "" {
			args = append(args, "-join", seed)
		}
		cmd := exec.CommandContext(ctx, exe, args...)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if _, err := cmd.StdinPipe(); err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		k := &kid{cmd: cmd}
		kids[i] = k
		go func(first bool) {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var st childStatus
				if json.Unmarshal(sc.Bytes(), &st) != nil {
					continue
				}
				if st.Seed != "" {
					if first {
						seedCh <- st.Seed
					}
					continue
				}
				k.last.Store(&st)
			}
		}(i == 0)
		if i == 0 {
			select {
			case seed = <-seedCh:
			case <-time.After(30 * time.Second):
				return fmt.Errorf("first child did not start")
			}
		}
	}
	total := per * o.procs
	status := func() (live int, st childStatus) {
		live = -1
		for _, k := range kids {
			s := k.last.Load()
			if s == nil {
				return -1, st
			}
			if live < 0 || s.LiveMin < live {
				live = s.LiveMin
			}
			st.RefuteSuspect += s.RefuteSuspect
			st.RefuteDead += s.RefuteDead
			st.MarkedFailed += s.MarkedFailed
			st.Failed = max(st.Failed, s.Failed)
		}
		return live, st
	}
	t0 := time.Now()
	limit := 3 * time.Minute // after the last start, at -join-rate
	if joinRate > 0 {
		limit += time.Duration(float64(total) / joinRate * float64(time.Second))
	}
	next := t0.Add(5 * time.Second)
	short := false
	for {
		live, _ := status()
		if live == total {
			break
		}
		if progress && time.Now().After(next) {
			next = next.Add(5 * time.Second)
			fmt.Fprintf(os.Stderr, "# %5.1f s: smallest view %d of %d\n", time.Since(t0).Seconds(), live, total)
		}
		if time.Since(t0) > limit {
			if live < 0 || live < total*9/10 {
				return fmt.Errorf("children did not converge: smallest view %d of %d", live, total)
			}
			// A view or two short (an alive message lost): a
			// push/pull repairs it in minutes; starve the fleet as it is.
			r.note("starve", fmt.Sprintf("not converged in %v: smallest view %d of %d", limit, live, total))
			short = true
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !short {
		r.fig("starve: members converged", time.Since(t0).Seconds(), "s", "members", total, "procs", o.procs)
	}
	time.Sleep(3 * time.Second) // let the join's suspicions (if any) settle
	window := func(stops bool) (n int, d childStatus) {
		_, s0 := status()
		end := time.Now().Add(o.starve)
		for time.Now().Before(end) {
			if stops {
				k := kids[rand.IntN(len(kids))]
				_ = k.cmd.Process.Signal(syscall.SIGSTOP)
				time.Sleep(o.pause)
				_ = k.cmd.Process.Signal(syscall.SIGCONT)
				n++
			}
			time.Sleep(time.Duration(rand.Int64N(int64(2 * o.pause))))
		}
		// Suspicions raised late still refute or expire (the suspicion
		// timeout grows with -dilate).
		time.Sleep(time.Duration(5 * dilate * float64(time.Second)))
		_, s1 := status()
		return n, childStatus{
			RefuteSuspect: s1.RefuteSuspect - s0.RefuteSuspect,
			RefuteDead:    s1.RefuteDead - s0.RefuteDead,
			MarkedFailed:  s1.MarkedFailed - s0.MarkedFailed,
			Failed:        s1.Failed,
		}
	}
	_, c := window(false)
	r.fig("starve control (no stops): false suspicions", float64(c.RefuteSuspect), "", "refuted_deaths", c.RefuteDead, "marked_failed", c.MarkedFailed, "failed_now", c.Failed)
	n, d := window(true)
	r.fig("starve: false suspicions (refuted)", float64(d.RefuteSuspect), "", "stops", n, "pause", o.pause, "members_per_stop", per)
	r.fig("starve: false deaths", float64(d.RefuteDead), "", "marked_failed", d.MarkedFailed, "failed_now", d.Failed)
	return nil
}

// runRing times ring rebuilds and counts the partitions that change owner
// on membership changes, at 100, 1,000 and 5,000 members.
func runRing(o options, r *reporter) error {
	for _, n := range o.ringSizes {
		for _, parts := range o.ringParts {
			cfg := cluster.RingConfig{Partitions: parts, Replicas: 2}
			names := make([]string, n)
			for i := range names {
				names[i] = fmt.Sprintf("tidepool-%06d", i)
			}
			var ms0, ms1 runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms0)
			const reps = 3
			var best time.Duration
			var ring *cluster.Ring
			for range reps {
				t := time.Now()
				var err error
				if ring, err = cluster.NewRing(names, cfg); err != nil {
					return err
				}
				if d := time.Since(t); best == 0 || d < best {
					best = d
				}
			}
			runtime.ReadMemStats(&ms1)
			tag := []any{"members", n, "partitions", parts}
			r.fig("ring rebuild (best of 3)", float64(best.Microseconds())/1000, "ms", append(tag, "allocs", (ms1.Mallocs-ms0.Mallocs)/reps, "bytes", (ms1.TotalAlloc-ms0.TotalAlloc)/reps)...)
			load := ring.Load()
			mx := 0
			for _, v := range load {
				mx = max(mx, v)
			}
			r.fig("ring max/mean load (first owners)", float64(mx)/(float64(parts)/float64(n)), "", tag...)
			// Join, leave, and a rolling restart of 10 % of the fleet
			// under new names (a Deployment's pods), one pod at a time.
			join, _ := cluster.NewRing(append(slices.Clone(names), "tidepool-new"), cfg)
			leave, _ := cluster.NewRing(names[1:], cfg)
			r.fig("moved on a join: primary / owner set", moved(ring, join, 1), "frac", append(tag, "owner_set", fmt.Sprintf("%.4f", moved(ring, join, 2)), "ideal", fmt.Sprintf("%.4f", 1/float64(n+1)))...)
			r.fig("moved on a leave: primary / owner set", moved(ring, leave, 1), "frac", append(tag, "owner_set", fmt.Sprintf("%.4f", moved(ring, leave, 2)), "ideal", fmt.Sprintf("%.4f", 1/float64(n)))...)
			// The rebalance traffic a join causes (computed, not run):
			// every node pushes the blocks it holds whose owner set
			// changed to their new owners, at most rebalance_max_bytes
			// a pass, at rebalance_rate.
			if o.nodeBytes > 0 {
				f := moved(ring, join, 2)
				per := min(f*float64(o.nodeBytes), float64(rebalanceMaxBytes))
				r.fig("rebalance after a join: pushed per node", per/(1<<20), "MiB", append(tag,
					"node_bytes_GiB", o.nodeBytes>>30, "fleet_GiB", fmt.Sprintf("%.1f", per*float64(n)/(1<<30)),
					"seconds_at_rebalance_rate", fmt.Sprintf("%.1f", per/rebalanceRate))...)
			}
			if o.ringRoll && (n <= 1000 || parts == cluster.DefaultRingConfig().Partitions) {
				roll := n / 10
				cur := slices.Clone(names)
				prev := ring
				var sum float64
				for i := range roll {
					cur[i] = fmt.Sprintf("tidepool-new-%06d", i)
					next, _ := cluster.NewRing(cur, cfg)
					sum += moved(prev, next, 1)
					prev = next
				}
				r.fig("rolling restart of 10%: primary moves summed over steps", sum, "frac", append(tag, "net", fmt.Sprintf("%.4f", moved(ring, prev, 1)), "steps", roll)...)
			}
		}
	}
	return nil
}

// The rebalancer's shipped bounds (docs/config.md: rebalance_rate,
// rebalance_max_bytes), for the computed rebalance traffic.
const (
	rebalanceRate     = 64 << 20 // bytes a second per node
	rebalanceMaxBytes = 1 << 30  // bytes a pass
)

// moved is the fraction of partitions whose first depth owners differ
// (as a set) between a and b.
func moved(a, b *cluster.Ring, depth int) float64 {
	p := a.Config().Partitions
	n := 0
	for i := range p {
		x, y := a.PartitionOwners(i, depth), b.PartitionOwners(i, depth)
		slices.Sort(x)
		slices.Sort(y)
		if !slices.Equal(x, y) {
			n++
		}
	}
	return float64(n) / float64(p)
}

// runChurn measures clusterview.View.Owners, the read path's placement
// call, while o.roll of the fleet f (-roll, 10 %) rolls at once (leaves
// gracefully and is replaced by new members): its latency against a
// quiet window, and the ring rebuilds the view made.
func runChurn(ctx context.Context, f *fleet, o options, r *reporter) error {
	if _, err := waitConverged(ctx, f.all(), len(f.all()), 3*time.Minute); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.note("churn", err.Error())
	}
	obs := f.all()[0]
	v, err := clusterview.New(obs.c, clusterview.Config{JoinSettle: -1}, nil)
	if err != nil {
		return err
	}
	if err := v.Start(ctx); err != nil {
		return err
	}
	defer v.Close()
	measure := func(d time.Duration, during func()) (*hdr.Histogram, clusterview.Stats) {
		const readers = 2
		hs := make([]*hdr.Histogram, readers)
		var stop atomic.Bool
		var wg sync.WaitGroup
		for i := range hs {
			hs[i] = hdr.New()
			wg.Add(1)
			go func(h *hdr.Histogram) {
				defer wg.Done()
				key := make([]byte, 16)
				for !stop.Load() {
					for j := range key {
						key[j] = byte(rand.Uint32())
					}
					t := time.Now()
					_ = v.Owners("ns", key)
					h.Record(time.Since(t).Nanoseconds())
				}
			}(hs[i])
		}
		s0 := v.Stats()
		end := time.Now().Add(d)
		if during != nil {
			during()
		}
		time.Sleep(time.Until(end))
		stop.Store(true)
		wg.Wait()
		for _, h := range hs[1:] {
			hs[0].Merge(h)
		}
		s1 := v.Stats()
		s1.Rebuilds -= s0.Rebuilds
		s1.Events -= s0.Events
		return hs[0], s1
	}
	show := func(name string, h *hdr.Histogram, st clusterview.Stats) {
		r.fig(name+": Owners p50", float64(h.ValueAtQuantile(0.5))/1000, "us",
			"p99_us", fmt.Sprintf("%.1f", float64(h.ValueAtQuantile(0.99))/1000),
			"p999_us", fmt.Sprintf("%.1f", float64(h.ValueAtQuantile(0.999))/1000),
			"max_ms", fmt.Sprintf("%.2f", float64(h.Max())/1e6),
			"reads", h.Count(), "events", st.Events, "rebuilds", st.Rebuilds)
	}
	h, st := measure(5*time.Second, nil)
	show("quiet", h, st)
	roll := max(1, int(o.roll*float64(o.nodes)))
	h, st = measure(20*time.Second, func() {
		ns := f.all()[1:]
		rand.Shuffle(len(ns), func(i, j int) { ns[i], ns[j] = ns[j], ns[i] })
		var wg sync.WaitGroup
		for _, nd := range ns[:roll] {
			wg.Add(1)
			go func() { defer wg.Done(); f.remove(nd, true) }()
		}
		wg.Wait()
		if _, err := f.add(ctx, roll, o.parallel, nil); err != nil {
			fmt.Fprintln(os.Stderr, "churn: add:", err)
		}
	})
	show(fmt.Sprintf("churn (%d members roll at once)", roll), h, st)
	return nil
}
