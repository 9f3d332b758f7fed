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

// scopeOf is the scope of a call's optional scope argument: the last one
// given, ScopeDefault without.
func scopeOf(s []Scope) Scope {
	if len(s) == 0 {
		return ScopeDefault
	}
	return s[len(s)-1]
}

// Present reports, per key, whether the block is present (BatchExists
// reduced to booleans; scope as Get's).
func (c *Client) Present(ctx context.Context, ns string, keys [][]byte, scope ...Scope) ([]bool, error) {
	var res tp.TidepoolBatchExistsResult
	if err := c.call(ctx, "BatchExists", &tp.TidepoolBatchExistsArgs{Req: &tp.BatchExistsRequest{Ns: ns, Keys: keys, Scope: scopeOf(scope)}}, &res); err != nil {
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
