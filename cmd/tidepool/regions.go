package main

import (
	"errors"
	"fmt"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/rdma"
)

// registerArenas registers each arena's memory with t, in arena order: the
// descriptors it returns are indexed like dram.Tier.Arenas and are what
// peerapi.ServerConfig.Regions and ClientConfig.Regions take (one registration
// serves both). On error nothing stays registered.
//
// Lifetime: the arena memory must stay mapped until deregisterArenas
// returns. Shut down in this order: close the peer API server and client,
// deregisterArenas (it waits for in-flight transfers), close the transport,
// then close the DRAM tier (which unmaps the arenas).
func registerArenas(t rdma.Transport, mems [][]byte) ([]rdma.RegionDesc, error) {
	if t == nil {
		return nil, errors.New("arenas: nil transport")
	}
	out := make([]rdma.RegionDesc, 0, len(mems))
	for i, m := range mems {
		if len(m) == 0 {
			_ = deregisterArenas(t, out)
			return nil, fmt.Errorf("arenas: arena %d has no memory", i)
		}
		d, err := t.Register(m)
		if err != nil {
			_ = deregisterArenas(t, out)
			return nil, fmt.Errorf("arenas: register arena %d: %w", i, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// deregisterArenas removes the regions registerArenas made, waiting for
// in-flight transfers; after it returns the transport no longer touches the
// arenas.
func deregisterArenas(t rdma.Transport, regions []rdma.RegionDesc) error {
	var errs []error
	for _, d := range regions {
		if err := t.Deregister(d.ID); err != nil && !errors.Is(err, rdma.ErrUnknownRegion) && !errors.Is(err, rdma.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// arenaTier is the DRAM tier (*dram.Tier) as tierArenaMems reads it.
type arenaTier interface {
	Arenas() []cache.ArenaInfo
	ArenaMem(i int) []byte
}

// tierArenaMems returns the memory of every arena of t (dram.Tier.ArenaMem),
// in arena order, for registerArenas.
func tierArenaMems(t arenaTier) [][]byte {
	n := len(t.Arenas())
	out := make([][]byte, n)
	for i := range out {
		out[i] = t.ArenaMem(i)
	}
	return out
}
