#include "textflag.h"

// func crc3(src *byte, crc uint32) (a, b, c uint32)
//
// Checksums 3*4096 bytes at src as three 4096-byte streams and returns
// their raw CRC-32C registers: the first continued from crc, the other two
// from 0. Eight words of each stream per iteration, interleaved so that
// the crc32 instruction's latency is hidden; each iteration prefetches the
// matching cache lines 24 KiB (two calls) ahead, so that a buffer in main
// memory arrives before it is needed. A prefetch past the end of the
// buffer is harmless (it never faults).
TEXT ·crc3(SB), NOSPLIT, $0-28
	MOVQ src+0(FP), SI
	MOVL crc+8(FP), AX
	XORL BX, BX
	XORL DX, DX
	XORQ CX, CX

loop:
	PREFETCHT0 24576(SI)(CX*1)
	PREFETCHT0 28672(SI)(CX*1)
	PREFETCHT0 32768(SI)(CX*1)
	CRC32Q 0(SI)(CX*1), AX
	CRC32Q 4096(SI)(CX*1), BX
	CRC32Q 8192(SI)(CX*1), DX
	CRC32Q 8(SI)(CX*1), AX
	CRC32Q 4104(SI)(CX*1), BX
	CRC32Q 8200(SI)(CX*1), DX
	CRC32Q 16(SI)(CX*1), AX
	CRC32Q 4112(SI)(CX*1), BX
	CRC32Q 8208(SI)(CX*1), DX
	CRC32Q 24(SI)(CX*1), AX
	CRC32Q 4120(SI)(CX*1), BX
	CRC32Q 8216(SI)(CX*1), DX
	CRC32Q 32(SI)(CX*1), AX
	CRC32Q 4128(SI)(CX*1), BX
	CRC32Q 8224(SI)(CX*1), DX
	CRC32Q 40(SI)(CX*1), AX
	CRC32Q 4136(SI)(CX*1), BX
	CRC32Q 8232(SI)(CX*1), DX
	CRC32Q 48(SI)(CX*1), AX
	CRC32Q 4144(SI)(CX*1), BX
	CRC32Q 8240(SI)(CX*1), DX
	CRC32Q 56(SI)(CX*1), AX
	CRC32Q 4152(SI)(CX*1), BX
	CRC32Q 8248(SI)(CX*1), DX
	ADDQ $64, CX
	CMPQ CX, $4096
	JB   loop

	MOVL AX, a+16(FP)
	MOVL BX, b+20(FP)
	MOVL DX, c+24(FP)
	RET

// func copy3(dst, src *byte, crc uint32) (a, b, c uint32)
//
// Copies 3*4096 bytes from src to dst and returns the raw CRC-32C
// registers of the three 4096-byte streams of src, as crc3 does. One pass:
// 16-byte loads and stores of a 64-byte line of each stream, then the crc32
// instruction on the lines just loaded (from L1), with the same prefetches
// as crc3.
TEXT ·copy3(SB), NOSPLIT, $0-36
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVL crc+16(FP), AX
	XORL BX, BX
	XORL DX, DX
	XORQ CX, CX

loop:
	PREFETCHT0 24576(SI)(CX*1)
	PREFETCHT0 28672(SI)(CX*1)
	PREFETCHT0 32768(SI)(CX*1)
	MOVOU 0(SI)(CX*1), X0
	MOVOU 16(SI)(CX*1), X1
	MOVOU 32(SI)(CX*1), X2
	MOVOU 48(SI)(CX*1), X3
	MOVOU X0, 0(DI)(CX*1)
	MOVOU X1, 16(DI)(CX*1)
	MOVOU X2, 32(DI)(CX*1)
	MOVOU X3, 48(DI)(CX*1)
	MOVOU 4096(SI)(CX*1), X0
	MOVOU 4112(SI)(CX*1), X1
	MOVOU 4128(SI)(CX*1), X2
	MOVOU 4144(SI)(CX*1), X3
	MOVOU X0, 4096(DI)(CX*1)
	MOVOU X1, 4112(DI)(CX*1)
	MOVOU X2, 4128(DI)(CX*1)
	MOVOU X3, 4144(DI)(CX*1)
	MOVOU 8192(SI)(CX*1), X0
	MOVOU 8208(SI)(CX*1), X1
	MOVOU 8224(SI)(CX*1), X2
	MOVOU 8240(SI)(CX*1), X3
	MOVOU X0, 8192(DI)(CX*1)
	MOVOU X1, 8208(DI)(CX*1)
	MOVOU X2, 8224(DI)(CX*1)
	MOVOU X3, 8240(DI)(CX*1)
	CRC32Q 0(SI)(CX*1), AX
	CRC32Q 4096(SI)(CX*1), BX
	CRC32Q 8192(SI)(CX*1), DX
	CRC32Q 8(SI)(CX*1), AX
	CRC32Q 4104(SI)(CX*1), BX
	CRC32Q 8200(SI)(CX*1), DX
	CRC32Q 16(SI)(CX*1), AX
	CRC32Q 4112(SI)(CX*1), BX
	CRC32Q 8208(SI)(CX*1), DX
	CRC32Q 24(SI)(CX*1), AX
	CRC32Q 4120(SI)(CX*1), BX
	CRC32Q 8216(SI)(CX*1), DX
	CRC32Q 32(SI)(CX*1), AX
	CRC32Q 4128(SI)(CX*1), BX
	CRC32Q 8224(SI)(CX*1), DX
	CRC32Q 40(SI)(CX*1), AX
	CRC32Q 4136(SI)(CX*1), BX
	CRC32Q 8232(SI)(CX*1), DX
	CRC32Q 48(SI)(CX*1), AX
	CRC32Q 4144(SI)(CX*1), BX
	CRC32Q 8240(SI)(CX*1), DX
	CRC32Q 56(SI)(CX*1), AX
	CRC32Q 4152(SI)(CX*1), BX
	CRC32Q 8248(SI)(CX*1), DX
	ADDQ $64, CX
	CMPQ CX, $4096
	JB   loop

	MOVL AX, a+24(FP)
	MOVL BX, b+28(FP)
	MOVL DX, c+32(FP)
	RET
