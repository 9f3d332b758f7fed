package fdlisten

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

func fstatIno(t *testing.T, fd int) (uint64, error) {
	t.Helper()
	var st syscall.Stat_t
	err := syscall.Fstat(fd, &st)
	return st.Ino, err
}

// TestDescriptorClosedOnceByRelease: Close, from many goroutines and many
// times, leaves the descriptor open; Release closes it once; a file that
// gets the number afterwards survives every later Close and Release.
func TestDescriptorClosedOnceByRelease(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ul, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(ul)
	if err != nil {
		t.Fatal(err)
	}
	fd := l.Fd()
	ino, err := fstatIno(t, fd)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				l.Close()
			}
		}()
	}
	wg.Wait()
	if got, err := fstatIno(t, fd); err != nil || got != ino {
		t.Fatalf("after Close: descriptor %d is %d, %v; want the socket (inode %d) still open", fd, got, err, ino)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := fstatIno(t, fd); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("after Release: fstat(%d) = %v, want EBADF", fd, err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket path after Release: %v", err)
	}
	// The lowest free number goes to the next file opened: most likely
	// fd. Whatever number it gets must survive the listener's closes.
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fino, _ := fstatIno(t, int(f.Fd()))
	l.Close()
	l.Release()
	if _, err := l.Accept(); !errors.Is(err, ErrReleased) {
		t.Fatalf("Accept after Release: %v, want ErrReleased", err)
	}
	if got, err := fstatIno(t, int(f.Fd())); err != nil || got != fino {
		t.Fatalf("a file opened after Release (descriptor %d) was closed by the listener: %v", f.Fd(), err)
	}
}

// TestAcceptNonBlockingAndDrain: Accept returns nil, nil when nobody
// waits, hands over a connection that works, and after Close closes
// waiting connections at once.
func TestAcceptNonBlockingAndDrain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ul, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(ul)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if c, err := l.Accept(); c != nil || err != nil {
		t.Fatalf("Accept with none waiting: %v, %v", c, err)
	}
	cl, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c, err := l.Accept()
	if err != nil || c == nil {
		t.Fatalf("Accept: %v, %v", c, err)
	}
	cl.Write([]byte("x"))
	buf := make([]byte, 1)
	for {
		n, err := c.Read(buf)
		if n == 1 && buf[0] == 'x' {
			break
		}
		if !errors.Is(err, syscall.EAGAIN) {
			t.Fatalf("Read: %d, %v", n, err)
		}
	}
	c.Close()

	l.Close()
	late, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if c, err := l.Accept(); c != nil || err != nil {
		t.Fatalf("Accept after Close: %v, %v; want nil, nil", c, err)
	}
	if n, err := late.Read(buf); n != 0 || err == nil {
		t.Fatalf("a connection waiting at Close: read %d, %v; want it closed", n, err)
	}
	if got := l.Stats(); got.Accepted != 1 || got.Drained != 1 {
		t.Fatalf("stats %+v, want 1 accepted and 1 drained", got)
	}
}
