// Package safedir creates and checks the directories a daemon keeps its
// socket, shared memory and data in, and locks a directory for one process.
//
// The checks follow OpenSSH's safe_path and systemd's unsafe-transition
// rules: a directory is trusted only when every directory on its path, up
// to the root, is owned by root or by the process's user and cannot be
// written by anyone else, except that a sticky directory owned by root or
// the user (such as /tmp or /dev/shm) may be writable by all, since others
// cannot rename or remove what the user puts in it. A directory that
// fails is refused, not repaired: another user may already control it.
package safedir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrUnsafe reports a directory that another user could write in or own.
var ErrUnsafe = errors.New("safedir: unsafe directory")

// Options say how strict a check is.
type Options struct {
	// Shared accepts, as the directory itself, a sticky directory that
	// others may write in (such as /tmp for a socket): it is then checked
	// like a parent. Without it the directory must belong to the
	// process's user and be writable by it alone.
	Shared bool
	// Trusted directories are accepted whatever their owner and mode, and
	// so are their parents (for instance a Kubernetes emptyDir, which the
	// kubelet creates 0777 and only the pod's containers can reach).
	// Directories below them are still checked. Absolute, cleaned paths.
	Trusted []string
}

func (o Options) trusted(dir string) bool {
	for _, t := range o.Trusted {
		if filepath.Clean(t) == dir {
			return true
		}
	}
	return false
}

// Ensure creates dir when it is missing, with mode perm (not narrowed by
// the umask) and, when gid >= 0, group gid, and so each missing parent;
// it refuses to create anything under a parent that fails the check, and
// then checks dir itself. It returns dir with symbolic links resolved.
// An existing dir keeps its mode and group.
func Ensure(dir string, perm os.FileMode, gid int, opt Options) (string, error) {
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("safedir: %q is not an absolute path", dir)
	}
	dir = filepath.Clean(dir)
	// The deepest existing ancestor must be safe before anything is made
	// below it.
	top := dir
	var missing []string
	for {
		if _, err := os.Stat(top); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("safedir: %w", err)
		}
		missing = append(missing, filepath.Base(top))
		top = filepath.Dir(top)
	}
	if len(missing) > 0 {
		real, err := filepath.EvalSymlinks(top)
		if err != nil {
			return "", fmt.Errorf("safedir: %w", err)
		}
		if err := checkChain(real, true, opt, dir); err != nil {
			return "", err
		}
		p := real
		for i := len(missing) - 1; i >= 0; i-- {
			p = filepath.Join(p, missing[i])
			if err := os.Mkdir(p, 0o700); err != nil {
				if errors.Is(err, os.ErrExist) {
					continue // made meanwhile: the final check judges it
				}
				return "", fmt.Errorf("safedir: create %s: %w", p, err)
			}
			if gid >= 0 {
				if err := os.Lchown(p, -1, gid); err != nil {
					return "", fmt.Errorf("safedir: give %s to group %d: %w", p, gid, err)
				}
			}
			if err := os.Chmod(p, perm); err != nil {
				return "", fmt.Errorf("safedir: chmod %s: %w", p, err)
			}
		}
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", fmt.Errorf("safedir: %w", err)
	}
	if err := checkChain(real, opt.Shared, opt, real); err != nil {
		return "", err
	}
	return real, nil
}

// Check verifies that dir exists, is a directory and is safe; see the
// package comment.
func Check(dir string, opt Options) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("safedir: %q is not an absolute path", dir)
	}
	real, err := filepath.EvalSymlinks(filepath.Clean(dir))
	if err != nil {
		return fmt.Errorf("safedir: %w", err)
	}
	return checkChain(real, opt.Shared, opt, real)
}

// checkChain checks real (no symbolic links in it) and each parent up to
// the root or a trusted directory. shared: real itself is judged as a
// parent. Errors name a directory other than of as a parent of of.
func checkChain(real string, shared bool, opt Options, of string) error {
	uid := uint32(os.Geteuid())
	leaf := true
	for p := real; ; p = filepath.Dir(p) {
		if opt.trusted(p) {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("safedir: %s: %w", p, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return fmt.Errorf("%w: %s is not a directory", ErrUnsafe, p)
		}
		if leaf && !shared {
			if st.Uid != uid || st.Mode&0o022 != 0 {
				return fmt.Errorf("%w: %s is owned by uid %d with mode %04o; it must be owned by uid %d (this process) and writable by it alone",
					ErrUnsafe, p, st.Uid, st.Mode&0o7777, uid)
			}
		} else if (st.Uid != 0 && st.Uid != uid) || (st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0) {
			name := p
			if p != of {
				name = p + ", a parent of " + of + ","
			}
			return fmt.Errorf("%w: %s is owned by uid %d with mode %04o; it must be owned by root or uid %d and not writable by group or others unless sticky",
				ErrUnsafe, name, st.Uid, st.Mode&0o7777, uid)
		}
		leaf = false
		if p == "/" || p == "." {
			return nil
		}
	}
}

// Reachable reports the first directory on dir's path (dir included)
// that members of group gid who are not its owners cannot search, or ""
// when they can reach dir's entries. It reads modes only (no ACLs).
func Reachable(dir string, gid int) (string, error) {
	real, err := filepath.EvalSymlinks(filepath.Clean(dir))
	if err != nil {
		return "", fmt.Errorf("safedir: %w", err)
	}
	for p := real; ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return "", fmt.Errorf("safedir: %s: %w", p, err)
		}
		if st.Mode&0o001 == 0 && (st.Mode&0o010 == 0 || int(st.Gid) != gid) {
			return p, nil
		}
		if p == "/" || strings.Count(p, "/") == 0 {
			return "", nil
		}
	}
}
