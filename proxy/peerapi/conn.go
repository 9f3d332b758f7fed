package peerapi

import (
	"context"

	kclient "github.com/cloudwego/kitex/client"

	"github.com/tidepool-kv/tidepool/protocol/gen/peer"
)

// apiConn is a Kitex client for one peer's API. It calls through the
// generic kclient.Client (as the generated wrapper does) because the
// generated wrapper cannot be closed.
type apiConn struct{ kc kclient.Client }

// call makes one RPC; a declared PeerError comes back as err.
func (a *apiConn) call(ctx context.Context, method string, args any, res interface{ GetErr() *peer.PeerError }) error {
	if err := a.kc.Call(ctx, method, args, res); err != nil {
		return err
	}
	if e := res.GetErr(); e != nil {
		return e
	}
	return nil
}

func (a *apiConn) Lookup(ctx context.Context, req *peer.LookupRequest) (*peer.LookupResponse, error) {
	args, res := peer.TidepoolPeerLookupArgs{Req: req}, peer.TidepoolPeerLookupResult{}
	if err := a.call(ctx, "Lookup", &args, &res); err != nil {
		return nil, err
	}
	if res.Success == nil {
		return &peer.LookupResponse{}, nil
	}
	return res.Success, nil
}

func (a *apiConn) Acquire(ctx context.Context, req *peer.AcquireRequest) (*peer.AcquireResponse, error) {
	args, res := peer.TidepoolPeerAcquireArgs{Req: req}, peer.TidepoolPeerAcquireResult{}
	if err := a.call(ctx, "Acquire", &args, &res); err != nil {
		return nil, err
	}
	if res.Success == nil {
		return &peer.AcquireResponse{}, nil
	}
	return res.Success, nil
}

func (a *apiConn) Release(ctx context.Context, req *peer.ReleaseRequest) (*peer.ReleaseResponse, error) {
	args, res := peer.TidepoolPeerReleaseArgs{Req: req}, peer.TidepoolPeerReleaseResult{}
	if err := a.call(ctx, "Release", &args, &res); err != nil {
		return nil, err
	}
	return &peer.ReleaseResponse{}, nil
}

func (a *apiConn) Put(ctx context.Context, req *peer.PutRequest) (*peer.PutResponse, error) {
	args, res := peer.TidepoolPeerPutArgs{Req: req}, peer.TidepoolPeerPutResult{}
	if err := a.call(ctx, "Put", &args, &res); err != nil {
		return nil, err
	}
	if res.Success == nil {
		return &peer.PutResponse{}, nil
	}
	return res.Success, nil
}

func (a *apiConn) Delete(ctx context.Context, req *peer.DeleteRequest) (*peer.DeleteResponse, error) {
	args, res := peer.TidepoolPeerDeleteArgs{Req: req}, peer.TidepoolPeerDeleteResult{}
	if err := a.call(ctx, "Delete", &args, &res); err != nil {
		return nil, err
	}
	if res.Success == nil {
		return &peer.DeleteResponse{}, nil
	}
	return res.Success, nil
}

func (a *apiConn) Clear(ctx context.Context, req *peer.ClearRequest) (*peer.ClearResponse, error) {
	args, res := peer.TidepoolPeerClearArgs{Req: req}, peer.TidepoolPeerClearResult{}
	if err := a.call(ctx, "Clear", &args, &res); err != nil {
		return nil, err
	}
	if res.Success == nil {
		return &peer.ClearResponse{}, nil
	}
	return res.Success, nil
}

// Close releases the connections.
func (a *apiConn) Close() error {
	if c, ok := a.kc.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}
