package dram

// ArenaMem returns the whole MAP_SHARED mapping of arena i (see Arenas), for
// registering with the transfer layer (rdma.Transport.Register) so that
// peers can read blocks in place and fetched blocks land in place. The slice
// is valid until Close: deregister it from every transport before closing
// the tier. Writing through it bypasses the tier's bookkeeping; only write
// into a Reservation's range. It returns nil for an index out of range.
func (t *Tier) ArenaMem(i int) []byte {
	if i < 0 || i >= len(t.arenas) {
		return nil
	}
	return t.arenas[i].mem
}
