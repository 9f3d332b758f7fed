// Package clitest runs the real tidepool binary for the tests of the
// command and its tools: it builds the binary once and starts
// `tidepool serve` processes.
package clitest

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// Build builds the tidepool binary into dir with the given build tags
// and returns its path; TIDEPOOL_BIN names a prebuilt one instead (the
// Soft-RoCE guest of scripts/test-rdma.sh has no Go toolchain).
func Build(dir string, tags ...string) (string, error) {
	if bin := os.Getenv("TIDEPOOL_BIN"); bin != "" {
		return bin, nil
	}
	bin := filepath.Join(dir, "tidepool")
	args := []string{"build", "-o", bin}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	out, err := exec.Command("go", append(args, "github.com/tidepool-kv/tidepool/cmd/tidepool")...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building tidepool: %v\n%s", err, out)
	}
	return bin, nil
}

// Main is a TestMain: it builds the binary (Build) into a temporary
// directory, sets *bin to its path, runs the tests and exits.
func Main(m *testing.M, bin *string, tags ...string) {
	dir, err := os.MkdirTemp("", "tpbin")
	if err != nil {
		panic(err)
	}
	if *bin, err = Build(dir, tags...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// MainUnlessShort is Main, except that with -short it builds nothing and
// leaves *bin empty: Start and Exec then skip their test.
func MainUnlessShort(m *testing.M, bin *string, tags ...string) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	Main(m, bin, tags...)
}

// Daemon is a real `tidepool serve` process.
type Daemon struct {
	Cmd     *exec.Cmd
	Socket  string
	Metrics string // host:port
	Stderr  *SyncBuffer
	Exited  chan error
	Lines   chan string // standard output after the first line
}

// SyncBuffer is a bytes.Buffer safe to read while the process writes it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Start starts `tidepool serve` from the binary bin under a command
// prefix (such as `ip netns exec NS`), with extra flags (a flag given
// again in extra overrides the default here), and returns once it printed
// its first line. The process is killed when the test ends.
func Start(t *testing.T, bin string, prefix []string, extra ...string) *Daemon {
	t.Helper()
	if testing.Short() {
		t.Skip("a real tidepool serve process: not in -short")
	}
	sockDir, err := os.MkdirTemp("", "tpcli")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	d := &Daemon{Socket: filepath.Join(sockDir, "tp.sock"), Stderr: &SyncBuffer{}, Exited: make(chan error, 1), Lines: make(chan string, 16)}
	for i := range len(extra) - 1 {
		if extra[i] == "--socket" {
			d.Socket = extra[i+1] // the last one wins, as in flag parsing
		}
	}
	args := append([]string{"serve",
		"--socket", filepath.Join(sockDir, "tp.sock"),
		"--data-dir", t.TempDir(),
		"--arena-dir", t.TempDir(),
		"--dram-capacity", "64MiB",
		"--max-value-size", "8MiB",
		"--metrics-addr", "127.0.0.1:0",
		"--log-level", "info",
	}, extra...)
	argv := append(append(append([]string{}, prefix...), bin), args...)
	d.Cmd = exec.Command(argv[0], argv[1:]...)
	d.Cmd.Stderr = d.Stderr
	stdout, err := d.Cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.Exited <- d.Cmd.Wait() }()
	t.Cleanup(func() {
		d.Cmd.Process.Kill()
		err := <-d.Exited
		d.Exited <- err
		if t.Failed() {
			t.Logf("server stderr:\n%s", d.Stderr.String())
		}
	})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case d.Lines <- sc.Text():
			default:
			}
		}
	}()
	select {
	case line := <-d.Lines:
		if !strings.Contains(line, "serving on socket "+d.Socket) {
			t.Fatalf("unexpected first line %q", line)
		}
		if m := regexp.MustCompile(`http://([0-9.:]+)/metrics`).FindStringSubmatch(line); m != nil {
			d.Metrics = m[1]
		}
	case err := <-d.Exited:
		d.Exited <- err // for the cleanup
		t.Fatalf("serve exited early: %v\n%s", err, d.Stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not report ready\n%s", d.Stderr.String())
	}
	return d
}

// Run runs the binary bin with a client command against d (args[0] is
// the command; --socket is added after it) and returns stdout, stderr and
// the exit code.
func (d *Daemon) Run(t *testing.T, bin string, stdin []byte, args ...string) (string, string, int) {
	t.Helper()
	return Exec(t, bin, stdin, append([]string{args[0], "--socket", d.Socket}, args[1:]...)...)
}

// Exec runs the binary bin with stdin and returns stdout, stderr and the
// exit code.
func Exec(t *testing.T, bin string, stdin []byte, args ...string) (string, string, int) {
	t.Helper()
	if bin == "" {
		t.Skip("runs the tidepool binary, which -short does not build")
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// CheckPNG fails unless path is a non-trivial PNG file.
func CheckPNG(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 5000 || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("%s: %d bytes, not a plot PNG", path, len(b))
	}
}
