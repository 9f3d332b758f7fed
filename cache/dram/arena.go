//go:build linux

package dram

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// arena is one mapped arena file.
type arena struct {
	path string
	f    *os.File
	mem  []byte // MAP_SHARED view of the whole file
}

// prepareDir creates dir 0700 and removes arena files of a previous run (they
// hold nothing durable).
func prepareDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("dram: create arena dir: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("dram: read arena dir: %w", err)
	}
	for _, e := range ents {
		if e.Type().IsRegular() && staleArena.MatchString(e.Name()) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("dram: remove stale arena: %w", err)
			}
		}
	}
	return nil
}

// checkFree fails with a clear message when the file system holding dir has
// less than need bytes free.
func checkFree(dir string, need int64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("dram: statfs %s: %w", dir, err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	if free < need {
		return fmt.Errorf("dram: %s has %d bytes free, the arenas need %d (enlarge the volume, e.g. the emptyDir sizeLimit, or lower Capacity): %w",
			dir, free, need, ErrArenaSpace)
	}
	return nil
}

// openArena creates, reserves and maps one arena file of size bytes.
func openArena(path string, size int64, prefault bool) (*arena, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("dram: create arena: %w", err)
	}
	fail := func(err error) (*arena, error) {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	// Reserve the blocks now: on tmpfs a short volume fails here with
	// ENOSPC instead of SIGBUS on a later write into the mapping.
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return fail(fmt.Errorf("dram: reserve %d bytes for %s: %w (%w)", size, path, ErrArenaSpace, err))
		}
		if !errors.Is(err, unix.EOPNOTSUPP) {
			return fail(fmt.Errorf("dram: reserve %d bytes for %s: %w", size, path, err))
		}
		// File systems without fallocate: size the file; the free-space
		// check in New is then the only guard.
		if err := f.Truncate(size); err != nil {
			return fail(fmt.Errorf("dram: size arena %s: %w", path, err))
		}
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("dram: mmap arena %s: %w", path, err))
	}
	if prefault {
		// Fault every page in writable now (Linux ≥ 5.14), so that puts
		// do not pay a write fault per 4 KiB on first use (MAP_POPULATE
		// would map shared pages read-only). Older kernels fault lazily.
		_ = unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
	}
	return &arena{path: path, f: f, mem: mem}, nil
}

// close unmaps and closes the arena, and removes its file.
func (a *arena) close() error {
	var errs []error
	if a.mem != nil {
		if err := unix.Munmap(a.mem); err != nil {
			errs = append(errs, fmt.Errorf("dram: munmap %s: %w", a.path, err))
		}
		a.mem = nil
	}
	if a.f != nil {
		if err := a.f.Close(); err != nil {
			errs = append(errs, fmt.Errorf("dram: close %s: %w", a.path, err))
		}
		a.f = nil
	}
	if err := os.Remove(a.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("dram: remove %s: %w", a.path, err))
	}
	return errors.Join(errs...)
}
