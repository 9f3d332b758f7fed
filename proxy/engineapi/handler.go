// Package engineapi is the Thrift edge of the engine API: it serves the
// proxy core over Kitex on a Unix socket, converts Thrift structs to domain
// calls and maps domain errors to protocol codes (through proxy/wirecode,
// the one table both Thrift edges share).
package engineapi

import (
	"context"
	"errors"
	"fmt"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/protocol"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/wirecode"
)

// scope converts the wire scope; unknown values mean the default.
func scope(s tp.Scope) proxy.Scope {
	switch s {
	case tp.Scope_LOCAL:
		return proxy.ScopeLocal
	case tp.Scope_CLUSTER:
		return proxy.ScopeCluster
	}
	return proxy.ScopeDefault
}

// handler implements the generated service interface over a proxy.
type handler struct {
	p     *proxy.Proxy
	build string // Config.Build
	// putSocket: the put socket is served (FeaturePutSocket).
	putSocket bool
	// bufferSocket: the buffer socket is served (FeatureBufferSocket).
	bufferSocket bool
}

var _ tp.Tidepool = (*handler)(nil)

func (h *handler) Hello(ctx context.Context, req *tp.HelloRequest) (*tp.HelloResponse, error) {
	if v := req.GetClientVersion(); v != protocol.Version {
		// One version so far: a client of another speaks calls or fields
		// this server may read differently, so it is refused up front.
		return nil, toThrift(fmt.Errorf("%w: client speaks engine API version %d; this server speaks %d",
			wirecode.ErrVersionMismatch, v, protocol.Version))
	}
	cfg := h.p.Config()
	st, err := h.p.Stats(ctx, "")
	if err != nil {
		return nil, toThrift(err)
	}
	resp := &tp.HelloResponse{
		ServerVersion: protocol.Version,
		Build:         h.build,
		NodeId:        cfg.NodeID,
		Features:      []string{FeatureAcquireRelease, FeatureCommitNext},
		Limits: &tp.Limits{
			MaxKeyBytes:       int32(cfg.MaxKeyBytes),
			MaxValueBytes:     cfg.MaxValueBytes,
			MaxBatch:          int32(cfg.MaxBatch),
			MaxNamespaceBytes: int32(cfg.MaxNamespaceBytes),
		},
	}
	if h.putSocket {
		resp.Features = append(resp.Features, FeaturePutSocket)
	}
	if h.bufferSocket {
		resp.Features = append(resp.Features, FeatureBufferSocket)
	}
	if h.p.HasGPU() {
		resp.Features = append(resp.Features, FeatureGPU)
	}
	if h.p.SlotIndexPath() != "" {
		resp.Features = append(resp.Features, FeatureSlotIndex)
	}
	for _, t := range st.Tiers {
		resp.Tiers = append(resp.Tiers, &tp.TierInfo{Name: t.Name, CapacityBytes: t.CapacityBytes, UsedBytes: t.UsedBytes, Blocks: t.Blocks})
	}
	arenas, layout := h.p.Arenas()
	resp.LayoutVersion = int32(layout)
	for i, a := range arenas {
		resp.Arenas = append(resp.Arenas, &tp.ArenaInfo{Id: int32(i), Path: a.Path, Size: a.Size})
	}
	return resp, nil
}

func (h *handler) Put(ctx context.Context, req *tp.PutRequest) (*tp.PutResponse, error) {
	existed, err := h.p.Put(ctx, req.Ns, req.Key, req.Value, cache.PutOptions{Depth: req.Depth, Durable: req.Durable,
		SyncReplicas: int(req.SyncReplicas), Meta: wirecode.Meta(req.TokenIds, req.ParentKey, req.BlockSize)})
	if err != nil {
		return nil, toThrift(err)
	}
	return &tp.PutResponse{Existed: existed}, nil
}

func (h *handler) BatchPut(ctx context.Context, req *tp.BatchPutRequest) (*tp.BatchPutResponse, error) {
	items := make([]proxy.PutItem, len(req.Items))
	for i, it := range req.Items {
		if it == nil {
			return nil, toThrift(errors.Join(proxy.ErrInvalidArgument, errors.New("nil item")))
		}
		items[i] = proxy.PutItem{Key: it.Key, Value: it.Value, Opts: cache.PutOptions{Depth: it.Depth, Durable: req.Durable,
			SyncReplicas: int(req.SyncReplicas), Meta: wirecode.Meta(it.TokenIds, it.ParentKey, it.BlockSize)}}
	}
	res, err := h.p.BatchPut(ctx, req.Ns, items)
	if err != nil {
		return nil, toThrift(err)
	}
	out := &tp.BatchPutResponse{Results: make([]*tp.ItemStatus, len(res))}
	for i, e := range res {
		out.Results[i] = itemResult(e)
	}
	return out, nil
}

func (h *handler) Get(ctx context.Context, req *tp.GetRequest) (*tp.GetResponse, error) {
	v, info, err := h.p.GetPinned(ctx, req.Ns, req.Key, scope(req.Scope), pinsFrom(ctx))
	if errors.Is(err, cache.ErrNotFound) {
		return &tp.GetResponse{Found: false}, nil
	}
	if err != nil {
		return nil, toThrift(err)
	}
	return &tp.GetResponse{Found: true, Value: v, Tier: info.Tier}, nil
}

func (h *handler) BatchGet(ctx context.Context, req *tp.BatchGetRequest) (*tp.BatchGetResponse, error) {
	res, err := h.p.BatchGetPinned(ctx, req.Ns, req.Keys, scope(req.Scope), pinsFrom(ctx))
	if err != nil {
		return nil, toThrift(err)
	}
	out := &tp.BatchGetResponse{Results: make([]*tp.GetItem, len(res))}
	for i, r := range res {
		out.Results[i] = &tp.GetItem{Code: wirecode.Code(r.Err), Value: r.Value, Tier: r.Info.Tier}
	}
	return out, nil
}

func (h *handler) Exists(ctx context.Context, req *tp.ExistsRequest) (*tp.ExistsResponse, error) {
	info, ok, err := h.p.Exists(ctx, req.Ns, req.Key, scope(req.Scope))
	if err != nil {
		return nil, toThrift(err)
	}
	return h.existsResponse(info, ok), nil
}

func (h *handler) existsResponse(info cache.Info, ok bool) *tp.ExistsResponse {
	if !ok {
		return &tp.ExistsResponse{}
	}
	node := info.Node // held by another node (cluster scope)
	if node == "" {
		node = h.p.Config().NodeID
	}
	return &tp.ExistsResponse{Present: true, Tier: info.Tier, NodeId: node}
}

func (h *handler) BatchExists(ctx context.Context, req *tp.BatchExistsRequest) (*tp.BatchExistsResponse, error) {
	res, err := h.p.BatchExists(ctx, req.Ns, req.Keys, scope(req.Scope))
	if err != nil {
		return nil, toThrift(err)
	}
	out := &tp.BatchExistsResponse{Results: make([]*tp.ExistsResponse, len(res))}
	for i, r := range res {
		// A key that fails validation is reported absent; the batch as a
		// whole stays answerable.
		out.Results[i] = h.existsResponse(r.Info, r.Present && r.Err == nil)
	}
	return out, nil
}

func (h *handler) Lookup(ctx context.Context, req *tp.LookupRequest) (*tp.LookupResponse, error) {
	n, err := h.p.Lookup(ctx, req.Ns, req.Keys, scope(req.Scope))
	if err != nil {
		return nil, toThrift(err)
	}
	return &tp.LookupResponse{Matched: int32(n)}, nil
}

func (h *handler) Delete(ctx context.Context, req *tp.DeleteRequest) (*tp.DeleteResponse, error) {
	ok, err := h.p.Delete(ctx, req.Ns, req.Key, scope(req.Scope))
	if err != nil {
		return nil, toThrift(err)
	}
	return &tp.DeleteResponse{Deleted: ok}, nil
}

func (h *handler) Clear(ctx context.Context, req *tp.ClearRequest) (*tp.ClearResponse, error) {
	n, err := h.p.Clear(ctx, req.Ns, scope(req.Scope))
	if err != nil {
		return nil, toThrift(err)
	}
	return &tp.ClearResponse{Removed: n}, nil
}

func (h *handler) Stats(ctx context.Context, req *tp.StatsRequest) (*tp.StatsResponse, error) {
	st, err := h.p.Stats(ctx, req.Ns)
	if err != nil {
		return nil, toThrift(err)
	}
	out := &tp.StatsResponse{UptimeMs: h.p.Uptime().Milliseconds(), NodeId: h.p.Config().NodeID}
	for _, t := range st.Tiers {
		out.Tiers = append(out.Tiers, &tp.TierStats{
			Name: t.Name, CapacityBytes: t.CapacityBytes, UsedBytes: t.UsedBytes, Blocks: t.Blocks,
			Hits: t.Hits, Misses: t.Misses, Evictions: t.Evictions, BytesIn: t.BytesIn, BytesOut: t.BytesOut,
		})
	}
	for _, n := range st.Namespaces {
		out.Namespaces = append(out.Namespaces, &tp.NamespaceStats{
			Ns: n.Namespace, Blocks: n.Blocks, Bytes: n.Bytes, Hits: n.Hits, Misses: n.Misses, Puts: n.Puts, Evictions: n.Evictions,
		})
	}
	return out, nil
}

func (h *handler) Prefetch(ctx context.Context, req *tp.PrefetchRequest) (*tp.PrefetchResponse, error) {
	n, err := h.p.Prefetch(ctx, req.Ns, req.Keys, scope(req.Scope))
	if err != nil {
		return nil, toThrift(err)
	}
	return &tp.PrefetchResponse{Queued: int32(n)}, nil
}

func (h *handler) Members(ctx context.Context, req *tp.MembersRequest) (*tp.MembersResponse, error) {
	ms := h.p.Members(ctx)
	out := &tp.MembersResponse{Members: make([]*tp.Member, len(ms))}
	for i, m := range ms {
		out.Members[i] = &tp.Member{Name: m.Name, State: m.State, GossipAddr: m.GossipAddr, PeerAddr: m.PeerAddr, Zone: m.Zone, IsSelf: m.Self}
	}
	return out, nil
}
