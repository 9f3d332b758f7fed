package safedir

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

const nobody = 65534

// base is a fresh directory the test owns, mode 0755.
func base(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	for _, p := range []string{filepath.Dir(d), d} { // both made by the test
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := Check(d, Options{}); err != nil {
		t.Skipf("the test's temporary directory is not safe itself: %v", err)
	}
	return d
}

func mkdir(t *testing.T, p string, mode os.FileMode, uid int) {
	t.Helper()
	if err := os.Mkdir(p, 0o700); err != nil {
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
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(t *testing.T, b string) string // returns the directory to check
		opt    Options
		unsafe string // "" when safe, else a word the error must contain
	}{
		{"own 0700", func(t *testing.T, b string) string { p := b + "/d"; mkdir(t, p, 0o700, -1); return p }, Options{}, ""},
		{"own 0750", func(t *testing.T, b string) string { p := b + "/d"; mkdir(t, p, 0o750, -1); return p }, Options{}, ""},
		{"own 0777", func(t *testing.T, b string) string { p := b + "/d"; mkdir(t, p, 0o777, -1); return p }, Options{}, "mode 0777"},
		{"own 0770", func(t *testing.T, b string) string { p := b + "/d"; mkdir(t, p, 0o770, -1); return p }, Options{}, "mode 0770"},
		{"own sticky 1777", func(t *testing.T, b string) string {
			p := b + "/d"
			mkdir(t, p, 0o777|os.ModeSticky, -1)
			return p
		}, Options{}, "mode 1777"},
		{"own sticky 1777, shared", func(t *testing.T, b string) string {
			p := b + "/d"
			mkdir(t, p, 0o777|os.ModeSticky, -1)
			return p
		}, Options{Shared: true}, ""},
		{"own 0777, shared", func(t *testing.T, b string) string { p := b + "/d"; mkdir(t, p, 0o777, -1); return p }, Options{Shared: true}, "unless sticky"},
		{"other user's 0700", func(t *testing.T, b string) string { p := b + "/d"; mkdir(t, p, 0o700, nobody); return p }, Options{}, "uid 65534"},
		{"other user's 0777", func(t *testing.T, b string) string { p := b + "/d"; mkdir(t, p, 0o777, nobody); return p }, Options{}, "uid 65534"},
		{"other user's sticky, shared", func(t *testing.T, b string) string {
			p := b + "/d"
			mkdir(t, p, 0o777|os.ModeSticky, nobody)
			return p
		}, Options{Shared: true}, "uid 65534"},
		{"under a world-writable parent", func(t *testing.T, b string) string {
			mkdir(t, b+"/p", 0o777, -1)
			mkdir(t, b+"/p/d", 0o700, -1)
			return b + "/p/d"
		}, Options{}, "a parent"},
		{"under a sticky parent", func(t *testing.T, b string) string {
			mkdir(t, b+"/p", 0o777|os.ModeSticky, -1)
			mkdir(t, b+"/p/d", 0o700, -1)
			return b + "/p/d"
		}, Options{}, ""},
		{"under another user's parent", func(t *testing.T, b string) string {
			mkdir(t, b+"/p", 0o755, nobody)
			mkdir(t, b+"/p/d", 0o700, -1)
			return b + "/p/d"
		}, Options{}, "uid 65534"},
		{"under a trusted world-writable parent", func(t *testing.T, b string) string {
			mkdir(t, b+"/p", 0o777, -1)
			mkdir(t, b+"/p/d", 0o700, -1)
			return b + "/p/d"
		}, Options{Trusted: []string{"@/p"}}, ""},
		{"trusted itself", func(t *testing.T, b string) string { p := b + "/d"; mkdir(t, p, 0o777, -1); return p }, Options{Trusted: []string{"@/d"}}, ""},
		{"symlink to an unsafe directory", func(t *testing.T, b string) string {
			mkdir(t, b+"/p", 0o777, -1)
			if err := os.Symlink(b+"/p", b+"/l"); err != nil {
				t.Fatal(err)
			}
			return b + "/l"
		}, Options{}, "mode 0777"},
		{"a file", func(t *testing.T, b string) string {
			os.WriteFile(b+"/f", nil, 0o600)
			return b + "/f"
		}, Options{}, "not a directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := base(t)
			p := tc.setup(t, b)
			opt := tc.opt
			for i, tr := range opt.Trusted {
				opt.Trusted[i] = strings.Replace(tr, "@", b, 1)
			}
			err := Check(p, opt)
			if tc.unsafe == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), tc.unsafe) {
				t.Fatalf("err %v, want ErrUnsafe mentioning %q", err, tc.unsafe)
			}
		})
	}
}

func TestEnsureCreatesWithModeAndGroup(t *testing.T) {
	b := base(t)
	old := syscall.Umask(0o077) // the mode must not depend on the umask
	defer syscall.Umask(old)
	gid := -1
	if os.Geteuid() == 0 {
		gid = 4242
	}
	p := filepath.Join(b, "a", "b")
	real, err := Ensure(p, 0o750, gid, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if real != p {
		t.Fatalf("Ensure returned %s, want %s", real, p)
	}
	for _, d := range []string{filepath.Join(b, "a"), p} {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o750 {
			t.Errorf("%s: mode %v, want 0750", d, fi.Mode())
		}
		if g := fi.Sys().(*syscall.Stat_t).Gid; gid >= 0 && int(g) != gid {
			t.Errorf("%s: group %d, want %d", d, g, gid)
		}
	}
	// An existing directory keeps its mode.
	if err := os.Chmod(p, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Ensure(p, 0o750, -1, Options{}); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o700 {
		t.Fatalf("existing dir's mode changed to %v", fi.Mode())
	}
}

func TestEnsureRefusesUnsafeParentAndCreatesNothing(t *testing.T) {
	b := base(t)
	mkdir(t, b+"/p", 0o777, -1)
	_, err := Ensure(b+"/p/x/y", 0o700, -1, Options{})
	if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), b+"/p, a parent") {
		t.Fatalf("err %v, want ErrUnsafe naming %s/p", err, b)
	}
	if _, err := os.Stat(b + "/p/x"); !os.IsNotExist(err) {
		t.Fatalf("something was created under the unsafe parent: %v", err)
	}
	if _, err := Ensure("relative/dir", 0o700, -1, Options{}); err == nil {
		t.Fatal("relative path accepted")
	}
}

func TestReachable(t *testing.T) {
	b := base(t)
	mkdir(t, b+"/g", 0o700, -1)
	if p, err := Reachable(b+"/g", 4242); err != nil || p != b+"/g" {
		t.Fatalf("0700: %q %v", p, err)
	}
	if os.Geteuid() == 0 {
		os.Chown(b+"/g", -1, 4242)
		os.Chmod(b+"/g", 0o750)
		if p, err := Reachable(b+"/g", 4242); err != nil || p != "" {
			t.Fatalf("0750 group 4242: %q %v", p, err)
		}
		if p, err := Reachable(b+"/g", 4243); err != nil || p != b+"/g" {
			t.Fatalf("0750 another group: %q %v", p, err)
		}
	}
}

func TestTryLock(t *testing.T) {
	b := base(t)
	path := filepath.Join(b, "tidepool.lock")
	l, err := TryLock(path)
	if err != nil {
		t.Fatal(err)
	}
	// flock locks belong to the open file description, so a second open
	// in this process conflicts as another process would.
	_, err = TryLock(path)
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("second lock: %v, want ErrLocked naming pid %d", err, os.Getpid())
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	l2, err := TryLock(path)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	l2.Close()

	// Never through a symbolic link, never another user's file.
	os.Symlink(path, b+"/link.lock")
	if _, err := TryLock(b + "/link.lock"); err == nil {
		t.Fatal("lock through a symbolic link accepted")
	}
	if os.Geteuid() == 0 {
		os.WriteFile(b+"/other.lock", nil, 0o666)
		os.Chown(b+"/other.lock", nobody, -1)
		if _, err := TryLock(b + "/other.lock"); !errors.Is(err, ErrUnsafe) {
			t.Fatalf("another user's lock file: %v", err)
		}
	}
}
