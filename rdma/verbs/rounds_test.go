//go:build verbs

package verbs

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/internal/peerauth"
	"github.com/tidepool-kv/tidepool/protocol/frame"
	"github.com/tidepool-kv/tidepool/rdma"
	"github.com/tidepool-kv/tidepool/rdma/tcp"
)

// TestBenchRounds compares the verbs transport with ib_read_bw (perftest),
// the limit of the device, on the same device in the same run, in several
// interleaved rounds: each round runs ib_read_bw with 1 and 16 queue pairs,
// 1 MiB summed reads over verbs with 16 and 1 callers (default slices, and
// 256 KiB work requests: "rdma256k") and the same over rdma/tcp,
// in an order that alternates between rounds (ib_read_bw first, then verbs
// first), and
// prints each phase's throughput, p50/p99 and where the guest's CPU time
// went (/proc/stat: user, system, softirq, idle) and the device's counters
// (packets, duplicate requests, retries: a retransmitted READ costs its
// whole response again). The verdict is the median over rounds of verbs(16
// callers) / ib_read_bw, printed against ib_read_bw with 1 QP (its
// default), with 16 QPs (as many as the verbs phase uses) and against the
// better of the two in each round (the device's limit as far as perftest
// shows it). It reports; it does not fail on the ratio
// (emulated runs swing too much for an assertion). It runs only where
// TIDEPOOL_RDMA_BENCH_ROUNDS is set (scripts/test-rdma.sh bench).
func TestBenchRounds(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("TIDEPOOL_RDMA_BENCH_ROUNDS"))
	if rounds <= 0 {
		t.Skip("TIDEPOOL_RDMA_BENCH_ROUNDS not set (scripts/test-rdma.sh bench)")
	}
	ip := envOr("TIDEPOOL_RDMA_BENCH_IP", "127.0.0.1")
	reads := envInt("TIDEPOOL_RDMA_BENCH_READS", 96)
	cfg := testConfig(t)
	if len(cfg.Devices) > 1 {
		cfg.Devices = cfg.Devices[:1] // ib_read_bw uses one device
	}
	infos, err := Probe(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dev := infos[0]
	key, err := peerauth.NewKey([]byte("verbs-benchmark-secret"), "bench")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ListenAddr = ip + ":0"
	cfg.Key = key
	// Generous limits: a busy host slows the guest down many times.
	cfg.IOTimeout, cfg.DialTimeout = 5*time.Minute, 30*time.Second
	// The production RC timeout and retries (testConfig shortens them for
	// the fault tests), as ib_read_bw uses its own default (14).
	def := DefaultConfig()
	cfg.QPTimeout, cfg.QPRetry = def.QPTimeout, def.QPRetry
	tc := tcp.DefaultLocalConfig()
	tc.ListenAddr = ip + ":0"
	tc.Key = key
	tc.IdleTimeout = time.Hour // pooled connections wait out the other phases
	tc.DialTimeout, tc.IOTimeout = 30*time.Second, 5*time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	const size = 1 << 20
	const maxCallers = 16
	src := make([]byte, size)
	for i := range src {
		src[i] = byte(i*7 + i>>11)
	}
	sum := frame.Checksum(src)
	mk := func(x, y rdma.Transport) *benchSetup {
		t.Cleanup(func() { _ = x.Close(); _ = y.Close() })
		rd, err := y.Register(src)
		if err != nil {
			t.Fatal(err)
		}
		ld, err := x.Register(make([]byte, maxCallers*size))
		if err != nil {
			t.Fatal(err)
		}
		p, err := x.Connect(ctx, y.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		s := &benchSetup{p: p, op: rdma.Op{Local: ld.ID, Remote: rd, Len: size, Sum: sum, SumKnown: true}}
		// Warm the pool: one QP or connection per caller.
		if _, err := s.run(ctx, maxCallers, maxCallers); err != nil {
			t.Fatal(err)
		}
		return s
	}
	vx, err := NewTransport(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	vy, err := NewTransport(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := tcp.New(tc, nil)
	if err != nil {
		t.Fatal(err)
	}
	ty, err := tcp.New(tc, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The same with 256 KiB work requests (a 1 MiB block is 4, each summed
	// as it lands while the next ones move): what slicing buys.
	c1m := cfg
	c1m.SliceSize = 256 << 10
	wx, err := NewTransport(c1m, nil)
	if err != nil {
		t.Fatal(err)
	}
	wy, err := NewTransport(c1m, nil)
	if err != nil {
		t.Fatal(err)
	}
	transports := map[string]*benchSetup{"rdma": mk(vx, vy), "rdma256k": mk(wx, wy), "tcp": mk(tx, ty)}

	type result struct {
		gbps     float64
		p50, p99 time.Duration
		cpu      cpuShare
		hw       string
	}
	phases := []string{"ib_read_bw", "ib_read_bw/16", "rdma/16", "rdma/1", "rdma256k/16", "rdma256k/1", "tcp/16", "tcp/1"}
	res := make(map[string][]result)
	for r := 0; r < rounds; r++ {
		order := phases
		if r%2 == 1 {
			order = []string{"rdma/16", "ib_read_bw/16", "ib_read_bw", "rdma/1", "rdma256k/1", "rdma256k/16", "tcp/1", "tcp/16"}
		}
		for _, ph := range order {
			c0, h0 := readCPU(), readHW(dev.Name, dev.Port)
			var out result
			if tool, qps, _ := strings.Cut(ph, "/"); tool == "ib_read_bw" {
				q, iters := 1, reads
				if qps != "" {
					q, _ = strconv.Atoi(qps)
					iters = max((reads+q-1)/q, 8)
				}
				// perftest calibrates its clock first and reports 0 when
				// that fails (r^2 < 0.9, common under TCG on a busy host):
				// run it again then.
				var g float64
				var err error
				for try := 0; try < 3; try++ {
					if g, err = runReadBW(ctx, dev.Name, dev.GIDIndex, ip, 18515+8*r+2*try+q%2, q, iters); err == nil {
						break
					}
					t.Logf("round %d %s: %v", r+1, ph, err)
				}
				if err != nil {
					t.Fatalf("round %d: %v", r+1, err)
				}
				out.gbps = g
			} else {
				tr, n, _ := strings.Cut(ph, "/")
				callers, _ := strconv.Atoi(n)
				cnt := reads
				if callers == 1 {
					cnt = max(reads/3, 8)
				}
				start := time.Now()
				lat, err := transports[tr].run(ctx, callers, cnt)
				if err != nil {
					t.Fatalf("round %d %s: %v", r+1, ph, err)
				}
				out.gbps = float64(cnt) * size * 8 / time.Since(start).Seconds() / 1e9
				out.p50, out.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
			}
			out.cpu = readCPU().since(c0)
			out.hw = readHW(dev.Name, dev.Port).since(h0)
			res[ph] = append(res[ph], out)
			extra := ""
			if out.p50 > 0 {
				extra = fmt.Sprintf(" p50 %v p99 %v", out.p50.Round(time.Millisecond), out.p99.Round(time.Millisecond))
			}
			t.Logf("round %d %-14s %.4f Gb/s%s; cpu %s; rxe0 %s", r+1, ph, out.gbps, extra, out.cpu, out.hw)
		}
		ib1, ib16 := res["ib_read_bw"][r].gbps, res["ib_read_bw/16"][r].gbps
		var rs []string
		for _, ph := range phases[2:] {
			rs = append(rs, fmt.Sprintf("%s %.0f%%/%.0f%%", ph, 100*res[ph][r].gbps/ib1, 100*res[ph][r].gbps/ib16))
		}
		t.Logf("round %d ratio to ib_read_bw (1 QP / 16 QPs): %s", r+1, strings.Join(rs, ", "))
	}
	median := func(xs []float64) float64 {
		s := append([]float64(nil), xs...)
		sort.Float64s(s)
		if len(s)%2 == 1 {
			return s[len(s)/2]
		}
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	var lines []string
	for _, ph := range phases {
		var r1, r16, rb, g, p50, p99 []float64
		for r, x := range res[ph] {
			r1 = append(r1, x.gbps/res["ib_read_bw"][r].gbps)
			r16 = append(r16, x.gbps/res["ib_read_bw/16"][r].gbps)
			rb = append(rb, x.gbps/max(res["ib_read_bw"][r].gbps, res["ib_read_bw/16"][r].gbps))
			g = append(g, x.gbps)
			p50 = append(p50, float64(x.p50.Milliseconds()))
			p99 = append(p99, float64(x.p99.Milliseconds()))
		}
		l := fmt.Sprintf("BENCH-SUMMARY %-14s median %.4f Gb/s", ph, median(g))
		if !strings.HasPrefix(ph, "ib_read_bw") {
			l += fmt.Sprintf(", p50 %.0f ms, p99 %.0f ms", median(p50), median(p99))
		}
		l += fmt.Sprintf("; to ib_read_bw 1 QP: %s, median %.0f%%; to 16 QPs: %s, median %.0f%%; to the better of the two: %s, median %.0f%%",
			pct(r1), 100*median(r1), pct(r16), 100*median(r16), pct(rb), 100*median(rb))
		lines = append(lines, l)
	}
	for _, l := range lines {
		fmt.Println(l)
	}
}

func pct(xs []float64) string {
	var b strings.Builder
	for i, x := range xs {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.0f%%", 100*x)
	}
	return b.String()
}

// benchSetup is a connected pair with a registered 1 MiB source.
type benchSetup struct {
	p  rdma.Peer
	op rdma.Op
}

// run does cnt summed 1 MiB reads (or the TCP equivalent) with callers
// goroutines, each into its own slot, and returns the sorted latencies.
func (s *benchSetup) run(ctx context.Context, callers, cnt int) ([]time.Duration, error) {
	lat := make([][]time.Duration, callers)
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	for w := 0; w < callers; w++ {
		n := cnt / callers
		if w < cnt%callers {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			op := s.op
			op.LocalOff = uint64(w) * op.Len
			for i := 0; i < n; i++ {
				t0 := time.Now()
				if err := s.p.Read(ctx, op); err != nil {
					errs <- err
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return nil, err
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	return all, nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func envInt(k string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(k)); err == nil && n > 0 {
		return n
	}
	return def
}

var readBWLine = regexp.MustCompile(`(?m)^\s*1048576\s+(\d+)\s+([\d.]+)\s+([\d.]+)`)

// runReadBW runs ib_read_bw (1 MiB reads, qps queue pairs, n iterations
// each) as server and
// client in loopback on dev and returns the client's average Gb/s.
func runReadBW(ctx context.Context, dev string, gid int, ip string, port, qps, n int) (float64, error) {
	args := []string{"-d", dev, "-x", strconv.Itoa(gid), "-F", "-s", "1048576", "-q", strconv.Itoa(qps), "-n", strconv.Itoa(n),
		"--report_gbits", "-p", strconv.Itoa(port)}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var sout bytes.Buffer
	srv := exec.CommandContext(ctx, "ib_read_bw", args...)
	srv.Stdout, srv.Stderr = &sout, &sout
	if err := srv.Start(); err != nil {
		return 0, fmt.Errorf("ib_read_bw server: %w", err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for !listening(port) {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("ib_read_bw server not listening on %d: %s", port, sout.String())
		}
		time.Sleep(20 * time.Millisecond) // polling /proc for the listener
	}
	out, err := exec.CommandContext(ctx, "ib_read_bw", append(args, ip)...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("ib_read_bw client: %w: %s", err, out)
	}
	m := readBWLine.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("ib_read_bw: no 1048576 line in %q", out)
	}
	g, err := strconv.ParseFloat(string(m[3]), 64)
	if err == nil && g <= 0 {
		err = fmt.Errorf("ib_read_bw: average %q in %q", m[3], out)
	}
	return g, err
}

// listening reports whether a TCP socket listens on port (/proc/net/tcp*).
func listening(port int) bool {
	want := fmt.Sprintf(":%04X ", port)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) > 3 && strings.HasSuffix(fs[1]+" ", want) && fs[3] == "0A" {
				return true
			}
		}
	}
	return false
}

// cpuSample is the guest's CPU time (/proc/stat, ticks). Under TCG ticks
// can be late, so only the split between user, system, softirq and idle
// of one phase means something.
type cpuSample struct {
	user, sys, irq, idle, total uint64
}

func readCPU() cpuSample {
	var s cpuSample
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		fs := strings.Fields(line)
		var v []uint64
		for _, f := range fs[1:] {
			x, _ := strconv.ParseUint(f, 10, 64)
			v = append(v, x)
		}
		if len(v) >= 8 {
			s.user = v[0] + v[1]
			s.sys = v[2]
			s.idle = v[3] + v[4]
			s.irq = v[5] + v[6]
			for _, x := range v[:8] {
				s.total += x
			}
		}
	}
	return s
}

// cpuShare is where the CPU time of a phase went, in % of all CPUs.
type cpuShare struct{ user, sys, irq, idle float64 }

func (s cpuSample) since(a cpuSample) cpuShare {
	tot := float64(s.total - a.total)
	if tot <= 0 {
		return cpuShare{}
	}
	f := func(x, y uint64) float64 { return 100 * float64(x-y) / tot }
	return cpuShare{f(s.user, a.user), f(s.sys, a.sys), f(s.irq, a.irq), f(s.idle, a.idle)}
}

func (c cpuShare) String() string {
	return fmt.Sprintf("user %.0f%% sys %.0f%% softirq+irq %.0f%% idle %.0f%%", c.user, c.sys, c.irq, c.idle)
}

// hwCounters are the port's hw_counters (rxe: sent_pkts, rcvd_pkts,
// duplicate_request, completer_retry_err, ...), by name.
type hwCounters map[string]uint64

func readHW(dev string, port int) hwCounters {
	dir := fmt.Sprintf("/sys/class/infiniband/%s/ports/%d/hw_counters", dev, port)
	es, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	h := hwCounters{}
	for _, e := range es {
		b, err := os.ReadFile(dir + "/" + e.Name())
		if err != nil {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
			h[e.Name()] = n
		}
	}
	return h
}

// since renders the counters that moved since a, sorted by name.
func (h hwCounters) since(a hwCounters) string {
	var out []string
	for k, v := range h {
		if d := v - a[k]; d != 0 {
			out = append(out, fmt.Sprintf("%s=%d", k, d))
		}
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}
