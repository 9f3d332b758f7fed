package gpu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/gpu/gputest"
)

// The tests run against the CUDA stand-in (gputest), loaded through the
// same path as libcuda.so.1. TIDEPOOL_GPU_LIBRARY names another library:
// scripts/device-check.sh sets it to the real driver.

const childEnv = "TIDEPOOL_GPU_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	os.Exit(m.Run())
}

func library(t testing.TB) string {
	if p := os.Getenv("TIDEPOOL_GPU_LIBRARY"); p != "" {
		return p
	}
	return gputest.Lib(t)
}

func isFake(t testing.TB) bool { return os.Getenv("TIDEPOOL_GPU_LIBRARY") == "" }

func openGPU(t testing.TB) *GPU {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Library = library(t)
	g, err := Open(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !g.Available() {
		t.Fatalf("no GPU: %s", g.Reason())
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// fakeCounts reads the stand-in's counters (see fakecuda.c).
type fakeCounts struct {
	IPCOpen, HostRegs, Streams, Events, Allocs, Copies, Ctx, Failed int64
}

func counts(t testing.TB) fakeCounts {
	t.Helper()
	h, err := purego.Dlopen(library(t), purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		t.Fatal(err)
	}
	var fn func(*[8]int64)
	purego.RegisterLibFunc(&fn, h, "fakecuda_counts")
	var c [8]int64
	fn(&c)
	return fakeCounts{c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]}
}

func failNext(t testing.TB, what string, n int) {
	t.Helper()
	h, err := purego.Dlopen(library(t), purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		t.Fatal(err)
	}
	var fn func(string, int32)
	purego.RegisterLibFunc(&fn, h, "fakecuda_fail")
	fn(what, int32(n))
}

// child is an engine process: it allocates device memory through the
// driver, prints the IPC handle, and lives until its stdin closes.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	handle []byte
}

func childMain() int {
	cfg := DefaultConfig()
	cfg.Library = os.Getenv("TIDEPOOL_GPU_LIBRARY_CHILD")
	g, err := Open(cfg, nil)
	if err != nil || !g.Available() {
		fmt.Println("ERR", err, g.Reason())
		return 1
	}
	var size int
	fmt.Sscan(os.Getenv(childEnv), &size)
	var p uint64
	var h IPCHandle
	g.devs[0].save.run(func(w *worker) {
		if err = w.d.call("cuMemAlloc_v2", w.d.cuMemAlloc, uintptr(unsafe.Pointer(&p)), uintptr(size)); err != nil {
			return
		}
		err = w.d.call("cuIpcGetMemHandle", w.d.cuIpcGetMemHandle, uintptr(unsafe.Pointer(&h)), uintptr(p))
	})
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	fmt.Println("HANDLE", hex.EncodeToString(h.Reserved[:]))
	io.Copy(io.Discard, os.Stdin)
	return 0
}

func startChild(t testing.TB, size int) *child {
	t.Helper()
	if !isFake(t) {
		t.Skip("the child engine allocates through the stand-in; device-check.sh uses PyTorch")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", childEnv, size), "TIDEPOOL_GPU_LIBRARY_CHILD="+library(t))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, stdin: stdin}
	t.Cleanup(c.stop)
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	hx, ok := strings.CutPrefix(strings.TrimSpace(line), "HANDLE ")
	if !ok {
		t.Fatalf("child said %q", line)
	}
	if c.handle, err = hex.DecodeString(hx); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *child) stop() {
	c.stdin.Close()
	c.cmd.Wait()
}

func random(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestNoGPU(t *testing.T) {
	for _, tc := range []struct {
		name, lib, devices string
	}{
		{"off", Off, ""},
		{"missing library", "/nonexistent/libcuda.so.1", ""},
		{"no device", "", "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.devices != "" {
				if !isFake(t) {
					t.Skip("needs the stand-in")
				}
				t.Setenv("FAKECUDA_DEVICES", tc.devices)
			}
			cfg := DefaultConfig()
			cfg.Library = tc.lib
			if cfg.Library == "" {
				cfg.Library = library(t)
			}
			g, err := Open(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if g.Available() || g.Reason() == "" {
				t.Fatalf("available %v, reason %q", g.Available(), g.Reason())
			}
			if _, err := g.OpenIPC(context.Background(), 0, make([]byte, 64), 0, 1); !errors.Is(err, ErrNoGPU) {
				t.Fatalf("OpenIPC: %v", err)
			}
			if errs := g.ToHost(context.Background(), 0, [][]cache.DeviceCopy{{}}); !errors.Is(errs[0], ErrNoGPU) {
				t.Fatalf("ToHost: %v", errs)
			}
			if err := g.PinHost(make([]byte, 8)); !errors.Is(err, ErrNoGPU) {
				t.Fatalf("PinHost: %v", err)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	err := Config{Library: "", Streams: 0}.Validate()
	if err == nil || !strings.Contains(err.Error(), "library") || !strings.Contains(err.Error(), "streams") {
		t.Fatalf("Validate: %v", err)
	}
	if _, err := Open(Config{Library: "x", Streams: 100}, nil); err == nil {
		t.Fatal("Open took 100 streams")
	}
}

// TestCopyAcrossProcesses: device memory of another process, opened from
// its IPC handle, saved to host memory and loaded back, in batches spread
// over the streams, byte for byte.
func TestCopyAcrossProcesses(t *testing.T) {
	const block, nblocks = 64 << 10, 32
	c := startChild(t, block*nblocks)
	dev := gputest.Map(t, c.handle)
	g := openGPU(t)
	want := random(len(dev), 1)
	copy(dev, want)

	// Two buffers over halves of one allocation share one mapping.
	ctx := context.Background()
	lo, err := g.OpenIPC(ctx, 0, c.handle, 0, block*nblocks/2)
	if err != nil {
		t.Fatal(err)
	}
	hi, err := g.OpenIPC(ctx, 0, c.handle, block*nblocks/2, block*nblocks/2)
	if err != nil {
		t.Fatal(err)
	}
	if got := counts(t).IPCOpen; got != 1 {
		t.Fatalf("%d mappings open, want 1", got)
	}
	if hi.Addr() != lo.Addr()+block*nblocks/2 {
		t.Fatalf("addresses %#x %#x", lo.Addr(), hi.Addr())
	}

	host := make([]byte, block*nblocks)
	mem, err := syscall.Mmap(-1, 0, len(host), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	if err := g.PinHost(mem); err != nil {
		t.Fatal(err)
	}
	// Save: every block, in reverse order, each in two segments.
	var items [][]cache.DeviceCopy
	for i := 0; i < nblocks; i++ {
		src := uint64(nblocks - 1 - i)
		dst := mem[i*block : (i+1)*block]
		items = append(items, []cache.DeviceCopy{
			{Device: lo.Addr() + src*block, Host: dst[:block/2]},
			{Device: lo.Addr() + src*block + block/2, Host: dst[block/2:]},
		})
	}
	for i, err := range g.ToHost(ctx, 0, items) {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	for i := 0; i < nblocks; i++ {
		src := nblocks - 1 - i
		if !bytes.Equal(mem[i*block:(i+1)*block], want[src*block:(src+1)*block]) {
			t.Fatalf("block %d differs after the save", i)
		}
	}
	// Load: new bytes from host into the device, straight order.
	copy(mem, random(len(mem), 2))
	items = items[:0]
	for i := 0; i < nblocks; i++ {
		items = append(items, []cache.DeviceCopy{{Device: lo.Addr() + uint64(i*block), Host: mem[i*block : (i+1)*block]}})
	}
	for i, err := range g.ToDevice(ctx, 0, items) {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	if !bytes.Equal(dev, mem) {
		t.Fatal("device memory differs after the load")
	}
	st := g.Stats()
	if st.ToHostBytes != block*nblocks || st.ToDeviceBytes != block*nblocks || st.OpenBuffers != 1 || st.PinnedBytes != int64(len(mem)) {
		t.Fatalf("stats %+v", st)
	}
	lo.Close()
	lo.Close()
	if got := counts(t).IPCOpen; got != 1 {
		t.Fatalf("%d mappings open with one buffer left, want 1", got)
	}
	hi.Close()
	if got := counts(t).IPCOpen; got != 0 {
		t.Fatalf("%d mappings open after both closed", got)
	}
}

// TestCopyFails: an item whose copy fails is reported alone, and the
// other items of the batch are copied.
func TestCopyFails(t *testing.T) {
	if !isFake(t) {
		t.Skip("failures are injected into the stand-in")
	}
	const block = 4096
	c := startChild(t, block*8)
	dev := gputest.Map(t, c.handle)
	copy(dev, random(len(dev), 3))
	copy(dev[3*block:], "FAILCOPY")
	g := openGPU(t)
	ctx := context.Background()
	b, err := g.OpenIPC(ctx, 0, c.handle, 0, block*8)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	host := make([]byte, block*8)
	var items [][]cache.DeviceCopy
	for i := 0; i < 8; i++ {
		items = append(items, []cache.DeviceCopy{{Device: b.Addr() + uint64(i*block), Host: host[i*block : (i+1)*block]}})
	}
	errs := g.ToHost(ctx, 0, items)
	for i, err := range errs {
		if (i == 3) != (err != nil) {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	if !errors.Is(errs[3], cache.ErrDeviceCopy) {
		t.Fatalf("failed item: %v", errs[3])
	}
	for i := 0; i < 8; i++ {
		if i != 3 && !bytes.Equal(host[i*block:(i+1)*block], dev[i*block:(i+1)*block]) {
			t.Fatalf("block %d differs", i)
		}
	}
	// A copy the driver refuses at once (not on the device).
	failNext(t, "htod", 1)
	errs = g.ToDevice(ctx, 0, items[:2])
	if !errors.Is(errs[0], cache.ErrDeviceCopy) || errs[1] != nil {
		t.Fatalf("refused enqueue: %v", errs)
	}
	// An address outside every mapping.
	errs = g.ToHost(ctx, 0, [][]cache.DeviceCopy{{{Device: b.Addr() + block*8, Host: host[:1]}}})
	if !errors.Is(errs[0], cache.ErrDeviceCopy) {
		t.Fatalf("out of range: %v", errs)
	}
	if g.Stats().CopyErrors != 3 {
		t.Fatalf("stats %+v", g.Stats())
	}
}

// TestOpenIPCRefuses: handles and ranges that cannot be opened leave
// nothing open.
func TestOpenIPCRefuses(t *testing.T) {
	const size = 1 << 20
	c := startChild(t, size)
	g := openGPU(t)
	ctx := context.Background()
	garbage := bytes.Repeat([]byte{0x5a}, 64)
	for _, tc := range []struct {
		name         string
		handle       []byte
		offset, size int64
	}{
		{"short handle", c.handle[:63], 0, 1},
		{"size beyond the allocation", c.handle, 0, size + 1},
		{"offset beyond the allocation", c.handle, size, 1},
		{"negative offset", c.handle, -1, 1},
		{"zero size", c.handle, 0, 0},
		{"overflowing range", c.handle, 1, 1<<63 - 1},
		{"garbage handle", garbage, 0, 1},
	} {
		if _, err := g.OpenIPC(ctx, 0, tc.handle, tc.offset, tc.size); err == nil {
			t.Errorf("%s: opened", tc.name)
		}
	}
	if _, err := g.OpenIPC(ctx, 1, c.handle, 0, 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("device 1: %v", err)
	}
	if got := counts(t).IPCOpen; got != 0 {
		t.Fatalf("%d mappings left open", got)
	}
	// A handle from a process that has exited.
	c.stop()
	if _, err := g.OpenIPC(ctx, 0, c.handle, 0, 1); err == nil {
		t.Fatal("opened the handle of an exited process")
	}
	if got := counts(t).IPCOpen; got != 0 {
		t.Fatalf("%d mappings left open", got)
	}
}

// TestCloseReleasesEverything: Close with buffers open and host memory
// pinned leaves nothing behind in the driver; buffers closed after it do
// nothing.
func TestCloseReleasesEverything(t *testing.T) {
	if !isFake(t) {
		t.Skip("counts the stand-in's objects")
	}
	before := counts(t)
	c := startChild(t, 1<<16)
	cfg := DefaultConfig()
	cfg.Library = library(t)
	g, err := Open(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := g.OpenIPC(context.Background(), 0, c.handle, 0, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	host := make([]byte, 1<<16)
	if err := g.PinHost(host); err != nil {
		t.Fatal(err)
	}
	if errs := g.ToHost(context.Background(), 0, [][]cache.DeviceCopy{{{Device: b.Addr(), Host: host}}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	mid := counts(t)
	if mid.IPCOpen != 1 || mid.HostRegs != 1 || mid.Streams <= before.Streams || mid.Ctx <= before.Ctx {
		t.Fatalf("while open: %+v (before %+v)", mid, before)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	after := counts(t)
	if after.IPCOpen != 0 || after.HostRegs != 0 || after.Streams != before.Streams || after.Events != before.Events || after.Ctx != before.Ctx {
		t.Fatalf("after Close: %+v (before %+v)", after, before)
	}
	if _, err := g.OpenIPC(context.Background(), 0, c.handle, 0, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("OpenIPC after Close: %v", err)
	}
	if errs := g.ToHost(context.Background(), 0, [][]cache.DeviceCopy{{}}); !errors.Is(errs[0], ErrClosed) {
		t.Fatalf("ToHost after Close: %v", errs)
	}
}
