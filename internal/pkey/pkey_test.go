//go:build linux && amd64

package pkey_test

import (
	"errors"
	"runtime/debug"
	"sync"
	"syscall"
	"testing"

	"github.com/tidepool-kv/tidepool/internal/pkey"
)

// keyed maps n bytes of shared memory read-write and tags them with a new
// key (skipping where the machine has no protection keys).
func keyed(t *testing.T, n int) (pkey.Key, []byte) {
	t.Helper()
	k, err := pkey.Alloc()
	if errors.Is(err, pkey.ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Free() }) // after the unmap below
	mem, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(mem) })
	if err := k.Protect(mem, syscall.PROT_READ|syscall.PROT_WRITE); err != nil {
		t.Fatal(err)
	}
	return k, mem
}

// TestWrite: pages of a key are written and read inside Write, and a
// write outside it faults, from the goroutine that wrote and from another one, also
// while a third is inside Write.
func TestWrite(t *testing.T) {
	k, mem := keyed(t, 1<<20)
	k.Write(func() {
		for i := range mem {
			mem[i] = byte(i)
		}
	})
	var got byte
	k.Write(func() { got = mem[12345] })
	if got != byte(12345%256) {
		t.Fatal("a write inside Write did not land")
	}
	if !writeFaults(mem, 0) {
		t.Fatal("a write after Write did not fault")
	}

	inside, release := make(chan struct{}), make(chan struct{})
	var holder, wg sync.WaitGroup
	holder.Go(func() {
		k.Write(func() {
			mem[1] = 'w'
			close(inside)
			<-release // holding writes allowed on this thread
		})
	})
	<-inside
	var faulted int
	for g := range 8 {
		wg.Go(func() {
			if writeFaults(mem, 4096*g+2) {
				mu.Lock()
				faulted++
				mu.Unlock()
			}
		})
	}
	wg.Wait() // the 8 writers; the holder waits for release
	close(release)
	holder.Wait()
	k.Write(func() { got = mem[1] })
	if got != 'w' {
		t.Fatal("the holder's write did not land")
	}
	if faulted != 8 {
		t.Fatalf("%d of 8 writes from other goroutines faulted while one was inside Write", faulted)
	}

	// A panic inside Write denies writes again.
	func() {
		defer func() { recover() }()
		k.Write(func() { panic("inside") })
	}()
	if !writeFaults(mem, 3) {
		t.Fatal("a write after a panic inside Write did not fault")
	}
}

var mu sync.Mutex

// writeFaults writes one byte of mem and reports whether the write
// faulted.
func writeFaults(mem []byte, off int) (faulted bool) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			faulted = true
		}
	}()
	store(&mem[off], 7)
	return false
}

//go:noinline
func store(p *byte, v byte) { *p = v }
