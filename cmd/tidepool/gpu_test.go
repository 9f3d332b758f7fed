package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache/gpu/gputest"
	"github.com/tidepool-kv/tidepool/client"
)

// The GPU end against a real `tidepool serve` that loads the CUDA
// stand-in (gputest) as its driver: this test process is the engine; it
// allocates "device memory" through the stand-in, hands the sidecar IPC
// handles, and checks the bytes through its own mapping of that memory.

const (
	gpuPiece  = 4096 // bytes of one block in one buffer (K or V of a layer)
	gpuBlocks = 16
	gpuNS     = "gpu-e2e"
)

var gpuHeader = []byte("tidepool-gpu-test-header")

type gpuEngine struct {
	lib     string
	handles [][]byte // K, V
	mem     [][]byte // the engine's view of each buffer
	layout  client.GPULayout
}

// newGPUEngine allocates two buffers laid out like FlashAttention's
// (2, num_blocks, ...) split: block s's piece of buffer b at s*gpuPiece.
func newGPUEngine(t *testing.T, lib string) *gpuEngine {
	e := &gpuEngine{lib: lib}
	l := client.GPULayout{NumBlocks: gpuBlocks, Header: gpuHeader}
	for b := 0; b < 2; b++ {
		h := gputest.Alloc(t, lib, gpuPiece*gpuBlocks)
		m := gputest.Map(t, h)
		for i := range m {
			m[i] = byte(i*7 + b*13 + i/gpuPiece)
		}
		e.handles = append(e.handles, h)
		e.mem = append(e.mem, m)
		l.Buffers = append(l.Buffers, client.GPUBuffer{Device: 0, IPCHandle: h, Offset: 0, Size: gpuPiece * gpuBlocks})
		l.Segments = append(l.Segments, client.GPUSegment{Buffer: int32(b), Offset: 0, Stride: gpuPiece, Length: gpuPiece})
	}
	e.layout = l
	return e
}

// value is what slot s holds, as a block value: header, K piece, V piece.
func (e *gpuEngine) value(s int) []byte {
	v := slices.Clone(gpuHeader)
	for _, m := range e.mem {
		v = append(v, m[s*gpuPiece:(s+1)*gpuPiece]...)
	}
	return v
}

func gpuKey(i int) []byte { return fmt.Appendf(nil, "gpu-block-%03d", i) }

func codes(errs []error) []client.ErrorCode {
	out := make([]client.ErrorCode, len(errs))
	for i, e := range errs {
		out[i] = client.CodeOf(e)
	}
	return out
}

func newGPUSession(t *testing.T, d *daemon) *client.GPU {
	t.Helper()
	g, err := client.NewGPU(client.DefaultConfig(d.socket))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// waitMappings polls the sidecar's /proc maps until it holds want of the
// stand-in's device mappings.
func waitMappings(t *testing.T, d *daemon, want int) {
	t.Helper()
	pid := strconv.Itoa(d.cmd.Process.Pid)
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := gputest.Mappings(t, pid)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sidecar maps %d engine buffers, want %d", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func liveReservations(t *testing.T, d *daemon) float64 {
	return metric(t, d, "tidepool_zerocopy_reservations_live")
}

// gpuClient returns a client of d (closed at the test's end) and whether
// its Hello lists the feature gpu.
func gpuClient(t *testing.T, d *daemon) (*client.Client, bool) {
	t.Helper()
	c, err := client.New(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h, err := c.Hello(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return c, slices.Contains(h.Features, "gpu")
}

func TestGPUEndToEnd(t *testing.T) {
	lib := gputest.Lib(t)
	d := startDaemon(t, "--gpu-library", lib)
	ctx := context.Background()
	c, hasGPU := gpuClient(t, d)
	if !hasGPU {
		t.Fatal("Hello features lack gpu")
	}
	e := newGPUEngine(t, lib)
	g := newGPUSession(t, d)
	defer g.Close()
	id, blockBytes, err := g.Register(ctx, e.layout)
	if err != nil {
		t.Fatal(err)
	}
	if blockBytes != int64(len(gpuHeader)+2*gpuPiece) {
		t.Fatalf("block bytes %d", blockBytes)
	}
	waitMappings(t, d, 2)

	// Save slots 0..7 in one batch; each block reads back as header + K + V.
	var save []client.GPUBlock
	for i := 0; i < 8; i++ {
		save = append(save, client.GPUBlock{Slot: int32(i), Key: gpuKey(i), Depth: int32(i)})
	}
	errs, err := g.Save(ctx, id, gpuNS, save, false)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("save %d: %v", i, e)
		}
	}
	for i := 0; i < 8; i++ {
		v, found, err := c.Get(ctx, gpuNS, gpuKey(i))
		if err != nil || !found || !bytes.Equal(v, e.value(i)) {
			t.Fatalf("block %d: found %v err %v, bytes equal %v", i, found, err, bytes.Equal(v, e.value(i)))
		}
	}
	if got := metric(t, d, "tidepool_gpu_saved_bytes_total"); got != 8*2*gpuPiece {
		t.Fatalf("tidepool_gpu_saved_bytes_total %v", got)
	}
	if got := metric(t, d, "tidepool_gpu_ipc_handles_open"); got != 2 {
		t.Fatalf("tidepool_gpu_ipc_handles_open %v", got)
	}
	// Saved again: EXISTS, nothing copied.
	errs, _ = g.Save(ctx, id, gpuNS, save[:2], false)
	if got := codes(errs); got[0] != client.CodeExists || got[1] != client.CodeExists {
		t.Fatalf("second save: %v", got)
	}

	// Load blocks 0..7 into slots 15..8 (wiped first), one batch; a key
	// never stored misses.
	for _, m := range e.mem {
		clear(m[8*gpuPiece:])
	}
	var load []client.GPUBlock
	for i := 0; i < 8; i++ {
		load = append(load, client.GPUBlock{Slot: int32(15 - i), Key: gpuKey(i)})
	}
	load = append(load, client.GPUBlock{Slot: 3, Key: []byte("never-stored")})
	errs, err = g.Load(ctx, id, gpuNS, load)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 8; i++ {
		if errs[i] != nil {
			t.Fatalf("load %d: %v", i, errs[i])
		}
		if got := e.value(15 - i); !bytes.Equal(got, e.value(i)) {
			t.Fatalf("slot %d does not hold block %d after the load", 15-i, i)
		}
	}
	if client.CodeOf(errs[8]) != client.CodeNotFound {
		t.Fatalf("missing key: %v", errs[8])
	}

	t.Run("copy fails", func(t *testing.T) {
		// Slot 9's K piece starts with the stand-in's poison: its copy
		// fails on the device; slot 10 in the same batch is saved.
		copy(e.mem[0][9*gpuPiece:], "FAILCOPY")
		before := liveReservations(t, d)
		errs, err := g.Save(ctx, id, gpuNS, []client.GPUBlock{{Slot: 9, Key: []byte("fails")}, {Slot: 10, Key: []byte("fine")}}, false)
		if err != nil {
			t.Fatal(err)
		}
		if got := codes(errs); got[0] != client.CodeInternal || got[1] != client.CodeOK {
			t.Fatalf("codes %v (%v)", got, errs)
		}
		if _, found, _ := c.Get(ctx, gpuNS, []byte("fails")); found {
			t.Fatal("the failed copy left a block")
		}
		if got := liveReservations(t, d); got != before {
			t.Fatalf("reservations live %v, before %v: the failed slot leaked", got, before)
		}
		// A load from a block whose bytes poison the host-to-device copy.
		bad := slices.Concat(gpuHeader, []byte("FAILCOPY"), make([]byte, 2*gpuPiece-8))
		if _, err := c.Put(ctx, gpuNS, []byte("poisoned"), bad, 0); err != nil {
			t.Fatal(err)
		}
		errs, err = g.Load(ctx, id, gpuNS, []client.GPUBlock{{Slot: 11, Key: []byte("poisoned")}, {Slot: 12, Key: gpuKey(1)}})
		if err != nil {
			t.Fatal(err)
		}
		if got := codes(errs); got[0] != client.CodeInternal || got[1] != client.CodeOK {
			t.Fatalf("load codes %v (%v)", got, errs)
		}
		if !bytes.Equal(e.value(12), e.value(1)) {
			t.Fatal("slot 12 wrong after a batch with a failed copy")
		}
	})

	t.Run("hostile requests", func(t *testing.T) {
		errs, err := g.Save(ctx, id, gpuNS, []client.GPUBlock{{Slot: gpuBlocks, Key: []byte("h1")}, {Slot: -1, Key: []byte("h2")}}, false)
		if err != nil {
			t.Fatal(err)
		}
		if got := codes(errs); got[0] != client.CodeInvalidArgument || got[1] != client.CodeInvalidArgument {
			t.Fatalf("slots out of range: %v", got)
		}
		errs, _ = g.Load(ctx, id, gpuNS, []client.GPUBlock{{Slot: 1, Key: gpuKey(0)}, {Slot: 1, Key: gpuKey(2)}, {Slot: gpuBlocks, Key: gpuKey(3)}})
		if got := codes(errs); got[0] != client.CodeOK || got[1] != client.CodeInvalidArgument || got[2] != client.CodeInvalidArgument {
			t.Fatalf("slot twice / out of range: %v", got)
		}
		// A block of another size than the registration's.
		if _, err := c.Put(ctx, gpuNS, []byte("short"), gpuHeader, 0); err != nil {
			t.Fatal(err)
		}
		errs, _ = g.Load(ctx, id, gpuNS, []client.GPUBlock{{Slot: 2, Key: []byte("short")}})
		if client.CodeOf(errs[0]) != client.CodeInvalidArgument {
			t.Fatalf("short block: %v", errs)
		}
		if _, err := g.Save(ctx, id+1000, gpuNS, save[:1], false); client.CodeOf(err) != client.CodeInvalidArgument {
			t.Fatalf("registration never made: %v", err)
		}
		// Another connection cannot use this one's registration.
		other := newGPUSession(t, d)
		defer other.Close()
		if _, err := other.Load(ctx, id, gpuNS, load[:1]); client.CodeOf(err) != client.CodeInvalidArgument {
			t.Fatalf("another connection's registration: %v", err)
		}
		lie := func(mut func(l *client.GPULayout)) error {
			l := e.layout
			l.Buffers = slices.Clone(l.Buffers)
			l.Segments = slices.Clone(l.Segments)
			mut(&l)
			_, _, err := other.Register(ctx, l)
			return err
		}
		for name, mut := range map[string]func(l *client.GPULayout){
			"size beyond the allocation": func(l *client.GPULayout) { l.Buffers[0].Size = gpuPiece*gpuBlocks + 1 },
			"offset beyond":              func(l *client.GPULayout) { l.Buffers[1].Offset = gpuPiece * gpuBlocks },
			"short handle":               func(l *client.GPULayout) { l.Buffers[0].IPCHandle = l.Buffers[0].IPCHandle[:10] },
			"garbage handle":             func(l *client.GPULayout) { l.Buffers[0].IPCHandle = bytes.Repeat([]byte{1}, 64) },
			"segment past its buffer":    func(l *client.GPULayout) { l.NumBlocks = gpuBlocks + 1 },
			"segment names no buffer":    func(l *client.GPULayout) { l.Segments[1].Buffer = 2 },
			"no segments":                func(l *client.GPULayout) { l.Segments = nil },
			"huge stride":                func(l *client.GPULayout) { l.Segments[0].Stride = 1 << 62 },
			"device not there":           func(l *client.GPULayout) { l.Buffers[0].Device = 3 },
		} {
			if err := lie(mut); client.CodeOf(err) != client.CodeInvalidArgument {
				t.Errorf("%s: %v", name, err)
			}
		}
		waitMappings(t, d, 2) // nothing opened stayed open
	})

	t.Run("handle of an exited process", func(t *testing.T) {
		// A child engine allocates and exits; its handle no longer opens.
		out, err := exec.Command(os.Args[0], "-test.run=^TestGPUChildAlloc$").CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		hx := strings.TrimSpace(string(out))
		_, after, ok := strings.Cut(hx, "HANDLE ")
		if !ok {
			t.Fatalf("child said %q", out)
		}
		var hb []byte
		fmt.Sscanf(after, "%x", &hb)
		l := e.layout
		l.Buffers = slices.Clone(l.Buffers)
		l.Buffers[0].IPCHandle = hb
		if _, _, err := g.Register(ctx, l); client.CodeOf(err) != client.CodeInvalidArgument {
			t.Fatalf("handle of an exited process: %v", err)
		}
		waitMappings(t, d, 2)
	})

	t.Run("engine disconnects mid-copy", func(t *testing.T) {
		g2 := newGPUSession(t, d)
		id2, _, err := g2.Register(ctx, e.layout)
		if err != nil {
			t.Fatal(err)
		}
		copy(e.mem[0][13*gpuPiece:], "SLOWCOPY") // 300 ms in the stand-in
		want := e.value(13)
		done := make(chan struct{})
		go func() {
			defer close(done)
			g2.Save(ctx, id2, gpuNS, []client.GPUBlock{{Slot: 13, Key: []byte("slow")}}, false)
		}()
		g2.Close() // whenever the save is: before, during or after its copy
		<-done
		// The registration ends with the connection; the first session's
		// remains (one mapping per handle, shared).
		waitMappings(t, d, 2)
		if _, err := g.Load(ctx, id, gpuNS, []client.GPUBlock{{Slot: 14, Key: gpuKey(0)}}); err != nil {
			t.Fatalf("the other session after a disconnect: %v", err)
		}
		// Stored whole or not at all.
		if v, found, err := c.Get(ctx, gpuNS, []byte("slow")); err != nil || (found && !bytes.Equal(v, want)) {
			t.Fatalf("slow block: found %v err %v", found, err)
		}
	})

	t.Run("unregister", func(t *testing.T) {
		g3 := newGPUSession(t, d)
		defer g3.Close()
		l := e.layout
		l.Buffers = l.Buffers[:1]
		l.Segments = l.Segments[:1]
		l.Buffers = append(l.Buffers, client.GPUBuffer{IPCHandle: gputest.Alloc(t, lib, gpuPiece*gpuBlocks), Size: gpuPiece * gpuBlocks})
		l.Segments = append(l.Segments, client.GPUSegment{Buffer: 1, Stride: gpuPiece, Length: gpuPiece})
		id3, _, err := g3.Register(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		waitMappings(t, d, 3)
		if err := g3.Unregister(ctx, id3); err != nil {
			t.Fatal(err)
		}
		waitMappings(t, d, 2)
		if err := g3.Unregister(ctx, id3); client.CodeOf(err) != client.CodeInvalidArgument {
			t.Fatalf("second unregister: %v", err)
		}
	})

	// The sidecar stops with a registration live: a clean exit.
	d.stop(t, syscall.SIGTERM)
}

// TestGPUChildAlloc is the child engine of "handle of an exited process":
// run alone it allocates and prints a handle, then exits.
func TestGPUChildAlloc(t *testing.T) {
	if !strings.Contains(strings.Join(os.Args, " "), "TestGPUChildAlloc") {
		t.Skip("the child of TestGPUEndToEnd")
	}
	fmt.Printf("HANDLE %x\n", gputest.Alloc(t, gputest.Lib(t), 4096))
}

// TestGPUOffWithoutDriver: a sidecar whose driver library is missing
// serves as before and refuses the GPU calls with UNAVAILABLE.
func TestGPUOffWithoutDriver(t *testing.T) {
	d := startDaemon(t, "--gpu-library", "/nonexistent/libcuda.so.1")
	ctx := context.Background()
	c, hasGPU := gpuClient(t, d)
	if hasGPU {
		t.Fatal("Hello lists gpu without a driver")
	}
	if _, err := c.Put(ctx, "ns", []byte("k"), []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	g := newGPUSession(t, d)
	defer g.Close()
	_, _, err := g.Register(ctx, client.GPULayout{NumBlocks: 1, Buffers: []client.GPUBuffer{{IPCHandle: make([]byte, 64), Size: 1}},
		Segments: []client.GPUSegment{{Length: 1}}})
	if client.CodeOf(err) != client.CodeUnavailable || errors.Is(err, context.Canceled) {
		t.Fatalf("register without a GPU: %v", err)
	}
}

// TestGPUArenaNotPinned: a driver that cannot pin the arenas leaves the
// GPU end working, unpinned.
func TestGPUArenaNotPinned(t *testing.T) {
	lib := gputest.Lib(t)
	t.Setenv("FAKECUDA_FAIL_HOST_REGISTER", "1")
	d := startDaemon(t, "--gpu-library", lib)
	c, hasGPU := gpuClient(t, d)
	if !hasGPU {
		t.Fatalf("no GPU end when the arenas cannot be pinned\n%s", d.stderr.String())
	}
	if !strings.Contains(d.stderr.String(), "arena not pinned") {
		t.Fatalf("no warning of the unpinned arena\n%s", d.stderr.String())
	}
	e := newGPUEngine(t, lib)
	g := newGPUSession(t, d)
	defer g.Close()
	ctx := context.Background()
	id, _, err := g.Register(ctx, e.layout)
	if err != nil {
		t.Fatal(err)
	}
	if errs, err := g.Save(ctx, id, gpuNS, []client.GPUBlock{{Slot: 2, Key: gpuKey(2)}}, false); err != nil || errs[0] != nil {
		t.Fatalf("save: %v %v", err, errs)
	}
	if v, found, err := c.Get(ctx, gpuNS, gpuKey(2)); err != nil || !found || !bytes.Equal(v, e.value(2)) {
		t.Fatalf("block: found %v err %v", found, err)
	}
}
