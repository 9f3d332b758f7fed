// Package pkey guards memory with x86 memory protection keys (PKU): pages
// tagged with a key can be touched only by a thread that has allowed it
// for that key in its PKRU register, and only while it has. Allowing and
// denying take one instruction each, no system call and no TLB flush, so a
// mapping can stay writable for a copy of a few microseconds and be
// read-only for the rest of the process, all the time.
//
// A thread's PKRU is its own: Write locks the goroutine to its thread for
// the call (the Go runtime then starts new threads from a clean thread,
// never from a locked one, so none inherits the allowed write), and the
// kernel gives a signal handler its default PKRU and restores the thread's
// on return.
package pkey

import (
	"errors"
	"runtime"
)

// ErrUnsupported is Alloc's error where the CPU or kernel has no
// protection keys, or none is free.
var ErrUnsupported = errors.New("pkey: memory protection keys unsupported")

// Key is an allocated protection key.
type Key int

// Write runs f with reads and writes of k's pages allowed for the calling
// thread alone, and denied again after f returns or panics.
func (k Key) Write(f func()) {
	runtime.LockOSThread()
	old := rdpkru()
	wrpkru(old &^ (3 << (2 * uint(k)))) // access and write allowed
	defer func() {
		wrpkru(old)
		runtime.UnlockOSThread()
	}()
	f()
}
