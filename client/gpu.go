package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	kclient "github.com/cloudwego/kitex/client"

	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
)

// GPU is a session of the sidecar's GPU calls (servers whose Hello lists
// "gpu"; docs/gpu.md). A registration belongs to the connection that made
// it, so a GPU session holds one connection and makes one call at a time
// on it: when that connection breaks, its registrations are gone and
// calls naming them fail with CodeInvalidArgument; register again.
type GPU struct {
	mu     sync.Mutex
	kc     kclient.Client
	closed atomic.Bool
}

// ErrGPUClosed is a call on a closed GPU session.
var ErrGPUClosed = errors.New("client: gpu session closed")

// GPUBuffer is one engine buffer: a CUDA IPC memory handle's allocation
// and the range of it used, on a device named by UUID (16 bytes, preferred)
// or ordinal.
type GPUBuffer struct {
	Device     int32
	DeviceUUID []byte
	IPCHandle  []byte // CUipcMemHandle, 64 bytes
	Offset     int64
	Size       int64
}

// GPUSegment is one piece of every block: slot s's piece is Length bytes
// at Offset + s*Stride of buffer Buffer.
type GPUSegment struct {
	Buffer                 int32
	Offset, Stride, Length int64
}

// GPULayout is a registration: buffers, the segments of one block (its
// value is Header followed by the segments), and the number of slots.
type GPULayout struct {
	Buffers   []GPUBuffer
	Segments  []GPUSegment
	NumBlocks int32
	Header    []byte
}

// GPUBlock names a slot and its block's key.
type GPUBlock struct {
	Slot  int32
	Key   []byte
	Depth int32
}

// NewGPU opens a GPU session on the sidecar of cfg.Socket (cfg's
// MaxIdleConns is ignored: the session holds one connection).
func NewGPU(cfg Config) (*GPU, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	kc, err := newKitex(cfg, 1, 24*time.Hour, "tidepool-gpu")
	if err != nil {
		return nil, err
	}
	return &GPU{kc: kc}, nil
}

func (g *GPU) call(ctx context.Context, method string, args any, res interface{ GetErr() *tp.TidepoolError }) (err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed.Load() {
		return ErrGPUClosed
	}
	defer func() {
		// Kitex panics on a call that races with Close.
		if r := recover(); r != nil {
			err = fmt.Errorf("%w (%v)", ErrGPUClosed, r)
		}
	}()
	return (&Client{kc: g.kc}).call(ctx, method, args, res)
}

// Register hands the sidecar the buffers of l and returns the
// registration's id and the value size of one block.
func (g *GPU) Register(ctx context.Context, l GPULayout) (id, blockBytes int64, err error) {
	req := &tp.GpuRegisterRequest{NumBlocks: l.NumBlocks, Header: l.Header}
	for _, b := range l.Buffers {
		req.Buffers = append(req.Buffers, &tp.GpuBuffer{Device: b.Device, DeviceUuid: b.DeviceUUID, IpcHandle: b.IPCHandle, Offset: b.Offset, Size: b.Size})
	}
	for _, s := range l.Segments {
		req.Segments = append(req.Segments, &tp.GpuSegment{Buffer: s.Buffer, Offset: s.Offset, Stride: s.Stride, Length: s.Length})
	}
	var res tp.TidepoolGpuRegisterResult
	if err := g.call(ctx, "GpuRegister", &tp.TidepoolGpuRegisterArgs{Req: req}, &res); err != nil {
		return 0, 0, err
	}
	return res.GetSuccess().RegistrationId, res.GetSuccess().BlockBytes, nil
}

// Unregister ends a registration; the sidecar closes its buffers once the
// copies in flight end.
func (g *GPU) Unregister(ctx context.Context, id int64) error {
	var res tp.TidepoolGpuUnregisterResult
	return g.call(ctx, "GpuUnregister", &tp.TidepoolGpuUnregisterArgs{Req: &tp.GpuUnregisterRequest{RegistrationId: id}}, &res)
}

func gpuRequest(id int64, ns string, blocks []GPUBlock, durable bool) *tp.GpuCopyRequest {
	req := &tp.GpuCopyRequest{RegistrationId: id, Ns: ns, Durable: durable, Blocks: make([]*tp.GpuBlock, len(blocks))}
	for i, b := range blocks {
		req.Blocks[i] = &tp.GpuBlock{Slot: b.Slot, Key: b.Key, Depth: b.Depth}
	}
	return req
}

// Save copies each block's GPU slot into a new block of its key; per
// block nil, CodeExists (already stored), CodeInternal (the copy failed:
// nothing stored) or the item's error.
func (g *GPU) Save(ctx context.Context, id int64, ns string, blocks []GPUBlock, durable bool) ([]error, error) {
	var res tp.TidepoolGpuSaveResult
	if err := g.call(ctx, "GpuSave", &tp.TidepoolGpuSaveArgs{Req: gpuRequest(id, ns, blocks, durable)}, &res); err != nil {
		return nil, err
	}
	return statusErrors(res.GetSuccess().Results), nil
}

// Load copies each key's block into its GPU slot; per block nil,
// CodeNotFound, CodeInternal (the copy failed: the slot's bytes are
// undefined) or the item's error.
func (g *GPU) Load(ctx context.Context, id int64, ns string, blocks []GPUBlock) ([]error, error) {
	var res tp.TidepoolGpuLoadResult
	if err := g.call(ctx, "GpuLoad", &tp.TidepoolGpuLoadArgs{Req: gpuRequest(id, ns, blocks, false)}, &res); err != nil {
		return nil, err
	}
	return statusErrors(res.GetSuccess().Results), nil
}

// Close closes the session's connection (also under a call in flight):
// the sidecar ends its registrations. Safe to call twice.
func (g *GPU) Close() error {
	if g.closed.Swap(true) {
		return nil
	}
	return g.kc.(interface{ Close() error }).Close()
}
