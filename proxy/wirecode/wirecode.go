// Package wirecode is the one error vocabulary of tidepool's two Thrift
// edges: the engine API (proxy/engineapi) and the peer API (proxy/peerapi)
// both carry tidepool.thrift's ErrorCode, and this package's table is the
// only place where domain errors (cache, proxy, rdma sentinels) become codes
// and codes become domain errors again.
//
// It also converts a block's description (cache.BlockMeta) to and from the
// optional fields both edges carry it in (meta.go).
//
// Code is used where an error leaves a process (a handler's answer); Err is
// used where a code enters one (a peer's answer), so that callers on the far
// side test a peer's answer with errors.Is against the same sentinels they
// test a local call with. docs/errors.md lists the same rows.
//
// The package sits between the core and the adapters: it imports the core's
// sentinels and the generated enum, never Kitex, and both adapters import it
// (so neither adapter imports the other).
package wirecode

import (
	"context"
	"errors"

	"github.com/tidepool-kv/tidepool/cache"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/rdma"
)

// Errors that exist only at the edges: what a code means when no domain
// sentinel of the core stands for it.
var (
	// ErrInternal is what a peer's INTERNAL answer (or a code this build
	// does not know, from a newer peer) decodes to: the peer failed in a
	// way it could not classify.
	ErrInternal = errors.New("wirecode: peer internal error")
	// ErrVersionMismatch: the other side speaks another version of the API
	// (the engine API's Hello).
	ErrVersionMismatch = errors.New("wirecode: protocol version mismatch")
)

// Row is one entry of the table: a domain error and its code.
type Row struct {
	Err  error
	Code tp.ErrorCode
}

// Rows returns a copy of the table, in order (for tests and tools).
func Rows() []Row { return append([]Row(nil), table...) }

// table maps every domain error to its protocol code. The first row whose
// error matches with errors.Is wins, so a row for an error that wraps
// another must come before the row of the wrapped one; anything unmatched is
// INTERNAL. Rows are grouped by code; within a code the first row is the
// code's canonical error, the one Err returns (see canonical).
var table = []Row{
	{cache.ErrNotFound, tp.ErrorCode_NOT_FOUND},
	{cache.ErrExists, tp.ErrorCode_EXISTS},
	{cache.ErrTooLarge, tp.ErrorCode_TOO_LARGE},
	{proxy.ErrInvalidArgument, tp.ErrorCode_INVALID_ARGUMENT},
	{cache.ErrInvalidKey, tp.ErrorCode_INVALID_ARGUMENT},
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
	{proxy.ErrNoGPU, tp.ErrorCode_UNAVAILABLE},
	{ErrInternal, tp.ErrorCode_INTERNAL},
	{ErrVersionMismatch, tp.ErrorCode_VERSION_MISMATCH},
	// The transfer layer's errors, when one reaches an edge unwrapped: bytes
	// that do not match their checksum are a checksum failure; every other
	// transfer failure means the peer cannot serve the block now.
	{rdma.ErrChecksum, tp.ErrorCode_CHECKSUM_MISMATCH},
	{rdma.ErrUnknownRegion, tp.ErrorCode_UNAVAILABLE},
	{rdma.ErrOutOfRange, tp.ErrorCode_UNAVAILABLE},
	{rdma.ErrTooLarge, tp.ErrorCode_UNAVAILABLE},
	{rdma.ErrClosed, tp.ErrorCode_UNAVAILABLE},
	{rdma.ErrPeerLost, tp.ErrorCode_UNAVAILABLE},
	{rdma.ErrProtocol, tp.ErrorCode_UNAVAILABLE},
	{rdma.ErrUnreachable, tp.ErrorCode_UNAVAILABLE},
}

// canonical is the inverse of table: for each code, the sentinel of its
// first row. Derived from table, so the two cannot disagree.
var canonical = func() map[tp.ErrorCode]error {
	m := make(map[tp.ErrorCode]error)
	for _, row := range table {
		if _, ok := m[row.Code]; !ok {
			m[row.Code] = row.Err
		}
	}
	return m
}()

// Code returns the protocol code for err: OK for nil, INTERNAL for an error
// that matches no row of the table.
func Code(err error) tp.ErrorCode {
	if err == nil {
		return tp.ErrorCode_OK
	}
	for _, row := range table {
		if errors.Is(err, row.Err) {
			return row.Code
		}
	}
	return tp.ErrorCode_INTERNAL
}

// Err returns the domain sentinel a code stands for: nil for OK, the
// code's first row otherwise, and ErrInternal for a code this build does
// not know (a newer peer's), which callers treat as a failed call. Callers
// wrap it with the peer and message; Code(Err(c)) == c for every known c.
func Err(code tp.ErrorCode) error {
	if code == tp.ErrorCode_OK {
		return nil
	}
	if err, ok := canonical[code]; ok {
		return err
	}
	return ErrInternal
}
