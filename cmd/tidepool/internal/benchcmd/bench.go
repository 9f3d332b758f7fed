package benchcmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/tidepool-kv/tidepool/client"
	"github.com/tidepool-kv/tidepool/cmd/tidepool/internal/chart"
	"github.com/tidepool-kv/tidepool/cmd/tidepool/internal/cli"
	"github.com/tidepool-kv/tidepool/internal/bench"
	"github.com/tidepool-kv/tidepool/internal/units"
)

const benchLong = `Load generator over the engine API. N callers repeat one operation for a
duration (or an op count) and the run ends with ops/s, bytes/s, latency
percentiles (p50/p90/p99/p99.9, HDR histogram) and errors.

  tidepool bench --op get --size 1MiB --concurrency 16 --duration 10s
  tidepool bench --op put --size 64KiB --json
  tidepool bench --op get --size 4KiB --concurrency 1,4,16,64 --plot lat.png

Operations: put (a new key per call), get (random key of --keys prefilled
ones), mixed (--ratio gets, the rest puts), lookup (--batch consecutive keys),
batch-get (--batch random keys). Raw limits, without the sidecar: memcpy
(copy a value between buffers), socket-copy (1-byte request, value-sized
reply over a Unix stream socket pair). --zero-copy moves values through the shared
arenas (PutFrom/GetInto) instead of the socket; --registered puts from and
gets into memory registered with the sidecar (its buffer socket: one round
trip, the sidecar copying; a remote block lands there from the network).
--remote SOCKET prefills the
keys through another node of the cluster and reads them through --socket with
cluster scope (keys owned by another node).`

type benchFlags struct {
	socket, ns, op, size, conc, remote, scope, plot, progress string
	writeMode                                                 string
	keys, batch                                               int
	duration, timeout                                         time.Duration
	ops                                                       int64
	ratio                                                     float64
	zeroCopy, json, noPrefill                                 bool
	verifyReads, registered                                   bool
}

// benchWriteModes are the values of --write-mode.
var benchWriteModes = map[string]client.WriteMode{
	"pwrite": client.WritePwrite,
	"mapped": client.WriteMapped,
	"keyed":  client.WriteKeyed,
}

// zeroCopier is the zero-copy part of the Go client (client/zerocopy.go).
type zeroCopier interface {
	PutFrom(ctx context.Context, ns string, key, buf []byte, depth int32) (existed bool, err error)
	GetInto(ctx context.Context, ns string, key, buf []byte) (n int, found bool, err error)
}

// benchEngine adapts the client to bench.Engine.
type benchEngine struct {
	c     *client.Client
	zc    zeroCopier // nil: inline
	reg   *registered
	ns    string
	scope client.Scope
	bufs  sync.Pool // *[]byte of size bytes, for Get
	size  int
}

// registered hands each concurrent call a buffer registered with the
// sidecar (--registered), as an engine's KV memory would be. Each holds
// the bench's value (bench.Value, one slice for the whole run), copied
// there once: an engine's blocks already lie in its registered memory.
type registered struct {
	c    *client.Client
	size int
	free chan *regBuf
	mu   sync.Mutex
	all  []*regBuf
}

type regBuf struct {
	b     *client.Buffer
	value *byte // what Bytes() holds: the first byte of the value copied there, or nil
}

func (r *registered) get(ctx context.Context) (*regBuf, error) {
	select {
	case rb := <-r.free:
		return rb, nil
	default:
	}
	b, err := r.c.RegisterBuffer(ctx, r.size)
	if err != nil {
		return nil, err
	}
	rb := &regBuf{b: b}
	r.mu.Lock()
	r.all = append(r.all, rb)
	r.mu.Unlock()
	return rb, nil
}

func (r *registered) put(rb *regBuf) {
	select {
	case r.free <- rb:
	default:
		rb.b.Close() // more than the callers need
	}
}

func (r *registered) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rb := range r.all {
		rb.b.Close()
	}
}

func (e *benchEngine) Put(ctx context.Context, key, value []byte) error {
	if e.reg != nil {
		rb, err := e.reg.get(ctx)
		if err != nil {
			return err
		}
		defer e.reg.put(rb)
		if len(value) > 0 && rb.value != &value[0] {
			copy(rb.b.Bytes(), value) // a value this buffer does not hold yet
			rb.value = &value[0]
		}
		_, err = rb.b.Put(ctx, e.ns, key, 0, len(value), 0)
		return err
	}
	if e.zc != nil {
		_, err := e.zc.PutFrom(ctx, e.ns, key, value, 0)
		return err
	}
	_, err := e.c.Put(ctx, e.ns, key, value, 0)
	return err
}

// Get reads into a buffer of the caller's, as an engine reads into its own
// memory: GetInto through the arenas, AppendGet through the socket.
func (e *benchEngine) Get(ctx context.Context, key []byte) (int, bool, error) {
	if e.reg != nil {
		rb, err := e.reg.get(ctx)
		if err != nil {
			return 0, false, err
		}
		defer e.reg.put(rb)
		rb.value = nil // overwritten
		return rb.b.Get(ctx, e.ns, key, 0, e.size, e.scope)
	}
	bp, _ := e.bufs.Get().(*[]byte)
	if bp == nil {
		b := make([]byte, e.size)
		bp = &b
	}
	defer e.bufs.Put(bp)
	if e.zc != nil {
		return e.zc.GetInto(ctx, e.ns, key, *bp)
	}
	v, found, err := e.c.AppendGet(ctx, (*bp)[:0], e.ns, key, e.scope)
	return len(v), found, err
}

func (e *benchEngine) Lookup(ctx context.Context, keys [][]byte) (int, error) {
	return e.c.Lookup(ctx, e.ns, keys, e.scope)
}

func (e *benchEngine) BatchGet(ctx context.Context, keys [][]byte) (int64, int, error) {
	res, err := e.c.BatchGet(ctx, e.ns, keys, e.scope)
	if err != nil {
		return 0, 0, err
	}
	var n int64
	miss := 0
	for i, r := range res {
		switch r.Code {
		case client.CodeOK:
			n += int64(len(r.Value))
		case client.CodeNotFound:
			miss++
		default:
			return n, miss, fmt.Errorf("batch-get item %d: %s", i, r.Code)
		}
	}
	return n, miss, nil
}

// parseInts parses "1,4,16".
func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// progressPrinter returns a bench progress callback writing to w: a bar
// redrawn in place on a terminal, a plain line per period otherwise.
func progressPrinter(w io.Writer, mode, label string) (func(bench.Progress), func()) {
	if mode == "auto" {
		mode = "plain"
		if cli.IsTerminal(w) {
			mode = "bar"
		}
	}
	switch mode {
	case "none":
		return nil, func() {}
	case "bar":
		return func(p bench.Progress) {
				fmt.Fprintf(w, "\r%s %s", label, bench.ProgressLine(p, 30))
			}, func() {
				fmt.Fprintln(w)
			}
	default:
		return func(p bench.Progress) {
			fmt.Fprintf(w, "%s %s\n", label, bench.ProgressLine(p, 0))
		}, func() {}
	}
}

func NewCommand(io *cli.Stdio, defaultSocket string) *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:               "bench [flags]",
		Short:             "load generator",
		Long:              benchLong,
		GroupID:           cli.GroupTools,
		Args:              cli.NoArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(*cobra.Command, []string) error {
			return cli.ExitWith(cmdBench(&f, io.Out, io.Err))
		},
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	fs.StringVar(&f.socket, "socket", cli.EnvOr("TIDEPOOL_SOCKET", defaultSocket), "sidecar socket (env TIDEPOOL_SOCKET)")
	fs.StringVar(&f.ns, "ns", cli.EnvOr("TIDEPOOL_NS", "bench"), "namespace (env TIDEPOOL_NS)")
	fs.StringVar(&f.op, "op", "get", "operation: put, get, mixed, lookup, batch-get; raw limits: memcpy, socket-copy")
	fs.StringVar(&f.size, "size", "4KiB", "value size (4096, 64KiB, 1MiB)")
	fs.IntVar(&f.keys, "keys", 1000, "keys that reads draw from (prefilled before the run)")
	fs.StringVar(&f.conc, "concurrency", "16", "concurrent callers; a list (1,4,16) runs one benchmark per value")
	fs.DurationVar(&f.duration, "duration", 10*time.Second, "length of each run (ignored when --ops is set)")
	fs.Int64Var(&f.ops, "ops", 0, "total calls per run instead of a duration")
	fs.Float64Var(&f.ratio, "ratio", 0.9, "mixed: fraction of gets")
	fs.IntVar(&f.batch, "batch", 16, "keys per call of lookup and batch-get")
	fs.BoolVar(&f.zeroCopy, "zero-copy", false, "move values through the shared arenas instead of the socket (put, get, mixed)")
	fs.BoolVar(&f.registered, "registered", false, "put from and get into memory registered with the sidecar through its buffer socket (put, get, mixed; with --remote too)")
	fs.BoolVar(&f.verifyReads, "verify-reads", false, "with --zero-copy: check every GetInto copy against its CRC-32C in the client (SetVerifyReads(true))")
	fs.StringVar(&f.writeMode, "write-mode", "default", "with --zero-copy: how puts copy into their slot: default (the client's: keyed where the machine has memory protection keys, else pwrite), keyed (a mapping only the copying thread can write, for the copy), pwrite or mapped (a writable mapping of every arena)")
	fs.StringVar(&f.remote, "remote", "", "socket of another node: prefill there, read here with cluster scope")
	fs.StringVar(&f.scope, "scope", "", "read scope: local, cluster or default (default: local, cluster with --remote)")
	fs.BoolVar(&f.noPrefill, "no-prefill", false, "skip storing the key set before read runs")
	fs.BoolVar(&f.json, "json", false, "print one JSON object (a {\"runs\": [...]} object for a sweep)")
	fs.StringVar(&f.plot, "plot", "", "write latency percentiles against concurrency to this PNG")
	fs.StringVar(&f.progress, "progress", "auto", "progress on stderr: auto (bar on a terminal, else lines), bar, plain, none")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "per-call timeout")
	cli.CompleteWords(cmd, "op", "put", "get", "mixed", "lookup", "batch-get", rawMemcpy, rawSocketCopy)
	cli.CompleteWords(cmd, "scope", "local", "cluster", "default")
	cli.CompleteWords(cmd, "write-mode", "default", "keyed", "pwrite", "mapped")
	cli.CompleteWords(cmd, "progress", "auto", "bar", "plain", "none")
	return cmd
}

// cmdBench runs `tidepool bench` with its parsed flags.
func cmdBench(fp *benchFlags, stdout, stderr io.Writer) int {
	f := *fp
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "tidepool bench: "+format+"\n", a...)
		return cli.ExitUsage
	}
	pl, err := planBench(&f)
	if err != nil {
		return usageErr("%v", err)
	}
	client.QuietKitexLogs()
	if f.op == rawMemcpy || f.op == rawSocketCopy {
		base := bench.DefaultConfig()
		base.Size, base.Keys, base.Duration, base.Ops = int(pl.size), 1, f.duration, f.ops
		if f.ops > 0 {
			base.Duration = 0
		}
		return runRaw(&f, base, pl.concs, stdout, stderr)
	}
	if err := pl.checkSidecarRun(&f); err != nil {
		return usageErr("%v", err)
	}

	c, err := client.NewWithConfig(pl.clientConfig(&f))
	if err != nil {
		return usageErr("%v", err)
	}
	defer c.Close()
	eng, mode, code := newBenchEngine(&f, pl, c, stderr)
	if code != cli.ExitOK {
		return code
	}
	if eng.reg != nil {
		defer eng.reg.close()
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	hctx, cancel := context.WithTimeout(ctx, f.timeout)
	hello, err := c.Hello(hctx)
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "tidepool bench: cannot reach the sidecar at %s: %v\n", f.socket, err)
		return cli.ExitError
	}
	if hello.Limits != nil && pl.size > hello.Limits.MaxValueBytes {
		return usageErr("--size %s exceeds the sidecar's max_value_size %s", f.size, units.FormatBytes(hello.Limits.MaxValueBytes))
	}
	if hello.Limits != nil && f.batch > int(hello.Limits.MaxBatch) && (pl.base.Op == bench.OpLookup || pl.base.Op == bench.OpBatchGet) {
		return usageErr("--batch %d exceeds the sidecar's max_batch %d", f.batch, hello.Limits.MaxBatch)
	}

	if pl.base.Op != bench.OpPut && !f.noPrefill {
		if code := prefill(ctx, &f, pl, eng, stderr); code != cli.ExitOK {
			return code
		}
	}
	reps, failed := sweep(ctx, &f, pl, eng, mode, stdout, stderr)
	return finishBench(&f, reps, failed, stdout, stderr)
}

// benchPlan is what the flags ask for, parsed and checked.
type benchPlan struct {
	size      int64
	concs     []int
	maxConc   int
	scope     client.Scope
	base      bench.Config // of every run but its concurrency
	writeMode client.WriteMode
}

// planBench parses and checks the flags every run needs.
func planBench(f *benchFlags) (benchPlan, error) {
	var pl benchPlan
	size, err := units.ParseBytes(f.size)
	if err != nil || size < 1 || size > 1<<30 {
		return pl, fmt.Errorf("bad --size %q", f.size)
	}
	pl.size = size
	if pl.concs, err = parseInts(f.conc); err != nil {
		return pl, fmt.Errorf("--concurrency: %v", err)
	}
	for _, c := range pl.concs {
		pl.maxConc = max(pl.maxConc, c)
	}
	pl.scope = client.ScopeLocal
	switch f.scope {
	case "":
		if f.remote != "" {
			pl.scope = client.ScopeCluster
		}
	case "local":
	case "cluster":
		pl.scope = client.ScopeCluster
	case "default":
		pl.scope = client.ScopeDefault
	default:
		return pl, fmt.Errorf("--scope must be local, cluster or default, not %q", f.scope)
	}
	if f.progress != "auto" && f.progress != "bar" && f.progress != "plain" && f.progress != "none" {
		return pl, errors.New("--progress must be auto, bar, plain or none")
	}
	return pl, nil
}

// checkSidecarRun checks the flags of a run against a sidecar (not a raw
// limit) and fills in the runs' configuration.
func (pl *benchPlan) checkSidecarRun(f *benchFlags) error {
	base := bench.DefaultConfig()
	base.Op, base.Size, base.Keys, base.Duration, base.Ops = bench.Op(f.op), int(pl.size), f.keys, f.duration, f.ops
	base.ReadRatio, base.Batch = f.ratio, f.batch
	if f.ops > 0 {
		base.Duration = 0
	}
	for _, c := range pl.concs {
		cfg := base
		cfg.Concurrency = c
		if err := cfg.Validate(); err != nil {
			return err
		}
	}
	pl.base = base
	if f.zeroCopy && (base.Op == bench.OpLookup || base.Op == bench.OpBatchGet) {
		return errors.New("--zero-copy applies to put, get and mixed")
	}
	if f.registered && (f.zeroCopy || base.Op == bench.OpLookup || base.Op == bench.OpBatchGet) {
		return errors.New("--registered applies to put, get and mixed, without --zero-copy")
	}
	if f.verifyReads && !f.zeroCopy {
		return errors.New("--verify-reads applies to --zero-copy reads (inline reads are verified by the sidecar's verify_reads)")
	}
	writeMode, ok := benchWriteModes[f.writeMode]
	if !ok && f.writeMode != "default" {
		return fmt.Errorf("--write-mode must be default, keyed, pwrite or mapped, not %q", f.writeMode)
	}
	pl.writeMode = writeMode
	if f.writeMode != "default" && !f.zeroCopy {
		return errors.New("--write-mode applies to --zero-copy puts")
	}
	if f.zeroCopy && f.remote != "" {
		return errors.New("--zero-copy reads local arenas; it cannot be combined with --remote")
	}
	return nil
}

// clientConfig is the client of a run: a connection per caller, replies
// large enough for a batch.
func (pl *benchPlan) clientConfig(f *benchFlags) client.Config {
	ccfg := client.DefaultConfig(f.socket)
	ccfg.Timeout, ccfg.MaxIdleConns = f.timeout, pl.maxConc+4
	ccfg.MaxResponseBytes = max(ccfg.MaxResponseBytes, int(pl.size)*f.batch+(1<<20))
	return ccfg
}

// newBenchEngine adapts c to the path the flags name (inline, registered
// buffers or zero-copy) and returns the mode's name for the report; the
// caller closes eng.reg.
func newBenchEngine(f *benchFlags, pl benchPlan, c *client.Client, stderr io.Writer) (eng *benchEngine, mode string, code int) {
	eng = &benchEngine{c: c, ns: f.ns, scope: pl.scope, size: int(pl.size)}
	mode = "inline"
	if f.registered {
		eng.reg = &registered{c: c, size: max(int(pl.size), 1), free: make(chan *regBuf, pl.maxConc)}
		mode = "registered buffers"
	}
	if f.zeroCopy {
		zc, ok := any(c).(zeroCopier)
		if !ok {
			fmt.Fprintln(stderr, "tidepool bench: --zero-copy: this build's client has no zero-copy calls (PutFrom/GetInto)")
			return nil, "", cli.ExitError
		}
		eng.zc, mode = zc, "zero-copy"
		if f.verifyReads {
			c.SetVerifyReads(true)
			mode = "zero-copy, verified reads"
		}
		if f.writeMode != "default" {
			c.SetWriteMode(pl.writeMode)
			mode += ", " + f.writeMode + " puts"
		}
	}
	return eng, mode, cli.ExitOK
}

// prefill stores the keys that reads draw from, through --remote when
// given.
func prefill(ctx context.Context, f *benchFlags, pl benchPlan, eng *benchEngine, stderr io.Writer) int {
	var pre bench.Engine = eng
	if f.remote != "" {
		rc, err := client.NewWithConfig(client.Config{Socket: f.remote, Timeout: f.timeout, MaxIdleConns: 16})
		if err != nil {
			fmt.Fprintf(stderr, "tidepool bench: --remote: %v\n", err)
			return cli.ExitUsage
		}
		defer rc.Close()
		pre = &benchEngine{c: rc, ns: f.ns, scope: client.ScopeLocal, size: int(pl.size)}
	}
	start := time.Now()
	if err := bench.Prefill(ctx, pre, int(pl.size), f.keys, min(16, pl.maxConc+1)); err != nil {
		fmt.Fprintf(stderr, "tidepool bench: %v\n", err)
		return cli.ExitError
	}
	if f.progress != "none" {
		fmt.Fprintf(stderr, "prefilled %d keys of %s in %.2fs\n", f.keys, bench.FormatSize(pl.size), time.Since(start).Seconds())
	}
	return cli.ExitOK
}

// sweep runs one benchmark per concurrency, printing each report as text
// unless --json; it stops at the first run that fails.
func sweep(ctx context.Context, f *benchFlags, pl benchPlan, eng *benchEngine, mode string, stdout, stderr io.Writer) (reps []bench.Report, failed bool) {
	for _, conc := range pl.concs {
		cfg := pl.base
		cfg.Concurrency = conc
		label := fmt.Sprintf("%s %s c=%d", cfg.Op, bench.FormatSize(pl.size), conc)
		var done func()
		cfg.Progress, done = progressPrinter(stderr, f.progress, label)
		rep, err := bench.Run(ctx, cfg, eng)
		done()
		rep.Mode = mode
		if pl.scope == client.ScopeCluster {
			rep.Scope = "cluster"
			if f.remote != "" {
				rep.Scope = "remote"
			}
		}
		reps = append(reps, rep)
		if err != nil {
			fmt.Fprintf(stderr, "tidepool bench: %v\n", err)
			return reps, true
		}
		if rep.Errors > 0 {
			failed = true
		}
		if !f.json {
			rep.WriteText(stdout)
		}
	}
	return reps, failed
}

// finishBench prints the JSON and the plot of a sweep.
func finishBench(f *benchFlags, reps []bench.Report, failed bool, stdout, stderr io.Writer) int {
	if f.json {
		enc := json.NewEncoder(stdout)
		if len(reps) == 1 {
			enc.Encode(reps[0])
		} else {
			enc.Encode(struct {
				Runs []bench.Report `json:"runs"`
			}{reps})
		}
	}
	if f.plot != "" {
		if err := chart.Latency(f.plot, reps); err != nil {
			fmt.Fprintf(stderr, "tidepool bench: %v\n", err)
			return cli.ExitError
		}
		if !f.json {
			fmt.Fprintf(stdout, "plot written to %s\n", f.plot)
		}
	}
	if failed {
		return cli.ExitError
	}
	return cli.ExitOK
}

// Raw limits: operations that move the same bytes without the sidecar, so
// a run can put the engine API's figures next to what the machine can do.
const (
	rawMemcpy     = "memcpy"      // copy a value between two buffers
	rawSocketCopy = "socket-copy" // a 1-byte request, then a value-sized reply over a Unix stream socket
)

// rawRingBytes is the source the raw limits copy from, cycled value by
// value: larger than any CPU cache, so reads come from memory as the
// sidecar's do.
const rawRingBytes = 256 << 20

// rawEngine runs a raw limit as bench.Engine.Get.
type rawEngine struct {
	op    string
	size  int
	ring  []byte
	next  atomic.Int64
	bufs  chan []byte
	pairs chan *rawPair
}

// rawPair is a Unix socket pair whose far end answers each byte it reads
// with size bytes.
type rawPair struct {
	near, far *os.File
	done      chan struct{}
}

func newRawEngine(op string, size, concurrency int) (*rawEngine, error) {
	e := &rawEngine{op: op, size: size, ring: make([]byte, max(rawRingBytes/size, 1)*size), bufs: make(chan []byte, concurrency), pairs: make(chan *rawPair, concurrency)}
	for i := 0; i < len(e.ring); i += 4096 {
		e.ring[i] = byte(i >> 12) // fault the pages in before timing
	}
	for range concurrency {
		e.bufs <- make([]byte, size)
		if op != rawSocketCopy {
			continue
		}
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			e.Close()
			return nil, err
		}
		p := &rawPair{near: os.NewFile(uintptr(fds[0]), "near"), far: os.NewFile(uintptr(fds[1]), "far"), done: make(chan struct{})}
		go func() {
			defer close(p.done)
			one := make([]byte, 1)
			for {
				if _, err := io.ReadFull(p.far, one); err != nil {
					return
				}
				if _, err := p.far.Write(e.src()); err != nil {
					return
				}
			}
		}()
		e.pairs <- p
	}
	return e, nil
}

// src returns the next value-sized piece of the ring.
func (e *rawEngine) src() []byte {
	n := int64(len(e.ring) / e.size)
	i := int((e.next.Add(1) % n)) * e.size
	return e.ring[i : i+e.size]
}

// Close ends the socket pairs.
func (e *rawEngine) Close() {
	for {
		select {
		case p := <-e.pairs:
			p.near.Close()
			<-p.done
			p.far.Close()
		default:
			return
		}
	}
}

func (e *rawEngine) Get(ctx context.Context, _ []byte) (int, bool, error) {
	buf := <-e.bufs
	defer func() { e.bufs <- buf }()
	if e.op == rawMemcpy {
		return copy(buf, e.src()), true, nil
	}
	p := <-e.pairs
	defer func() { e.pairs <- p }()
	if _, err := p.near.Write([]byte{1}); err != nil {
		return 0, false, err
	}
	n, err := io.ReadFull(p.near, buf)
	return n, err == nil, err
}

func (e *rawEngine) Put(context.Context, []byte, []byte) error { return errors.New("raw: no put") }
func (e *rawEngine) Lookup(context.Context, [][]byte) (int, error) {
	return 0, errors.New("raw: no lookup")
}
func (e *rawEngine) BatchGet(context.Context, [][]byte) (int64, int, error) {
	return 0, 0, errors.New("raw: no batch-get")
}

// runRaw runs a raw-limit sweep and prints it like a benchmark.
func runRaw(f *benchFlags, base bench.Config, concs []int, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var reps []bench.Report
	for _, conc := range concs {
		eng, err := newRawEngine(f.op, base.Size, conc)
		if err != nil {
			fmt.Fprintf(stderr, "tidepool bench: %v\n", err)
			return cli.ExitError
		}
		cfg := base
		cfg.Op, cfg.Concurrency = bench.OpGet, conc
		var done func()
		cfg.Progress, done = progressPrinter(stderr, f.progress, fmt.Sprintf("%s %s c=%d", f.op, bench.FormatSize(int64(base.Size)), conc))
		rep, err := bench.Run(ctx, cfg, eng)
		done()
		eng.Close()
		rep.Op, rep.Mode = bench.Op(f.op), "raw limit"
		reps = append(reps, rep)
		if err != nil {
			fmt.Fprintf(stderr, "tidepool bench: %v\n", err)
			return cli.ExitError
		}
		if !f.json {
			rep.WriteText(stdout)
		}
	}
	return finishBench(f, reps, false, stdout, stderr)
}
