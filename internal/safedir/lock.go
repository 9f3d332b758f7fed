package safedir

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// ErrLocked reports that another process holds the lock.
var ErrLocked = errors.New("safedir: in use by another process")

// Lock is an exclusive flock(2) on a lock file, held until Close. It owns
// the file's descriptor and closes it exactly once.
type Lock struct {
	path string
	once sync.Once
	fd   int
	err  error
}

// TryLock takes an exclusive, non-blocking flock(2) on the file at path
// (created 0600 if missing, never through a symbolic link) and writes the
// process id into it. The file must be a regular file owned by this
// process's user. When another process holds the lock it fails with
// ErrLocked and the holder's process id when the file names one; it
// changes nothing then. The file is never removed: removing a lock file
// lets two processes lock two different files of one name.
func TryLock(path string) (*Lock, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0o600)
	if err != nil {
		return nil, fmt.Errorf("safedir: open lock file %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("safedir: stat lock file %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != uint32(os.Geteuid()) || st.Nlink != 1 {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: lock file %s is not a regular file of uid %d with one link (uid %d, mode %06o, %d links)",
			ErrUnsafe, path, os.Geteuid(), st.Uid, st.Mode, st.Nlink)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			if pid := readPid(fd); pid > 0 {
				return nil, fmt.Errorf("%w: %s is locked by pid %d", ErrLocked, path, pid)
			}
			return nil, fmt.Errorf("%w: %s is locked", ErrLocked, path)
		}
		return nil, fmt.Errorf("safedir: flock %s: %w", path, err)
	}
	pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
	err = unix.Ftruncate(fd, 0)
	if err == nil {
		_, err = unix.Pwrite(fd, pid, 0)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("safedir: write lock file %s: %w", path, err)
	}
	return &Lock{path: path, fd: fd}, nil
}

// readPid reads the process id a holder wrote; 0 when there is none.
func readPid(fd int) int {
	buf := make([]byte, 32)
	n, _ := unix.Pread(fd, buf, 0)
	if n <= 0 {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil {
		return 0
	}
	return pid
}

// Path is the lock file's path.
func (l *Lock) Path() string { return l.path }

// Close releases the lock (closing the descriptor releases it). Safe to
// call twice; the file stays.
func (l *Lock) Close() error {
	l.once.Do(func() {
		if err := unix.Close(l.fd); err != nil {
			l.err = fmt.Errorf("safedir: close lock file %s: %w", l.path, err)
		}
		l.fd = -1
	})
	return l.err
}
