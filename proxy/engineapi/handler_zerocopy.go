package engineapi

import (
	"context"
	"errors"
	"time"

	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/wirecode"
)

// The zero-copy calls (docs/zerocopy.md): thin conversions to the proxy's
// Reserve/Commit/Abort/Acquire/Release/Renew. Request-level problems are
// raised as TidepoolError; per-item outcomes travel in the results.

var errNilItem = errors.Join(proxy.ErrInvalidArgument, errors.New("nil item"))

func ms(n int32) time.Duration { return time.Duration(n) * time.Millisecond }

func slot(s proxy.Slot) *tp.Slot {
	return &tp.Slot{Arena: int32(s.Arena), Offset: s.Offset, Length: s.Length}
}

func (h *handler) Reserve(ctx context.Context, req *tp.ReserveRequest) (*tp.ReserveResponse, error) {
	items := make([]proxy.ReserveItem, len(req.Items))
	for i, it := range req.Items {
		if it == nil {
			return nil, toThrift(errNilItem)
		}
		items[i] = proxy.ReserveItem{Key: it.Key, Size: it.Size, Depth: it.Depth, Unbound: it.Unbound}
	}
	res, err := h.p.Reserve(ctx, req.Ns, items, ms(req.TtlMs), req.Durable)
	if err != nil {
		return nil, toThrift(err)
	}
	return &tp.ReserveResponse{Results: reservations(res)}, nil
}

func reservations(res []proxy.ReserveResult) []*tp.Reservation {
	out := make([]*tp.Reservation, len(res))
	for i, r := range res {
		switch {
		case r.Err != nil:
			out[i] = &tp.Reservation{Code: wirecode.Code(r.Err), Message: r.Err.Error(), Slot: &tp.Slot{}}
		case r.Token == 0: // not asked for (CommitNext)
			out[i] = &tp.Reservation{Code: tp.ErrorCode_OK, Slot: &tp.Slot{}}
		default:
			out[i] = &tp.Reservation{Code: tp.ErrorCode_OK, Slot: slot(r.Slot), Token: r.Token, DeadlineUnixMs: r.Deadline.UnixMilli()}
		}
	}
	return out
}

// FeatureCommitNext, listed in HelloResponse.features: Reserve takes
// unbound items (ReserveItem.unbound) whose key comes with their Commit,
// and Commit reserves the next unbound slot of an item that asks
// (CommitItem.next_size), so that a zero-copy put takes one round trip.
const FeatureCommitNext = "commit_next"

func (h *handler) Commit(ctx context.Context, req *tp.CommitRequest) (*tp.CommitResponse, error) {
	items := make([]proxy.CommitItem, len(req.Items))
	for i, it := range req.Items {
		if it == nil {
			return nil, toThrift(errNilItem)
		}
		items[i] = proxy.CommitItem{Token: it.Token, Checksum: uint32(it.Checksum), HasChecksum: it.HasChecksum,
			Key: it.Key, Depth: it.Depth, NextSize: it.NextSize, Meta: wirecode.Meta(it.TokenIds, it.ParentKey, it.BlockSize)}
	}
	res, next, err := h.p.CommitNext(ctx, items)
	if err != nil {
		return nil, toThrift(err)
	}
	out := &tp.CommitResponse{Results: itemResults(res)}
	if next != nil {
		out.Next = reservations(next)
	}
	return out, nil
}

func (h *handler) Abort(ctx context.Context, req *tp.AbortRequest) (*tp.AbortResponse, error) {
	res, err := h.p.Abort(ctx, req.Tokens)
	if err != nil {
		return nil, toThrift(err)
	}
	return &tp.AbortResponse{Results: itemResults(res)}, nil
}

// FeatureAcquireRelease, listed in HelloResponse.features: Acquire
// releases AcquireRequest.release_lease_ids first, so a client's finished
// leases ride on its next Acquire instead of a Release round trip.
const FeatureAcquireRelease = "acquire_release"

// FeatureSlotIndex, listed in HelloResponse.features: the DRAM tier keeps
// a slot index, the file slots.idx in the directory of arena 0: where each
// block lies, for a reader on this node to copy a block out of the arenas
// without a call and check afterwards that it did not change
// (docs/zerocopy.md, "Reads without a call").
const FeatureSlotIndex = "slot_index"

func (h *handler) Acquire(ctx context.Context, req *tp.AcquireRequest) (*tp.AcquireResponse, error) {
	if len(req.ReleaseLeaseIds) > 0 {
		// Per-id outcomes are not answered (the IDL says so): an id not
		// held is ignored; the client checked its copy against the lease's
		// deadline. A request-level error (too many ids) refuses the whole
		// call before anything is acquired.
		if _, err := h.p.Release(ctx, req.ReleaseLeaseIds); err != nil {
			return nil, toThrift(err)
		}
	}
	res, err := h.p.Acquire(ctx, req.Ns, req.Keys, ms(req.LeaseMs), scope(req.Scope))
	if err != nil {
		return nil, toThrift(err)
	}
	out := &tp.AcquireResponse{Results: make([]*tp.Lease, len(res))}
	var deadline time.Time
	for i, r := range res {
		if r.Err != nil {
			out.Results[i] = &tp.Lease{Code: wirecode.Code(r.Err), Slot: &tp.Slot{}}
			continue
		}
		out.Results[i] = &tp.Lease{Code: tp.ErrorCode_OK, Slot: slot(r.Slot), LeaseId: r.LeaseID, Checksum: int32(r.Info.Checksum), Tier: r.Info.Tier}
		if deadline.IsZero() || r.Deadline.Before(deadline) {
			deadline = r.Deadline
		}
	}
	if !deadline.IsZero() {
		out.DeadlineUnixMs = deadline.UnixMilli()
	}
	return out, nil
}

func (h *handler) Release(ctx context.Context, req *tp.ReleaseRequest) (*tp.ReleaseResponse, error) {
	res, err := h.p.Release(ctx, req.LeaseIds)
	if err != nil {
		return nil, toThrift(err)
	}
	return &tp.ReleaseResponse{Results: itemResults(res)}, nil
}

func (h *handler) Renew(ctx context.Context, req *tp.RenewRequest) (*tp.RenewResponse, error) {
	res, deadline, err := h.p.Renew(ctx, req.LeaseIds, ms(req.LeaseMs))
	if err != nil {
		return nil, toThrift(err)
	}
	out := &tp.RenewResponse{Results: itemResults(res)}
	if !deadline.IsZero() {
		out.DeadlineUnixMs = deadline.UnixMilli()
	}
	return out, nil
}

func itemResults(errs []error) []*tp.ItemStatus {
	out := make([]*tp.ItemStatus, len(errs))
	for i, e := range errs {
		out[i] = itemResult(e)
	}
	return out
}
