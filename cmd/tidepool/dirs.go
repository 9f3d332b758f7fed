package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/tidepool-kv/tidepool/internal/safedir"
)

// lockName is the lock file serve holds in data_dir and arena_dir.
const lockName = "tidepool.lock"

// defaultArenaDir is this instance's own arena directory, named after its
// socket path (two live instances never share a socket, so they never
// share arena files, whatever their data_dir): under /dev/shm/tidepool-<uid>
// when /dev/shm is writable (a tmpfs: arena pages never go to a disk),
// else beside the socket.
func defaultArenaDir(socket string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(socket)))
	name := "arenas-" + hex.EncodeToString(sum[:6])
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() && unix.Access("/dev/shm", unix.W_OK) == nil {
		return filepath.Join("/dev/shm", fmt.Sprintf("tidepool-%d", os.Getuid()), name)
	}
	return filepath.Join(filepath.Dir(socket), filepath.Base(socket)+".arenas")
}

// runDirs holds the locks on the directories of one serve process, from
// before anything in them is created, deleted or truncated until Close.
type runDirs struct {
	locks []*safedir.Lock // data_dir, arena_dir, socket; closed in reverse
}

// prepareDirs checks the data, arena and socket directories (creating the
// missing ones with safe modes) and locks each for this process. It
// refuses a directory another user owns or could write in (ErrUnsafe,
// naming its path, owner and mode), and a directory another process
// holds (ErrLocked, naming its pid), and then has changed nothing in
// them. gid is socket_group's gid, -1 when unset.
func prepareDirs(cfg Config, gid int, lg *zap.Logger) (_ *runDirs, err error) {
	d := &runDirs{}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	opt := safedir.Options{Trusted: cfg.TrustedDirs}

	// First every directory is checked (and made), then each is locked.
	// The socket's directory: others may need to reach the socket in it
	// (socket_mode with group or other bits), and it may be a sticky
	// directory such as /tmp (the socket cannot be replaced there).
	sockDir := filepath.Dir(cfg.Socket)
	perm, dirGid := os.FileMode(0o700), -1
	if cfg.SocketMode&0o070 != 0 {
		perm |= 0o050
		dirGid = gid
	}
	if cfg.SocketMode&0o007 != 0 {
		perm |= 0o005
	}
	sopt := opt
	sopt.Shared = true
	if _, err := safedir.Ensure(sockDir, perm, dirGid, sopt); err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if cfg.SocketMode&0o070 != 0 {
		if err := groupCanReach(sockDir, cfg.SocketMode, gid, lg); err != nil {
			return nil, err
		}
	}
	var data, arena string
	for _, x := range []struct {
		key, dir string
		real     *string
	}{{"data_dir", cfg.DataDir, &data}, {"arena_dir", cfg.ArenaDir, &arena}} {
		abs, err := filepath.Abs(x.dir) // a relative path is relative to the working directory
		if err == nil {
			*x.real, err = safedir.Ensure(abs, 0o700, -1, opt)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", x.key, err)
		}
	}

	if err := d.lock("data_dir", filepath.Join(data, lockName)); err != nil {
		return nil, err
	}
	if arena != data { // one lock file per directory: a second flock would conflict with the first
		if err := d.lock("arena_dir", filepath.Join(arena, lockName)); err != nil {
			return nil, err
		}
	}
	if err := d.lock("socket", cfg.Socket+".lock"); err != nil {
		return nil, err
	}
	return d, nil
}

// groupCanReach makes sure members of the socket's group can search the
// socket's directory. tidepool's own runtime directory (left 0700 by an
// earlier version) is opened to the group; any other directory is the
// operator's, and one that shuts the group out is an error. A parent that
// shuts the group out is logged only: an ACL may still let it through.
func groupCanReach(sockDir string, mode os.FileMode, gid int, lg *zap.Logger) error {
	if gid < 0 {
		gid = os.Getegid()
	}
	blocked, err := safedir.Reachable(sockDir, gid)
	if err != nil || blocked == "" {
		return err
	}
	if blocked == filepath.Clean(sockDir) {
		var st unix.Stat_t
		if err := unix.Stat(sockDir, &st); err != nil {
			return fmt.Errorf("socket: stat %s: %w", sockDir, err)
		}
		perm := os.FileMode(st.Mode & 0o777)
		if filepath.Clean(sockDir) != runtimeDir() || int(st.Uid) != os.Geteuid() {
			return fmt.Errorf("socket: socket_mode %04o lets group %d use the socket, but its directory %s (mode %04o) does not let that group reach it: give the directory to the group with mode 0750, or remove it so that tidepool creates it so",
				uint32(mode), gid, sockDir, uint32(perm))
		}
		if err := os.Chown(sockDir, -1, gid); err != nil {
			return fmt.Errorf("socket: give %s to group %d: %w", sockDir, gid, err)
		}
		if err := os.Chmod(sockDir, perm|0o050); err != nil {
			return fmt.Errorf("socket: %w", err)
		}
		if blocked, err = safedir.Reachable(sockDir, gid); err != nil || blocked == "" {
			return err
		}
	}
	lg.Warn("members of the socket's group may not reach the socket: a directory above it does not let them search it",
		zap.String("dir", blocked), zap.Int("gid", gid))
	return nil
}

// lock takes the lock file at path for what (a setting's name).
func (d *runDirs) lock(what, path string) error {
	l, err := safedir.TryLock(path)
	if err != nil {
		if errors.Is(err, safedir.ErrLocked) {
			return fmt.Errorf("%s: another tidepool serve uses it: %w", what, err)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	d.locks = append(d.locks, l)
	return nil
}

// Close releases the locks, in reverse order. Safe to call twice.
func (d *runDirs) Close() error {
	var errs []error
	for i := len(d.locks) - 1; i >= 0; i-- {
		errs = append(errs, d.locks[i].Close())
	}
	return errors.Join(errs...)
}
