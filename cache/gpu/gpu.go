// Package gpu is the sidecar's own GPU end: the CUDA driver API loaded at
// run time (libcuda.so.1 through purego, nothing of CUDA at build time),
// engine GPU memory opened from CUDA IPC memory handles, the DRAM arenas
// pinned once (cuMemHostRegister), and batched copies between the two on
// the sidecar's own streams (cuMemcpyDtoHAsync / cuMemcpyHtoDAsync).
//
// Threads: a CUDA call uses the context current on the calling OS thread.
// Every call here runs on a worker goroutine locked to its OS thread with
// the device's primary context current: per device, one worker for copies
// to host (saves; it also runs the control calls: open, close, pin) and one
// for copies to the device (loads), so saves and loads use both copy
// engines at once. Each worker owns its streams and events.
//
// Without a usable library or device, Open returns a GPU that is not
// Available (Reason says why) and whose calls fail with ErrNoGPU: the rest
// of the sidecar works as without this package.
package gpu

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
)

// Errors of this package; test with errors.Is. Driver failures are *Error
// (wrapped with cache.ErrDeviceCopy where a copy failed).
var (
	ErrNoGPU   = errors.New("gpu: no GPU")
	ErrClosed  = errors.New("gpu: closed")
	ErrInvalid = errors.New("gpu: invalid argument")
)

// DefaultLibrary is the driver library's name (the NVIDIA container
// toolkit mounts it into GPU containers).
const DefaultLibrary = "libcuda.so.1"

// Off as Config.Library turns the GPU end off without looking for a driver.
const Off = "off"

// Config of the GPU end.
type Config struct {
	// Library is the CUDA driver library to load: a file name (searched as
	// dlopen searches) or a path. Default DefaultLibrary; Off disables.
	Library string
	// Streams is the number of CUDA streams each copy worker spreads a
	// batch over (per device and direction). Default 4.
	Streams int
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config { return Config{Library: DefaultLibrary, Streams: 4} }

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	if c.Library == "" {
		errs = append(errs, errors.New("gpu: library is empty (use \"off\" to disable)"))
	}
	if c.Streams < 1 || c.Streams > 64 {
		errs = append(errs, fmt.Errorf("gpu: streams %d not in [1, 64]", c.Streams))
	}
	return errors.Join(errs...)
}

// Device describes one CUDA device as the sidecar sees it.
type Device struct {
	Ordinal int
	Name    string
	UUID    [16]byte
}

// Stats are counters since Open.
type Stats struct {
	Available     bool
	Devices       int
	OpenBuffers   int64 // IPC mappings open now
	PinnedBytes   int64 // host bytes registered now
	ToHostBytes   uint64
	ToDeviceBytes uint64
	CopyErrors    uint64 // items whose copy failed
}

// GPU is the loaded driver and its devices. Methods are safe for
// concurrent use.
type GPU struct {
	cfg    Config
	lg     *zap.Logger
	d      *driver
	reason string
	devs   []*device

	openMu  sync.Mutex // serializes opening IPC handles (one mapping per handle)
	mu      sync.Mutex
	closed  bool
	maps    map[mapKey]*mapping
	pinned  []pinned
	inUse   sync.WaitGroup // calls in flight (Close waits)
	toHost  atomic.Uint64
	toDev   atomic.Uint64
	cpErrs  atomic.Uint64
	pinnedN atomic.Int64
	openN   atomic.Int64
}

type device struct {
	info     Device
	ctx      uintptr // primary context
	save     *worker // copies to host, and the control calls
	load     *worker // copies to the device
	retained bool
}

type mapKey struct {
	dev    int
	handle IPCHandle
}

// mapping is one opened IPC handle, shared by the buffers opened from it
// (the driver maps a handle once per process).
type mapping struct {
	key  mapKey
	base uint64
	size int64 // the allocation's size, from cuMemGetAddressRange
	refs int
}

type pinned struct {
	mem []byte
}

// Open loads the driver named by cfg.Library and starts a worker pair per
// device. A missing library, a failed cuInit or no device is not an error:
// the GPU returned is not Available and Reason says why. Errors are for a
// bad configuration and for a driver that fails after it found a device.
func Open(cfg Config, lg *zap.Logger) (*GPU, error) {
	if lg == nil {
		lg = zap.NewNop()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g := &GPU{cfg: cfg, lg: lg, maps: make(map[mapKey]*mapping)}
	if cfg.Library == Off {
		g.reason = "gpu_library is off"
		return g, nil
	}
	d, err := load(cfg.Library)
	if err != nil {
		g.reason = err.Error()
		return g, nil
	}
	g.d = d
	if err := d.call("cuInit", d.cuInit, 0); err != nil {
		g.reason = err.Error()
		g.d = nil
		return g, nil
	}
	var n int32
	if err := d.call("cuDeviceGetCount", d.cuDeviceGetCount, uintptr(unsafe.Pointer(&n))); err != nil || n == 0 {
		g.reason = "no CUDA device"
		if err != nil {
			g.reason = err.Error()
		}
		g.d = nil
		return g, nil
	}
	for i := 0; i < int(n); i++ {
		dev, err := g.openDevice(i)
		if err != nil {
			g.Close()
			return nil, err
		}
		g.devs = append(g.devs, dev)
	}
	return g, nil
}

func (g *GPU) openDevice(ordinal int) (*device, error) {
	d := g.d
	var h int32
	if err := d.call("cuDeviceGet", d.cuDeviceGet, uintptr(unsafe.Pointer(&h)), uintptr(ordinal)); err != nil {
		return nil, err
	}
	dev := &device{info: Device{Ordinal: ordinal}}
	name := make([]byte, 256)
	if err := d.call("cuDeviceGetName", d.cuDeviceGetName, uintptr(unsafe.Pointer(&name[0])), uintptr(len(name)), uintptr(h)); err == nil {
		dev.info.Name = cString(&name[0], len(name))
	}
	if err := d.call("cuDeviceGetUuid_v2", d.cuDeviceGetUuid, uintptr(unsafe.Pointer(&dev.info.UUID[0])), uintptr(h)); err != nil {
		return nil, err
	}
	if err := d.call("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(&dev.ctx)), uintptr(h)); err != nil {
		return nil, err
	}
	dev.retained = true
	var err error
	if dev.save, err = startWorker(d, dev.ctx, g.cfg.Streams); err != nil {
		g.releaseDevice(dev)
		return nil, err
	}
	if dev.load, err = startWorker(d, dev.ctx, g.cfg.Streams); err != nil {
		g.releaseDevice(dev)
		return nil, err
	}
	return dev, nil
}

func (g *GPU) releaseDevice(dev *device) {
	if dev.save != nil {
		dev.save.stop()
	}
	if dev.load != nil {
		dev.load.stop()
	}
	if dev.retained {
		_ = g.d.call("cuDevicePrimaryCtxRelease_v2", g.d.cuDevicePrimaryCtxRelease, uintptr(dev.info.Ordinal))
		dev.retained = false
	}
}

// Available reports whether a driver and at least one device were found.
func (g *GPU) Available() bool { return len(g.devs) > 0 }

// Reason says why the GPU is not Available ("" when it is).
func (g *GPU) Reason() string { return g.reason }

// Devices lists the devices found, by ordinal.
func (g *GPU) Devices() []Device {
	out := make([]Device, len(g.devs))
	for i, d := range g.devs {
		out[i] = d.info
	}
	return out
}

// Stats returns the counters.
func (g *GPU) Stats() Stats {
	return Stats{
		Available:     g.Available(),
		Devices:       len(g.devs),
		OpenBuffers:   g.openN.Load(),
		PinnedBytes:   g.pinnedN.Load(),
		ToHostBytes:   g.toHost.Load(),
		ToDeviceBytes: g.toDev.Load(),
		CopyErrors:    g.cpErrs.Load(),
	}
}

// enter counts a call in flight; the caller MUST call g.inUse.Done.
func (g *GPU) enter() error {
	if !g.Available() {
		return ErrNoGPU
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return ErrClosed
	}
	g.inUse.Add(1)
	return nil
}

func (g *GPU) device(i int) (*device, error) {
	if i < 0 || i >= len(g.devs) {
		return nil, fmt.Errorf("%w: device %d of %d", ErrInvalid, i, len(g.devs))
	}
	return g.devs[i], nil
}

// DeviceIndex finds the device an engine names: by UUID when uuid is not
// empty (16 bytes; the engine's and the sidecar's ordinals may differ, as
// CUDA_VISIBLE_DEVICES orders them), else by ordinal.
func (g *GPU) DeviceIndex(ordinal int, uuid []byte) (int, error) {
	if !g.Available() {
		return 0, ErrNoGPU
	}
	if len(uuid) > 0 {
		if len(uuid) != 16 {
			return 0, fmt.Errorf("%w: device uuid of %d bytes (want 16)", ErrInvalid, len(uuid))
		}
		for i, d := range g.devs {
			if string(d.info.UUID[:]) == string(uuid) {
				return i, nil
			}
		}
		return 0, fmt.Errorf("%w: no device with uuid %x", ErrInvalid, uuid)
	}
	if ordinal < 0 || ordinal >= len(g.devs) {
		return 0, fmt.Errorf("%w: device %d of %d", ErrInvalid, ordinal, len(g.devs))
	}
	return ordinal, nil
}

// PinHost registers mem with the driver as pinned host memory (portable:
// every context may copy to and from it at full speed), until Close. Pin
// each arena once.
func (g *GPU) PinHost(mem []byte) error {
	if len(mem) == 0 {
		return fmt.Errorf("%w: empty host range", ErrInvalid)
	}
	if err := g.enter(); err != nil {
		return err
	}
	defer g.inUse.Done()
	dev := g.devs[0]
	var err error
	dev.save.run(func(w *worker) {
		err = w.d.call("cuMemHostRegister_v2", w.d.cuMemHostRegister, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), memHostRegisterPortable)
	})
	if err != nil {
		return err
	}
	g.mu.Lock()
	g.pinned = append(g.pinned, pinned{mem: mem})
	g.mu.Unlock()
	g.pinnedN.Add(int64(len(mem)))
	return nil
}

// buffer is an open DeviceBuffer.
type buffer struct {
	g      *GPU
	m      *mapping
	addr   uint64
	size   int64
	closed atomic.Bool
}

var _ cache.DeviceBuffer = (*buffer)(nil)

func (b *buffer) Addr() uint64 { return b.addr }
func (b *buffer) Size() int64  { return b.size }

func (b *buffer) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	return b.g.unref(b.m)
}

// OpenIPC opens size bytes at offset of the allocation that handle (a
// CUipcMemHandle of another process, 64 bytes) names, on device dev (an
// index of Devices). Opening the same handle again shares the mapping.
// The range must lie inside the allocation (cuMemGetAddressRange says how
// large it is): a size that lies is refused, and nothing stays open.
func (g *GPU) OpenIPC(ctx context.Context, dev int, handle []byte, offset, size int64) (cache.DeviceBuffer, error) {
	var h IPCHandle
	if len(handle) != len(h.Reserved) {
		return nil, fmt.Errorf("%w: ipc handle of %d bytes (want %d)", ErrInvalid, len(handle), len(h.Reserved))
	}
	if offset < 0 || size <= 0 {
		return nil, fmt.Errorf("%w: offset %d size %d", ErrInvalid, offset, size)
	}
	copy(h.Reserved[:], handle)
	if err := g.enter(); err != nil {
		return nil, err
	}
	defer g.inUse.Done()
	d, err := g.device(dev)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	key := mapKey{dev: dev, handle: h}
	g.openMu.Lock()
	g.mu.Lock()
	m := g.maps[key]
	if m != nil {
		m.refs++
	}
	g.mu.Unlock()
	if m == nil {
		m, err = g.openMapping(d, key)
	}
	g.openMu.Unlock()
	if err != nil {
		return nil, err
	}
	if offset > m.size || size > m.size-offset {
		_ = g.unref(m)
		return nil, fmt.Errorf("%w: range [%d, +%d) outside the %d-byte allocation", ErrInvalid, offset, size, m.size)
	}
	return &buffer{g: g, m: m, addr: m.base + uint64(offset), size: size}, nil
}

// openMapping opens key's handle on its device (under g.openMu).
func (g *GPU) openMapping(d *device, key mapKey) (*mapping, error) {
	var base, abase uint64
	var asize uintptr
	var err error
	d.save.run(func(w *worker) {
		if r := w.d.ipcOpen(&base, key.handle, ipcMemLazyEnablePeerAccess); r != 0 {
			err = w.d.check("cuIpcOpenMemHandle_v2", result(r))
			return
		}
		err = w.d.call("cuMemGetAddressRange_v2", w.d.cuMemGetAddressRange,
			uintptr(unsafe.Pointer(&abase)), uintptr(unsafe.Pointer(&asize)), uintptr(base))
		if err == nil && abase != base {
			err = fmt.Errorf("gpu: ipc mapping at %#x is inside an allocation at %#x", base, abase)
		}
		if err != nil {
			_ = w.d.call("cuIpcCloseMemHandle", w.d.cuIpcCloseMemHandle, uintptr(base))
		}
	})
	if err != nil {
		return nil, err
	}
	m := &mapping{key: key, base: base, size: int64(asize), refs: 1}
	g.mu.Lock()
	g.maps[key] = m
	g.mu.Unlock()
	g.openN.Add(1)
	return m, nil
}

// unref drops one buffer's hold on m and closes the handle with the last.
// After Close it does nothing: Close closed every mapping.
func (g *GPU) unref(m *mapping) error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	m.refs--
	last := m.refs == 0
	if last {
		delete(g.maps, m.key)
		g.inUse.Add(1) // Close waits for this close
	}
	g.mu.Unlock()
	if !last {
		return nil
	}
	defer g.inUse.Done()
	g.openN.Add(-1)
	var err error
	g.devs[m.key.dev].save.run(func(w *worker) {
		err = w.d.call("cuIpcCloseMemHandle", w.d.cuIpcCloseMemHandle, uintptr(m.base))
	})
	return err
}

// ToHost copies each item (a list of contiguous copies, device to host) and
// returns one error per item: nil, or an error wrapping
// cache.ErrDeviceCopy. It returns when every copy has completed or failed,
// so the host memory may be reused at once. The device addresses must lie
// in buffers opened on device dev and still open.
func (g *GPU) ToHost(ctx context.Context, dev int, items [][]cache.DeviceCopy) []error {
	return g.copy(ctx, dev, items, true)
}

// ToDevice is ToHost the other way: host to device.
func (g *GPU) ToDevice(ctx context.Context, dev int, items [][]cache.DeviceCopy) []error {
	return g.copy(ctx, dev, items, false)
}

func (g *GPU) copy(ctx context.Context, dev int, items [][]cache.DeviceCopy, toHost bool) []error {
	errs := make([]error, len(items))
	fail := func(err error) []error {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	if err := g.enter(); err != nil {
		return fail(err)
	}
	defer g.inUse.Done()
	d, err := g.device(dev)
	if err != nil {
		return fail(err)
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	w := d.load
	if toHost {
		w = d.save
	}
	w.run(func(w *worker) { w.copy(items, toHost, errs) })
	var n uint64
	for i, it := range items {
		if errs[i] != nil {
			g.cpErrs.Add(1)
			continue
		}
		for _, c := range it {
			n += uint64(len(c.Host))
		}
	}
	if toHost {
		g.toHost.Add(n)
	} else {
		g.toDev.Add(n)
	}
	return errs
}

// Close waits for calls in flight, closes every IPC mapping still open
// (their buffers fail from then on), unpins the host memory, and stops the
// workers. Safe to call twice.
func (g *GPU) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	g.mu.Unlock()
	g.inUse.Wait()
	var errs []error
	g.mu.Lock()
	maps := g.maps
	g.maps = make(map[mapKey]*mapping)
	pins := g.pinned
	g.pinned = nil
	g.mu.Unlock()
	if len(maps) > 0 {
		g.lg.Info("closing engine GPU buffers still open at stop", zap.Int("handles", len(maps)))
	}
	for _, m := range maps {
		g.openN.Add(-1)
		g.devs[m.key.dev].save.run(func(w *worker) {
			if err := w.d.call("cuIpcCloseMemHandle", w.d.cuIpcCloseMemHandle, uintptr(m.base)); err != nil {
				errs = append(errs, err)
			}
		})
	}
	for _, p := range pins {
		g.devs[0].save.run(func(w *worker) {
			if err := w.d.call("cuMemHostUnregister", w.d.cuMemHostUnregister, uintptr(unsafe.Pointer(&p.mem[0]))); err != nil {
				errs = append(errs, err)
			}
		})
		g.pinnedN.Add(-int64(len(p.mem)))
	}
	for _, d := range g.devs {
		g.releaseDevice(d)
	}
	return errors.Join(errs...)
}

// worker is a goroutine locked to an OS thread on which a device's primary
// context is current; it owns its streams and a pool of events.
type worker struct {
	d       *driver
	jobs    chan func(*worker)
	done    chan struct{}
	streams []uintptr
	events  []uintptr
}

// startWorker starts a worker with n streams.
func startWorker(d *driver, ctx uintptr, n int) (*worker, error) {
	w := &worker{d: d, jobs: make(chan func(*worker)), done: make(chan struct{})}
	started := make(chan error, 1)
	go w.loop(ctx, n, started)
	if err := <-started; err != nil {
		return nil, err
	}
	return w, nil
}

func (w *worker) loop(ctx uintptr, n int, started chan<- error) {
	// Locked for life and never unlocked: the thread, with the context
	// current on it, ends with the goroutine.
	runtime.LockOSThread()
	defer close(w.done)
	err := w.d.call("cuCtxSetCurrent", w.d.cuCtxSetCurrent, ctx)
	for i := 0; i < n && err == nil; i++ {
		var s uintptr
		if err = w.d.call("cuStreamCreate", w.d.cuStreamCreate, uintptr(unsafe.Pointer(&s)), streamNonBlocking); err == nil {
			w.streams = append(w.streams, s)
		}
	}
	if err != nil {
		w.release()
		started <- err
		return
	}
	started <- nil
	for job := range w.jobs {
		job(w)
	}
	w.release()
}

func (w *worker) release() {
	for _, e := range w.events {
		_ = w.d.call("cuEventDestroy_v2", w.d.cuEventDestroy, e)
	}
	for _, s := range w.streams {
		_ = w.d.call("cuStreamDestroy_v2", w.d.cuStreamDestroy, s)
	}
	w.events, w.streams = nil, nil
}

// run runs job on the worker's thread and returns when it has.
func (w *worker) run(job func(*worker)) {
	done := make(chan struct{})
	w.jobs <- func(w *worker) {
		defer close(done)
		job(w)
	}
	<-done
}

func (w *worker) stop() {
	close(w.jobs)
	<-w.done
}

// copy issues each item's copies on stream i mod len(streams), records an
// event after each item, and waits for every event: an item's error is its
// first failed enqueue or the error its event reports (a copy that failed
// on the device). errs has one slot per item.
func (w *worker) copy(items [][]cache.DeviceCopy, toHost bool, errs []error) {
	for len(w.events) < len(items) {
		var e uintptr
		if err := w.d.call("cuEventCreate", w.d.cuEventCreate, uintptr(unsafe.Pointer(&e)), eventDisableTiming); err != nil {
			for i := range errs {
				errs[i] = fmt.Errorf("%w: %w", cache.ErrDeviceCopy, err)
			}
			return
		}
		w.events = append(w.events, e)
	}
	recorded := make([]bool, len(items))
	for i, it := range items {
		s := w.streams[i%len(w.streams)]
		for _, c := range it {
			if len(c.Host) == 0 {
				continue
			}
			var err error
			if toHost {
				err = w.d.call("cuMemcpyDtoHAsync_v2", w.d.cuMemcpyDtoHAsync,
					uintptr(unsafe.Pointer(&c.Host[0])), uintptr(c.Device), uintptr(len(c.Host)), s)
			} else {
				err = w.d.call("cuMemcpyHtoDAsync_v2", w.d.cuMemcpyHtoDAsync,
					uintptr(c.Device), uintptr(unsafe.Pointer(&c.Host[0])), uintptr(len(c.Host)), s)
			}
			if err != nil {
				errs[i] = fmt.Errorf("%w: %w", cache.ErrDeviceCopy, err)
				break
			}
		}
		if err := w.d.call("cuEventRecord", w.d.cuEventRecord, w.events[i], s); err != nil {
			if errs[i] == nil {
				errs[i] = fmt.Errorf("%w: %w", cache.ErrDeviceCopy, err)
			}
			continue
		}
		recorded[i] = true
	}
	for i := range items {
		if !recorded[i] {
			// Its stream's later events still order after its copies.
			continue
		}
		if err := w.d.call("cuEventSynchronize", w.d.cuEventSynchronize, w.events[i]); err != nil && errs[i] == nil {
			errs[i] = fmt.Errorf("%w: %w", cache.ErrDeviceCopy, err)
		}
	}
	for i := range items {
		if !recorded[i] {
			// No event says when this item's copies finished: wait for
			// its stream before the caller reuses the memory.
			s := w.streams[i%len(w.streams)]
			_ = w.d.call("cuStreamSynchronize", w.d.cuStreamSynchronize, s)
		}
	}
}
