//go:build verbs

package verbs

import (
	"encoding/binary"
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
			msg := err.Error()
			if len(msg) > maxMsg-1 {
				msg = msg[:maxMsg-1]
			}
			return writeMsg(c, msgErr, append([]byte{code}, msg...)) == nil
		}
		if !hello && typ != msgHello {
			_ = fail(errRefused, fmt.Errorf("%w: message %d before hello", rdma.ErrProtocol, typ))
			return
		}
		var werr error
		switch typ {
		case msgHello:
			if len(p) != len(helloPayload)+1 || string(p[:4]) != helloPayload || p[4] != ctlVersion {
				_ = fail(errRefused, fmt.Errorf("%w: bad hello", rdma.ErrProtocol))
				return
			}
			hello = true
			werr = writeMsg(c, msgOK, []byte{byte(len(t.devs))})
		case msgConnect:
			var remote connData
			var dev *device
			err := fmt.Errorf("%w: connect of %d bytes", rdma.ErrProtocol, len(p))
			if len(p) == connDataLen+1 {
				if remote, err = decodeConnData(p[:connDataLen]); err == nil {
					if i := int(p[connDataLen]); i < len(t.devs) {
						dev = t.devs[i]
					} else {
						err = fmt.Errorf("%w: device %d of %d", rdma.ErrProtocol, i, len(t.devs))
					}
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
				if err = dev.connect(q, remote, t.cfg.QPTimeout, t.cfg.QPRetry, 16); err != nil {
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
			if len(p) != 4 {
				_ = fail(errRefused, fmt.Errorf("%w: destroy of %d bytes", rdma.ErrProtocol, len(p)))
				return
			}
			n := binary.BigEndian.Uint32(p)
			if q := qps[n]; q != nil {
				q.destroy()
				delete(qps, n)
				t.qps.Add(-1)
			}
			werr = writeMsg(c, msgOK, nil)
		case msgCheck:
			if len(p) != 32 {
				_ = fail(errRefused, fmt.Errorf("%w: check of %d bytes", rdma.ErrProtocol, len(p)))
				return
			}
			code, err := t.check(p)
			if err != nil {
				if !fail(code, err) {
					return
				}
				continue
			}
			werr = writeMsg(c, msgOK, nil)
		case msgResolve:
			if len(p) != 20 {
				_ = fail(errRefused, fmt.Errorf("%w: resolve of %d bytes", rdma.ErrProtocol, len(p)))
				return
			}
			out, err := t.resolve(p)
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
			werr = writeMsg(c, msgOK, out)
		case msgStats:
			if len(p) != 32 {
				_ = fail(errRefused, fmt.Errorf("%w: stats of %d bytes", rdma.ErrProtocol, len(p)))
				return
			}
			w, r := binary.BigEndian.Uint64(p), binary.BigEndian.Uint64(p[8:])
			bin, bout := binary.BigEndian.Uint64(p[16:]), binary.BigEndian.Uint64(p[24:])
			t.serve.Reported(w, r, bin, bout)
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
func (t *Transport) resolve(p []byte) ([]byte, error) {
	id := rdma.RegionID(binary.BigEndian.Uint64(p))
	key := binary.BigEndian.Uint32(p[8:])
	base := binary.BigEndian.Uint64(p[12:])
	t.mrMu.RLock()
	m := t.mrs[id]
	t.mrMu.RUnlock()
	if m == nil {
		return nil, fmt.Errorf("%w: %d", rdma.ErrUnknownRegion, id)
	}
	if err := t.table.Check(id, key, true, base, 0); err != nil {
		return nil, fmt.Errorf("%w: %d", rdma.ErrUnknownRegion, id)
	}
	out := make([]byte, 17, 17+4*len(m.per))
	binary.BigEndian.PutUint64(out, m.addr)
	binary.BigEndian.PutUint64(out[8:], m.size)
	out[16] = byte(len(m.per))
	for _, x := range m.per {
		out = binary.BigEndian.AppendUint32(out, x.rkey)
	}
	return out, nil
}

// check verifies the CRC-32C of a range of a registered region, named the
// remote way (id, key, base+offset).
func (t *Transport) check(p []byte) (byte, error) {
	id := rdma.RegionID(binary.BigEndian.Uint64(p))
	key := binary.BigEndian.Uint32(p[8:])
	addr := binary.BigEndian.Uint64(p[12:])
	n := binary.BigEndian.Uint64(p[20:])
	sum := binary.BigEndian.Uint32(p[28:])
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
