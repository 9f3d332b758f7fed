package cache

import "errors"

// The vocabulary of the GPU end (cache/gpu): what the proxy, which moves
// blocks between an engine's GPU memory and the arenas, sees of it.

// ErrDeviceCopy is a copy between GPU memory and the arenas that the
// driver reported failed: the bytes it was to write are not to be used.
var ErrDeviceCopy = errors.New("cache: gpu copy failed")

// DeviceCopy is one contiguous copy between GPU memory and host memory:
// Len(Host) bytes at device address Device.
type DeviceCopy struct {
	Device uint64 // device address (CUdeviceptr)
	Host   []byte // arena memory (pinned where the arenas were pinned)
}

// DeviceBuffer is GPU memory of another process opened in this one (a CUDA
// IPC memory handle). It MUST be closed (Close), after the last copy that
// uses it has returned.
type DeviceBuffer interface {
	// Addr is the device address of the buffer's first byte (the handle's
	// allocation plus the offset it was opened at).
	Addr() uint64
	// Size is how many bytes from Addr the buffer covers.
	Size() int64
	// Close unmaps the memory when no other buffer of the same handle is
	// open. Safe to call twice.
	Close() error
}
