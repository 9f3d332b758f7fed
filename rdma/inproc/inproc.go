// Package inproc is an in-process rdma.Transport for tests: transports
// attached to one Network reach each other by name and copy bytes directly
// between registered regions, chunk by chunk, honouring the same errors,
// bounds, deadlines and close semantics as the network transports.
package inproc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/protocol/frame"
	"github.com/tidepool-kv/tidepool/rdma"
	"github.com/tidepool-kv/tidepool/rdma/internal/counters"
	"github.com/tidepool-kv/tidepool/rdma/internal/region"
)

// Network connects in-process transports by name.
type Network struct {
	mu sync.Mutex
	ts map[string]*Transport
	n  int
}

// NewNetwork returns an empty network.
func NewNetwork() *Network { return &Network{ts: make(map[string]*Transport)} }

func (n *Network) lookup(addr string) *Transport {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ts[addr]
}

// Config configures a Transport. A zero field takes its default
// (DefaultConfig, applied in withDefaults by New and Validate).
type Config struct {
	// Network the transport attaches to. Required.
	Network *Network
	// Addr is the name peers connect to. Default: "inproc-<n>".
	Addr string
	// ChunkSize is the copy granularity in bytes: between chunks a transfer
	// checks its context and whether either side closed. Default 256 KiB.
	ChunkSize int
	// MaxTransfer bounds Op.Len in bytes. Default 1 GiB.
	MaxTransfer uint64
}

// DefaultConfig returns the defaults (Network still to be set).
func DefaultConfig() Config {
	return Config{ChunkSize: 256 << 10, MaxTransfer: 1 << 30}
}

// withDefaults fills the zero fields with their defaults (Addr is named
// by New).
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.ChunkSize == 0 {
		c.ChunkSize = d.ChunkSize
	}
	if c.MaxTransfer == 0 {
		c.MaxTransfer = d.MaxTransfer
	}
	return c
}

// Validate reports every problem with c (after defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.Network == nil {
		errs = append(errs, errors.New("inproc: Network is required"))
	}
	if c.ChunkSize <= 0 {
		errs = append(errs, fmt.Errorf("inproc: ChunkSize %d must be > 0", c.ChunkSize))
	}
	if c.MaxTransfer == 0 {
		errs = append(errs, errors.New("inproc: MaxTransfer must be > 0"))
	}
	return errors.Join(errs...)
}

// Transport is the in-process transport.
type Transport struct {
	cfg    Config
	lg     *zap.Logger
	table  *region.Table
	serve  counters.Serve
	closed atomic.Bool

	mu    sync.Mutex
	peers map[string]*counters.Peer
	hs    map[*peer]struct{}
}

var _ rdma.Transport = (*Transport)(nil)

// New attaches a transport to cfg.Network.
func New(cfg Config, lg *zap.Logger) (*Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if lg == nil {
		lg = zap.NewNop()
	}
	n := cfg.Network
	n.mu.Lock()
	defer n.mu.Unlock()
	if cfg.Addr == "" {
		n.n++
		cfg.Addr = fmt.Sprintf("inproc-%d", n.n)
	}
	if _, ok := n.ts[cfg.Addr]; ok {
		return nil, fmt.Errorf("inproc: address %q in use", cfg.Addr)
	}
	t := &Transport{cfg: cfg, lg: lg.Named("rdma.inproc"), table: region.NewTable(),
		peers: make(map[string]*counters.Peer), hs: make(map[*peer]struct{})}
	n.ts[cfg.Addr] = t
	return t, nil
}

// Addr returns the transport's name on its network.
func (t *Transport) Addr() string { return t.cfg.Addr }

// Register implements rdma.Transport.
func (t *Transport) Register(buf []byte) (rdma.RegionDesc, error) {
	if t.closed.Load() {
		return rdma.RegionDesc{}, rdma.ErrClosed
	}
	return t.table.Register(buf)
}

// Deregister implements rdma.Transport.
func (t *Transport) Deregister(id rdma.RegionID) error { return t.table.Deregister(id) }

// Connect implements rdma.Transport.
func (t *Transport) Connect(ctx context.Context, addr string) (rdma.Peer, error) {
	if t.closed.Load() {
		return nil, rdma.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.peers[addr]
	if c == nil {
		c = &counters.Peer{Addr: addr}
		t.peers[addr] = c
	}
	if r := t.cfg.Network.lookup(addr); r == nil || r.closed.Load() {
		c.DialFail()
		return nil, fmt.Errorf("%w: %s", rdma.ErrUnreachable, addr)
	}
	p := &peer{t: t, addr: addr, c: c}
	t.hs[p] = struct{}{}
	c.Conn(1)
	return p, nil
}

// Stats implements rdma.Transport.
func (t *Transport) Stats() rdma.Stats {
	n, b := t.table.Len()
	t.mu.Lock()
	defer t.mu.Unlock()
	return counters.TransportStats(n, b, &t.serve, t.peers)
}

// Close detaches the transport: peers can no longer reach it and in-flight
// transfers through or into it fail. Safe to call more than once.
func (t *Transport) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	n := t.cfg.Network
	n.mu.Lock()
	if n.ts[t.cfg.Addr] == t {
		delete(n.ts, t.cfg.Addr)
	}
	n.mu.Unlock()
	t.mu.Lock()
	hs := t.hs
	t.hs = map[*peer]struct{}{}
	t.mu.Unlock()
	for p := range hs {
		p.close()
	}
	return nil
}

type peer struct {
	t      *Transport
	addr   string
	c      *counters.Peer
	closed atomic.Bool
}

func (p *peer) Addr() string { return p.addr }

func (p *peer) Stats() rdma.PeerStats { return p.c.Snapshot() }

func (p *peer) close() {
	if !p.closed.Swap(true) {
		p.c.Conn(-1)
	}
}

func (p *peer) Close() error {
	p.close()
	p.t.mu.Lock()
	delete(p.t.hs, p)
	p.t.mu.Unlock()
	return nil
}

func (p *peer) Write(ctx context.Context, op rdma.Op) error { return p.do(ctx, op, true) }

func (p *peer) Read(ctx context.Context, op rdma.Op) error { return p.do(ctx, op, false) }

func (p *peer) do(ctx context.Context, op rdma.Op, write bool) error {
	start := time.Now()
	err := p.transfer(ctx, op, write)
	p.c.Done(write, op.Len, time.Since(start), err)
	if err != nil {
		verb := "read"
		if write {
			verb = "write"
		}
		return fmt.Errorf("inproc %s %s (%s): %w", verb, p.addr, op, err)
	}
	return nil
}

func (p *peer) alive() (*Transport, error) {
	if p.closed.Load() || p.t.closed.Load() {
		return nil, rdma.ErrClosed
	}
	r := p.t.cfg.Network.lookup(p.addr)
	if r == nil || r.closed.Load() {
		return nil, rdma.ErrPeerLost
	}
	return r, nil
}

func (p *peer) transfer(ctx context.Context, op rdma.Op, write bool) error {
	if op.Len > p.t.cfg.MaxTransfer {
		return fmt.Errorf("%w: %d > %d", rdma.ErrTooLarge, op.Len, p.t.cfg.MaxTransfer)
	}
	if err := p.t.table.Check(op.Local, 0, false, op.LocalOff, op.Len); err != nil {
		return err
	}
	r, err := p.alive()
	if err != nil {
		return err
	}
	if err := r.table.Check(op.Remote.ID, op.Remote.Key, true, op.Remote.Addr+op.RemoteOff, op.Len); err != nil {
		if write {
			r.serve.Error()
		}
		return fmt.Errorf("remote: %w", err)
	}
	chunk := uint64(p.t.cfg.ChunkSize)
	var sum uint32 // CRC-32C of the bytes landed so far, for op.SumKnown
	for done := uint64(0); done < op.Len || (op.Len == 0 && done == 0); {
		if err := ctx.Err(); err != nil {
			return err
		}
		if r, err = p.alive(); err != nil {
			return err
		}
		n := min(chunk, op.Len-done)
		last := done+n == op.Len
		if err := p.copyChunk(r, op, done, n, write, last, &sum); err != nil {
			r.serve.Error()
			return err
		}
		if op.Len == 0 {
			break
		}
		done += n
	}
	if op.SumKnown && sum != op.Sum {
		return fmt.Errorf("%w: crc %08x, want %08x", rdma.ErrChecksum, sum, op.Sum)
	}
	return nil
}

// copyChunk moves one chunk and, for op.SumKnown, extends *sum with the
// bytes where they landed.
func (p *peer) copyChunk(r *Transport, op rdma.Op, done, n uint64, write, last bool, sum *uint32) error {
	ls, err := p.t.table.Acquire(op.Local, 0, false, op.LocalOff+done, n)
	if err != nil {
		return err
	}
	defer ls.Release()
	rs, err := r.table.Acquire(op.Remote.ID, op.Remote.Key, true, op.Remote.Addr+op.RemoteOff+done, n)
	if err != nil {
		return fmt.Errorf("remote: %w", err)
	}
	defer rs.Release()
	landed := ls.B
	if write {
		copy(rs.B, ls.B)
		r.serve.Applied(n, last)
		landed = rs.B
	} else {
		copy(ls.B, rs.B)
		r.serve.Sent(n, last)
	}
	if op.SumKnown {
		*sum = frame.UpdateChecksum(*sum, landed)
	}
	return nil
}
