#include "textflag.h"

// Folding constants for CRC-32C, bit-reflected: for a fold of D bits,
// the low quadword of each 128-bit lane is multiplied by
// reflect(x^(D+32) mod P) << 1 and the high one by reflect(x^(D-32) mod P)
// << 1 (TestFoldConstants derives them).
DATA k1024<>+0(SB)/8, $0x6992cea2
DATA k1024<>+8(SB)/8, $0x0d3b6092
GLOBL k1024<>(SB), RODATA|NOPTR, $16
DATA k256<>+0(SB)/8, $0x1384aa63a
DATA k256<>+8(SB)/8, $0xba4fc28e
GLOBL k256<>(SB), RODATA|NOPTR, $16
DATA k128<>+0(SB)/8, $0xf20c0dfe
DATA k128<>+8(SB)/8, $0x14cd00bd6
GLOBL k128<>(SB), RODATA|NOPTR, $16

// func cpuidVPCLMULQDQ() bool
TEXT ·cpuidVPCLMULQDQ(SB), NOSPLIT, $0-1
	MOVL $7, AX
	XORL CX, CX
	CPUID
	SHRL $10, CX
	ANDL $1, CX
	MOVB CX, ret+0(FP)
	RET

// FOLD folds the 256-bit accumulator acc forward by the constant in k
// and adds (xors) the 256-bit value d: acc = clmul(acc.lo, k.lo) ^
// clmul(acc.hi, k.hi) ^ d, in each 128-bit lane.
#define FOLD(acc, d, k, t) \
	VPCLMULQDQ $0x00, k, acc, t; \
	VPCLMULQDQ $0x11, k, acc, acc; \
	VPXOR      t, acc, acc;        \
	VPXOR      d, acc, acc

// REDUCE folds the four accumulators Y0–Y3 (Y0 the earliest 32 bytes)
// into one 128-bit value, congruent modulo the polynomial to all the bytes
// folded, and leaves its raw CRC-32C register, which is theirs, in R8: the
// crc32 instruction over its 16 bytes from 0.
#define REDUCE \
	VBROADCASTI128 k256<>(SB), Y5; \
	FOLD(Y0, Y1, Y5, Y6);          \
	FOLD(Y0, Y2, Y5, Y6);          \
	FOLD(Y0, Y3, Y5, Y6);          \
	VEXTRACTI128   $1, Y0, X1;     \
	VMOVDQU        k128<>(SB), X5; \
	VPCLMULQDQ     $0x00, X5, X0, X6; \
	VPCLMULQDQ     $0x11, X5, X0, X0; \
	VPXOR          X6, X0, X0;     \
	VPXOR          X1, X0, X0;     \
	VMOVQ          X0, AX;         \
	VPEXTRQ        $1, X0, BX;     \
	XORQ           R8, R8;         \
	CRC32Q         AX, R8;         \
	CRC32Q         BX, R8;         \
	VZEROUPPER

// func foldCopy(dst, src *byte, n int, crc uint32) uint32
//
// Copies n bytes from src to dst and returns the raw CRC-32C register
// after them, continued from the raw register crc; n must be a positive
// multiple of 128. One pass: each 128 bytes are loaded once, stored, and
// folded into four 256-bit accumulators, each of whose 128-bit lanes moves
// 1024 bits (one step) forward per step. The register is xored into the
// first four bytes, as the crc32 instruction would take it.
TEXT ·foldCopy(SB), NOSPLIT, $0-36
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL crc+24(FP), AX
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	VMOVD   AX, X4
	VPXOR   Y4, Y0, Y0
	VBROADCASTI128 k1024<>(SB), Y5
	ADDQ $128, SI
	ADDQ $128, DI
	SUBQ $128, CX
	JZ   reduce

loop:
	PREFETCHT0 1024(SI)
	PREFETCHT0 1088(SI)
	VMOVDQU 0(SI), Y8
	VMOVDQU 32(SI), Y9
	VMOVDQU 64(SI), Y10
	VMOVDQU 96(SI), Y11
	VMOVDQU Y8, 0(DI)
	VMOVDQU Y9, 32(DI)
	VMOVDQU Y10, 64(DI)
	VMOVDQU Y11, 96(DI)
	FOLD(Y0, Y8, Y5, Y12)
	FOLD(Y1, Y9, Y5, Y13)
	FOLD(Y2, Y10, Y5, Y14)
	FOLD(Y3, Y11, Y5, Y15)
	ADDQ $128, SI
	ADDQ $128, DI
	SUBQ $128, CX
	JNZ  loop

reduce:
	REDUCE
	MOVL R8, ret+32(FP)
	RET
