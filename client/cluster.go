package client

import (
	"context"

	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
)

// Member is one sidecar of the cluster view.
type Member struct {
	Name       string `json:"name"`
	State      string `json:"state"` // alive, suspect, leaving, left, failed
	GossipAddr string `json:"gossip_addr,omitempty"`
	PeerAddr   string `json:"peer_addr,omitempty"`
	Zone       string `json:"zone,omitempty"`
	Self       bool   `json:"self"`
}

// Members returns the sidecar's view of the cluster (itself alone on a
// single node).
func (c *Client) Members(ctx context.Context) ([]Member, error) {
	var res tp.TidepoolMembersResult
	if err := c.call(ctx, "Members", &tp.TidepoolMembersArgs{Req: &tp.MembersRequest{}}, &res); err != nil {
		return nil, err
	}
	r := res.GetSuccess()
	out := make([]Member, len(r.Members))
	for i, m := range r.Members {
		out[i] = Member{Name: m.Name, State: m.State, GossipAddr: m.GossipAddr, PeerAddr: m.PeerAddr, Zone: m.Zone, Self: m.IsSelf}
	}
	return out, nil
}
