//go:build linux

package ssd

/*
#include <stddef.h>
#include <stdint.h>
uint32_t tidepool_crc32c_extend(uint32_t crc, const char *buf, size_t n);
uint64_t tidepool_crc32c_calls(void);
int tidepool_crc32c_hardware(void);
*/
import "C"

import "unsafe"

// librocksdb checksums with rocksdb::crc32c::Extend. crc32c_amd64.c defines
// that symbol in the tidepool executable, which interposes it: Debian's
// portable librocksdb computes it a byte at a time from tables, the
// replacement with the SSE4.2 crc32 instruction, three streams at once
// (1 MiB block writes: see docs/ssd.md). Nothing changes on disk: the
// function computes the same CRC-32C.

// rocksCRC names the CRC-32C implementation librocksdb calls, for the log
// line of Open.
func rocksCRC() string {
	if C.tidepool_crc32c_hardware() != 0 {
		return "tidepool sse4.2"
	}
	return "tidepool bitwise"
}

// rocksCRCCalls is how many times librocksdb (or a test) called the
// replacement; a test checks that RocksDB writes go through it.
func rocksCRCCalls() uint64 { return uint64(C.tidepool_crc32c_calls()) }

// rocksCRCExtend calls the replacement directly, for tests.
func rocksCRCExtend(crc uint32, p []byte) uint32 {
	var ptr *C.char
	if len(p) > 0 {
		ptr = (*C.char)(unsafe.Pointer(&p[0]))
	}
	return uint32(C.tidepool_crc32c_extend(C.uint32_t(crc), ptr, C.size_t(len(p))))
}
