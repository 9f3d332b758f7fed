package engineapi

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// ErrSocketInUse reports that another live process serves the socket path.
var ErrSocketInUse = errors.New("engineapi: socket in use by a live process")

// Listen creates the Unix socket listener at path safely: it refuses to
// start when a live process answers on path, removes a stale socket left by
// a dead one, refuses to remove anything that is not a socket, and sets the
// socket's mode (0600 by default) and, when gid >= 0, its group. The
// directory is created 0700 if missing.
func Listen(path string, mode os.FileMode, gid int) (net.Listener, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("engineapi: socket path %q must be absolute", path)
	}
	if mode == 0 {
		mode = 0o600
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("engineapi: socket dir: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("engineapi: %s exists and is not a socket; refusing to remove it", path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("%w: %s", ErrSocketInUse, path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ENOENT) {
			return nil, fmt.Errorf("engineapi: probing existing socket %s: %w", path, err)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("engineapi: removing stale socket: %w", err)
		}
	}
	// Create the socket with no permissions for anyone but the owner from
	// the first instant, then widen to the configured mode.
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("engineapi: listen %s: %w", path, err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(true)
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			ln.Close()
			return nil, fmt.Errorf("engineapi: chown socket to group %d: %w", gid, err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("engineapi: chmod socket: %w", err)
	}
	return ln, nil
}
