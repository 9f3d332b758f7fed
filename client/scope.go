package client

import (
	"context"

	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
)

// Scope says where a read looks for blocks.
type Scope = tp.Scope

// Scopes of the read calls.
const (
	// ScopeDefault is ScopeCluster on a clustered node, ScopeLocal otherwise.
	ScopeDefault = tp.Scope_DEFAULT
	// ScopeLocal looks only in the sidecar's own tiers.
	ScopeLocal = tp.Scope_LOCAL
	// ScopeCluster also asks the blocks' owners on other nodes.
	ScopeCluster = tp.Scope_CLUSTER
)

// LookupScope is Lookup with an explicit scope.
func (c *Client) LookupScope(ctx context.Context, ns string, keys [][]byte, scope Scope) (int, error) {
	var res tp.TidepoolLookupResult
	err := c.call(ctx, "Lookup", &tp.TidepoolLookupArgs{Req: &tp.LookupRequest{Ns: ns, Keys: keys, Scope: scope}}, &res)
	r := res.GetSuccess()
	if err != nil {
		return 0, err
	}
	return int(r.Matched), nil
}

// GetScope is Get with an explicit scope.
func (c *Client) GetScope(ctx context.Context, ns string, key []byte, scope Scope) (value []byte, found bool, err error) {
	var res tp.TidepoolGetResult
	err = c.call(ctx, "Get", &tp.TidepoolGetArgs{Req: &tp.GetRequest{Ns: ns, Key: key, Scope: scope}}, &res)
	r := res.GetSuccess()
	if err != nil {
		return nil, false, err
	}
	return r.Value, r.Found, nil
}

// BatchGetScope is BatchGet with an explicit scope.
func (c *Client) BatchGetScope(ctx context.Context, ns string, keys [][]byte, scope Scope) ([]GetResult, error) {
	var res tp.TidepoolBatchGetResult
	err := c.call(ctx, "BatchGet", &tp.TidepoolBatchGetArgs{Req: &tp.BatchGetRequest{Ns: ns, Keys: keys, Scope: scope}}, &res)
	r := res.GetSuccess()
	if err != nil {
		return nil, err
	}
	out := make([]GetResult, len(r.Results))
	for i, g := range r.Results {
		if g != nil {
			out[i] = GetResult{Value: g.Value, Code: g.Code, Tier: g.Tier}
		}
	}
	return out, nil
}

// PresentScope reports, per key, whether the block is present in scope
// (BatchExists reduced to booleans).
func (c *Client) PresentScope(ctx context.Context, ns string, keys [][]byte, scope Scope) ([]bool, error) {
	var res tp.TidepoolBatchExistsResult
	if err := c.call(ctx, "BatchExists", &tp.TidepoolBatchExistsArgs{Req: &tp.BatchExistsRequest{Ns: ns, Keys: keys, Scope: scope}}, &res); err != nil {
		return nil, err
	}
	r := res.GetSuccess()
	out := make([]bool, len(r.Results))
	for i, e := range r.Results {
		out[i] = e != nil && e.Present
	}
	return out, nil
}

// AliveMembers returns how many members of the sidecar's cluster view are
// alive (1 on a single node).
func (c *Client) AliveMembers(ctx context.Context) (int, error) {
	var res tp.TidepoolMembersResult
	if err := c.call(ctx, "Members", &tp.TidepoolMembersArgs{Req: &tp.MembersRequest{}}, &res); err != nil {
		return 0, err
	}
	n := 0
	for _, m := range res.GetSuccess().Members {
		if m != nil && m.State == "alive" {
			n++
		}
	}
	return n, nil
}

// DeleteScope is Delete with an explicit scope: ScopeCluster (the default
// on a clustered node) deletes the block on every live member, ScopeLocal
// in this sidecar's tiers only.
func (c *Client) DeleteScope(ctx context.Context, ns string, key []byte, scope Scope) (bool, error) {
	var res tp.TidepoolDeleteResult
	err := c.call(ctx, "Delete", &tp.TidepoolDeleteArgs{Req: &tp.DeleteRequest{Ns: ns, Key: key, Scope: scope}}, &res)
	r := res.GetSuccess()
	if err != nil {
		return false, err
	}
	return r.Deleted, nil
}

// ClearScope is Clear with an explicit scope: ScopeCluster (the default on
// a clustered node) clears the namespace on every live member, ScopeLocal
// in this sidecar's tiers only.
func (c *Client) ClearScope(ctx context.Context, ns string, scope Scope) (int64, error) {
	var res tp.TidepoolClearResult
	err := c.call(ctx, "Clear", &tp.TidepoolClearArgs{Req: &tp.ClearRequest{Ns: ns, Scope: scope}}, &res)
	r := res.GetSuccess()
	if err != nil {
		return 0, err
	}
	return r.Removed, nil
}
