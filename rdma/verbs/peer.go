//go:build verbs

package verbs

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidepool-kv/tidepool/internal/peerauth"
	"github.com/tidepool-kv/tidepool/rdma"
	"github.com/tidepool-kv/tidepool/rdma/internal/counters"
)

// Connect implements rdma.Transport: it dials the control endpoint,
// authenticates, and exchanges hellos. Queue pairs come on demand.
func (t *Transport) Connect(ctx context.Context, addr string) (rdma.Peer, error) {
	if t.closed.Load() {
		return nil, rdma.ErrClosed
	}
	t.mu.Lock()
	c := t.peers[addr]
	if c == nil {
		c = &counters.Peer{Addr: addr}
		t.peers[addr] = c
	}
	t.mu.Unlock()
	nc, rdevs, err := t.dial(ctx, addr)
	if err != nil {
		c.DialFail()
		return nil, fmt.Errorf("%w: %s: %w", rdma.ErrUnreachable, addr, err)
	}
	p := &peer{t: t, addr: addr, c: c, ctl: nc, rdevs: rdevs,
		done: make(chan struct{}), all: make(map[*iqp]struct{}), flushed: make(chan struct{}),
		resolved: make(map[rdma.RegionID]remoteMR)}
	for range t.devs {
		p.pools = append(p.pools, &pool{sem: make(chan struct{}, t.cfg.MaxQPsPerPeer)})
	}
	t.mu.Lock()
	if t.closed.Load() {
		t.mu.Unlock()
		_ = nc.Close()
		return nil, rdma.ErrClosed
	}
	t.hs[p] = struct{}{}
	t.mu.Unlock()
	go p.reportLoop()
	return p, nil
}

// dial connects, authenticates and exchanges hellos; the owner answers
// how many devices it serves on.
func (t *Transport) dial(ctx context.Context, addr string) (net.Conn, int, error) {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.DialTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, 0, err
	}
	dl, _ := ctx.Deadline()
	if k := t.cfg.Key; k != nil {
		ac, err := k.Client(nc, peerauth.PurposeVerbs, dl)
		if err != nil {
			_ = nc.Close()
			return nil, 0, err
		}
		nc = ac
	}
	_ = nc.SetDeadline(dl)
	if err := writeMsg(nc, msgHello, encodeHello()); err != nil {
		_ = nc.Close()
		return nil, 0, err
	}
	typ, p, err := readMsg(nc)
	devs := 0
	switch {
	case err != nil:
	case typ != msgOK:
		err = fmt.Errorf("%w: hello refused: %w", rdma.ErrProtocol, decodeErr(p))
	default:
		devs, err = decodeHelloAnswer(p)
	}
	if err != nil {
		_ = nc.Close()
		return nil, 0, err
	}
	_ = nc.SetDeadline(time.Time{})
	return nc, devs, nil
}

type peer struct {
	t     *Transport
	addr  string
	c     *counters.Peer
	done  chan struct{}
	rdevs int // devices the owner serves on

	ctlMu sync.Mutex
	ctl   net.Conn

	// life: transfers of this handle hold it for reading (see Transport).
	life   sync.RWMutex
	mu     sync.Mutex
	closed bool
	lost   bool
	pools  []*pool // by local device
	all    map[*iqp]struct{}

	// Regions resolved on the owner, by id.
	rmu      sync.Mutex
	resolved map[rdma.RegionID]remoteMR

	// Transfers not yet reported to the owner.
	rWrites, rReads, rIn, rOut atomic.Uint64
	flushed                    chan struct{}
}

func (p *peer) Addr() string          { return p.addr }
func (p *peer) Stats() rdma.PeerStats { return p.c.Snapshot() }

// Close implements rdma.Peer.
func (p *peer) Close() error {
	p.shutdown()
	p.t.mu.Lock()
	delete(p.t.hs, p)
	p.t.mu.Unlock()
	return nil
}

// shutdown breaks in-flight transfers (their QPs go to the error state and
// flush), waits for them, destroys the QPs and closes the control
// connection, which makes the owner destroy its side.
func (p *peer) shutdown() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.done)
	for q := range p.all {
		_ = q.q.toError()
	}
	p.mu.Unlock()
	p.life.Lock()
	p.mu.Lock()
	all := p.all
	p.all = nil
	for _, pl := range p.pools {
		pl.idle = nil
	}
	p.mu.Unlock()
	p.life.Unlock()
	for q := range all {
		p.t.iqps.Delete(qpKey{q.dev, q.q.num})
		q.q.destroy()
		p.t.qps.Add(-1)
		p.c.Conn(-1)
	}
	<-p.flushed
	p.ctlMu.Lock()
	_ = p.ctl.Close()
	p.ctlMu.Unlock()
}

// call sends one control request and reads its answer. A failed exchange
// means the owner is gone: the handle is marked lost.
func (p *peer) call(typ byte, payload []byte) ([]byte, error) {
	p.ctlMu.Lock()
	defer p.ctlMu.Unlock()
	p.mu.Lock()
	lost := p.lost
	p.mu.Unlock()
	if lost {
		return nil, fmt.Errorf("%w: %s: control connection lost", rdma.ErrPeerLost, p.addr)
	}
	_ = p.ctl.SetDeadline(time.Now().Add(p.t.cfg.DialTimeout))
	err := writeMsg(p.ctl, typ, payload)
	var rt byte
	var rp []byte
	if err == nil {
		rt, rp, err = readMsg(p.ctl)
	}
	if err != nil {
		p.markLost()
		return nil, fmt.Errorf("%w: %s: control: %w", rdma.ErrPeerLost, p.addr, err)
	}
	switch rt {
	case msgOK:
		return rp, nil
	case msgErr:
		return nil, decodeErr(rp)
	default:
		p.markLost()
		return nil, fmt.Errorf("%w: answer type %d", rdma.ErrProtocol, rt)
	}
}

// markLost fails every later transfer of the handle fast and breaks the
// QPs of the ones in flight.
func (p *peer) markLost() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lost {
		return
	}
	p.lost = true
	for q := range p.all {
		_ = q.q.toError()
	}
}

// reportLoop tells the owner, every StatsInterval, what this handle moved
// (its serve counters: the owner's CPU does not see one-sided transfers).
func (p *peer) reportLoop() {
	defer close(p.flushed)
	tk := time.NewTicker(p.t.cfg.StatsInterval)
	defer tk.Stop()
	for {
		select {
		case <-p.done:
			p.report()
			return
		case <-tk.C:
			p.report()
		}
	}
}

func (p *peer) report() {
	w, r, in, out := p.rWrites.Swap(0), p.rReads.Swap(0), p.rIn.Swap(0), p.rOut.Swap(0)
	if w+r == 0 {
		return
	}
	_, _ = p.call(msgStats, statsReq{writes: w, reads: r, in: in, out: out}.encode())
}

// remoteMR is a resolved remote region.
type remoteMR struct {
	key   uint32
	base  uint64
	addr  uint64
	size  uint64
	rkeys []uint32 // one per owner device
}

// resolve returns the rkey and address of a remote region, asking the
// owner the first time.
func (p *peer) resolve(d rdma.RegionDesc) (remoteMR, error) {
	p.rmu.Lock()
	r, ok := p.resolved[d.ID]
	p.rmu.Unlock()
	if ok && r.key == d.Key && r.base == d.Addr {
		return r, nil
	}
	out, err := p.call(msgResolve, resolveReq{id: d.ID, key: d.Key, base: d.Addr}.encode())
	if err != nil {
		return r, err
	}
	a, err := decodeResolveAnswer(out)
	if err != nil {
		return r, err
	}
	r = remoteMR{key: d.Key, base: d.Addr, addr: a.addr, size: a.size, rkeys: a.rkeys}
	p.rmu.Lock()
	if len(p.resolved) >= maxResolved {
		clear(p.resolved)
	}
	p.resolved[d.ID] = r
	p.rmu.Unlock()
	return r, nil
}

// maxResolved bounds a handle's cache of resolved regions.
const maxResolved = 4096

func (p *peer) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}
