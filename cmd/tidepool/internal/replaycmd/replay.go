package replaycmd

import (
	"bufio"
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tidepool-kv/tidepool/cache/evict"
	"github.com/tidepool-kv/tidepool/cache/evict/sim"
	"github.com/tidepool-kv/tidepool/client"
	"github.com/tidepool-kv/tidepool/cmd/tidepool/internal/chart"
	"github.com/tidepool-kv/tidepool/cmd/tidepool/internal/cli"
	"github.com/tidepool-kv/tidepool/internal/replay"
	"github.com/tidepool-kv/tidepool/internal/trace"
	"github.com/tidepool-kv/tidepool/internal/units"
	"github.com/tidepool-kv/tidepool/protocol"
)

const replayLong = `Replays a Mooncake-format request trace (one JSON object per line with
hash_ids, one id per 512-token block) against real sidecars, the way engines
would: per request, Lookup the chained block keys, count the longest present
prefix as hits, read those blocks, then Put the missing ones. Reports the
prefix hit rate (hit blocks / all blocks), per-node hit rates, bytes moved
and time.

  tidepool replay --nodes 1 --capacity-tokens 3M --policy prefix
  tidepool replay --sockets /run/a.sock,/run/b.sock --route prefix --json
  tidepool replay --capacity-tokens 1M,3M,10M --policy lru,prefix --plot hit.png
  tidepool replay --sim --capacity-tokens 500k,1M,3M,10M --policy lru,prefix --references --plot hit.png

With --nodes, replay starts that many local sidecars itself (this binary's
"serve", DRAM tier only) with capacity = capacity-tokens / block-tokens blocks
of --block-bytes each, and stops them at the end; lists in --capacity-tokens
and --policy sweep every combination (fresh sidecars each). --sim runs the
same sweep in the offline simulator (cache/evict/sim) instead: much faster,
labelled "simulated".`

type replayFlags struct {
	tracePath, sockets, capacities, blockBytes, route, scope, policies, ns, plot, progress string
	nodes, requests, blockTokens                                                           int
	speed, loadSlack                                                                       float64
	json, simulate, references, noFetch, withSim, checkChains                              bool
	timeout                                                                                time.Duration
	policyTable                                                                            map[string]evict.Factory // the eviction policies --policy may name
}

// replayRun is one replay of a sweep; the JSON names are the stable
// interface of `tidepool replay --json`.
type replayRun struct {
	Policy         string `json:"policy"`
	CapacityTokens int64  `json:"capacity_tokens"`
	CapacityBlocks int64  `json:"capacity_blocks"`
	BlockBytes     int64  `json:"block_bytes"`
	Route          string `json:"route"`
	Scope          string `json:"scope"`
	Simulated      bool   `json:"simulated"`
	Trace          string `json:"trace"`
	replay.Result
	// BlocksAtEnd is each sidecar's block count after the replay (never
	// more than CapacityBlocks); empty when simulated or on --sockets.
	BlocksAtEnd []int64 `json:"blocks_at_end,omitempty"`
}

// footprint is the DRAM tier's footprint of a value (cache/dram: values up
// to 32 KiB take size classes 512 B…32 KiB, four per power of two; larger
// values whole 64 KiB pages).
func footprint(size int64) int64 {
	const page = 64 << 10
	if size <= page/2 {
		for base := int64(512); base <= page/2; base *= 2 {
			for i := int64(0); i < 4; i++ {
				if c := base + base/4*i; c >= size && c <= page/2 {
					return c
				}
			}
		}
	}
	return (size + page - 1) / page * page
}

// sidecarNode adapts the client to replay.Node.
type sidecarNode struct {
	c        *client.Client
	ns       string
	scope    client.Scope
	maxBatch int
}

func (n *sidecarNode) Lookup(ctx context.Context, keys [][]byte) (int, error) {
	total := 0
	for len(keys) > 0 {
		k := keys[:min(len(keys), n.maxBatch)]
		m, err := n.c.Lookup(ctx, n.ns, k, n.scope)
		if err != nil {
			return total, err
		}
		total += m
		if m < len(k) {
			break
		}
		keys = keys[len(k):]
	}
	return total, nil
}

// Fetch reads the hit prefix. In cluster scope it first asks which of
// those blocks the node holds itself: the others are fetched from their
// owners by the read, and their bytes count as moved between nodes. A
// block that does not come back OK is counted by its code.
func (n *sidecarNode) Fetch(ctx context.Context, keys [][]byte) (replay.Fetched, error) {
	var f replay.Fetched
	for len(keys) > 0 {
		k := keys[:min(len(keys), n.maxBatch)]
		var local []bool
		if n.scope == client.ScopeCluster {
			var err error
			if local, err = n.c.Present(ctx, n.ns, k, client.ScopeLocal); err != nil {
				return f, err
			}
		}
		res, err := n.c.BatchGet(ctx, n.ns, k, n.scope)
		if err != nil {
			return f, err
		}
		for i, r := range res {
			if r.Code != client.CodeOK {
				if f.Unread == nil {
					f.Unread = map[string]int64{}
				}
				f.Unread[r.Code.String()]++
				continue
			}
			f.Blocks++
			f.Bytes += int64(len(r.Value))
			if local != nil && i < len(local) && !local[i] {
				f.Remote += int64(len(r.Value))
			}
		}
		if len(res) < len(k) {
			if f.Unread == nil {
				f.Unread = map[string]int64{}
			}
			f.Unread["no answer"] += int64(len(k) - len(res))
		}
		keys = keys[len(k):]
	}
	return f, nil
}

func (n *sidecarNode) Store(ctx context.Context, keys [][]byte, firstDepth int, value []byte, out []replay.PutOutcome) error {
	items := make([]client.Item, 0, min(len(keys), n.maxBatch))
	for len(keys) > 0 {
		k := keys[:min(len(keys), n.maxBatch)]
		items = items[:0]
		for i, key := range k {
			items = append(items, client.Item{Key: key, Value: value, Depth: int32(firstDepth + i)})
		}
		errs, err := n.c.BatchPut(ctx, n.ns, items)
		if err != nil {
			return err
		}
		for i, e := range errs {
			switch client.CodeOf(e) {
			case client.CodeOK:
				out[i] = replay.PutStored
			case client.CodeExists:
				out[i] = replay.PutPresent
			case client.CodeNoSpace:
				out[i] = replay.PutRefused
			default:
				out[i] = replay.PutFailed
			}
		}
		keys, out = keys[len(k):], out[len(k):]
		firstDepth += len(k)
	}
	return nil
}

// blockKey chains trace ids with the canonical key: each hash id is one
// "token" of a one-token block, so keys are prefix-chained like an
// engine's.
func blockKey(parent []byte, id uint64) []byte {
	toks := []uint32{uint32(id)}
	if id>>32 != 0 {
		toks = append(toks, uint32(id>>32))
	}
	k := protocol.BlockKey(parent, toks, nil)
	return k[:]
}

// localSidecar is a `tidepool serve` child started by replay.
type localSidecar struct {
	cmd    *exec.Cmd
	dir    string
	socket string
	stderr bytes.Buffer
	exited chan error
}

// freeAddr returns a free loopback TCP address.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// writeClusterCreds writes a random gossip key and peer secret into dir and
// returns the serve flags naming them.
func writeClusterCreds(dir string) ([]string, error) {
	var args []string
	for _, f := range []struct{ flag, name string }{{"--gossip-key-file", "gossip.key"}, {"--peer-secret-file", "peer.secret"}} {
		b := make([]byte, 32)
		if _, err := crand.Read(b); err != nil {
			return nil, err
		}
		path := filepath.Join(dir, f.name)
		if err := os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(b)), 0o600); err != nil {
			return nil, err
		}
		args = append(args, f.flag, path)
	}
	return args, nil
}

// serveSupportsCluster reports whether this build's serve has cluster flags.
func serveSupportsCluster(exe string) bool {
	out, _ := exec.Command(exe, "serve", "--help").CombinedOutput()
	return bytes.Contains(out, []byte("-join"))
}

// startSidecars starts n local sidecars, each with dramBytes of DRAM and the
// given eviction policy; cluster joins them into one cluster.
func startSidecars(ctx context.Context, n int, dramBytes, maxValue int64, policy string, cluster bool, stderr io.Writer) ([]*localSidecar, func(), error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	var nodes []*localSidecar
	stopAll := func() {
		for _, s := range nodes {
			s.stop()
		}
	}
	joinAddr := ""
	var creds []string // the credential flags of a cluster run
	for i := range n {
		dir, err := os.MkdirTemp("", "tpreplay")
		if err != nil {
			stopAll()
			return nil, nil, err
		}
		s := &localSidecar{dir: dir, socket: filepath.Join(dir, "tp.sock"), exited: make(chan error, 1)}
		nodes = append(nodes, s)
		args := []string{"serve",
			"--socket", s.socket,
			"--arena-dir", filepath.Join(dir, "arena"),
			"--data-dir", filepath.Join(dir, "data"),
			"--dram-capacity", fmt.Sprint(dramBytes),
			"--max-value-size", fmt.Sprint(maxValue),
			// serve caps the arena size at the capacity, and an arena must
			// be a multiple of 64 KiB.
			"--arena-size", fmt.Sprint(dramBytes &^ (64<<10 - 1)),
			"--eviction-policy", policy,
			"--ssd-capacity", "0", // DRAM only: capacity in blocks is exact
			"--metrics-addr", "",
			"--log-level", "warn",
			"--node-name", fmt.Sprintf("replay-%d", i),
		}
		if cluster {
			gossip, err1 := freeAddr()
			peer, err2 := freeAddr()
			transfer, err3 := freeAddr()
			if err := errors.Join(err1, err2, err3); err != nil {
				stopAll()
				return nil, nil, err
			}
			args = append(args, "--gossip-addr", gossip, "--peer-addr", peer, "--transfer-addr", transfer)
			// Fresh credentials for this run, the same for every node.
			if i == 0 {
				if creds, err = writeClusterCreds(dir); err != nil {
					stopAll()
					return nil, nil, err
				}
			}
			args = append(args, creds...)
			if joinAddr != "" {
				args = append(args, "--join", joinAddr)
			} else {
				joinAddr = gossip
			}
		}
		s.cmd = exec.Command(exe, args...)
		s.cmd.Stderr = &s.stderr
		out, err := s.cmd.StdoutPipe()
		if err != nil {
			stopAll()
			return nil, nil, err
		}
		if err := s.cmd.Start(); err != nil {
			stopAll()
			return nil, nil, err
		}
		go func() { s.exited <- s.cmd.Wait() }()
		ready := make(chan bool, 1)
		go func() {
			sc := bufio.NewScanner(out)
			ok := sc.Scan() && strings.Contains(sc.Text(), "serving on socket")
			ready <- ok
			for sc.Scan() {
			}
		}()
		select {
		case ok := <-ready:
			if !ok {
				select {
				case <-s.exited:
					s.cmd = nil
				case <-time.After(5 * time.Second):
				}
				err := fmt.Errorf("sidecar %d did not start: %s", i, strings.TrimSpace(s.stderr.String()))
				stopAll()
				return nil, nil, err
			}
		case <-time.After(60 * time.Second):
			stopAll()
			return nil, nil, fmt.Errorf("sidecar %d not ready after 60s: %s", i, s.stderr.String())
		case <-ctx.Done():
			stopAll()
			return nil, nil, ctx.Err()
		}
	}
	if cluster {
		if err := waitMembers(ctx, nodes); err != nil {
			stopAll()
			return nil, nil, err
		}
	}
	return nodes, stopAll, nil
}

// waitMembers polls every node until it sees all of them alive (30 s).
func waitMembers(ctx context.Context, nodes []*localSidecar) error {
	deadline := time.Now().Add(30 * time.Second)
	for i, s := range nodes {
		c, err := client.New(s.socket)
		if err != nil {
			return err
		}
		for {
			n, err := c.AliveMembers(ctx)
			if err == nil && n == len(nodes) {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				c.Close()
				return fmt.Errorf("node %d sees %d of %d members alive after 30s (%v): does this build's serve form a cluster from --gossip-addr/--join?", i, n, len(nodes), err)
			}
			t := time.NewTimer(100 * time.Millisecond)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
		c.Close()
	}
	return nil
}

// stop sends SIGTERM, waits (SIGKILL after 15 s) and removes the temp dir.
func (s *localSidecar) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(15 * time.Second):
			s.cmd.Process.Kill()
			<-s.exited
		}
		s.cmd = nil
	}
	os.RemoveAll(s.dir)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func NewCommand(io *cli.Stdio, policies map[string]evict.Factory) *cobra.Command {
	f := replayFlags{policyTable: policies}
	cmd := &cobra.Command{
		Use:               "replay [flags]",
		Short:             "replay a request trace",
		Long:              replayLong,
		GroupID:           cli.GroupTools,
		Args:              cli.NoArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(*cobra.Command, []string) error {
			return cli.ExitWith(cmdReplay(&f, io.Out, io.Err))
		},
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	fs.StringVar(&f.tracePath, "trace", "", "trace file (default: the shared conversation trace, or $TIDEPOOL_TRACE)")
	fs.IntVar(&f.requests, "requests", 0, "replay only the first N requests (0: all)")
	fs.IntVar(&f.nodes, "nodes", 1, "local sidecars to start (ignored with --sockets)")
	fs.StringVar(&f.sockets, "sockets", "", "comma-separated sockets of running sidecars to replay against")
	fs.StringVar(&f.capacities, "capacity-tokens", "3M", "per-node capacity in tokens (500k, 3M); a list sweeps")
	fs.StringVar(&f.capacities, "capacities", "3M", "alias of --capacity-tokens")
	fs.IntVar(&f.blockTokens, "block-tokens", trace.BlockTokens, "tokens per trace block (converts capacity to blocks)")
	fs.StringVar(&f.blockBytes, "block-bytes", "4KiB", "bytes stored per block (scaled down: the hit rate depends on block counts)")
	fs.StringVar(&f.route, "route", "round-robin", "request routing: round-robin, or prefix (the node with the longest cached prefix)")
	fs.StringVar(&f.scope, "scope", "local", "lookup scope: local (node-local caches) or cluster (cluster-wide)")
	fs.StringVar(&f.policies, "policy", "prefix", "eviction policy of the local sidecars: prefix or lru; a list sweeps")
	fs.StringVar(&f.policies, "policies", "prefix", "alias of --policy")
	fs.StringVar(&f.ns, "ns", "replay", "namespace")
	fs.Float64Var(&f.loadSlack, "load-slack", 0.25, "prefix routing load band: a node this fraction above the mean request count gets no request, one this far below gets the next")
	fs.Float64Var(&f.speed, "speed", 0, "honour timestamps, scaled: 1 real time, 10 ten times faster; 0 ignores them")
	fs.BoolVar(&f.noFetch, "no-fetch", false, "do not read the hit prefix (engines do; reads also tell eviction what was used)")
	fs.BoolVar(&f.checkChains, "check-chains", false, "after each request's puts, look its keys up again and count requests whose own puts pushed out part of their chain (chains_cut)")
	fs.BoolVar(&f.simulate, "sim", false, "run the offline simulator (cache/evict/sim) instead of sidecars; results are labelled simulated")
	fs.BoolVar(&f.withSim, "with-sim", false, "also run the simulator for every sidecar run (plotted dashed, labelled simulated)")
	fs.BoolVar(&f.references, "references", false, "with --sim: add the offline optimum (Belady) and the unbounded cache")
	fs.BoolVar(&f.json, "json", false, "print one JSON object (a {\"runs\": [...]} object for a sweep)")
	fs.StringVar(&f.plot, "plot", "", "write hit rate against capacity (one line per policy) to this PNG")
	fs.StringVar(&f.progress, "progress", "auto", "progress on stderr: auto, plain, none")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "per-call timeout")
	cli.CompleteWords(cmd, "route", string(replay.RouteRoundRobin), string(replay.RoutePrefix))
	cli.CompleteWords(cmd, "scope", "local", "cluster")
	cli.CompleteWords(cmd, "policy", "prefix", "lru")
	cli.CompleteWords(cmd, "policies", "prefix", "lru")
	cli.CompleteWords(cmd, "progress", "auto", "plain", "none")
	return cmd
}

// cmdReplay runs `tidepool replay` with its parsed flags.
func cmdReplay(fp *replayFlags, stdout, stderr io.Writer) int {
	f := *fp
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "tidepool replay: "+format+"\n", a...)
		return cli.ExitUsage
	}
	pl, err := planReplay(&f)
	if err != nil {
		return usageErr("%v", err)
	}
	tracePath := f.tracePath
	if tracePath == "" {
		if tracePath, err = sim.FindTrace(sim.ConversationTrace); err != nil {
			return usageErr("%v (give --trace FILE)", err)
		}
	}
	tf, err := os.Open(tracePath)
	if err != nil {
		return usageErr("%v", err)
	}
	reqs, err := trace.Read(tf)
	tf.Close()
	if err != nil {
		fmt.Fprintf(stderr, "tidepool replay: %v\n", err)
		return cli.ExitError
	}
	if f.requests > 0 && f.requests < len(reqs) {
		reqs = reqs[:f.requests]
	}
	pl.trace = filepath.Base(tracePath)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if f.scope == "cluster" && !f.simulate && len(pl.sockets) == 0 && pl.nodes > 1 {
		exe, _ := os.Executable()
		if !serveSupportsCluster(exe) {
			fmt.Fprintln(stderr, "tidepool replay: --scope cluster needs a clustered build: this binary's `serve --help` lists no --join flag")
			return cli.ExitError
		}
	}

	var runs []replayRun
	emit := func(run replayRun) {
		runs = append(runs, run)
		if !f.json {
			writeReplayText(stdout, run)
		}
	}
	for _, pol := range pl.pols {
		for _, capTok := range pl.caps {
			run := replayRun{
				Policy: pol, CapacityTokens: capTok, CapacityBlocks: capTok / int64(f.blockTokens), BlockBytes: pl.blockBytes,
				Route: string(pl.route), Scope: f.scope, Simulated: f.simulate, Trace: pl.trace,
			}
			if len(pl.sockets) > 0 {
				run.Policy, run.CapacityTokens, run.CapacityBlocks = "", 0, 0 // the sidecars' own settings
			}
			if run.CapacityBlocks < 1 && len(pl.sockets) == 0 {
				return usageErr("capacity %d tokens is less than one block of %d tokens", capTok, f.blockTokens)
			}
			label := fmt.Sprintf("%s %s", pol, formatCount(capTok))
			var err error
			if f.simulate {
				run.Result, err = simulateRun(reqs, pl.nodes, run.CapacityBlocks, f.scope, f.policyTable[pol])
			} else {
				err = sidecarRun(ctx, &f, &run, reqs, pl.sockets, pl.nodes, label, stderr)
			}
			if err != nil {
				fmt.Fprintf(stderr, "tidepool replay: %s: %v\n", label, err)
				return cli.ExitError
			}
			emit(run)
			if f.withSim {
				srun := run
				srun.Simulated, srun.BlocksAtEnd = true, nil
				if srun.Result, err = simulateRun(reqs, pl.nodes, run.CapacityBlocks, f.scope, f.policyTable[pol]); err != nil {
					fmt.Fprintf(stderr, "tidepool replay: %s simulated: %v\n", label, err)
					return cli.ExitError
				}
				emit(srun)
			}
		}
	}
	if f.references {
		if err := referenceRuns(&f, pl, reqs, emit); err != nil {
			fmt.Fprintf(stderr, "tidepool replay: %v\n", err)
			return cli.ExitError
		}
	}
	if f.json {
		enc := json.NewEncoder(stdout)
		if len(runs) == 1 {
			enc.Encode(runs[0])
		} else {
			enc.Encode(struct {
				Runs []replayRun `json:"runs"`
			}{runs})
		}
	}
	if f.plot != "" {
		if err := plotRuns(&f, pl, len(reqs), runs); err != nil {
			fmt.Fprintf(stderr, "tidepool replay: %v\n", err)
			return cli.ExitError
		}
		if !f.json {
			fmt.Fprintf(stdout, "plot written to %s\n", f.plot)
		}
	}
	return cli.ExitOK
}

// replayPlan is what the flags ask for, parsed and checked.
type replayPlan struct {
	caps       []int64  // per-node capacities, in tokens
	pols       []string // eviction policies
	blockBytes int64
	route      replay.Route
	sockets    []string // running sidecars (--sockets); empty: replay starts its own
	nodes      int      // sidecars replayed against
	trace      string   // the trace file's name, for the reports
}

// planReplay parses and checks the flags.
func planReplay(f *replayFlags) (replayPlan, error) {
	var pl replayPlan
	for _, c := range splitList(f.capacities) {
		v, err := units.ParseCount(c)
		if err != nil || v < 1 {
			return pl, fmt.Errorf("bad capacity %q (examples: 500k, 3M)", c)
		}
		pl.caps = append(pl.caps, v)
	}
	pl.pols = splitList(f.policies)
	for _, p := range pl.pols {
		if _, ok := f.policyTable[p]; !ok {
			return pl, fmt.Errorf("unknown policy %q (prefix or lru)", p)
		}
	}
	if len(pl.caps) == 0 || len(pl.pols) == 0 {
		return pl, errors.New("need at least one capacity and one policy")
	}
	if f.blockTokens < 1 {
		return pl, errors.New("--block-tokens must be positive")
	}
	bb, err := units.ParseBytes(f.blockBytes)
	if err != nil || bb < 1 {
		return pl, fmt.Errorf("bad --block-bytes %q", f.blockBytes)
	}
	pl.blockBytes = bb
	pl.route = replay.Route(f.route)
	if pl.route == "rr" {
		pl.route = replay.RouteRoundRobin
	}
	if pl.route != replay.RouteRoundRobin && pl.route != replay.RoutePrefix {
		return pl, errors.New("--route must be round-robin or prefix")
	}
	if f.scope != "local" && f.scope != "cluster" {
		return pl, errors.New("--scope must be local or cluster")
	}
	if f.references && !f.simulate {
		return pl, errors.New("--references needs --sim")
	}
	if f.withSim && f.simulate {
		return pl, errors.New("--with-sim compares sidecars with the simulator; drop --sim")
	}
	if f.withSim && f.sockets != "" {
		return pl, errors.New("--with-sim needs the sidecars replay starts itself (their policy and capacity are known)")
	}
	if f.sockets != "" {
		pl.sockets = splitList(f.sockets)
		if len(pl.caps) > 1 || len(pl.pols) > 1 {
			return pl, errors.New("a capacity or policy sweep starts its own sidecars; not with --sockets")
		}
	} else if f.nodes < 1 {
		return pl, errors.New("--nodes must be at least 1")
	}
	if f.simulate {
		if pl.route != replay.RouteRoundRobin {
			return pl, errors.New("--sim routes round-robin only")
		}
		if len(pl.sockets) > 0 {
			return pl, errors.New("--sim runs no sidecars; drop --sockets")
		}
	}
	pl.nodes = f.nodes
	if len(pl.sockets) > 0 {
		pl.nodes = len(pl.sockets)
	}
	return pl, nil
}

// referenceRuns simulates the reference lines of --references (the
// offline optimum and the unbounded cache) at every capacity and hands
// each run to emit.
func referenceRuns(f *replayFlags, pl replayPlan, reqs []trace.Request, emit func(replayRun)) error {
	for _, capTok := range pl.caps {
		blocks := capTok / int64(f.blockTokens)
		cfg := sim.Config{CapacityBlocks: int(blocks), Nodes: pl.nodes, Scope: simScope(f.scope)}
		b, err := sim.Belady(reqs, cfg)
		if err != nil {
			return fmt.Errorf("belady: %w", err)
		}
		u, err := sim.Unbounded(reqs, cfg)
		if err != nil {
			return fmt.Errorf("unbounded: %w", err)
		}
		for _, ref := range []struct {
			name string
			r    sim.Result
		}{{refBelady, b}, {refUnbounded, u}} {
			emit(replayRun{Policy: ref.name, CapacityTokens: capTok, CapacityBlocks: blocks, BlockBytes: pl.blockBytes,
				Route: string(pl.route), Scope: f.scope, Simulated: true, Trace: pl.trace, Result: fromSim(ref.r, pl.nodes)})
		}
	}
	return nil
}

// plotRuns writes the hit-rate plot of --plot: one line per policy,
// dashed for simulated runs beside sidecar ones and for the references.
func plotRuns(f *replayFlags, pl replayPlan, requests int, runs []replayRun) error {
	var pts []chart.HitPoint
	dashed := map[string]bool{}
	for _, r := range runs {
		name := r.Policy
		switch {
		case f.withSim && r.Simulated:
			name += " (simulated)"
			dashed[name] = true
		case f.withSim:
			name += " (sidecars)"
		}
		if f.references && (name == refBelady || name == refUnbounded) {
			dashed[name] = true
		}
		pts = append(pts, chart.HitPoint{Policy: name, CapacityTokens: r.CapacityTokens, CapacityBlocks: r.CapacityBlocks, HitRate: r.HitRate, Simulated: r.Simulated})
	}
	how := "real sidecars"
	if f.simulate {
		how = "simulated"
	} else if f.withSim {
		how = "real sidecars vs simulator"
	}
	title := fmt.Sprintf("Prefix hit rate, %s (%d requests), %d node(s), %s scope, %s", pl.trace, requests, pl.nodes, f.scope, how)
	return chart.HitRate(f.plot, title, pts, dashed)
}

// Names of the reference lines of --references.
const (
	refBelady    = "offline optimum (Belady)"
	refUnbounded = "unbounded cache"
)

func simScope(s string) sim.Scope {
	if s == "cluster" {
		return sim.ScopeCluster
	}
	return sim.ScopeLocal
}

// fromSim converts a simulator result (per-node figures are not kept by
// the simulator).
func fromSim(r sim.Result, nodes int) replay.Result {
	return replay.Result{Requests: r.Requests, Blocks: r.Blocks, HitBlocks: r.HitBlocks, HitRate: r.HitRate(), Nodes: make([]replay.NodeResult, 0, nodes)}
}

func simulateRun(reqs []trace.Request, nodes int, blocks int64, scope string, pol evict.Factory) (replay.Result, error) {
	start := time.Now()
	r, err := sim.Run(reqs, sim.Config{CapacityBlocks: int(blocks), Nodes: nodes, Scope: simScope(scope)}, pol)
	res := fromSim(r, nodes)
	res.Seconds = time.Since(start).Seconds()
	return res, err
}

// sidecarRun replays reqs against the given sockets, or against nodes
// local sidecars it starts for run's policy and capacity.
func sidecarRun(ctx context.Context, f *replayFlags, run *replayRun, reqs []trace.Request, sockets []string, nodes int, label string, stderr io.Writer) error {
	scope := client.ScopeLocal
	if f.scope == "cluster" {
		scope = client.ScopeCluster
	}
	if len(sockets) == 0 {
		dram := run.CapacityBlocks * footprint(run.BlockBytes)
		if dram < 1<<20 {
			return fmt.Errorf("%d blocks of %s take %s of DRAM, below the sidecar's 1 MiB minimum: raise --block-bytes or the capacity",
				run.CapacityBlocks, units.FormatBytes(run.BlockBytes), units.FormatBytes(dram))
		}
		locals, stopAll, err := startSidecars(ctx, nodes, dram, run.BlockBytes, run.Policy, f.scope == "cluster" && nodes > 1, stderr)
		if err != nil {
			return err
		}
		defer stopAll()
		for _, s := range locals {
			sockets = append(sockets, s.socket)
		}
	}
	var rnodes []replay.Node
	var clients []*client.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for _, s := range sockets {
		c, err := client.NewWithConfig(client.Config{Socket: s, Timeout: f.timeout, MaxIdleConns: 4})
		if err != nil {
			return err
		}
		clients = append(clients, c)
		hctx, cancel := context.WithTimeout(ctx, f.timeout)
		hello, err := c.Hello(hctx)
		cancel()
		if err != nil {
			return fmt.Errorf("sidecar %s: %w", s, err)
		}
		maxBatch := 1024
		if hello.Limits != nil && hello.Limits.MaxBatch > 0 {
			maxBatch = int(hello.Limits.MaxBatch)
		}
		if hello.Limits != nil && run.BlockBytes > hello.Limits.MaxValueBytes {
			return fmt.Errorf("sidecar %s: --block-bytes %d exceeds its max_value_size %d", s, run.BlockBytes, hello.Limits.MaxValueBytes)
		}
		// Each batch of puts must fit a framed request.
		maxBatch = max(1, min(maxBatch, int((64<<20)/(run.BlockBytes+64))))
		rnodes = append(rnodes, &sidecarNode{c: c, ns: f.ns, scope: scope, maxBatch: maxBatch})
	}
	cfg := replay.DefaultConfig()
	cfg.Route, cfg.BlockBytes, cfg.Key, cfg.NoFetch, cfg.Speed = replay.Route(run.Route), int(run.BlockBytes), blockKey, f.noFetch, f.speed
	cfg.CheckChains = f.checkChains
	cfg.LoadSlack = f.loadSlack
	if f.progress != "none" {
		last := time.Now()
		plain := f.progress == "plain" || !cli.IsTerminal(stderr)
		cfg.Progress = func(done, total int) {
			if time.Since(last) < time.Second && done < total {
				return
			}
			last = time.Now()
			if plain {
				fmt.Fprintf(stderr, "replay %s: %d/%d requests\n", label, done, total)
			} else {
				fmt.Fprintf(stderr, "\rreplay %s: %d/%d requests", label, done, total)
				if done == total {
					fmt.Fprintln(stderr)
				}
			}
		}
	}
	res, err := replay.Run(ctx, cfg, reqs, rnodes)
	run.Result = res
	if err != nil {
		return err
	}
	if run.CapacityBlocks > 0 {
		for i, c := range clients {
			st, err := c.Stats(ctx, "")
			if err != nil {
				return fmt.Errorf("stats of node %d: %w", i, err)
			}
			var blocks int64
			for _, t := range st.Tiers {
				blocks += t.Blocks
			}
			run.BlocksAtEnd = append(run.BlocksAtEnd, blocks)
			if blocks > run.CapacityBlocks {
				return fmt.Errorf("node %d holds %d blocks, more than its capacity of %d", i, blocks, run.CapacityBlocks)
			}
		}
	}
	return nil
}

func writeReplayText(w io.Writer, r replayRun) {
	how := "sidecars"
	if r.Simulated {
		how = "simulated"
	}
	head := fmt.Sprintf("%s: %d requests, %d blocks", r.Trace, r.Requests, r.Blocks)
	if r.CapacityTokens > 0 {
		head += fmt.Sprintf("; policy %s, capacity %s tokens (%d blocks of %s) per node", r.Policy, formatCount(r.CapacityTokens), r.CapacityBlocks, units.FormatBytes(r.BlockBytes))
	}
	fmt.Fprintf(w, "%s; route %s, scope %s, %s\n", head, r.Route, r.Scope, how)
	fmt.Fprintf(w, "  prefix hit rate %.4f (%d of %d blocks)\n", r.HitRate, r.HitBlocks, r.Blocks)
	if !r.Simulated && (r.ReadBlocks > 0 || len(r.UnreadBlocks) > 0) {
		fmt.Fprintf(w, "  read back       %.4f (%d of %d blocks)", r.ReadHitRate, r.ReadBlocks, r.Blocks)
		if len(r.UnreadBlocks) > 0 {
			codes := slices.Sorted(maps.Keys(r.UnreadBlocks))
			var parts []string
			for _, c := range codes {
				parts = append(parts, fmt.Sprintf("%d %s", r.UnreadBlocks[c], c))
			}
			fmt.Fprintf(w, "; hits not read back: %s", strings.Join(parts, ", "))
		}
		fmt.Fprintln(w)
	}
	if len(r.Nodes) > 1 {
		var parts []string
		for i, n := range r.Nodes {
			parts = append(parts, fmt.Sprintf("%d: %.4f (%d req)", i, n.HitRate, n.Requests))
		}
		fmt.Fprintf(w, "  per node        %s\n", strings.Join(parts, ", "))
	}
	if !r.Simulated {
		fmt.Fprintf(w, "  bytes           %s read from cache, %s between nodes, %s stored; %d failed puts, %d refused for room, %d orphans\n",
			units.FormatBytes(r.BytesFetched), units.FormatBytes(r.BytesRemote), units.FormatBytes(r.BytesStored), r.FailedPuts, r.RefusedPuts, r.OrphanPuts)
		if len(r.BlocksAtEnd) > 0 {
			fmt.Fprintf(w, "  blocks at end   %v (capacity %d per node)\n", r.BlocksAtEnd, r.CapacityBlocks)
		}
	}
	fmt.Fprintf(w, "  time            %.2fs\n", r.Seconds)
}

// formatCount prints a token count the way --capacity-tokens takes it.
func formatCount(n int64) string {
	switch {
	case n >= 1e6 && n%1e5 == 0:
		return strings.TrimSuffix(strings.TrimSuffix(fmt.Sprintf("%.1f", float64(n)/1e6), "0"), ".") + "M"
	case n >= 1e3 && n%100 == 0:
		return strings.TrimSuffix(strings.TrimSuffix(fmt.Sprintf("%.1f", float64(n)/1e3), "0"), ".") + "k"
	}
	return fmt.Sprint(n)
}
