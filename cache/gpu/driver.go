package gpu

import (
	"fmt"
	"unsafe"

	"github.com/ebitengine/purego"
)

// The CUDA driver API, loaded at run time: no CUDA header or library is
// needed to build tidepool. Entry points are resolved by their versioned
// names (cuMemcpyDtoHAsync_v2, cuIpcOpenMemHandle_v2, ...), the ABI the
// driver has kept since CUDA 4 (the _v2 names are what cuda.h's macros
// call; cuGetProcAddress would return the same functions).
//
// Calls go through purego.SyscallN: every argument is an integer or a
// pointer, which the SysV amd64 and AAPCS64 ABIs pass in registers. The one
// exception is cuIpcOpenMemHandle_v2, whose CUipcMemHandle argument is a
// 64-byte struct passed BY VALUE: on amd64 the caller copies it onto the
// stack (the MEMORY class, it takes no register, so flags still goes in the
// second integer register); on arm64 the caller passes a pointer to a copy.
// purego (v0.11) implements both for functions bound with RegisterFunc and
// a struct parameter type, so that call is bound that way (ipcOpen below),
// and the stand-in driver of the tests (testdata/fakecuda) declares the
// same by-value parameter, so the tests exercise the same ABI path.

// result is a CUresult.
type result int32

const cudaSuccess result = 0

// Flags of the calls used here (cuda.h).
const (
	ipcMemLazyEnablePeerAccess = 0x1 // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
	memHostRegisterPortable    = 0x1 // CU_MEMHOSTREGISTER_PORTABLE
	streamNonBlocking          = 0x1 // CU_STREAM_NON_BLOCKING
	eventDisableTiming         = 0x2 // CU_EVENT_DISABLE_TIMING
)

// IPCHandle is a CUipcMemHandle: 64 opaque bytes.
type IPCHandle struct {
	Reserved [64]byte
}

// driver holds the resolved entry points of one loaded library.
type driver struct {
	path string

	cuInit                    uintptr
	cuGetErrorString          uintptr
	cuDeviceGetCount          uintptr
	cuDeviceGet               uintptr
	cuDeviceGetName           uintptr
	cuDeviceGetUuid           uintptr
	cuDevicePrimaryCtxRetain  uintptr
	cuDevicePrimaryCtxRelease uintptr
	cuCtxSetCurrent           uintptr
	cuStreamCreate            uintptr
	cuStreamDestroy           uintptr
	cuStreamSynchronize       uintptr
	cuEventCreate             uintptr
	cuEventDestroy            uintptr
	cuEventRecord             uintptr
	cuEventSynchronize        uintptr
	cuMemcpyDtoHAsync         uintptr
	cuMemcpyHtoDAsync         uintptr
	cuMemcpyDtoH              uintptr
	cuMemcpyHtoD              uintptr
	cuMemAlloc                uintptr
	cuMemFree                 uintptr
	cuMemGetAddressRange      uintptr
	cuIpcGetMemHandle         uintptr
	cuIpcCloseMemHandle       uintptr
	cuMemHostRegister         uintptr
	cuMemHostUnregister       uintptr
	ipcOpen                   func(dptr *uint64, h IPCHandle, flags uint32) int32
}

// symbols lists every entry point with the field it fills.
func (d *driver) symbols() []struct {
	name string
	p    *uintptr
} {
	return []struct {
		name string
		p    *uintptr
	}{
		{"cuInit", &d.cuInit},
		{"cuGetErrorString", &d.cuGetErrorString},
		{"cuDeviceGetCount", &d.cuDeviceGetCount},
		{"cuDeviceGet", &d.cuDeviceGet},
		{"cuDeviceGetName", &d.cuDeviceGetName},
		{"cuDeviceGetUuid_v2", &d.cuDeviceGetUuid},
		{"cuDevicePrimaryCtxRetain", &d.cuDevicePrimaryCtxRetain},
		{"cuDevicePrimaryCtxRelease_v2", &d.cuDevicePrimaryCtxRelease},
		{"cuCtxSetCurrent", &d.cuCtxSetCurrent},
		{"cuStreamCreate", &d.cuStreamCreate},
		{"cuStreamDestroy_v2", &d.cuStreamDestroy},
		{"cuStreamSynchronize", &d.cuStreamSynchronize},
		{"cuEventCreate", &d.cuEventCreate},
		{"cuEventDestroy_v2", &d.cuEventDestroy},
		{"cuEventRecord", &d.cuEventRecord},
		{"cuEventSynchronize", &d.cuEventSynchronize},
		{"cuMemcpyDtoHAsync_v2", &d.cuMemcpyDtoHAsync},
		{"cuMemcpyHtoDAsync_v2", &d.cuMemcpyHtoDAsync},
		{"cuMemcpyDtoH_v2", &d.cuMemcpyDtoH},
		{"cuMemcpyHtoD_v2", &d.cuMemcpyHtoD},
		{"cuMemAlloc_v2", &d.cuMemAlloc},
		{"cuMemFree_v2", &d.cuMemFree},
		{"cuMemGetAddressRange_v2", &d.cuMemGetAddressRange},
		{"cuIpcGetMemHandle", &d.cuIpcGetMemHandle},
		{"cuIpcCloseMemHandle", &d.cuIpcCloseMemHandle},
		{"cuMemHostRegister_v2", &d.cuMemHostRegister},
		{"cuMemHostUnregister", &d.cuMemHostUnregister},
	}
}

// load opens the library at path and resolves every entry point. The
// library stays loaded for the life of the process (a driver is not meant
// to be unloaded).
func load(path string) (*driver, error) {
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	d := &driver{path: path}
	for _, s := range d.symbols() {
		p, err := purego.Dlsym(h, s.name)
		if err != nil || p == 0 {
			return nil, fmt.Errorf("%s: no symbol %s (driver too old?)", path, s.name)
		}
		*s.p = p
	}
	if _, err := purego.Dlsym(h, "cuIpcOpenMemHandle_v2"); err != nil {
		return nil, fmt.Errorf("%s: no symbol cuIpcOpenMemHandle_v2 (driver too old?)", path)
	}
	purego.RegisterLibFunc(&d.ipcOpen, h, "cuIpcOpenMemHandle_v2")
	return d, nil
}

// Error is a CUresult other than success, with the call that returned it.
type Error struct {
	Call string
	Code int32
	Msg  string
}

func (e *Error) Error() string {
	return fmt.Sprintf("gpu: %s: CUDA error %d (%s)", e.Call, e.Code, e.Msg)
}

// call runs fn(args...) and turns its CUresult into an error.
//
//go:uintptrescapes
func (d *driver) call(name string, fn uintptr, args ...uintptr) error {
	r, _, _ := purego.SyscallN(fn, args...)
	return d.check(name, result(int32(r)))
}

func (d *driver) check(name string, r result) error {
	if r == cudaSuccess {
		return nil
	}
	return &Error{Call: name, Code: int32(r), Msg: d.errorString(r)}
}

// errorString asks the driver for r's text (cuGetErrorString never needs a
// context). Not cached: errors are rare and the map would need a lock.
func (d *driver) errorString(r result) string {
	var s *byte
	if rr, _, _ := purego.SyscallN(d.cuGetErrorString, uintptr(r), uintptr(unsafe.Pointer(&s))); rr != 0 || s == nil {
		return "unknown"
	}
	return cString(s, 256)
}

// cString copies the NUL-terminated C string at p (at most max bytes).
func cString(p *byte, max int) string {
	b := unsafe.Slice(p, max)
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
