//go:build verbs

package verbs

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/tidepool-kv/tidepool/rdma"
)

// iqp is an initiator QP and the owner's QP number it is connected to.
type iqp struct {
	q      *qp
	remote uint32
	dev    int   // local device index
	p      *peer // the handle whose pool holds it
	// broken: an asynchronous event reported it failed; put and get
	// destroy it instead of reusing it.
	broken atomic.Bool
}

// qpKey names an initiator QP for asynchronous events.
type qpKey struct {
	dev int
	qpn uint32
}

// pool is a handle's QPs on one local device.
type pool struct {
	sem  chan struct{} // one token per QP in use
	idle []*iqp
}

// get takes a QP token and an idle QP, connecting a new one if none is
// idle.
func (p *peer) get(ctx context.Context, dev int) (*iqp, error) {
	pl := p.pools[dev]
	select {
	case pl.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.done:
		return nil, rdma.ErrClosed
	}
	p.mu.Lock()
	switch {
	case p.closed:
		p.mu.Unlock()
		<-pl.sem
		return nil, rdma.ErrClosed
	case p.lost:
		p.mu.Unlock()
		<-pl.sem
		return nil, fmt.Errorf("%w: %s", rdma.ErrPeerLost, p.addr)
	}
	for n := len(pl.idle); n > 0; n = len(pl.idle) {
		q := pl.idle[n-1]
		pl.idle = pl.idle[:n-1]
		if !q.broken.Load() {
			p.mu.Unlock()
			return q, nil
		}
		p.mu.Unlock()
		p.drop(q) // failed while idle (asynchronous event)
		p.mu.Lock()
	}
	p.mu.Unlock()
	q, err := p.connectQP(dev)
	if err != nil {
		<-pl.sem
		return nil, err
	}
	return q, nil
}

// connectQP creates a QP, exchanges connection data with the owner over
// the control connection and brings the QP to RTS.
func (p *peer) connectQP(dev int) (*iqp, error) {
	d := p.t.devs[dev]
	q, err := d.createQP(false, p.t.cfg.QueueDepth, randPSN())
	if err != nil {
		return nil, err
	}
	// Local device i pairs with the owner's device i (mod its count).
	resp, err := p.call(msgConnect, connectReq{conn: d.local(q), dev: byte(dev % p.rdevs)}.encode())
	if err != nil {
		q.destroy()
		return nil, err
	}
	remote, err := decodeConnData(resp)
	if err == nil {
		err = d.connect(q, remote, p.t.cfg.QPTimeout, p.t.cfg.QPRetry, 16)
	}
	if err != nil {
		q.destroy()
		if remote.QPN != 0 {
			_, _ = p.call(msgDestroy, encodeDestroy(remote.QPN))
		}
		return nil, err
	}
	iq := &iqp{q: q, remote: remote.QPN, dev: dev, p: p}
	p.mu.Lock()
	if p.closed || p.lost {
		p.mu.Unlock()
		q.destroy()
		if p.closed {
			return nil, rdma.ErrClosed
		}
		return nil, fmt.Errorf("%w: %s", rdma.ErrPeerLost, p.addr)
	}
	p.all[iq] = struct{}{}
	p.t.iqps.Store(qpKey{dev, q.num}, iq)
	p.mu.Unlock()
	p.t.qps.Add(1)
	p.c.Conn(1)
	return iq, nil
}

// put returns a QP to the pool, or destroys it (and its owner-side twin)
// when a transfer on it failed: an error completion leaves an RC QP in the
// error state.
func (p *peer) put(q *iqp, clean bool) {
	pl := p.pools[q.dev]
	p.mu.Lock()
	if clean && !q.broken.Load() && !p.closed && !p.lost {
		pl.idle = append(pl.idle, q)
		p.mu.Unlock()
		<-pl.sem
		return
	}
	p.mu.Unlock()
	p.drop(q)
	<-pl.sem
}

// drop destroys q and its twin on the owner.
func (p *peer) drop(q *iqp) {
	p.mu.Lock()
	_, tracked := p.all[q]
	delete(p.all, q)
	if tracked {
		p.t.iqps.Delete(qpKey{q.dev, q.q.num})
	}
	p.mu.Unlock()
	if tracked {
		q.q.destroy()
		p.t.qps.Add(-1)
		p.c.Conn(-1)
		_, _ = p.call(msgDestroy, encodeDestroy(q.remote))
	}
}
