//go:build verbs

package verbs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/protocol/frame"
	"github.com/tidepool-kv/tidepool/rdma"
)

// Write implements rdma.Peer.
func (p *peer) Write(ctx context.Context, op rdma.Op) error { return p.do(ctx, op, true) }

// Read implements rdma.Peer.
func (p *peer) Read(ctx context.Context, op rdma.Op) error { return p.do(ctx, op, false) }

func (p *peer) do(ctx context.Context, op rdma.Op, write bool) error {
	start := time.Now()
	err := p.transfer(ctx, op, write)
	p.c.Done(write, op.Len, time.Since(start), err)
	if err == nil {
		if write {
			p.rWrites.Add(1)
			p.rIn.Add(op.Len)
		} else {
			p.rReads.Add(1)
			p.rOut.Add(op.Len)
		}
	}
	return err
}

func (p *peer) transfer(ctx context.Context, op rdma.Op, write bool) error {
	what := "read"
	if write {
		what = "write"
	}
	t := p.t
	t.life.RLock()
	defer t.life.RUnlock()
	p.life.RLock()
	defer p.life.RUnlock()
	if t.closed.Load() || p.isClosed() {
		return rdma.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("verbs: %s: %w", what, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.cfg.IOTimeout)
		defer cancel()
	}
	if op.Len > t.cfg.MaxTransfer {
		return fmt.Errorf("%w: %d bytes, at most %d", rdma.ErrTooLarge, op.Len, t.cfg.MaxTransfer)
	}
	if err := rdma.CheckRange(op.Remote.Len, op.RemoteOff, op.Len); err != nil {
		return fmt.Errorf("remote region %d: %w", op.Remote.ID, err)
	}
	span, err := t.table.Acquire(op.Local, 0, false, op.LocalOff, op.Len)
	if err != nil {
		return err
	}
	defer span.Release()
	t.mrMu.RLock()
	m := t.mrs[op.Local]
	t.mrMu.RUnlock()
	if m == nil || (op.Len > 0 && len(m.per) != len(t.devs)) {
		return fmt.Errorf("%w: %d", rdma.ErrUnknownRegion, op.Local)
	}
	rm, err := p.resolve(op.Remote)
	if err != nil {
		return err
	}
	if err := rdma.CheckRange(rm.size, op.RemoteOff, op.Len); err != nil {
		return fmt.Errorf("remote region %d: %w", op.Remote.ID, err)
	}
	// A summed read checks the bytes as its work requests complete (each
	// landed slice while the next ones are still moving), not after.
	var dst []byte
	if op.SumKnown && !write {
		dst = span.B
	}
	var got uint32
	if op.Len > 0 {
		var err error
		got, err = p.sliced(ctx, write, m, op.LocalOff, rm, op.RemoteOff, op.Len, dst)
		if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("verbs: %s: %w (%v)", what, ctx.Err(), err)
		}
		if err != nil {
			if errors.Is(err, rdma.ErrUnknownRegion) {
				// Deregistered on the owner since it was resolved.
				p.rmu.Lock()
				delete(p.resolved, op.Remote.ID)
				p.rmu.Unlock()
			}
			if p.isClosed() {
				return fmt.Errorf("%w: %v", rdma.ErrClosed, err)
			}
			if errors.Is(err, rdma.ErrPeerLost) {
				// Is the owner there at all? If not, later calls fail fast.
				_, _ = p.call(msgPing, nil)
			}
			return err
		}
	}
	if !op.SumKnown {
		return nil
	}
	if !write {
		if got != op.Sum {
			return fmt.Errorf("%w: read of %d bytes: crc %08x, want %08x", rdma.ErrChecksum, op.Len, got, op.Sum)
		}
		return nil
	}
	c := checkReq{id: op.Remote.ID, key: op.Remote.Key, addr: op.Remote.Addr + op.RemoteOff, n: op.Len, sum: op.Sum}
	_, err = p.call(msgCheck, c.encode())
	return err
}

// SliceAcross is the smallest transfer cut across several devices; parts
// are multiples of 4 KiB.
const SliceAcross = 64 << 10

// sliced runs one transfer on the usable devices, in the local region's
// NUMA order: cut into one contiguous part per device when there are
// several and it is at least SliceAcross long (Mooncake sprays slices over
// NICs the same way), each part on a QP of its device, all at once; a part
// that fails for a transport reason is moved again on another usable
// device (part); the first error that remains wins. With dst (the local
// range of a read) it returns the CRC-32C of the landed bytes, each part
// summed as its work requests complete and the parts combined.
func (p *peer) sliced(ctx context.Context, write bool, m *regMRs, loff uint64, rm remoteMR, roff, n uint64, dst []byte) (uint32, error) {
	devs := p.t.usable(m.order)
	if len(devs) == 0 {
		return 0, fmt.Errorf("%w: no usable RDMA device (ports down or failed)", rdma.ErrPeerLost)
	}
	parts := uint64(len(devs))
	if n < SliceAcross {
		parts = 1
	}
	step := (n/parts + 4095) &^ 4095
	if parts == 1 {
		step = n
	}
	type result struct {
		i   int
		crc uint32
		err error
	}
	res := make(chan result, parts)
	var launched int
	for i, off := 0, uint64(0); off < n; i, off = i+1, off+step {
		l := min(step, n-off)
		var part []byte
		if dst != nil {
			part = dst[off : off+l]
		}
		go func() {
			crc, err := p.part(ctx, write, m, loff+off, rm, roff+off, l, part, devs, i)
			res <- result{i: i, crc: crc, err: err}
		}()
		launched++
	}
	sums := make([]uint32, launched)
	var first error
	for k := 0; k < launched; k++ {
		r := <-res
		if r.err != nil && first == nil {
			first = r.err
		}
		sums[r.i] = r.crc
	}
	if first != nil || dst == nil {
		return 0, first
	}
	crc := sums[0]
	for i := 1; i < launched; i++ {
		crc = crcCombine(crc, sums[i], min(step, n-uint64(i)*step))
	}
	return crc, nil
}

// part moves one part on devs[first]; when that fails for a transport
// reason (an error completion, a QP that could not be made) and the owner
// still answers, it moves the whole part again on the next usable device,
// each at most once, before the error goes up (and auto falls back to
// TCP). A failed run has waited for its flushed completions, so the local
// range is no longer written when the next device rewrites it.
func (p *peer) part(ctx context.Context, write bool, m *regMRs, loff uint64, rm remoteMR, roff, n uint64, dst []byte, devs []int, first int) (uint32, error) {
	var err error
	for k := 0; k < len(devs); k++ {
		dev := devs[(first+k)%len(devs)]
		if k > 0 {
			if !p.t.health[dev].usable.Load() {
				continue
			}
			if ctx.Err() != nil || !(errors.Is(err, rdma.ErrPeerLost) || errors.Is(err, errQP)) {
				break
			}
			if _, perr := p.call(msgPing, nil); perr != nil {
				break // the owner is gone, not a device
			}
			p.t.sliceRetries.Add(1)
			p.t.lg.Warn("RDMA part failed: moving it on another device", zap.String("peer", p.addr),
				zap.String("failed", p.t.devs[devs[(first+k-1)%len(devs)]].cur().Name),
				zap.String("device", p.t.devs[dev].cur().Name), zap.Error(err))
		}
		q, gerr := p.get(ctx, dev)
		if gerr != nil {
			err = gerr
			continue
		}
		rkey := rm.rkeys[dev%len(rm.rkeys)]
		crc, rerr := p.run(ctx, q, write, m.addr+loff, m.per[dev].lkey, rm.addr+roff, rkey, n, dst)
		p.put(q, rerr == nil)
		if rerr == nil {
			return crc, nil
		}
		err = rerr
	}
	return 0, err
}

// usable returns the devices of order whose port is usable now.
func (t *Transport) usable(order []int) []int {
	out := make([]int, 0, len(order))
	for _, i := range order {
		if t.health[i].usable.Load() {
			out = append(out, i)
		}
	}
	return out
}

// run posts the transfer as work requests of at most SliceSize bytes,
// keeping up to QueueDepth in flight, and waits for every completion. When
// ctx ends first, the QP is moved to the error state so that the posted
// requests flush, and run still waits for their completions: when it
// returns, the device no longer touches the local range.
//
// With dst (the n local bytes of a read) it returns their CRC-32C, summing
// each slice as soon as its completion arrived: an RC send queue completes
// in order, so the slices are summed in order while later ones still move.
func (p *peer) run(ctx context.Context, q *iqp, write bool, laddr uint64, lkey uint32, raddr uint64, rkey uint32, n uint64, dst []byte) (uint32, error) {
	t := p.t
	depth := t.cfg.QueueDepth
	slice := uint64(t.cfg.SliceSize)
	id := t.wrID.Add(1)
	ch := make(chan wc, depth)
	t.waiters.Store(id, ch)
	defer t.waiters.Delete(id)

	total := int((n + slice - 1) / slice)
	posted, done := 0, 0
	var first error
	var crc uint32
	ctxDone := ctx.Done()
	var flushTimer <-chan time.Time
	ws := make([]wr, 0, depth)
	for {
		if first == nil && posted < total && posted-done < depth {
			ws = ws[:0]
			for posted+len(ws) < total && posted+len(ws)-done < depth && len(ws) < maxPost {
				i := uint64(posted + len(ws))
				l := min(slice, n-i*slice)
				ws = append(ws, mkWR(id, laddr+i*slice, raddr+i*slice, uint32(l), lkey, rkey))
			}
			if posted == 0 && t.testBreak != nil && t.testBreak(q.dev) {
				q.broken.Store(true)
				_ = q.q.toError() // what is posted now flushes
			}
			if err := q.q.post(write, ws); err != nil {
				first = fmt.Errorf("%w: %w", rdma.ErrPeerLost, err)
				_ = q.q.toError()
			} else {
				posted += len(ws)
			}
		}
		if done == posted && (first != nil || posted == total) {
			return crc, first
		}
		select {
		case w := <-ch:
			done++
			if w.status != wcSuccess && first == nil {
				first = statusErr(uint32(w.status), uint32(w.vendor_err), raddr, n)
			}
			if first == nil && dst != nil {
				i := uint64(done - 1)
				crc = frame.UpdateChecksum(crc, dst[i*slice:min((i+1)*slice, n)])
			}
		case <-ctxDone:
			ctxDone = nil
			if first == nil {
				first = fmt.Errorf("verbs: transfer of %d bytes: %w", n, ctx.Err())
			}
			_ = q.q.toError()
			flushTimer = time.After(10 * time.Second)
		case <-flushTimer:
			// The device never flushed: leave the QP broken (put destroys
			// it) rather than wait forever.
			t.lg.Error("queue pair did not flush", zap.Int("outstanding", posted-done))
			return 0, first
		}
	}
}

// statusErr maps an error completion to the rdma sentinels.
func statusErr(s, vendor uint32, raddr, n uint64) error {
	msg := fmt.Sprintf("work completion %s (vendor %#x)", wcStatusString(s), vendor)
	switch s {
	case wcRemAccessErr, wcRemInvReqErr:
		// The owner's device refused the rkey or the address: the region
		// is not registered there (any more), or the descriptor is wrong.
		return fmt.Errorf("%w: %s for %d bytes", rdma.ErrUnknownRegion, msg, n)
	case wcLocLenErr, wcLocProtErr:
		return fmt.Errorf("%w: %s", rdma.ErrProtocol, msg)
	default:
		return fmt.Errorf("%w: %s", rdma.ErrPeerLost, msg)
	}
}
