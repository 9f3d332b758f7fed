#include "textflag.h"

// func rdpkru() uint32
TEXT ·rdpkru(SB), NOSPLIT, $0-4
	XORL CX, CX
	BYTE $0x0f; BYTE $0x01; BYTE $0xee // RDPKRU: EAX = PKRU (ECX must be 0; EDX is zeroed)
	MOVL AX, ret+0(FP)
	RET

// func wrpkru(v uint32)
TEXT ·wrpkru(SB), NOSPLIT, $0-4
	MOVL v+0(FP), AX
	XORL CX, CX
	XORL DX, DX
	BYTE $0x0f; BYTE $0x01; BYTE $0xef // WRPKRU: PKRU = EAX (ECX, EDX must be 0)
	RET
