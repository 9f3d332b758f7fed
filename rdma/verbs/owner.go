//go:build verbs

package verbs

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/tidepool-kv/tidepool/protocol/frame"
	"github.com/tidepool-kv/tidepool/rdma"
)

func (t *Transport) acceptLoop() {
	defer t.acceptW.Done()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := t.ln.Accept()
		if err != nil {
			return
		}
		t.mu.Lock()
		if t.closed.Load() {
			t.mu.Unlock()
			_ = c.Close()
			return
		}
		t.in[c] = struct{}{}
		t.mu.Unlock()
		t.serve.Conn(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.serveConn(c)
			t.mu.Lock()
			delete(t.in, c)
			t.mu.Unlock()
			t.serve.Conn(-1)
			_ = c.Close()
		}()
	}
}

// serveConn answers one initiator's control requests. The responder QPs it
// created die with the connection.
func (t *Transport) serveConn(c net.Conn) {
	qps := make(map[uint32]*qp)
	defer func() {
		for _, q := range qps {
			q.destroy()
			t.qps.Add(-1)
		}
	}()
	hello := false
	fails := 0
	for {
		_ = c.SetReadDeadline(time.Time{})
		typ, p, err := readMsg(c)
		if err != nil {
			return
		}
		_ = c.SetWriteDeadline(time.Now().Add(t.cfg.DialTimeout))
		fail := func(code byte, err error) bool {
			t.serve.Error()
			return writeMsg(c, msgErr, encodeErr(code, err.Error())) == nil
		}
		if !hello && typ != msgHello {
			_ = fail(errRefused, fmt.Errorf("%w: message %d before hello", rdma.ErrProtocol, typ))
			return
		}
		var werr error
		switch typ {
		case msgHello:
			if err := decodeHello(p); err != nil {
				_ = fail(errRefused, err)
				return
			}
			hello = true
			werr = writeMsg(c, msgOK, encodeHelloAnswer(len(t.devs)))
		case msgConnect:
			var dev *device
			m, err := decodeConnect(p)
			if err == nil {
				if i := int(m.dev); i < len(t.devs) {
					dev = t.devs[i]
				} else {
					err = fmt.Errorf("%w: device %d of %d", rdma.ErrProtocol, i, len(t.devs))
				}
			}
			if err != nil {
				if !fail(errRefused, err) {
					return
				}
				continue
			}
			if len(qps) >= t.cfg.MaxQPsServed {
				if !fail(errRefused, fmt.Errorf("%w: %d queue pairs already", rdma.ErrProtocol, len(qps))) {
					return
				}
				continue
			}
			q, err := dev.createQP(true, 1, randPSN())
			if err == nil {
				if err = dev.connect(q, m.conn, t.cfg.QPTimeout, t.cfg.QPRetry, 16); err != nil {
					q.destroy()
				}
			}
			if err != nil {
				if !fail(errInternal, err) {
					return
				}
				continue
			}
			qps[q.num] = q
			t.qps.Add(1)
			werr = writeMsg(c, msgOK, dev.local(q).encode())
		case msgDestroy:
			n, err := decodeDestroy(p)
			if err != nil {
				_ = fail(errRefused, err)
				return
			}
			if q := qps[n]; q != nil {
				q.destroy()
				delete(qps, n)
				t.qps.Add(-1)
			}
			werr = writeMsg(c, msgOK, nil)
		case msgCheck:
			m, err := decodeCheck(p)
			if err != nil {
				_ = fail(errRefused, err)
				return
			}
			code, err := t.check(m)
			if err != nil {
				if !fail(code, err) {
					return
				}
				continue
			}
			werr = writeMsg(c, msgOK, nil)
		case msgResolve:
			m, err := decodeResolve(p)
			if err != nil {
				_ = fail(errRefused, err)
				return
			}
			out, err := t.resolve(m)
			if err != nil {
				// Like the tcp port: a wrong name costs the asker time.
				fails++
				select {
				case <-time.After(min(time.Duration(fails)*100*time.Millisecond, time.Second)):
				case <-t.done:
					return
				}
				if !fail(errUnknown, err) {
					return
				}
				continue
			}
			werr = writeMsg(c, msgOK, out.encode())
		case msgStats:
			m, err := decodeStats(p)
			if err != nil {
				_ = fail(errRefused, err)
				return
			}
			t.serve.Reported(m.writes, m.reads, m.in, m.out)
			werr = writeMsg(c, msgOK, nil)
		case msgPing:
			werr = writeMsg(c, msgOK, nil)
		default:
			_ = fail(errRefused, fmt.Errorf("%w: unknown control message %d", rdma.ErrProtocol, typ))
			return
		}
		if werr != nil {
			return
		}
	}
}

// resolve answers the rkey, address and length of a region named by (id,
// key, base).
func (t *Transport) resolve(r resolveReq) (resolveAnswer, error) {
	id, key, base := r.id, r.key, r.base
	t.mrMu.RLock()
	m := t.mrs[id]
	t.mrMu.RUnlock()
	if m == nil {
		return resolveAnswer{}, fmt.Errorf("%w: %d", rdma.ErrUnknownRegion, id)
	}
	if err := t.table.Check(id, key, true, base, 0); err != nil {
		return resolveAnswer{}, fmt.Errorf("%w: %d", rdma.ErrUnknownRegion, id)
	}
	out := resolveAnswer{addr: m.addr, size: m.size, rkeys: make([]uint32, 0, len(m.per))}
	for _, x := range m.per {
		out.rkeys = append(out.rkeys, x.rkey)
	}
	return out, nil
}

// check verifies the CRC-32C of a range of a registered region, named the
// remote way (id, key, base+offset).
func (t *Transport) check(m checkReq) (byte, error) {
	id, key, addr, n, sum := m.id, m.key, m.addr, m.n, m.sum
	s, err := t.table.Acquire(id, key, true, addr, n)
	if err != nil {
		if errors.Is(err, rdma.ErrUnknownRegion) {
			return errUnknown, err
		}
		return errRange, err
	}
	got := frame.Checksum(s.B)
	s.Release()
	if got != sum {
		return errChecksum, fmt.Errorf("%w: write of %d bytes: crc %08x, want %08x", rdma.ErrChecksum, n, got, sum)
	}
	return 0, nil
}
