package engineapi

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy"
)

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
	}
	if len(want) != len(codeTable) {
		t.Fatalf("table has %d rows, test covers %d", len(codeTable), len(want))
	}
	for _, row := range codeTable {
		code, ok := want[row.err]
		if !ok {
			t.Fatalf("row %v not covered by the test", row.err)
		}
		wrapped := fmt.Errorf("context: %w", row.err)
		if got := Code(wrapped); got != code {
			t.Errorf("Code(%v) = %v, want %v", wrapped, got, code)
		}
		var te *tp.TidepoolError
		if !errors.As(toThrift(wrapped), &te) || te.Code != code || te.Message != wrapped.Error() {
			t.Errorf("toThrift(%v) = %v", wrapped, te)
		}
	}
	if Code(nil) != tp.ErrorCode_OK || Code(errors.New("surprise")) != tp.ErrorCode_INTERNAL {
		t.Fatal("nil must be OK and unknown errors INTERNAL")
	}
	if codeOf(nil) != "OK" || codeOf(toThrift(cache.ErrNoSpace)) != "NO_SPACE" || codeOf(errors.New("x")) != "TRANSPORT" {
		t.Fatal("codeOf")
	}
}
