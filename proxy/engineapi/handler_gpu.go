package engineapi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/wirecode"
)

// FeatureGPU, listed in HelloResponse.features: the GPU calls work (the
// sidecar found a CUDA driver and a device).
const FeatureGPU = "gpu"

// maxConnGPURegistrations bounds the registrations of one connection.
const maxConnGPURegistrations = 64

// connGPU is one connection's GPU registrations: they end with it
// (connTracker.OnInactive), at GpuUnregister, or at the server's close.
type connGPU struct {
	mu     sync.Mutex
	closed bool
	regs   map[int64]*proxy.GPURegistration
}

var gpuIDs atomic.Int64

var errNoConn = errors.New("engineapi: the GPU calls need a tracked connection")

func (c *connGPU) add(r *proxy.GPURegistration) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, fmt.Errorf("%w: connection closing", proxy.ErrClosed)
	}
	if len(c.regs) >= maxConnGPURegistrations {
		return 0, fmt.Errorf("%w: %d GPU registrations on this connection", proxy.ErrInvalidArgument, maxConnGPURegistrations)
	}
	if c.regs == nil {
		c.regs = make(map[int64]*proxy.GPURegistration)
	}
	id := gpuIDs.Add(1)
	c.regs[id] = r
	return id, nil
}

// held reports whether the connection holds registrations.
func (c *connGPU) held() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.regs) > 0
}

func (c *connGPU) get(id int64) (*proxy.GPURegistration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.regs[id]; r != nil {
		return r, nil
	}
	return nil, fmt.Errorf("%w: gpu registration %d is not registered on this connection", proxy.ErrInvalidArgument, id)
}

func (c *connGPU) remove(id int64) (*proxy.GPURegistration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.regs[id]
	if r == nil {
		return nil, fmt.Errorf("%w: gpu registration %d is not registered on this connection", proxy.ErrInvalidArgument, id)
	}
	delete(c.regs, id)
	return r, nil
}

// close ends every registration of the connection (copies in flight end
// first) and refuses new ones.
func (c *connGPU) close() {
	c.mu.Lock()
	regs := c.regs
	c.regs = nil
	c.closed = true
	c.mu.Unlock()
	for _, r := range regs {
		r.Close()
	}
}

func gpuOf(ctx context.Context) (*connGPU, error) {
	st, ok := ctx.Value(connStateKey{}).(*connState)
	if !ok {
		return nil, errNoConn
	}
	return &st.gpu, nil
}

func (h *handler) GpuRegister(ctx context.Context, req *tp.GpuRegisterRequest) (*tp.GpuRegisterResponse, error) {
	c, err := gpuOf(ctx)
	if err != nil {
		return nil, toThrift(err)
	}
	l := proxy.GPULayout{NumBlocks: int(req.NumBlocks), Header: req.Header}
	if len(req.Buffers) > proxy.MaxGPUBuffers || len(req.Segments) > proxy.MaxGPUSegments {
		return nil, toThrift(fmt.Errorf("%w: %d buffers, %d segments (at most %d, %d)", proxy.ErrInvalidArgument,
			len(req.Buffers), len(req.Segments), proxy.MaxGPUBuffers, proxy.MaxGPUSegments))
	}
	for _, b := range req.Buffers {
		if b == nil {
			return nil, toThrift(errNilItem)
		}
		l.Buffers = append(l.Buffers, proxy.GPUBufferSpec{Device: int(b.Device), DeviceUUID: b.DeviceUuid, Handle: b.IpcHandle, Offset: b.Offset, Size: b.Size})
	}
	for _, s := range req.Segments {
		if s == nil {
			return nil, toThrift(errNilItem)
		}
		l.Segments = append(l.Segments, proxy.GPUSegment{Buffer: int(s.Buffer), Offset: s.Offset, Stride: s.Stride, Length: s.Length})
	}
	r, err := h.p.GPURegister(ctx, l)
	if err != nil {
		return nil, toThrift(err)
	}
	id, err := c.add(r)
	if err != nil {
		r.Close()
		return nil, toThrift(err)
	}
	return &tp.GpuRegisterResponse{RegistrationId: id, BlockBytes: r.BlockBytes()}, nil
}

func (h *handler) GpuUnregister(ctx context.Context, req *tp.GpuUnregisterRequest) (*tp.GpuUnregisterResponse, error) {
	c, err := gpuOf(ctx)
	if err != nil {
		return nil, toThrift(err)
	}
	r, err := c.remove(req.RegistrationId)
	if err != nil {
		return nil, toThrift(err)
	}
	r.Close()
	return &tp.GpuUnregisterResponse{}, nil
}

func (h *handler) GpuSave(ctx context.Context, req *tp.GpuCopyRequest) (*tp.GpuCopyResponse, error) {
	return h.gpuCopy(ctx, req, true)
}

func (h *handler) GpuLoad(ctx context.Context, req *tp.GpuCopyRequest) (*tp.GpuCopyResponse, error) {
	return h.gpuCopy(ctx, req, false)
}

func (h *handler) gpuCopy(ctx context.Context, req *tp.GpuCopyRequest, save bool) (*tp.GpuCopyResponse, error) {
	c, err := gpuOf(ctx)
	if err != nil {
		return nil, toThrift(err)
	}
	r, err := c.get(req.RegistrationId)
	if err != nil {
		return nil, toThrift(err)
	}
	blocks := make([]proxy.GPUBlock, len(req.Blocks))
	for i, b := range req.Blocks {
		if b == nil {
			return nil, toThrift(errNilItem)
		}
		blocks[i] = proxy.GPUBlock{Slot: int(b.Slot), Key: b.Key, Depth: b.Depth}
	}
	var res []error
	if save {
		res, err = h.p.GPUSave(ctx, r, req.Ns, blocks, req.Durable)
	} else {
		res, err = h.p.GPULoad(ctx, r, req.Ns, blocks, scope(req.Scope))
	}
	if err != nil {
		return nil, toThrift(err)
	}
	out := &tp.GpuCopyResponse{Results: make([]*tp.ItemStatus, len(res))}
	for i, e := range res {
		out.Results[i] = &tp.ItemStatus{Code: wirecode.Code(e)}
		if e != nil {
			out.Results[i].Message = e.Error()
		}
	}
	return out, nil
}
