package memfd

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestCreateAndMap(t *testing.T) {
	fd, mem, err := Create("memfd-test", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	defer Unmap(mem)
	mem[12345] = 7
	other, err := Map(fd, 1<<20)
	if err != nil {
		t.Fatalf("Map of a buffer Create made: %v", err)
	}
	defer Unmap(other)
	if other[12345] != 7 {
		t.Fatal("the two mappings do not share memory")
	}
	if _, err := Map(fd, 1<<20+1); !errors.Is(err, ErrShort) {
		t.Fatalf("past the end: %v", err)
	}
	if unix.Ftruncate(fd, 1<<19) == nil {
		t.Fatal("a sealed buffer shrank")
	}
}

func TestMapRefuses(t *testing.T) {
	raw := func(seal, allocate bool) int {
		fd, err := unix.MemfdCreate("memfd-test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		unix.Ftruncate(fd, 1<<20)
		if allocate {
			unix.Fallocate(fd, 0, 0, 1<<20)
		}
		if seal {
			unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
		}
		return fd
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for name, tc := range map[string]struct {
		fd   int
		want error
	}{
		"unsealed": {raw(false, true), ErrNotSealed},
		"holes":    {raw(true, false), ErrHoles},
		"a pipe":   {int(r.Fd()), ErrNotFile},
	} {
		if _, err := Map(tc.fd, 1<<20); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
}
