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
