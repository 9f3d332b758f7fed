#include "textflag.h"

// func copyCRC3(dst, src *byte, crc uint32) (a, b, c uint32)
//
// Copies 3*streamLen (3 * 4096) bytes from src to dst and returns the raw
// CRC-32C registers of its three 4096-byte thirds: the first continued from
// crc, the other two from 0. One pass: each 8-byte word is loaded once,
// stored and fed to the crc32 instruction, three streams interleaved so
// that the instruction's latency is hidden.
TEXT ·copyCRC3(SB), NOSPLIT, $0-36
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVL crc+16(FP), AX
	XORL BX, BX
	XORL DX, DX
	XORQ CX, CX

loop:
	MOVQ (SI)(CX*1), R8
	MOVQ 4096(SI)(CX*1), R9
	MOVQ 8192(SI)(CX*1), R10
	MOVQ R8, (DI)(CX*1)
	MOVQ R9, 4096(DI)(CX*1)
	MOVQ R10, 8192(DI)(CX*1)
	CRC32Q R8, AX
	CRC32Q R9, BX
	CRC32Q R10, DX
	ADDQ $8, CX
	CMPQ CX, $4096
	JB   loop

	MOVL AX, a+24(FP)
	MOVL BX, b+28(FP)
	MOVL DX, c+32(FP)
	RET

// func hasSSE42() bool
TEXT ·hasSSE42(SB), NOSPLIT, $0-1
	MOVL $1, AX
	XORL CX, CX
	CPUID
	SHRL $20, CX
	ANDL $1, CX
	MOVB CX, ret+0(FP)
	RET
