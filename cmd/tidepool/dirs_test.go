package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/tidepool-kv/tidepool/client"
)

const nobodyUID = 65534

// serveOnce runs `tidepool serve` with args and returns its standard
// error and exit code. A serve that starts serving is a failure: it is
// killed and the test fails.
func serveOnce(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(binPath, append([]string{"serve", "--metrics-addr", "", "--dram-capacity", "64MiB", "--max-value-size", "8MiB", "--ssd-capacity", "0"}, args...)...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	served := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "serving on socket") {
				served <- sc.Text()
				return
			}
		}
		close(served)
	}()
	if line, ok := <-served; ok {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("serve %v started: %s", args, line)
	}
	err = cmd.Wait()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return errb.String(), code
}

// zeroCopyRead reads key with a fresh Go client through the shared arenas
// (Hello, map the arena files by path, Acquire, copy, verify, Release).
func zeroCopyRead(t *testing.T, socket string, key []byte, want []byte) {
	t.Helper()
	c, err := client.New(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, len(want))
	n, found, err := c.GetInto(context.Background(), "ns", key, buf)
	if err != nil || !found || n != len(want) || !bytes.Equal(buf, want) {
		t.Fatalf("zero-copy read of %s: n=%d found=%v err=%v equal=%v", key, n, found, err, bytes.Equal(buf[:min(n, len(buf))], want))
	}
}

// TestSecondServeLeavesFirstAlone: a second serve that shares any of the
// first one's data_dir, arena_dir or socket exits non-zero naming the
// first one's pid, before it touches anything: the first one's arena files
// stay, and a new client still reads its blocks in place.
func TestSecondServeLeavesFirstAlone(t *testing.T) {
	dataDir, arenaDir := t.TempDir(), t.TempDir()
	d := startDaemon(t, "--data-dir", dataDir, "--arena-dir", arenaDir, "--ssd-capacity", "0")
	value := restartValue(1, 1<<20)
	c, err := client.New(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(context.Background(), "ns", []byte("k"), value, 0); err != nil {
		t.Fatal(err)
	}
	c.Close()
	zeroCopyRead(t, d.socket, []byte("k"), value)
	arena := filepath.Join(arenaDir, "arena-0000.mem")
	before, err := os.Stat(arena)
	if err != nil {
		t.Fatal(err)
	}
	pid := "pid " + strconv.Itoa(d.cmd.Process.Pid)

	other := func() string { return filepath.Join(t.TempDir(), "other.sock") }
	for _, tc := range []struct {
		name string
		args []string
		what string // the setting the error names
	}{
		{"same data_dir and arena_dir", []string{"--socket", other(), "--data-dir", dataDir, "--arena-dir", arenaDir}, "data_dir"},
		{"same arena_dir", []string{"--socket", other(), "--data-dir", t.TempDir(), "--arena-dir", arenaDir}, "arena_dir"},
		{"same data_dir", []string{"--socket", other(), "--data-dir", dataDir, "--arena-dir", t.TempDir()}, "data_dir"},
		{"same socket", []string{"--socket", d.socket, "--data-dir", t.TempDir(), "--arena-dir", t.TempDir()}, "socket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := serveOnce(t, tc.args...)
			if code == 0 || !strings.Contains(out, tc.what+": another tidepool serve uses it") || !strings.Contains(out, pid) {
				t.Fatalf("exit %d, want non-zero naming %s and %s:\n%s", code, tc.what, pid, out)
			}
			after, err := os.Stat(arena)
			if err != nil || !os.SameFile(before, after) || after.Size() != before.Size() {
				t.Fatalf("the first server's arena file changed: %v", err)
			}
			zeroCopyRead(t, d.socket, []byte("k"), value)
		})
	}
	if _, _, code := d.tp(t, nil, "stat"); code != 0 {
		t.Fatal("first server hurt by the second")
	}
}

// TestDefaultArenaDirPerInstance: two servers with different sockets and
// data dirs and no arena_dir get arena files of their own.
func TestDefaultArenaDirPerInstance(t *testing.T) {
	arenaDirs := make([]string, 2)
	for i := range arenaDirs {
		d := startDaemon(t, "--arena-dir", "", "--ssd-capacity", "0")
		c, err := client.New(d.socket)
		if err != nil {
			t.Fatal(err)
		}
		h, err := c.Hello(context.Background())
		c.Close()
		if err != nil || len(h.Arenas) == 0 {
			t.Fatalf("hello: %v", err)
		}
		arenaDirs[i] = filepath.Dir(h.Arenas[0].Path)
		if _, err := os.Stat(h.Arenas[0].Path); err != nil {
			t.Fatal(err)
		}
		if want := defaultArenaDir(d.socket); arenaDirs[i] != want {
			t.Errorf("arena dir %s, want %s", arenaDirs[i], want)
		}
		// Left running: the second starts while the first serves.
		t.Cleanup(func() {
			d.stop(t, syscall.SIGTERM)
			os.RemoveAll(arenaDirs[i])            // only the lock file is left
			os.Remove(filepath.Dir(arenaDirs[i])) // /dev/shm/tidepool-<uid>, when nothing else is in it
		})
	}
	if arenaDirs[0] == arenaDirs[1] {
		t.Fatalf("two servers share the arena dir %s", arenaDirs[0])
	}
}

// TestServeRefusesUnsafeDirs: a directory another user owns, or that
// others may write in, is refused with an error naming it, its owner and
// its mode, and nothing is created in it.
func TestServeRefusesUnsafeDirs(t *testing.T) {
	type setup func(t *testing.T, b string) []string // returns serve's arguments
	dir := func(t *testing.T, p string, mode os.FileMode, uid int) string {
		t.Helper()
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if uid >= 0 {
			if os.Geteuid() != 0 {
				t.Skip("needs root to give a directory to another user")
			}
			if err := os.Chown(p, uid, -1); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	ok := func(b, name string) string { return filepath.Join(b, name) }
	for _, tc := range []struct {
		name  string
		setup setup
		bad   string // the refused directory, relative to the base
		want  string // in the error
	}{
		{"world-writable data_dir", func(t *testing.T, b string) []string {
			return []string{"--socket", ok(b, "s/tp.sock"), "--data-dir", dir(t, b+"/d", 0o777, -1), "--arena-dir", ok(b, "a")}
		}, "d", "mode 0777"},
		{"world-writable arena_dir", func(t *testing.T, b string) []string {
			return []string{"--socket", ok(b, "s/tp.sock"), "--data-dir", ok(b, "d"), "--arena-dir", dir(t, b+"/a", 0o777, -1)}
		}, "a", "mode 0777"},
		{"arena_dir under a world-writable parent without sticky bit", func(t *testing.T, b string) []string {
			dir(t, b+"/shm", 0o777, -1)
			return []string{"--socket", ok(b, "s/tp.sock"), "--data-dir", ok(b, "d"), "--arena-dir", ok(b, "shm/a")}
		}, "shm", "mode 0777"},
		{"socket dir world-writable without sticky bit", func(t *testing.T, b string) []string {
			return []string{"--socket", dir(t, b+"/s", 0o777, -1) + "/tp.sock", "--data-dir", ok(b, "d"), "--arena-dir", ok(b, "a")}
		}, "s", "mode 0777"},
		{"socket dir pre-created 0777 by another user", func(t *testing.T, b string) []string {
			return []string{"--socket", dir(t, b+"/s", 0o777, nobodyUID) + "/tp.sock", "--data-dir", ok(b, "d"), "--arena-dir", ok(b, "a")}
		}, "s", "uid 65534"},
		{"arena_dir pre-created by another user", func(t *testing.T, b string) []string {
			return []string{"--socket", ok(b, "s/tp.sock"), "--data-dir", ok(b, "d"), "--arena-dir", dir(t, b+"/a", 0o700, nobodyUID)}
		}, "a", "uid 65534"},
		{"sticky arena_dir of another user", func(t *testing.T, b string) []string {
			return []string{"--socket", ok(b, "s/tp.sock"), "--data-dir", ok(b, "d"), "--arena-dir", dir(t, b+"/a", 0o777|os.ModeSticky, nobodyUID)}
		}, "a", "uid 65534"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := t.TempDir()
			args := tc.setup(t, b)
			bad := filepath.Join(b, tc.bad)
			out, code := serveOnce(t, args...)
			if code == 0 || !strings.Contains(out, "unsafe directory: "+bad) || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want non-zero naming %s and %q:\n%s", code, bad, tc.want, out)
			}
			if ents, _ := os.ReadDir(bad); len(ents) > 0 {
				t.Fatalf("serve created %s in the unsafe %s", ents[0].Name(), bad)
			}
		})
	}
	// The control: the same layout with safe modes serves.
	b := t.TempDir()
	dir(t, b+"/shm", 0o777|os.ModeSticky, -1)
	d := startDaemon(t, "--socket", b+"/s/tp.sock", "--arena-dir", b+"/shm/a", "--ssd-capacity", "0")
	if _, _, code := d.tp(t, nil, "stat"); code != 0 {
		t.Fatal("stat failed on the safe layout")
	}
	// trusted_dirs lets a world-writable mount (a Kubernetes emptyDir) be used.
	dir(t, b+"/empty", 0o777, -1)
	d = startDaemon(t, "--socket", b+"/empty/tp.sock", "--arena-dir", b+"/empty/arenas", "--trusted-dirs", b+"/empty", "--ssd-capacity", "0")
	if _, _, code := d.tp(t, nil, "stat"); code != 0 {
		t.Fatal("stat failed under a trusted dir")
	}
}

// TestSocketGroupReachesSocket: with socket_mode 0660 and socket_group,
// the socket's directory is created 0750 with that group, and a process of
// another user in that group connects; one outside the group cannot.
func TestSocketGroupReachesSocket(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a client as another user")
	}
	const gid = 4242
	b := t.TempDir()
	for _, p := range []string{filepath.Dir(b), b, filepath.Dir(binPath)} {
		if err := os.Chmod(p, 0o755); err != nil { // the test's own directories
			t.Fatal(err)
		}
	}
	sock := filepath.Join(b, "run", "tp.sock")
	d := startDaemon(t, "--socket", sock, "--socket-mode", "0660", "--socket-group", strconv.Itoa(gid), "--ssd-capacity", "0")
	fi, err := os.Stat(filepath.Dir(sock))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o750 || st.Gid != gid {
		t.Fatalf("socket dir: mode %v group %d, want 0750 group %d", fi.Mode(), st.Gid, gid)
	}
	stat := func(g uint32) (string, int) {
		cmd := exec.Command(binPath, "stat", "--socket", d.socket)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyUID, Gid: g, Groups: []uint32{}}}
		cmd.Env = []string{"HOME=/"}
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	if out, code := stat(gid); code != 0 {
		t.Fatalf("a member of group %d cannot use the socket: exit %d\n%s", gid, code, out)
	}
	if out, code := stat(nobodyUID); code == 0 || !strings.Contains(out, "permission denied") {
		t.Fatalf("a process outside the group: exit %d\n%s", code, out)
	}
}

// TestSocketGroupExistingDir: an existing socket directory that shuts the
// socket's group out is refused with an error saying so, unless it is
// tidepool's own runtime directory (made 0700 by earlier versions), which
// is opened to the group.
func TestSocketGroupExistingDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a directory to a group")
	}
	b := t.TempDir()
	os.Mkdir(b+"/mine", 0o700)
	out, code := serveOnce(t, "--socket", b+"/mine/tp.sock", "--socket-mode", "0660", "--socket-group", "4242",
		"--data-dir", b+"/d", "--arena-dir", b+"/a")
	if code == 0 || !strings.Contains(out, "its directory "+b+"/mine (mode 0700) does not let that group reach it") {
		t.Fatalf("exit %d, want an error about %s/mine:\n%s", code, b, out)
	}

	t.Setenv("XDG_RUNTIME_DIR", b) // inherited by serve: its runtime dir is b/tidepool
	os.Mkdir(b+"/tidepool", 0o700)
	startDaemon(t, "--socket", b+"/tidepool/tidepool.sock", "--socket-mode", "0660", "--socket-group", "4242", "--ssd-capacity", "0")
	fi, err := os.Stat(b + "/tidepool")
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o750 || st.Gid != 4242 {
		t.Fatalf("runtime dir: mode %v group %d, want 0750 group 4242", fi.Mode(), st.Gid)
	}
}
