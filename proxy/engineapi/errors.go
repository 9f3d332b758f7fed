package engineapi

import (
	"context"
	"errors"

	"github.com/tidepool-kv/tidepool/cache"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy"
)

// codeTable maps every domain error to its protocol code. It is the only
// place where errors become codes (docs/errors.md lists the same rows); the
// first row whose error matches with errors.Is wins, and anything unmatched
// is INTERNAL.
var codeTable = []struct {
	err  error
	code tp.ErrorCode
}{
	{cache.ErrNotFound, tp.ErrorCode_NOT_FOUND},
	{cache.ErrExists, tp.ErrorCode_EXISTS},
	{cache.ErrTooLarge, tp.ErrorCode_TOO_LARGE},
	{cache.ErrInvalidKey, tp.ErrorCode_INVALID_ARGUMENT},
	{proxy.ErrInvalidArgument, tp.ErrorCode_INVALID_ARGUMENT},
	{cache.ErrNoSpace, tp.ErrorCode_NO_SPACE},
	{cache.ErrLeaseExpired, tp.ErrorCode_LEASE_EXPIRED},
	{cache.ErrChecksum, tp.ErrorCode_CHECKSUM_MISMATCH},
	{cache.ErrUnavailable, tp.ErrorCode_UNAVAILABLE},
	{cache.ErrClosed, tp.ErrorCode_UNAVAILABLE},
	{proxy.ErrClosed, tp.ErrorCode_UNAVAILABLE},
	{context.Canceled, tp.ErrorCode_UNAVAILABLE},
	{context.DeadlineExceeded, tp.ErrorCode_UNAVAILABLE},
	{proxy.ErrUnknownNamespace, tp.ErrorCode_UNKNOWN_NAMESPACE},
	{proxy.ErrBatchTooLarge, tp.ErrorCode_BATCH_TOO_LARGE},
	{proxy.ErrNoReservation, tp.ErrorCode_LEASE_EXPIRED},
	{proxy.ErrNoLease, tp.ErrorCode_LEASE_EXPIRED},
	{proxy.ErrNoArenas, tp.ErrorCode_UNAVAILABLE},
}

// Code returns the protocol code for err: OK for nil, INTERNAL for errors
// that match no row of the table.
func Code(err error) tp.ErrorCode {
	if err == nil {
		return tp.ErrorCode_OK
	}
	for _, row := range codeTable {
		if errors.Is(err, row.err) {
			return row.code
		}
	}
	return tp.ErrorCode_INTERNAL
}

// toThrift converts a domain error to the API's exception.
func toThrift(err error) error {
	if err == nil {
		return nil
	}
	return &tp.TidepoolError{Code: Code(err), Message: err.Error()}
}

// itemResult converts a per-item error to its result entry.
func itemResult(err error) *tp.ItemStatus {
	r := &tp.ItemStatus{Code: Code(err)}
	if err != nil {
		r.Message = err.Error()
	}
	return r
}

// codeOf names the protocol code an error returned by a handler carries.
func codeOf(err error) string {
	if err == nil {
		return "OK"
	}
	var te *tp.TidepoolError
	if errors.As(err, &te) {
		return te.Code.String()
	}
	return "TRANSPORT"
}
