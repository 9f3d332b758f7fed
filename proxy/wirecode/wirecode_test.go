package wirecode

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/rdma"
)

// allCodes lists every value of the generated enum.
func allCodes() []tp.ErrorCode {
	var out []tp.ErrorCode
	for c := tp.ErrorCode(0); c < 1024; c++ {
		if c.String() != "<UNSET>" {
			out = append(out, c)
		}
	}
	return out
}

// TestCodeTable covers every row of the table, wrapped as callers wrap.
func TestCodeTable(t *testing.T) {
	want := map[error]tp.ErrorCode{
		cache.ErrNotFound:         tp.ErrorCode_NOT_FOUND,
		cache.ErrExists:           tp.ErrorCode_EXISTS,
		cache.ErrTooLarge:         tp.ErrorCode_TOO_LARGE,
		cache.ErrInvalidKey:       tp.ErrorCode_INVALID_ARGUMENT,
		proxy.ErrInvalidArgument:  tp.ErrorCode_INVALID_ARGUMENT,
		cache.ErrNoSpace:          tp.ErrorCode_NO_SPACE,
		cache.ErrLeaseExpired:     tp.ErrorCode_LEASE_EXPIRED,
		cache.ErrChecksum:         tp.ErrorCode_CHECKSUM_MISMATCH,
		cache.ErrUnavailable:      tp.ErrorCode_UNAVAILABLE,
		cache.ErrClosed:           tp.ErrorCode_UNAVAILABLE,
		proxy.ErrClosed:           tp.ErrorCode_UNAVAILABLE,
		context.Canceled:          tp.ErrorCode_UNAVAILABLE,
		context.DeadlineExceeded:  tp.ErrorCode_UNAVAILABLE,
		proxy.ErrUnknownNamespace: tp.ErrorCode_UNKNOWN_NAMESPACE,
		proxy.ErrBatchTooLarge:    tp.ErrorCode_BATCH_TOO_LARGE,
		proxy.ErrNoReservation:    tp.ErrorCode_LEASE_EXPIRED,
		proxy.ErrNoLease:          tp.ErrorCode_LEASE_EXPIRED,
		proxy.ErrNoArenas:         tp.ErrorCode_UNAVAILABLE,
		proxy.ErrNoGPU:            tp.ErrorCode_UNAVAILABLE,
		ErrInternal:               tp.ErrorCode_INTERNAL,
		ErrVersionMismatch:        tp.ErrorCode_VERSION_MISMATCH,
		rdma.ErrChecksum:          tp.ErrorCode_CHECKSUM_MISMATCH,
		rdma.ErrUnknownRegion:     tp.ErrorCode_UNAVAILABLE,
		rdma.ErrOutOfRange:        tp.ErrorCode_UNAVAILABLE,
		rdma.ErrTooLarge:          tp.ErrorCode_UNAVAILABLE,
		rdma.ErrClosed:            tp.ErrorCode_UNAVAILABLE,
		rdma.ErrPeerLost:          tp.ErrorCode_UNAVAILABLE,
		rdma.ErrProtocol:          tp.ErrorCode_UNAVAILABLE,
		rdma.ErrUnreachable:       tp.ErrorCode_UNAVAILABLE,
	}
	rows := Rows()
	if len(want) != len(rows) {
		t.Fatalf("table has %d rows, test covers %d", len(rows), len(want))
	}
	for _, row := range rows {
		code, ok := want[row.Err]
		if !ok {
			t.Fatalf("row %v not covered by the test", row.Err)
		}
		wrapped := fmt.Errorf("context: %w", row.Err)
		if got := Code(wrapped); got != code {
			t.Errorf("Code(%v) = %v, want %v", wrapped, got, code)
		}
	}
	if Code(nil) != tp.ErrorCode_OK || Code(errors.New("surprise")) != tp.ErrorCode_INTERNAL {
		t.Fatal("nil must be OK and unknown errors INTERNAL")
	}
	// The SSD tier's bad block wraps three sentinels; a bad block is a miss.
	if c := Code(fmt.Errorf("%w: %w: %w", errors.New("ssd: corrupt"), cache.ErrChecksum, cache.ErrNotFound)); c != tp.ErrorCode_NOT_FOUND {
		t.Fatalf("corrupt SSD block: %v, want NOT_FOUND", c)
	}
}

// TestEveryCodeMapped fails when a code of the enum has no domain error:
// each one (but OK) has a row, decodes to a sentinel, and that sentinel
// encodes back to the same code.
func TestEveryCodeMapped(t *testing.T) {
	codes := allCodes()
	if len(codes) < 13 {
		t.Fatalf("only %d codes enumerated", len(codes))
	}
	inTable := map[tp.ErrorCode]bool{}
	for _, row := range Rows() {
		inTable[row.Code] = true
	}
	for _, c := range codes {
		err := Err(c)
		if c == tp.ErrorCode_OK {
			if err != nil {
				t.Fatalf("Err(OK) = %v", err)
			}
			continue
		}
		if !inTable[c] {
			t.Errorf("code %v has no row in the table", c)
		}
		if err == nil {
			t.Errorf("Err(%v) = nil", c)
			continue
		}
		if got := Code(err); got != c {
			t.Errorf("Code(Err(%v)) = %v (Err = %v)", c, got, err)
		}
		if got := Code(fmt.Errorf("peer n: %w", err)); got != c {
			t.Errorf("wrapped Err(%v) encodes as %v", c, got)
		}
	}
	// A code from a newer peer that this build does not know: a failed call.
	if err := Err(tp.ErrorCode(1000)); !errors.Is(err, ErrInternal) {
		t.Fatalf("unknown code: %v, want ErrInternal", err)
	}
}

// TestWireValues pins the numbers on the wire: the peer API carried these
// codes as plain i32 before it typed them as ErrorCode, and peers of either
// version must read each other's.
func TestWireValues(t *testing.T) {
	for c, v := range map[tp.ErrorCode]int32{
		tp.ErrorCode_OK: 0, tp.ErrorCode_NOT_FOUND: 1, tp.ErrorCode_EXISTS: 2, tp.ErrorCode_TOO_LARGE: 3,
		tp.ErrorCode_INVALID_ARGUMENT: 4, tp.ErrorCode_NO_SPACE: 5, tp.ErrorCode_LEASE_EXPIRED: 6,
		tp.ErrorCode_CHECKSUM_MISMATCH: 7, tp.ErrorCode_UNAVAILABLE: 8, tp.ErrorCode_INTERNAL: 9,
		tp.ErrorCode_UNKNOWN_NAMESPACE: 10, tp.ErrorCode_BATCH_TOO_LARGE: 11, tp.ErrorCode_VERSION_MISMATCH: 12,
	} {
		if int32(c) != v {
			t.Errorf("%v = %d on the wire, was %d", c, int32(c), v)
		}
	}
}
