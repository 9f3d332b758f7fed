package engineapi

import (
	"context"
	"errors"

	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy"
)

// The zero-copy calls are being implemented (issue 4); until then they
// answer UNAVAILABLE with a clear message and change nothing.
var errZeroCopyPending = errors.Join(proxy.ErrClosed, errors.New("zero-copy calls are not enabled in this build"))

func (h *handler) Reserve(ctx context.Context, req *tp.ReserveRequest) (*tp.ReserveResponse, error) {
	return nil, toThrift(errZeroCopyPending)
}

func (h *handler) Commit(ctx context.Context, req *tp.CommitRequest) (*tp.CommitResponse, error) {
	return nil, toThrift(errZeroCopyPending)
}

func (h *handler) Abort(ctx context.Context, req *tp.AbortRequest) (*tp.AbortResponse, error) {
	return nil, toThrift(errZeroCopyPending)
}

func (h *handler) Acquire(ctx context.Context, req *tp.AcquireRequest) (*tp.AcquireResponse, error) {
	return nil, toThrift(errZeroCopyPending)
}

func (h *handler) Release(ctx context.Context, req *tp.ReleaseRequest) (*tp.ReleaseResponse, error) {
	return nil, toThrift(errZeroCopyPending)
}

func (h *handler) Renew(ctx context.Context, req *tp.RenewRequest) (*tp.RenewResponse, error) {
	return nil, toThrift(errZeroCopyPending)
}
