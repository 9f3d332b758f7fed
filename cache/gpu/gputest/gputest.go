// Package gputest builds and inspects the TEST-ONLY stand-in for the CUDA
// driver (cache/gpu/testdata/fakecuda/libfakecuda.so), for the tests of
// cache/gpu and of the sidecar. Nothing here is part of tidepool itself.
package gputest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// Source is the stand-in's C source.
func Source() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "testdata", "fakecuda", "fakecuda.c")
}

// Build compiles the stand-in with cc (once per test binary, into a
// directory that outlives the test) and returns the library's path. dir is
// where to put it the first time; "" uses a temporary directory.
func Build(dir string) (string, error) {
	buildOnce.Do(func() {
		if dir == "" {
			if dir, buildErr = os.MkdirTemp("", "fakecuda-"); buildErr != nil {
				return
			}
		}
		out := filepath.Join(dir, "libfakecuda.so")
		cmd := exec.Command("cc", "-shared", "-fPIC", "-O2", "-pthread", "-o", out, Source())
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building the CUDA stand-in: %v\n%s", err, b)
			return
		}
		buildPath = out
	})
	return buildPath, buildErr
}

// Lib builds the stand-in (failing t when it cannot) and returns its path.
func Lib(t testing.TB) string {
	t.Helper()
	p, err := Build("")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Handle is the stand-in's IPC handle layout: "FAKECUDA", pid, fd, size.
type Handle struct {
	PID  int32
	FD   int32
	Size uint64
}

// ParseHandle decodes a stand-in IPC handle (64 bytes).
func ParseHandle(h []byte) (Handle, error) {
	if len(h) != 64 || !bytes.HasPrefix(h, []byte("FAKECUDA")) {
		return Handle{}, fmt.Errorf("not a fakecuda handle: %x", h)
	}
	return Handle{
		PID:  int32(binary.LittleEndian.Uint32(h[8:])),
		FD:   int32(binary.LittleEndian.Uint32(h[12:])),
		Size: binary.LittleEndian.Uint64(h[16:]),
	}, nil
}

// Map maps the "device memory" a stand-in handle names, from outside the
// process that exported it (through /proc/<pid>/fd/<fd>): how tests check
// what a copy wrote, by a path independent of the code under test.
func Map(t testing.TB, handle []byte) []byte {
	t.Helper()
	h, err := ParseHandle(handle)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/%d", h.PID, h.FD), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := syscall.Mmap(int(f.Fd()), 0, int(h.Size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(m) })
	return m
}

// Mappings counts the stand-in's device-memory mappings in process pid
// ("self" for this one), from /proc/<pid>/maps: an IPC handle left open in
// a sidecar shows here.
func Mappings(t testing.TB, pid string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", pid, "maps"))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b, []byte("memfd:fakecuda-devmem"))
}

// Alloc allocates size bytes of "device memory" through the stand-in at
// lib in this process (as an engine would through the driver) and returns
// its IPC handle; Map gives the bytes.
func Alloc(t testing.TB, lib string, size int) []byte {
	t.Helper()
	h, err := purego.Dlopen(lib, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		t.Fatal(err)
	}
	call := func(name string, args ...uintptr) {
		fn, err := purego.Dlsym(h, name)
		if err != nil {
			t.Fatal(err)
		}
		if r, _, _ := purego.SyscallN(fn, args...); int32(r) != 0 {
			t.Fatalf("%s: CUDA error %d", name, int32(r))
		}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var ctx uintptr
	var p uint64
	handle := make([]byte, 64)
	call("cuInit", 0)
	call("cuDevicePrimaryCtxRetain", uintptr(unsafe.Pointer(&ctx)), 0)
	call("cuCtxSetCurrent", ctx)
	call("cuMemAlloc_v2", uintptr(unsafe.Pointer(&p)), uintptr(size))
	call("cuIpcGetMemHandle", uintptr(unsafe.Pointer(&handle[0])), uintptr(p))
	call("cuCtxSetCurrent", 0)
	return handle
}
