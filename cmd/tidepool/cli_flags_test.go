package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// runInProcess runs the CLI in this process (run, as main does) and
// returns stdout, stderr and the exit status.
func runInProcess(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, strings.NewReader(""), &out, &errb)
	return out.String(), errb.String(), code
}

// commandPaths lists every command of the tree (without "tidepool"), each
// as its words: "get", "completion bash", ...
func commandPaths() [][]string {
	var paths [][]string
	var walk func(c *cobra.Command, prefix []string)
	walk = func(c *cobra.Command, prefix []string) {
		for _, sub := range c.Commands() {
			if sub.Hidden {
				continue
			}
			p := append(append([]string{}, prefix...), sub.Name())
			paths = append(paths, p)
			walk(sub, p)
		}
	}
	root := newRootCmd(&stdio{In: strings.NewReader(""), Out: &bytes.Buffer{}, Err: &bytes.Buffer{}})
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	walk(root, nil)
	return paths
}

// TestCLIFlagsAnyOrder is the regression test of `tidepool get KEY -o
// FILE` ("want exactly one KEY": flags after an argument were taken as
// arguments): against a real serve, put, get, exists, lookup and delete
// take their flags before, between and after the arguments.
func TestCLIFlagsAnyOrder(t *testing.T) {
	d := startDaemon(t)
	dir := t.TempDir()
	sock := "--socket=" + d.socket
	valueFile := filepath.Join(dir, "value")
	os.WriteFile(valueFile, []byte("from a file"), 0o600)

	type step struct {
		name     string
		stdin    string
		args     []string
		code     int
		stdout   string // substring of stdout
		fileOut  string // the file written by -o / --output
		wantFile string
	}
	out1, out2, out3 := filepath.Join(dir, "o1"), filepath.Join(dir, "o2"), filepath.Join(dir, "o3")
	steps := []step{
		{name: "put, flags after the key", stdin: "v0", args: []string{"put", "k0", "--ns", "order", sock}, stdout: "stored k0 (2 bytes)"},
		{name: "put, flags after KEY FILE", args: []string{"put", "k1", valueFile, "--depth", "1", "--ns", "order", sock}, stdout: "stored k1 (11 bytes)"},
		{name: "put, flags between KEY and -", stdin: "v2", args: []string{"put", sock, "k2", "--ns=order", "-", "--durable=false"}, stdout: "stored k2"},
		{name: "put, key after --", stdin: "dash", args: []string{"put", "--ns", "order", sock, "--", "-k3"}, stdout: "stored -k3"},
		{name: "get KEY -o FILE", args: []string{"get", "k1", "-o", out1, "--ns", "order", sock}, fileOut: out1, wantFile: "from a file"},
		{name: "get KEY --output=FILE", args: []string{"get", "k0", "--output=" + out2, sock, "--ns", "order"}, fileOut: out2, wantFile: "v0"},
		{name: "get -o FILE KEY, flags first", args: []string{"get", "--ns", "order", sock, "-o", out3, "k2"}, fileOut: out3, wantFile: "v2"},
		{name: "get KEY --ns to stdout", args: []string{"get", "k2", "--ns", "order", sock}, stdout: "v2"},
		{name: "get of a key after --", args: []string{"get", "--ns", "order", sock, "--", "-k3"}, stdout: "dash"},
		{name: "get absent, flags after", args: []string{"get", "nope", "--ns", "order", sock}, code: exitNotFound},
		{name: "exists, flags between keys", args: []string{"exists", "k0", "--ns", "order", "k1", sock, "--scope", "local"}, stdout: "k1\tpresent"},
		{name: "exists, absent key, flags after", args: []string{"exists", "k0", "nope", "--ns", "order", sock}, code: exitNotFound, stdout: "nope\tabsent"},
		{name: "lookup, flags after the keys", args: []string{"lookup", "k0", "k1", "nope", "--ns", "order", "--json", sock}, stdout: `"matched": 2`},
		{name: "delete, flags after the key", args: []string{"delete", "k0", "--ns", "order", sock}, stdout: "deleted k0"},
		{name: "delete again: not found", args: []string{"delete", "k0", sock, "--ns", "order"}, code: exitNotFound},
		{name: "get --hex after the key", args: []string{"get", "6b31", "--hex", "--ns", "order", sock}, stdout: "from a file"},
	}
	for _, s := range steps {
		out, errs, code := runTool(t, []byte(s.stdin), s.args...)
		if code != s.code || !strings.Contains(out, s.stdout) {
			t.Errorf("%s: tidepool %q: exit %d (want %d), stdout %q (want %q), stderr %q", s.name, s.args, code, s.code, out, s.stdout, errs)
			continue
		}
		if s.fileOut != "" {
			b, err := os.ReadFile(s.fileOut)
			if err != nil || string(b) != s.wantFile {
				t.Errorf("%s: %s holds %q (%v), want %q", s.name, s.fileOut, b, err, s.wantFile)
			}
			if out != "" {
				t.Errorf("%s: with -o, stdout %q, want nothing", s.name, out)
			}
		}
	}
	// The namespace came from flags given after the keys: the blocks are
	// in "order", none in "default".
	out, errs, code := runTool(t, nil, "stat", "--json", sock)
	var st struct {
		Namespaces []struct {
			Ns     string
			Blocks int64
		}
	}
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("stat: %d %q %q", code, out, errs)
	}
	for _, n := range st.Namespaces {
		if n.Ns != "order" || n.Blocks != 3 {
			t.Errorf("namespace %q holds %d blocks; want only order with 3 (k1, k2, -k3)", n.Ns, n.Blocks)
		}
	}
}

// TestCLIHelpEveryCommand runs --help and -h on every command: exit 0,
// the usage on stdout, nothing on stderr.
func TestCLIHelpEveryCommand(t *testing.T) {
	paths := commandPaths()
	for _, want := range []string{"serve", "put", "get", "exists", "lookup", "delete", "clear", "stat", "members", "prefetch", "bench", "replay", "inject", "webhook", "version", "help", "completion", "completion bash", "completion zsh", "completion fish"} {
		found := false
		for _, p := range paths {
			found = found || strings.Join(p, " ") == want
		}
		if !found {
			t.Errorf("no command %q in the tree", want)
		}
	}
	for _, p := range append(paths, nil) { // nil: the root
		for _, h := range []string{"--help", "-h"} {
			out, errs, code := runInProcess(t, append(append([]string{}, p...), h)...)
			use := strings.TrimSpace("tidepool " + strings.Join(p, " "))
			if code != exitOK || errs != "" || !strings.Contains(out, "Usage:") || !strings.Contains(out, use) {
				t.Errorf("tidepool %s %s: exit %d, stderr %q, stdout:\n%s", strings.Join(p, " "), h, code, errs, out)
			}
		}
	}
	// The root help documents every exit status.
	out, _, _ := runInProcess(t, "--help")
	for code, meaning := range map[int]string{exitOK: "success", exitError: "error", exitUsage: "usage error", exitNotFound: "not found"} {
		if !strings.Contains(out, fmt.Sprintf("  %d  %s", code, meaning)) {
			t.Errorf("root help does not document exit status %d (%s):\n%s", code, meaning, out)
		}
	}
	// The binary too: help is not an error (serve --help used to exit 2).
	b, err := exec.Command(binPath, "serve", "--help").Output()
	if err != nil || !strings.Contains(string(b), "--dram-capacity bytes") {
		t.Fatalf("tidepool serve --help: %v\n%s", err, b)
	}
}

// TestCLIUnknownFlagUsage checks that an unknown flag, a flag value of the
// wrong type and a stray argument are usage errors (exit 2) on every
// command, named on stderr with a pointer to --help.
func TestCLIUnknownFlagUsage(t *testing.T) {
	for _, p := range append(commandPaths(), nil) {
		args := append(append([]string{}, p...), "--no-such-flag")
		out, errs, code := runInProcess(t, args...)
		if code != exitUsage || !strings.Contains(errs, "unknown flag: --no-such-flag") || !strings.Contains(errs, "--help' for usage") || out != "" {
			t.Errorf("tidepool %q: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
	for _, args := range [][]string{
		{"get", "k", "--timeout", "soon"},
		{"put", "k", "--depth", "first"},
		{"bench", "--keys", "many"},
		{"serve", "stray"},
		{"version", "now"},
		{"frobnicate"},
		{}, // no command
	} {
		_, errs, code := runInProcess(t, args...)
		if code != exitUsage || errs == "" {
			t.Errorf("tidepool %q: exit %d, stderr %q; want usage error", args, code, errs)
		}
	}
	// The binary's status, as a shell sees it.
	cmd := exec.Command(binPath, "get", "k", "--no-such-flag")
	if b, err := cmd.CombinedOutput(); err == nil || cmd.ProcessState.ExitCode() != exitUsage {
		t.Fatalf("tidepool get k --no-such-flag: %v\n%s", err, b)
	}
}

// TestCLICompletion checks the shell completion scripts and the answers
// the scripts ask the binary for.
func TestCLICompletion(t *testing.T) {
	for _, sh := range []string{"bash", "zsh", "fish"} {
		out, errs, code := runTool(t, nil, "completion", sh)
		if code != 0 || len(out) < 1000 || !strings.Contains(out, "tidepool") {
			t.Fatalf("completion %s: exit %d, %d bytes, stderr %q", sh, code, len(out), errs)
		}
		if sh == "bash" {
			script := filepath.Join(t.TempDir(), "tidepool.bash")
			os.WriteFile(script, []byte(out), 0o600)
			if b, err := exec.Command("bash", "-n", script).CombinedOutput(); err != nil {
				t.Fatalf("bash -n on the completion script: %v\n%s", err, b)
			}
		}
	}
	// What the scripts run on <TAB>: commands, flags, flag values.
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"__complete", "g"}, []string{"get"}},
		{[]string{"__complete", "get", "k", "--sc"}, []string{"--scope"}},
		{[]string{"__complete", "get", "k", "--scope", ""}, []string{"local", "cluster"}},
		{[]string{"__complete", "serve", "--log-level", ""}, []string{"debug", "info", "warn", "error"}},
		{[]string{"__complete", "serve", "--dram-c"}, []string{"--dram-capacity"}},
	} {
		out, errs, code := runTool(t, nil, c.args...)
		for _, w := range c.want {
			if code != 0 || !strings.Contains(out, w+"\n") && !strings.Contains(out, w+"\t") {
				t.Errorf("tidepool %q: exit %d, want %q in\n%s%s", c.args, code, w, out, errs)
			}
		}
	}
}

// TestCLIServeFlagsFromConfigTable checks that serve's flags are the
// settings table: one flag per key, named --key with '-' for '_', with the
// embedded default, the setting's kind and its variable, and no other flag
// but --config and --help.
func TestCLIServeFlagsFromConfigTable(t *testing.T) {
	cmd := newServeCmd(&stdio{In: strings.NewReader(""), Out: &bytes.Buffer{}, Err: &bytes.Buffer{}})
	fs := cmd.Flags()
	def := DefaultConfig()
	keys := map[string]bool{"config": true, "help": true}
	for _, s := range settings {
		keys[s.flagName()] = true
		f := fs.Lookup(s.flagName())
		if f == nil {
			t.Errorf("setting %s has no flag --%s", s.key, s.flagName())
			continue
		}
		if f.DefValue != s.get(&def) || f.Value.Type() != s.kind || s.kind == "" || !strings.Contains(f.Usage, s.envName()) {
			t.Errorf("--%s: default %q type %q usage %q; want default %q, type %q, env %s", f.Name, f.DefValue, f.Value.Type(), f.Usage, s.get(&def), s.kind, s.envName())
		}
		if f.NoOptDefVal != "" {
			t.Errorf("--%s takes no value; every setting flag takes one (--insecure-cluster true)", f.Name)
		}
	}
	cmd.InitDefaultHelpFlag()
	fs.VisitAll(func(f *pflag.Flag) {
		if !keys[f.Name] {
			t.Errorf("serve flag --%s is not in the settings table", f.Name)
		}
	})
	// The generated flags reach loadConfig, and bad values of several
	// flags are all reported.
	_, errs, code := runInProcess(t, "serve", "--max-batch", "lots", "--log-level", "warn", "--lease-timeout", "never")
	if code != exitUsage || !strings.Contains(errs, "--max-batch") || !strings.Contains(errs, "--lease-timeout") {
		t.Fatalf("serve with two bad flags: exit %d\n%s", code, errs)
	}
}
