//go:build verbs

package verbs

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/tidepool-kv/tidepool/internal/peerauth"
	"github.com/tidepool-kv/tidepool/protocol/frame"
	"github.com/tidepool-kv/tidepool/rdma"
	"github.com/tidepool-kv/tidepool/rdma/internal/counters"
	"github.com/tidepool-kv/tidepool/rdma/internal/region"
)

// Built reports whether the binary has the verbs binding.
const Built = true

// Probe lists the devices with an active port, as New would see them.
// ErrNoDevice when there are none.
func Probe(cfg Config) ([]DeviceInfo, error) {
	cfg = cfg.withDefaults() // Port 0: port 1
	names, err := listDevices()
	if err != nil {
		return nil, err
	}
	var out []DeviceInfo
	var errs []error
	for _, n := range names {
		if !cfg.wants(n) {
			continue
		}
		d, err := openDevice(n, cfg.Port, cfg.GIDIndex, 16)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, d.info)
		d.close()
	}
	if len(out) == 0 {
		if len(errs) > 0 {
			return nil, fmt.Errorf("%w: %w", ErrNoDevice, errors.Join(errs...))
		}
		return nil, fmt.Errorf("%w: %q not among %v", ErrNoDevice, cfg.names(), names)
	}
	return out, nil
}

// Transport is the verbs transport.
type Transport struct {
	cfg   Config
	lg    *zap.Logger
	devs  []*device // the devices in use; a transfer is sliced across them
	ln    *peerauth.Listener
	addr  string
	table *region.Table
	serve counters.Serve

	mrMu sync.RWMutex
	mrs  map[rdma.RegionID]*regMRs

	wrID    atomic.Uint64
	waiters sync.Map // wr_id -> chan wc

	// health is each device's state (by index), set by asynchronous
	// events; iqps finds an initiator QP by device and number for them.
	health       []*devHealth
	iqps         sync.Map // qpKey -> *iqp
	sliceRetries atomic.Uint64
	// testBreak, when set (tests), is asked before a part's first post
	// whether to move its QP to the error state (its work requests then
	// flush; on rxe a post runs the transfer inline, so later is too late).
	testBreak func(dev int) bool
	qps       atomic.Int64
	pollWG    sync.WaitGroup
	stopPol   atomic.Bool
	// wake is an eventfd the completion and event loops block on next to
	// their device fds (no timeout, so an idle transport never wakes);
	// Close makes it readable.
	wake    int
	acceptW sync.WaitGroup

	// life: transfers hold it for reading; Close takes it for writing once
	// it broke every QP, to wait them out before freeing the device.
	life   sync.RWMutex
	closed atomic.Bool
	done   chan struct{} // closed by Close
	mu     sync.Mutex
	peers  map[string]*counters.Peer
	hs     map[*peer]struct{}
	in     map[net.Conn]struct{}
}

var _ rdma.Transport = (*Transport)(nil)

// New opens the device, starts the completion poller and the control
// endpoint. ErrNoDevice when no usable device exists.
func New(cfg Config, lg *zap.Logger) (rdma.Transport, error) { return NewTransport(cfg, lg) }

// NewTransport is New returning the concrete type.
func NewTransport(cfg Config, lg *zap.Logger) (*Transport, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if lg == nil {
		lg = zap.NewNop()
	}
	lg = lg.Named("rdma.verbs")
	infos, err := Probe(cfg)
	if err != nil {
		return nil, err
	}
	var picks []string
	var active []DeviceInfo
	for _, d := range infos {
		switch {
		case d.Active && len(cfg.names()) > 0:
			picks = append(picks, d.Name)
		case d.Active:
			active = append(active, d)
		case len(cfg.names()) > 0:
			return nil, fmt.Errorf("%w: %s port %d is %s", ErrNoDevice, d.Name, d.Port, d.State)
		}
	}
	if len(active) > 0 {
		// None named: the first active device on this process's NUMA
		// node, else the first active one.
		nodes := make([]int, len(active))
		for i, d := range active {
			nodes[i] = d.NUMANode
		}
		picks = append(picks, active[preferNUMA(nodes, processNode())[0]].Name)
	}
	if len(picks) == 0 {
		return nil, fmt.Errorf("%w: no active port among %d device(s) (%s: %s)", ErrNoDevice, len(infos), infos[0].Name, infos[0].State)
	}
	cqSize := 4 * cfg.MaxQPsPerPeer * cfg.QueueDepth
	if cqSize < 256 {
		cqSize = 256
	}
	var devs []*device
	closeDevs := func() {
		for _, d := range devs {
			d.close()
		}
	}
	for _, name := range picks {
		dev, err := openDevice(name, cfg.Port, cfg.GIDIndex, cqSize)
		if err != nil {
			closeDevs()
			return nil, err
		}
		devs = append(devs, dev)
	}
	ln := cfg.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", cfg.ListenAddr); err != nil {
			closeDevs()
			return nil, fmt.Errorf("verbs: listen %s: %w", cfg.ListenAddr, err)
		}
	}
	t := &Transport{
		cfg: cfg, lg: lg, devs: devs, table: region.NewTable(), mrs: make(map[rdma.RegionID]*regMRs),
		health: make([]*devHealth, len(devs)),
		peers:  make(map[string]*counters.Peer), hs: make(map[*peer]struct{}), in: make(map[net.Conn]struct{}),
		done: make(chan struct{}),
	}
	t.ln = peerauth.NewListener(ln, peerauth.ListenerConfig{
		Key: cfg.Key, Purpose: peerauth.PurposeVerbs, MaxConns: 1024, HandshakeTimeout: cfg.DialTimeout,
	}, lg)
	t.addr = cfg.AdvertiseAddr
	if t.addr == "" {
		t.addr = ln.Addr().String()
	}
	if t.wake, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		_ = t.ln.Close()
		closeDevs()
		return nil, fmt.Errorf("verbs: eventfd: %w", err)
	}
	if err := forkInit(); err != nil {
		lg.Warn("ibv_fork_init failed: a child made by fork() may break registrations", zap.Error(err))
	}
	for i, dev := range devs {
		info := dev.cur()
		lg.Info("verbs transport up", zap.String("device", info.Name), zap.Int("port", info.Port),
			zap.String("link_layer", info.LinkLayer), zap.Int("gid_index", info.GIDIndex),
			zap.String("gid", net.IP(info.GID[:]).String()), zap.Int("mtu", info.ActiveMTU),
			zap.Int("numa_node", info.NUMANode), zap.String("fork_safety", ForkSafety()), zap.String("addr", t.addr))
		t.health[i] = &devHealth{events: map[string]uint64{}}
		t.health[i].usable.Store(true)
		t.pollWG.Add(2)
		go t.pollLoop(dev)
		go t.asyncLoop(i)
	}
	t.acceptW.Add(1)
	go t.acceptLoop()
	return t, nil
}

// Device returns what was discovered about the (first) device in use.
func (t *Transport) Device() DeviceInfo { return t.devs[0].cur() }

// Devices returns every device in use.
func (t *Transport) Devices() []DeviceInfo {
	out := make([]DeviceInfo, len(t.devs))
	for i, d := range t.devs {
		out[i] = d.cur()
	}
	return out
}

// QPs returns the number of queue pairs open now (initiator and responder).
func (t *Transport) QPs() int { return int(t.qps.Load()) }

// Addr implements rdma.Transport.
func (t *Transport) Addr() string { return t.addr }

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

// Stats implements rdma.Transport.
func (t *Transport) Stats() rdma.Stats {
	n, b := t.table.Len()
	t.mu.Lock()
	defer t.mu.Unlock()
	return counters.TransportStats(n, b, &t.serve, t.peers)
}

// Close breaks in-flight transfers, closes every handle and inbound control
// connection (destroying their QPs), deregisters every region and closes
// the device. Safe to call twice.
func (t *Transport) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	close(t.done)
	err := t.ln.Close()
	t.mu.Lock()
	hs := t.hs
	t.hs = map[*peer]struct{}{}
	for c := range t.in {
		_ = c.Close()
	}
	t.mu.Unlock()
	for p := range hs {
		p.shutdown()
	}
	t.acceptW.Wait()
	t.life.Lock() // every transfer has returned
	t.life.Unlock()
	t.stopPol.Store(true)
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = unix.Write(t.wake, one[:])
	t.pollWG.Wait()
	_ = unix.Close(t.wake)
	t.mrMu.Lock()
	for id, m := range t.mrs {
		_ = m.dereg()
		delete(t.mrs, id)
	}
	t.mrMu.Unlock()
	for _, d := range t.devs {
		d.close()
	}
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// pollLoop takes completions off the CQ in batches and hands each to the
// transfer that posted it; when the CQ is empty it arms it and sleeps on
// the completion channel. Locked to its thread: verbs polling wants one.
func (t *Transport) pollLoop(dev *device) {
	defer t.pollWG.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	buf := make([]wc, 32)
	for !t.stopPol.Load() {
		n, err := dev.poll(buf)
		if err != nil {
			t.lg.Error("poll_cq", zap.Error(err))
			return
		}
		t.dispatch(buf[:n])
		if n > 0 {
			continue
		}
		if err := dev.arm(); err != nil {
			t.lg.Error("arm cq", zap.Error(err))
			return
		}
		if n, _ = dev.poll(buf); n > 0 {
			t.dispatch(buf[:n])
			continue
		}
		if _, err := dev.wait(t.wake); err != nil {
			t.lg.Error("cq event", zap.Error(err))
			return
		}
	}
}

func (t *Transport) dispatch(ws []wc) {
	for _, w := range ws {
		if ch, ok := t.waiters.Load(uint64(w.wr_id)); ok {
			ch.(chan wc) <- w // buffered for every WR the transfer has in flight
		}
	}
}

// ---- control protocol ----

// Control messages: [type u8][len u16 BE][payload]. Requests go from the
// initiator to the owner; every request has one answer, msgOK (with a
// payload for msgConnect) or msgErr (code u8, text).
const (
	msgHello   = 1 // "TPVB" + version u8
	msgConnect = 2 // connData
	msgDestroy = 3 // qpn u32
	msgCheck   = 4 // id u64, key u32, addr u64, len u64, sum u32
	msgStats   = 5 // writes, reads, bytesIn, bytesOut: u64 each
	msgPing    = 6
	msgOK      = 7
	msgErr     = 8
	msgResolve = 9 // id u64, key u32, base u64 -> addr u64, len u64, n u8, n x rkey u32 (one per device)

	maxMsg       = 256
	ctlVersion   = 1
	connDataLen  = 16 + 4 + 4 + 1 + 2
	errUnknown   = 1
	errRange     = 2
	errChecksum  = 3
	errRefused   = 4
	errInternal  = 5
	helloPayload = "TPVB"
)

var codeErrs = map[byte]error{
	errUnknown: rdma.ErrUnknownRegion, errRange: rdma.ErrOutOfRange, errChecksum: rdma.ErrChecksum,
	errRefused: rdma.ErrProtocol, errInternal: rdma.ErrProtocol,
}

func writeMsg(w io.Writer, typ byte, payload []byte) error {
	if len(payload) > maxMsg {
		return fmt.Errorf("%w: control message of %d bytes", rdma.ErrProtocol, len(payload))
	}
	b := make([]byte, 3+len(payload))
	b[0] = typ
	binary.BigEndian.PutUint16(b[1:], uint16(len(payload)))
	copy(b[3:], payload)
	_, err := w.Write(b)
	return err
}

func readMsg(r io.Reader) (byte, []byte, error) {
	var h [3]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint16(h[1:]))
	if n > maxMsg {
		return 0, nil, fmt.Errorf("%w: control message of %d bytes", rdma.ErrProtocol, n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, err
	}
	return h[0], p, nil
}

func (d connData) encode() []byte {
	b := make([]byte, connDataLen)
	copy(b, d.GID[:])
	binary.BigEndian.PutUint32(b[16:], d.QPN)
	binary.BigEndian.PutUint32(b[20:], d.PSN)
	b[24] = d.MTU
	binary.BigEndian.PutUint16(b[25:], d.LID)
	return b
}

// decodeConnData parses and validates connection data from a peer.
func decodeConnData(b []byte) (connData, error) {
	var d connData
	if len(b) != connDataLen {
		return d, fmt.Errorf("%w: connection data of %d bytes, want %d", rdma.ErrProtocol, len(b), connDataLen)
	}
	copy(d.GID[:], b)
	d.QPN = binary.BigEndian.Uint32(b[16:])
	d.PSN = binary.BigEndian.Uint32(b[20:])
	d.MTU = b[24]
	d.LID = binary.BigEndian.Uint16(b[25:])
	switch {
	case d.QPN == 0 || d.QPN > 0xffffff:
		return d, fmt.Errorf("%w: QPN %#x out of range", rdma.ErrProtocol, d.QPN)
	case d.PSN > 0xffffff:
		return d, fmt.Errorf("%w: PSN %#x out of range", rdma.ErrProtocol, d.PSN)
	case d.MTU < 1 || d.MTU > 5:
		return d, fmt.Errorf("%w: MTU enum %d out of range", rdma.ErrProtocol, d.MTU)
	}
	return d, nil
}

func randPSN() uint32 {
	var b [4]byte
	_, _ = crand.Read(b[:])
	return binary.BigEndian.Uint32(b[:]) & 0xffffff
}

// ---- owner side ----

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

// ---- initiator side ----

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
	if err := writeMsg(nc, msgHello, append([]byte(helloPayload), ctlVersion)); err != nil {
		_ = nc.Close()
		return nil, 0, err
	}
	typ, p, err := readMsg(nc)
	switch {
	case err != nil:
	case typ != msgOK:
		err = fmt.Errorf("%w: hello refused: %s", rdma.ErrProtocol, msgText(p))
	case len(p) != 1 || p[0] == 0:
		err = fmt.Errorf("%w: hello answer of %d bytes", rdma.ErrProtocol, len(p))
	}
	if err != nil {
		_ = nc.Close()
		return nil, 0, err
	}
	_ = nc.SetDeadline(time.Time{})
	return nc, int(p[0]), nil
}

func msgText(p []byte) string {
	if len(p) < 1 {
		return ""
	}
	return string(p[1:])
}

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
		if len(rp) < 1 {
			return nil, fmt.Errorf("%w: empty error", rdma.ErrProtocol)
		}
		e, ok := codeErrs[rp[0]]
		if !ok {
			e = rdma.ErrProtocol
		}
		return nil, fmt.Errorf("remote: %w: %s", e, rp[1:])
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
	b := make([]byte, 32)
	binary.BigEndian.PutUint64(b, w)
	binary.BigEndian.PutUint64(b[8:], r)
	binary.BigEndian.PutUint64(b[16:], in)
	binary.BigEndian.PutUint64(b[24:], out)
	_, _ = p.call(msgStats, b)
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
	resp, err := p.call(msgConnect, append(d.local(q).encode(), byte(dev%p.rdevs)))
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
			b := make([]byte, 4)
			binary.BigEndian.PutUint32(b, remote.QPN)
			_, _ = p.call(msgDestroy, b)
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
		b := make([]byte, 4)
		binary.BigEndian.PutUint32(b, q.remote)
		_, _ = p.call(msgDestroy, b)
	}
}

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
	b := make([]byte, 32)
	binary.BigEndian.PutUint64(b, uint64(op.Remote.ID))
	binary.BigEndian.PutUint32(b[8:], op.Remote.Key)
	binary.BigEndian.PutUint64(b[12:], op.Remote.Addr+op.RemoteOff)
	binary.BigEndian.PutUint64(b[20:], op.Len)
	binary.BigEndian.PutUint32(b[28:], op.Sum)
	_, err = p.call(msgCheck, b)
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

// ---- asynchronous events ----

// devHealth is what asynchronous events said about a device.
type devHealth struct {
	usable atomic.Bool // port active and no fatal event
	fatal  atomic.Bool // device_fatal or cq_err: unusable until restart
	mu     sync.Mutex
	events map[string]uint64
}

func (h *devHealth) count(name string) {
	h.mu.Lock()
	h.events[name]++
	h.mu.Unlock()
}

// Health reports every device's state and its asynchronous events.
func (t *Transport) Health() []DeviceHealth {
	out := make([]DeviceHealth, len(t.devs))
	for i, d := range t.devs {
		h := t.health[i]
		info := d.cur()
		out[i] = DeviceHealth{Name: info.Name, NUMANode: info.NUMANode, Usable: h.usable.Load(), Events: map[string]uint64{}}
		h.mu.Lock()
		for k, v := range h.events {
			out[i].Events[k] = v
		}
		h.mu.Unlock()
	}
	return out
}

// SliceRetries counts parts moved again on another device after a
// transport failure on theirs.
func (t *Transport) SliceRetries() uint64 { return t.sliceRetries.Load() }

// asyncLoop reads the device's asynchronous events (each acknowledged at
// once) until Close, and acts on them (onEvent).
func (t *Transport) asyncLoop(i int) {
	defer t.pollWG.Done()
	dev := t.devs[i]
	for !t.stopPol.Load() {
		ev, ok, err := dev.asyncWait(t.wake)
		if err != nil {
			t.lg.Error("async events", zap.String("device", dev.cur().Name), zap.Error(err))
			return
		}
		if ok {
			t.onEvent(i, ev)
		}
	}
}

// onEvent: a port going down makes the device unusable for new transfers
// (transfers in flight end on RC retries or succeed); a port coming up, or
// a GID/LID change, re-queries the port (new GID for new QPs) and makes it
// usable again; a QP error marks that initiator QP broken and moves it to
// the error state, so its transfer fails now and the QP is rebuilt; a
// device or CQ fatal error makes the device unusable until restart and
// breaks its QPs. Every event is counted (Health).
func (t *Transport) onEvent(i int, ev asyncEvent) {
	dev, h := t.devs[i], t.health[i]
	h.count(ev.name)
	name := dev.cur().Name
	lg := t.lg.With(zap.String("device", name), zap.String("event", ev.name))
	switch ev.name {
	case "port_err":
		if ev.port == dev.cur().Port {
			h.usable.Store(false)
			lg.Warn("RDMA port down: device unusable until it comes back", zap.Int("port", ev.port))
		}
	case "port_active", "gid_change", "lid_change", "pkey_change", "sm_change", "client_reregister":
		if ev.port != dev.cur().Port {
			return
		}
		info, err := dev.refresh()
		switch {
		case err != nil:
			h.usable.Store(false)
			lg.Warn("RDMA port query after event failed: device unusable", zap.Error(err))
		case info.Active && !h.fatal.Load():
			h.usable.Store(true)
			lg.Info("RDMA port usable", zap.Int("gid_index", info.GIDIndex),
				zap.String("gid", net.IP(info.GID[:]).String()), zap.Int("mtu", info.ActiveMTU))
		case !info.Active:
			h.usable.Store(false)
		}
	case "qp_fatal", "qp_req_err", "qp_access_err", "path_mig_err":
		if v, ok := t.iqps.Load(qpKey{i, ev.qpn}); ok {
			q := v.(*iqp)
			q.p.mu.Lock()
			if _, live := q.p.all[q]; live {
				q.broken.Store(true)
				_ = q.q.toError()
			}
			q.p.mu.Unlock()
		}
		lg.Warn("RDMA queue pair failed: rebuilt on next use", zap.Uint32("qpn", ev.qpn))
	case "cq_err", "device_fatal":
		h.fatal.Store(true)
		h.usable.Store(false)
		t.iqps.Range(func(k, v any) bool {
			if k.(qpKey).dev == i {
				q := v.(*iqp)
				q.p.mu.Lock()
				if _, live := q.p.all[q]; live {
					q.broken.Store(true)
					_ = q.q.toError()
				}
				q.p.mu.Unlock()
			}
			return true
		})
		lg.Error("RDMA device failed: unusable until restart")
	default:
		lg.Debug("RDMA asynchronous event")
	}
}

// memNode is the NUMA node of b's first page (registered, so present),
// or -1.
func memNode(b []byte) int {
	if len(b) == 0 {
		return -1
	}
	var node int32
	const mpolFNode, mpolFAddr = 1, 2
	_, _, e := unix.Syscall6(unix.SYS_GET_MEMPOLICY, uintptr(unsafe.Pointer(&node)), 0, 0,
		uintptr(unsafe.Pointer(&b[0])), mpolFNode|mpolFAddr, 0)
	if e != 0 {
		return -1
	}
	return int(node)
}

// processNode is the NUMA node of the CPU this thread runs on, or -1.
func processNode() int {
	var cpu, node uint32
	_, _, e := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), uintptr(unsafe.Pointer(&node)), 0)
	if e != 0 {
		return -1
	}
	return int(node)
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
	b := make([]byte, 20)
	binary.BigEndian.PutUint64(b, uint64(d.ID))
	binary.BigEndian.PutUint32(b[8:], d.Key)
	binary.BigEndian.PutUint64(b[12:], d.Addr)
	out, err := p.call(msgResolve, b)
	if err != nil {
		return r, err
	}
	if len(out) < 17 || out[16] == 0 || len(out) != 17+4*int(out[16]) {
		return r, fmt.Errorf("%w: resolve answer of %d bytes", rdma.ErrProtocol, len(out))
	}
	r = remoteMR{key: d.Key, base: d.Addr, addr: binary.BigEndian.Uint64(out), size: binary.BigEndian.Uint64(out[8:])}
	for i := 0; i < int(out[16]); i++ {
		r.rkeys = append(r.rkeys, binary.BigEndian.Uint32(out[17+4*i:]))
	}
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
