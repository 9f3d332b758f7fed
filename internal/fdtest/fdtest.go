// Package fdtest helps tests drive a process out of file descriptors, the
// condition ("too many open files") under which accept loops must back off
// and keep serving instead of stopping.
package fdtest

import (
	"errors"
	"os"
	"syscall"
	"testing"
)

// Exhaust lowers RLIMIT_NOFILE to a little above the descriptors open now
// and opens /dev/null until EMFILE, then closes leave of those files again
// so that exactly leave descriptors are free. release closes the rest and
// restores the limit; it is safe to call more than once.
func Exhaust(t testing.TB, leave int) (release func()) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	lim := old
	lim.Cur = uint64(len(ents) + 64)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	var files []*os.File
	release = func() {
		for _, f := range files {
			f.Close()
		}
		files = nil
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old)
	}
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			if !errors.Is(err, syscall.EMFILE) {
				release()
				t.Fatal(err)
			}
			break
		}
		files = append(files, f)
	}
	for i := 0; i < leave && len(files) > 0; i++ {
		files[len(files)-1].Close()
		files = files[:len(files)-1]
	}
	return release
}
