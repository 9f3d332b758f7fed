package benchcmd

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidepool-kv/tidepool/cmd/tidepool/internal/cli"
	"github.com/tidepool-kv/tidepool/cmd/tidepool/internal/clitest"
	"github.com/tidepool-kv/tidepool/internal/bench"
)

// binPath is the tidepool binary built once for the process tests.
var binPath string

func TestMain(m *testing.M) { clitest.MainUnlessShort(m, &binPath) }

func TestBenchCLI(t *testing.T) {
	d := clitest.Start(t, binPath, nil)
	tests := []struct {
		name  string
		args  []string
		bytes bool // the op moves value bytes
	}{
		{"put", []string{"--op", "put"}, true},
		{"get", []string{"--op", "get"}, true},
		{"mixed", []string{"--op", "mixed", "--ratio", "0.5"}, true},
		{"lookup", []string{"--op", "lookup", "--batch", "8"}, false},
		{"batch-get", []string{"--op", "batch-get", "--batch", "4"}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"bench", "--size", "4KiB", "--keys", "64", "--concurrency", "2", "--ops", "300", "--json", "--progress", "none"}, tc.args...)
			out, errs, code := d.Run(t, binPath, nil, args...)
			if code != 0 {
				t.Fatalf("exit %d: %s %s", code, out, errs)
			}
			var r bench.Report
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatalf("%v: %q", err, out)
			}
			if r.Ops != 300 || r.Errors != 0 || r.Misses != 0 || r.OpsPerSec <= 0 || r.P50Us <= 0 || r.P99Us < r.P50Us {
				t.Fatalf("report %+v", r)
			}
			if tc.bytes != (r.BytesPerSec > 0) {
				t.Fatalf("bytes/s %f for %s", r.BytesPerSec, tc.name)
			}
		})
	}
	t.Run("sweep text and plot", func(t *testing.T) {
		png := filepath.Join(t.TempDir(), "lat.png")
		out, errs, code := d.Run(t, binPath, nil, "bench", "--op", "get", "--size", "64KiB", "--keys", "32", "--concurrency", "1,2,4", "--ops", "200", "--plot", png, "--progress", "plain")
		if code != 0 || strings.Count(out, "throughput") != 3 || !strings.Contains(out, "plot written") {
			t.Fatalf("exit %d\n%s\n%s", code, out, errs)
		}
		if !strings.Contains(errs, "ops/s") {
			t.Fatalf("no plain progress lines on stderr: %q", errs)
		}
		clitest.CheckPNG(t, png)
	})
	t.Run("zero-copy", func(t *testing.T) {
		out, errs, code := d.Run(t, binPath, nil, "bench", "--op", "get", "--size", "64KiB", "--keys", "16", "--concurrency", "2", "--ops", "100", "--zero-copy", "--json", "--progress", "none")
		if code != 0 && (strings.Contains(errs, "no zero-copy calls") || strings.Contains(errs+out, "nknown method")) {
			t.Skipf("zero-copy not in this build: %s", errs)
		}
		var r bench.Report
		if err := json.Unmarshal([]byte(out), &r); code != 0 || err != nil || r.Ops != 100 || r.Errors != 0 || r.Mode != "zero-copy" {
			t.Fatalf("exit %d, %v: %s %s", code, err, out, errs)
		}
		out, errs, code = d.Run(t, binPath, nil, "bench", "--op", "get", "--size", "64KiB", "--keys", "16", "--concurrency", "2", "--ops", "100", "--zero-copy", "--verify-reads", "--json", "--progress", "none")
		r = bench.Report{}
		if err := json.Unmarshal([]byte(out), &r); code != 0 || err != nil || r.Ops != 100 || r.Errors != 0 || r.Mode != "zero-copy, verified reads" {
			t.Fatalf("--verify-reads: exit %d, %v: %s %s", code, err, out, errs)
		}
		for _, wm := range []string{"pwrite", "mapped", "keyed"} {
			out, errs, code = d.Run(t, binPath, nil, "bench", "--op", "put", "--size", "64KiB", "--concurrency", "2", "--ops", "100", "--zero-copy", "--write-mode", wm, "--json", "--progress", "none")
			r = bench.Report{}
			if err := json.Unmarshal([]byte(out), &r); code != 0 || err != nil || r.Ops != 100 || r.Errors != 0 || r.Mode != "zero-copy, "+wm+" puts" {
				t.Fatalf("--write-mode %s: exit %d, %v: %s %s", wm, code, err, out, errs)
			}
		}
	})
	t.Run("registered", func(t *testing.T) {
		for _, op := range []string{"put", "get", "mixed"} {
			out, errs, code := d.Run(t, binPath, nil, "bench", "--op", op, "--size", "64KiB", "--keys", "16", "--concurrency", "3", "--ops", "150", "--registered", "--json", "--progress", "none")
			var r bench.Report
			if err := json.Unmarshal([]byte(out), &r); code != 0 || err != nil || r.Ops != 150 || r.Errors != 0 || r.Misses != 0 || r.Mode != "registered buffers" {
				t.Fatalf("%s: exit %d, %v: %s %s", op, code, err, out, errs)
			}
		}
	})
	t.Run("usage errors", func(t *testing.T) {
		for _, args := range [][]string{
			{"bench", "--op", "get", "--registered", "--zero-copy"},
			{"bench", "--op", "lookup", "--registered"},
			{"bench", "--op", "scan"},
			{"bench", "--size", "0"},
			{"bench", "--concurrency", "1,x"},
			{"bench", "--op", "lookup", "--zero-copy"},
			{"bench", "--op", "get", "--verify-reads"},
			{"bench", "--op", "put", "--write-mode", "mapped"},
			{"bench", "--op", "put", "--zero-copy", "--write-mode", "splice"},
			{"bench", "--op", "put", "--zero-copy", "--write-mode", "mmap"},
			{"bench", "--scope", "everywhere"},
		} {
			cmd := exec.Command(binPath, append(args, "--socket", d.Socket)...)
			if out, err := cmd.CombinedOutput(); err == nil || cmd.ProcessState.ExitCode() != cli.ExitUsage {
				t.Errorf("%v: %v, want usage error\n%s", args, err, out)
			}
		}
	})
}
