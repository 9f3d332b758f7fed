//go:build verbs

package verbs

import (
	"errors"

	"github.com/tidepool-kv/tidepool/rdma"
)

// Register implements rdma.Transport: the buffer is registered with the
// device (ibv_reg_mr) for local and remote read and write. The descriptor
// names it the way rdma/tcp does (random 64-bit id, 32-bit key and 64-bit
// base, docs/security.md), not by rkey and virtual address: an initiator
// resolves (id, key, base) to the rkey and address over the authenticated
// control connection once per region and caches the answer.
func (t *Transport) Register(buf []byte) (rdma.RegionDesc, error) {
	if t.closed.Load() {
		return rdma.RegionDesc{}, rdma.ErrClosed
	}
	d, err := t.table.Register(buf)
	if err != nil {
		return d, err
	}
	if err := t.regMR(buf, d.ID); err != nil {
		_ = t.table.Deregister(d.ID)
		return rdma.RegionDesc{}, err
	}
	return d, nil
}

// RegisterAs registers buf under a descriptor drawn by another transport
// (rdma/auto: the tcp transport's), so that one descriptor names the region
// on both.
func (t *Transport) RegisterAs(buf []byte, d rdma.RegionDesc) error {
	if t.closed.Load() {
		return rdma.ErrClosed
	}
	if err := t.table.RegisterAs(buf, d); err != nil {
		return err
	}
	if err := t.regMR(buf, d.ID); err != nil {
		_ = t.table.Deregister(d.ID)
		return err
	}
	return nil
}

// regMRs is one region registered with every device in use.
type regMRs struct {
	addr, size uint64
	per        []*mr // by device index
	// order lists the device indices to prefer for this region: those on
	// the NUMA node of its memory first (preferNUMA).
	order []int
}

func (r *regMRs) dereg() error {
	var errs []error
	for _, m := range r.per {
		errs = append(errs, m.dereg())
	}
	return errors.Join(errs...)
}

func (t *Transport) regMR(buf []byte, id rdma.RegionID) error {
	r := &regMRs{size: uint64(len(buf))}
	for _, d := range t.devs {
		m, err := d.regMR(buf)
		if err != nil {
			_ = r.dereg()
			return err
		}
		r.addr = m.addr
		r.per = append(r.per, m)
	}
	nodes := make([]int, len(t.devs))
	for i, d := range t.devs {
		nodes[i] = d.cur().NUMANode
	}
	node := memNode(buf)
	if node < 0 {
		node = processNode()
	}
	r.order = preferNUMA(nodes, node)
	t.mrMu.Lock()
	t.mrs[id] = r
	t.mrMu.Unlock()
	return nil
}

// Deregister implements rdma.Transport: it waits for this transport's own
// transfers from or into the region, then deregisters it from the device,
// after which remote reads and writes of it fail with a remote access
// error.
func (t *Transport) Deregister(id rdma.RegionID) error {
	if err := t.table.Deregister(id); err != nil {
		return err
	}
	t.mrMu.Lock()
	m := t.mrs[id]
	delete(t.mrs, id)
	t.mrMu.Unlock()
	if m != nil {
		return m.dereg()
	}
	return nil
}
