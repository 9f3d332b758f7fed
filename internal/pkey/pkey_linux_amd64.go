package pkey

import (
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

const pkeyDisableAccess = 0x1 // PKEY_DISABLE_ACCESS

// Alloc allocates a key whose pages no thread may read or write outside
// Write: the calling thread is set so, and the others of a process that
// has not changed its PKRU have that as the kernel's default for every
// key but 0. (Pages to be read outside Write are read through another
// mapping.)
func Alloc() (Key, error) {
	k, _, errno := syscall.Syscall(unix.SYS_PKEY_ALLOC, 0, pkeyDisableAccess, 0)
	if errno != 0 {
		if errno == syscall.ENOSYS || errno == syscall.EINVAL || errno == syscall.ENOSPC {
			return 0, fmt.Errorf("%w: pkey_alloc: %v", ErrUnsupported, errno)
		}
		return 0, fmt.Errorf("pkey: pkey_alloc: %w", errno)
	}
	return Key(k), nil
}

// Protect sets the protection of mem (page aligned, as from mmap) to prot
// and tags its pages with k.
func (k Key) Protect(mem []byte, prot int) error {
	if len(mem) == 0 {
		return nil
	}
	_, _, errno := syscall.Syscall6(unix.SYS_PKEY_MPROTECT, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(prot), uintptr(k), 0, 0)
	if errno != 0 {
		return fmt.Errorf("pkey: pkey_mprotect: %w", errno)
	}
	return nil
}

// Free returns k to the kernel; pages still tagged with it keep the tag.
func (k Key) Free() error {
	if _, _, errno := syscall.Syscall(unix.SYS_PKEY_FREE, uintptr(k), 0, 0); errno != 0 {
		return fmt.Errorf("pkey: pkey_free: %w", errno)
	}
	return nil
}

// rdpkru returns the calling thread's PKRU; wrpkru sets it (pkey_amd64.s).
func rdpkru() uint32
func wrpkru(v uint32)
