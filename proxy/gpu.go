package proxy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/tidepool-kv/tidepool/cache"
)

// The GPU end (layer 2): an engine registers its KV-cache buffers (CUDA IPC
// memory handles and a block layout), then names block slots to save into
// the store or load from it, and the sidecar copies between the engine's
// GPU memory and the arenas itself. A save is a Reserve, a device-to-host
// copy into the reserved slot and a Commit (checksummed there, replicated
// as any zero-copy put); a load is an Acquire (remote fetch included), a
// host-to-device copy and a Release.

// GPU is what the proxy needs of the sidecar's GPU end (cache/gpu.GPU). Nil
// in Deps: the GPU calls fail with ErrNoGPU.
type GPU interface {
	// DeviceIndex finds the device an engine names, by UUID when given.
	DeviceIndex(ordinal int, uuid []byte) (int, error)
	// OpenIPC opens size bytes at offset of the allocation an IPC handle
	// names; the buffer MUST be closed.
	OpenIPC(ctx context.Context, dev int, handle []byte, offset, size int64) (cache.DeviceBuffer, error)
	// ToHost and ToDevice copy items (each a list of contiguous copies)
	// and return one error per item, when every copy has ended.
	ToHost(ctx context.Context, dev int, items [][]cache.DeviceCopy) []error
	ToDevice(ctx context.Context, dev int, items [][]cache.DeviceCopy) []error
}

// ErrNoGPU: the sidecar has no GPU end (no driver or no device).
var ErrNoGPU = errors.New("proxy: no GPU on this sidecar")

// Bounds of a registration, checked before anything is opened.
const (
	MaxGPUBuffers       = 4096    // buffers of one registration (a layer each, K and V apart: 2 per layer)
	MaxGPUSegments      = 8192    // segments of one block
	MaxGPUHeader        = 4096    // bytes of the header of every block
	MaxGPUBlocks        = 1 << 24 // slots of one registration
	maxGPURegistrations = 1024    // registrations open at once, all connections together
)

// GPUBufferSpec names one engine buffer: an IPC handle's allocation, the
// range of it used, and its device (by UUID when given, else ordinal).
type GPUBufferSpec struct {
	Device     int
	DeviceUUID []byte
	Handle     []byte
	Offset     int64
	Size       int64
}

// GPUSegment is one piece of every block: slot s's piece lies at Offset +
// s*Stride of buffer Buffer, Length bytes.
type GPUSegment struct {
	Buffer                 int
	Offset, Stride, Length int64
}

// GPULayout is what GPURegister takes: the buffers, the segments of a
// block (a block's value is Header followed by its segments, in order), and
// the number of slots.
type GPULayout struct {
	Buffers   []GPUBufferSpec
	Segments  []GPUSegment
	NumBlocks int
	Header    []byte
}

// GPUBlock names one slot and its block's key (Depth: saves).
type GPUBlock struct {
	Slot  int
	Key   []byte
	Depth int32
}

// GPURegistration is an engine's registered buffers. It MUST be closed
// (Close) when the engine unregisters or disconnects; copies in flight
// finish first.
type GPURegistration struct {
	p          *Proxy
	dev        int
	bufs       []cache.DeviceBuffer
	segs       []GPUSegment
	nblocks    int
	header     []byte
	blockBytes int64

	mu     sync.Mutex
	users  int
	closed bool
	done   bool // buffers closed
}

var gpuRegs atomic.Int64 // open registrations, all proxies of the process

// BlockBytes is the value size of one block.
func (r *GPURegistration) BlockBytes() int64 { return r.blockBytes }

// GPURegister validates l, opens its buffers and returns the registration.
// Every range must lie inside its buffer and every buffer inside its
// allocation; on any error nothing stays open.
func (p *Proxy) GPURegister(ctx context.Context, l GPULayout) (*GPURegistration, error) {
	if p.gpu == nil {
		return nil, ErrNoGPU
	}
	if _, _, err := p.zeroCopyStore(); err != nil {
		return nil, err
	}
	blockBytes, err := p.checkLayout(l)
	if err != nil {
		return nil, err
	}
	dev := -1
	for i, b := range l.Buffers {
		d, err := p.gpu.DeviceIndex(b.Device, b.DeviceUUID)
		if err != nil {
			return nil, fmt.Errorf("%w: buffer %d: %v", ErrInvalidArgument, i, err)
		}
		if dev >= 0 && d != dev {
			return nil, fmt.Errorf("%w: buffer %d is on device %d, buffer 0 on %d (one registration per device)", ErrInvalidArgument, i, d, dev)
		}
		dev = d
	}
	if n := gpuRegs.Add(1); n > maxGPURegistrations {
		gpuRegs.Add(-1)
		return nil, fmt.Errorf("%w: %d GPU registrations open", cache.ErrNoSpace, maxGPURegistrations)
	}
	r := &GPURegistration{p: p, dev: dev, segs: append([]GPUSegment(nil), l.Segments...), nblocks: l.NumBlocks,
		header: append([]byte(nil), l.Header...), blockBytes: blockBytes}
	for i, b := range l.Buffers {
		buf, err := p.gpu.OpenIPC(ctx, dev, b.Handle, b.Offset, b.Size)
		if err != nil {
			r.closeBuffers()
			return nil, fmt.Errorf("%w: buffer %d: %w", ErrInvalidArgument, i, err)
		}
		r.bufs = append(r.bufs, buf)
	}
	return r, nil
}

// checkLayout checks l against the limits and its own sizes, before
// anything is opened, and returns the block size.
func (p *Proxy) checkLayout(l GPULayout) (int64, error) {
	bad := func(format string, a ...any) (int64, error) {
		return 0, fmt.Errorf("%w: gpu layout: %s", ErrInvalidArgument, fmt.Sprintf(format, a...))
	}
	switch {
	case len(l.Buffers) == 0 || len(l.Buffers) > MaxGPUBuffers:
		return bad("%d buffers (1 to %d)", len(l.Buffers), MaxGPUBuffers)
	case len(l.Segments) == 0 || len(l.Segments) > MaxGPUSegments:
		return bad("%d segments (1 to %d)", len(l.Segments), MaxGPUSegments)
	case l.NumBlocks <= 0 || l.NumBlocks > MaxGPUBlocks:
		return bad("%d blocks (1 to %d)", l.NumBlocks, MaxGPUBlocks)
	case len(l.Header) > MaxGPUHeader:
		return bad("header of %d bytes (at most %d)", len(l.Header), MaxGPUHeader)
	}
	for i, b := range l.Buffers {
		if b.Offset < 0 || b.Size <= 0 {
			return bad("buffer %d: offset %d size %d", i, b.Offset, b.Size)
		}
	}
	total := int64(len(l.Header))
	last := int64(l.NumBlocks - 1)
	for i, s := range l.Segments {
		if s.Buffer < 0 || s.Buffer >= len(l.Buffers) {
			return bad("segment %d names buffer %d of %d", i, s.Buffer, len(l.Buffers))
		}
		size := l.Buffers[s.Buffer].Size
		if s.Offset < 0 || s.Stride < 0 || s.Length <= 0 || s.Offset > size || s.Length > size-s.Offset {
			return bad("segment %d: offset %d length %d outside its %d-byte buffer", i, s.Offset, s.Length, size)
		}
		room := size - s.Offset - s.Length // what the strides may cover
		if s.Stride > 0 && last > room/s.Stride {
			return bad("segment %d: %d blocks of stride %d pass the end of its %d-byte buffer", i, l.NumBlocks, s.Stride, size)
		}
		total += s.Length
		if total > p.cfg.MaxValueBytes {
			return 0, fmt.Errorf("%w: gpu layout: blocks of more than %d bytes", cache.ErrTooLarge, p.cfg.MaxValueBytes)
		}
	}
	return total, nil
}

// use holds r for one call; ErrInvalidArgument once it is closed.
func (r *GPURegistration) use() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("%w: gpu registration closed", ErrInvalidArgument)
	}
	r.users++
	return nil
}

func (r *GPURegistration) unuse() {
	r.mu.Lock()
	r.users--
	last := r.closed && r.users == 0
	r.mu.Unlock()
	if last {
		r.closeBuffers()
	}
}

// Close ends the registration: its buffers are closed now, or when the
// copies in flight end. Safe to call twice.
func (r *GPURegistration) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	now := r.users == 0
	r.mu.Unlock()
	if now {
		r.closeBuffers()
	}
}

func (r *GPURegistration) closeBuffers() {
	r.mu.Lock()
	if r.done {
		r.mu.Unlock()
		return
	}
	r.done = true
	r.mu.Unlock()
	for _, b := range r.bufs {
		_ = b.Close()
	}
	r.bufs = nil
	gpuRegs.Add(-1)
}

// copies returns slot's segments as copies into (or out of) value, after
// the header.
func (r *GPURegistration) copies(slot int, value []byte) []cache.DeviceCopy {
	out := make([]cache.DeviceCopy, len(r.segs))
	off := int64(len(r.header))
	for i, s := range r.segs {
		out[i] = cache.DeviceCopy{
			Device: r.bufs[s.Buffer].Addr() + uint64(s.Offset+int64(slot)*s.Stride),
			Host:   value[off : off+s.Length],
		}
		off += s.Length
	}
	return out
}

func (r *GPURegistration) checkSlot(slot int) error {
	if slot < 0 || slot >= r.nblocks {
		return fmt.Errorf("%w: slot %d of %d", ErrInvalidArgument, slot, r.nblocks)
	}
	return nil
}

// GPUSave copies each block's slot into a new block of its key in ns and
// commits it. Per-block outcomes are in the result, in order: nil,
// cache.ErrExists (nothing copied), an error wrapping cache.ErrDeviceCopy
// (the copy failed; the slot was aborted), or the item's error.
func (p *Proxy) GPUSave(ctx context.Context, r *GPURegistration, ns string, blocks []GPUBlock, durable bool) ([]error, error) {
	if err := r.use(); err != nil {
		return nil, err
	}
	defer r.unuse()
	out := make([]error, len(blocks))
	var items []ReserveItem
	var want []int
	for i, b := range blocks {
		if out[i] = r.checkSlot(b.Slot); out[i] == nil {
			items = append(items, ReserveItem{Key: b.Key, Size: r.blockBytes, Depth: b.Depth})
			want = append(want, i)
		}
	}
	if err := p.checkBatch(len(blocks)); err != nil {
		return nil, err
	}
	res, err := p.Reserve(ctx, ns, items, 0, durable)
	if err != nil {
		return nil, err
	}
	_, s, _ := p.zeroCopyStore()
	var idx []int
	var tokens []int64 // by item of idx
	var copies [][]cache.DeviceCopy
	var abort []int64
	for j, rr := range res {
		i := want[j]
		if rr.Err != nil {
			out[i] = rr.Err
			continue
		}
		s.mu.Lock()
		e := s.reservations[rr.Token]
		s.mu.Unlock()
		if e == nil { // reclaimed already
			out[i] = cache.ErrLeaseExpired
			continue
		}
		value := e.r.Bytes()
		copy(value, r.header)
		idx = append(idx, i)
		tokens = append(tokens, rr.Token)
		copies = append(copies, r.copies(blocks[i].Slot, value))
	}
	var commit []CommitItem
	var committed []int
	for j, err := range p.gpu.ToHost(ctx, r.dev, copies) {
		i := idx[j]
		if err != nil {
			out[i] = err
			abort = append(abort, tokens[j])
			continue
		}
		commit = append(commit, CommitItem{Token: tokens[j]})
		committed = append(committed, i)
	}
	if len(abort) > 0 {
		_, _ = p.Abort(ctx, abort)
	}
	if len(commit) > 0 {
		cres, err := p.Commit(ctx, commit)
		for j, i := range committed {
			switch {
			case err != nil:
				out[i] = err
			default:
				out[i] = cres[j]
			}
		}
	}
	return out, nil
}

// GPULoad copies each key's block of ns into its slot. Per-block
// outcomes are in the result, in order: nil, cache.ErrNotFound, an error
// wrapping cache.ErrDeviceCopy (the slot's bytes are undefined), or the
// item's error (a block of another size or header: ErrInvalidArgument).
func (p *Proxy) GPULoad(ctx context.Context, r *GPURegistration, ns string, blocks []GPUBlock, scope Scope) ([]error, error) {
	if err := r.use(); err != nil {
		return nil, err
	}
	defer r.unuse()
	if err := p.checkBatch(len(blocks)); err != nil {
		return nil, err
	}
	out := make([]error, len(blocks))
	keys := make([][]byte, 0, len(blocks))
	var want []int
	slots := make(map[int]bool, len(blocks))
	for i, b := range blocks {
		if out[i] = r.checkSlot(b.Slot); out[i] != nil {
			continue
		}
		if slots[b.Slot] {
			out[i] = fmt.Errorf("%w: slot %d named twice", ErrInvalidArgument, b.Slot)
			continue
		}
		slots[b.Slot] = true
		keys = append(keys, b.Key)
		want = append(want, i)
	}
	res, err := p.Acquire(ctx, ns, keys, 0, scope)
	if err != nil {
		return nil, err
	}
	_, s, _ := p.zeroCopyStore()
	var held []int64
	var heldAt []int
	var idx []int
	var copies [][]cache.DeviceCopy
	for j, a := range res {
		i := want[j]
		if a.Err != nil {
			out[i] = a.Err
			continue
		}
		held = append(held, a.LeaseID)
		heldAt = append(heldAt, i)
		s.mu.Lock()
		l := s.leases[a.LeaseID]
		s.mu.Unlock()
		if l == nil {
			out[i] = cache.ErrLeaseExpired
			continue
		}
		value := l.Bytes()
		switch {
		case int64(len(value)) != r.blockBytes:
			out[i] = fmt.Errorf("%w: block of %d bytes; this registration's blocks are %d", ErrInvalidArgument, len(value), r.blockBytes)
			continue
		case string(value[:len(r.header)]) != string(r.header):
			out[i] = fmt.Errorf("%w: block saved with another header (another layout)", ErrInvalidArgument)
			continue
		}
		idx = append(idx, i)
		copies = append(copies, r.copies(blocks[i].Slot, value))
	}
	for j, err := range p.gpu.ToDevice(ctx, r.dev, copies) {
		out[idx[j]] = err
	}
	if len(held) > 0 {
		rel, err := p.Release(ctx, held)
		for j, i := range heldAt {
			// A lease that ended before its release: the bytes copied
			// under it may be wrong.
			if out[i] == nil && (err != nil || rel[j] != nil) {
				out[i] = cache.ErrLeaseExpired
			}
		}
	}
	return out, nil
}

// HasGPU reports whether the GPU calls can work (Hello's "gpu" feature).
func (p *Proxy) HasGPU() bool { return p.gpu != nil }
