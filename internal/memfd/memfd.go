// Package memfd makes and maps the shared memory of registered buffers
// (the engine API's buffer socket): a client's side makes a sealed,
// allocated memfd (Create); the sidecar maps one it was sent only when a
// write into the mapping can never fault (Map).
package memfd

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Seals of a buffer: it can neither shrink nor grow, nor change its seals.
const Seals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// Create makes a memfd of size bytes, allocates every page of it (so that
// a write into a mapping of it never needs a page the system cannot
// give), seals it (Seals) and maps it read-write, shared. The caller
// closes fd once it has been sent (the mapping keeps the file) and unmaps
// mem with Unmap.
func Create(name string, size int) (fd int, mem []byte, err error) {
	if size <= 0 {
		return -1, nil, fmt.Errorf("memfd: a buffer of %d bytes", size)
	}
	fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("memfd_create: %w", err)
	}
	fail := func(what string, err error) (int, []byte, error) {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("memfd: %s a buffer of %d bytes: %w", what, size, err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail("size", err)
	}
	if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil {
		return fail("allocate", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, Seals); err != nil {
		return fail("seal", err)
	}
	if mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return fail("map", err)
	}
	return fd, mem, nil
}

// Why Map refuses a descriptor.
var (
	ErrNotFile   = errors.New("not a regular file or memfd")
	ErrNotSealed = errors.New("the file is not sealed against shrinking (memfd_create with MFD_ALLOW_SEALING, then F_ADD_SEALS F_SEAL_SHRINK)")
	ErrShort     = errors.New("the file is shorter than the buffer")
	ErrHoles     = errors.New("the file has holes: write or fallocate it first")
)

// Map maps the first size bytes of the file fd read-write, shared, when a
// write into them can never fault: fd is a regular file (a memfd), sealed
// against shrinking, at least size bytes long, with every byte allocated.
// It does not close fd.
func Map(fd int, size int) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%w (mode %o)", ErrNotFile, st.Mode)
	}
	if seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0); err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		return nil, ErrNotSealed
	}
	if st.Size < int64(size) {
		return nil, fmt.Errorf("%w: %d bytes, the buffer %d", ErrShort, st.Size, size)
	}
	if st.Blocks*512 < int64(size) {
		return nil, fmt.Errorf("%w (%d of %d bytes allocated)", ErrHoles, st.Blocks*512, size)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w", err)
	}
	return mem, nil
}

// Unmap unmaps what Create or Map mapped.
func Unmap(mem []byte) error { return unix.Munmap(mem) }
