package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
)

// fakeGPU is an in-process GPU for the proxy's unit tests: "device memory"
// is one byte slice, a handle names an offset into it (8 bytes of offset,
// then zeros), and an item fails when its first device byte is 0xEE. The
// real package is tested against the stand-in driver (cache/gpu,
// cmd/tidepool's TestGPUEndToEnd).
type fakeGPU struct {
	mem []byte

	mu     sync.Mutex
	opened int
	closed int
}

type fakeBuf struct {
	g    *fakeGPU
	addr uint64
	size int64
	once sync.Once
}

func (b *fakeBuf) Addr() uint64 { return b.addr }
func (b *fakeBuf) Size() int64  { return b.size }
func (b *fakeBuf) Close() error {
	b.once.Do(func() { b.g.mu.Lock(); b.g.closed++; b.g.mu.Unlock() })
	return nil
}

func (g *fakeGPU) DeviceIndex(ordinal int, uuid []byte) (int, error) {
	if ordinal != 0 || len(uuid) != 0 {
		return 0, errors.New("fake: one device")
	}
	return 0, nil
}

func (g *fakeGPU) OpenIPC(ctx context.Context, dev int, handle []byte, offset, size int64) (cache.DeviceBuffer, error) {
	if len(handle) != 64 {
		return nil, errors.New("fake: bad handle")
	}
	var base int64
	fmt.Sscanf(string(bytes.TrimRight(handle, "\x00")), "%d", &base)
	if base+offset+size > int64(len(g.mem)) {
		return nil, errors.New("fake: outside the allocation")
	}
	g.mu.Lock()
	g.opened++
	g.mu.Unlock()
	return &fakeBuf{g: g, addr: uint64(base + offset), size: size}, nil
}

func (g *fakeGPU) copy(items [][]cache.DeviceCopy, toHost bool) []error {
	errs := make([]error, len(items))
	for i, it := range items {
		for _, c := range it {
			d := g.mem[c.Device : c.Device+uint64(len(c.Host))]
			if (toHost && d[0] == 0xEE) || (!toHost && c.Host[0] == 0xEE) {
				errs[i] = fmt.Errorf("%w: fake", cache.ErrDeviceCopy)
				break
			}
			if toHost {
				copy(c.Host, d)
			} else {
				copy(d, c.Host)
			}
		}
	}
	return errs
}

func (g *fakeGPU) ToHost(ctx context.Context, dev int, items [][]cache.DeviceCopy) []error {
	return g.copy(items, true)
}

func (g *fakeGPU) ToDevice(ctx context.Context, dev int, items [][]cache.DeviceCopy) []error {
	return g.copy(items, false)
}

func handleAt(off int) []byte {
	h := make([]byte, 64)
	copy(h, fmt.Sprint(off))
	return h
}

func newGPUFixture(t *testing.T) (*zcFixture, *fakeGPU) {
	g := &fakeGPU{mem: make([]byte, 1<<20)}
	f := newZC(t, 16<<20, func(tier *dram.Tier) Deps {
		return Deps{Store: tier, ZeroCopy: tier, GPU: g}
	})
	return f, g
}

func TestGPULayoutChecks(t *testing.T) {
	f, g := newGPUFixture(t)
	good := GPULayout{NumBlocks: 8, Header: []byte("h"),
		Buffers:  []GPUBufferSpec{{Handle: handleAt(0), Size: 8 * 1024}},
		Segments: []GPUSegment{{Buffer: 0, Stride: 1024, Length: 1024}}}
	for name, mut := range map[string]func(l *GPULayout){
		"no buffers":         func(l *GPULayout) { l.Buffers = nil },
		"no segments":        func(l *GPULayout) { l.Segments = nil },
		"no blocks":          func(l *GPULayout) { l.NumBlocks = 0 },
		"too many blocks":    func(l *GPULayout) { l.NumBlocks = MaxGPUBlocks + 1 },
		"header too long":    func(l *GPULayout) { l.Header = make([]byte, MaxGPUHeader+1) },
		"negative offset":    func(l *GPULayout) { l.Buffers[0].Offset = -1 },
		"zero size":          func(l *GPULayout) { l.Buffers[0].Size = 0 },
		"segment buffer":     func(l *GPULayout) { l.Segments[0].Buffer = 1 },
		"segment past end":   func(l *GPULayout) { l.NumBlocks = 9 },
		"segment length":     func(l *GPULayout) { l.Segments[0].Length = 8*1024 + 1 },
		"zero length":        func(l *GPULayout) { l.Segments[0].Length = 0 },
		"negative stride":    func(l *GPULayout) { l.Segments[0].Stride = -1 },
		"overflowing stride": func(l *GPULayout) { l.Segments[0].Stride = 1 << 62 },
		"overflowing offset": func(l *GPULayout) { l.Segments[0].Offset = 1<<63 - 1 },
		"device":             func(l *GPULayout) { l.Buffers[0].Device = 1 },
		"outside the handle": func(l *GPULayout) { l.Buffers[0].Size = 2 << 20 },
		"malformed handle":   func(l *GPULayout) { l.Buffers[0].Handle = []byte{1} },
	} {
		l := good
		l.Buffers = append([]GPUBufferSpec(nil), good.Buffers...)
		l.Segments = append([]GPUSegment(nil), good.Segments...)
		mut(&l)
		if _, err := f.p.GPURegister(bg, l); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
	big := good
	big.Buffers = []GPUBufferSpec{{Handle: handleAt(0), Size: 1 << 20}}
	big.Segments = []GPUSegment{{Length: 1 << 20}, {Length: 1 << 20}, {Length: 1 << 20}, {Length: 1 << 20}, {Length: 1 << 20}, {Length: 1 << 20}, {Length: 1 << 20}, {Length: 1 << 20}, {Length: 1 << 20}}
	if _, err := f.p.GPURegister(bg, big); !errors.Is(err, cache.ErrTooLarge) {
		t.Errorf("blocks over max_value_size: %v", err)
	}
	if g.opened != g.closed {
		t.Fatalf("%d buffers opened, %d closed", g.opened, g.closed)
	}
	noGPU := newZC(t, 16<<20, nil)
	if _, err := noGPU.p.GPURegister(bg, good); !errors.Is(err, ErrNoGPU) {
		t.Fatalf("without a GPU: %v", err)
	}
}

func TestGPUSaveLoad(t *testing.T) {
	f, g := newGPUFixture(t)
	for i := range g.mem {
		g.mem[i] = byte(i % 251)
	}
	g.mem[3*1024] = 0xEE // slot 3's copy fails
	r, err := f.p.GPURegister(bg, GPULayout{NumBlocks: 8, Header: []byte("hdr"),
		Buffers:  []GPUBufferSpec{{Handle: handleAt(0), Size: 8 * 1024}, {Handle: handleAt(8 * 1024), Size: 8 * 1024}},
		Segments: []GPUSegment{{Buffer: 0, Stride: 1024, Length: 1024}, {Buffer: 1, Stride: 1024, Length: 1024}}})
	if err != nil {
		t.Fatal(err)
	}
	if r.BlockBytes() != 3+2048 {
		t.Fatalf("block bytes %d", r.BlockBytes())
	}
	key := func(i int) []byte { return fmt.Appendf(nil, "k%d", i) }
	errs, err := f.p.GPUSave(bg, r, "ns", []GPUBlock{{Slot: 1, Key: key(1)}, {Slot: 3, Key: key(3)}, {Slot: 8, Key: key(8)}}, false)
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || !errors.Is(errs[1], cache.ErrDeviceCopy) || !errors.Is(errs[2], ErrInvalidArgument) {
		t.Fatalf("save: %v", errs)
	}
	if st := f.p.ZeroCopyStats(); st.LiveReservations != 0 {
		t.Fatalf("reservations left: %+v", st)
	}
	want := append([]byte("hdr"), g.mem[1024:2048]...)
	want = append(want, g.mem[9*1024:10*1024]...)
	got, _, err := f.tier.Get(bg, "ns", key(1), nil)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("saved block: %v", err)
	}
	if _, _, err := f.tier.Get(bg, "ns", key(3), nil); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("failed save left a block: %v", err)
	}
	errs, err = f.p.GPULoad(bg, r, "ns", []GPUBlock{{Slot: 6, Key: key(1)}, {Slot: 6, Key: key(1)}, {Slot: 5, Key: key(3)}}, ScopeLocal)
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || !errors.Is(errs[1], ErrInvalidArgument) || !errors.Is(errs[2], cache.ErrNotFound) {
		t.Fatalf("load: %v", errs)
	}
	if !bytes.Equal(g.mem[6*1024:7*1024], g.mem[1024:2048]) || !bytes.Equal(g.mem[14*1024:15*1024], g.mem[9*1024:10*1024]) {
		t.Fatal("slot 6 does not hold block k1")
	}
	if st := f.p.ZeroCopyStats(); st.LiveLeases != 0 {
		t.Fatalf("leases left: %+v", st)
	}
	// Closed while a call holds it: the buffers close when the call ends.
	if err := r.use(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if g.closed != 0 {
		t.Fatal("buffers closed under a call in flight")
	}
	if _, err := f.p.GPUSave(bg, r, "ns", []GPUBlock{{Slot: 1, Key: key(9)}}, false); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("save on a closed registration: %v", err)
	}
	r.unuse()
	if g.closed != 2 || g.opened != 2 {
		t.Fatalf("opened %d closed %d", g.opened, g.closed)
	}
	r.Close()
}
