package peerapi

import (
	"errors"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/rdma"
)

// The tests' share of the wiring that cmd/tidepool does for serve
// (registerArenas there; membership changes go through
// cluster.OnMembershipChange as in serve).

// RegisterTestArenas registers the memory of every arena of tier with tr,
// in arena order (the order ServerConfig.Regions and ClientConfig.Regions
// take), and returns a function that deregisters them.
func RegisterTestArenas(tr rdma.Transport, tier interface {
	Arenas() []cache.ArenaInfo
	ArenaMem(i int) []byte
}) ([]rdma.RegionDesc, func(), error) {
	var out []rdma.RegionDesc
	deregister := func() {
		for _, d := range out {
			_ = tr.Deregister(d.ID)
		}
	}
	for i := range tier.Arenas() {
		d, err := tr.Register(tier.ArenaMem(i))
		if err != nil {
			deregister()
			return nil, nil, err
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, nil, errors.New("no arenas")
	}
	return out, deregister, nil
}

// AnswerUndescribed makes s answer as a node that predates block
// descriptions (no description in Acquire answers, no fetch_describe,
// named reads of version 2 refused), or as itself again.
func AnswerUndescribed(s *Server, on bool) { s.h.undescribed.Store(on) }
