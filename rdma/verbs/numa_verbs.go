//go:build verbs

package verbs

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// memNode is the NUMA node of b's first page (registered, so present),
// or -1.
func memNode(b []byte) int {
	if len(b) == 0 {
		return -1
	}
	var node int32
	const mpolFNode, mpolFAddr = 1, 2
	_, _, e := unix.Syscall6(unix.SYS_GET_MEMPOLICY, uintptr(unsafe.Pointer(&node)), 0, 0,
		uintptr(unsafe.Pointer(&b[0])), mpolFNode|mpolFAddr, 0)
	if e != 0 {
		return -1
	}
	return int(node)
}

// processNode is the NUMA node of the CPU this thread runs on, or -1.
func processNode() int {
	var cpu, node uint32
	_, _, e := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), uintptr(unsafe.Pointer(&node)), 0)
	if e != 0 {
		return -1
	}
	return int(node)
}
