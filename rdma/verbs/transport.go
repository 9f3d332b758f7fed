//go:build verbs

package verbs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/tidepool-kv/tidepool/internal/peerauth"
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

// Transport is the verbs transport. Its lock order is in the package doc
// (verbs.go, "Locks").
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
	// Taking life for writing waits until every transfer has returned.
	t.life.Lock()
	//lint:ignore SA2001 the empty section is the wait
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
