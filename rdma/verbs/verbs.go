// Package verbs is the rdma.Transport over RDMA verbs (libibverbs, RC queue
// pairs, one-sided RDMA READ and WRITE), with its own cgo binding.
//
// The binding needs libibverbs at build time and is behind the build tag
// "verbs": the default build compiles only this file and stub.go, whose New
// returns ErrNotBuilt, so it needs no RDMA library. A binary built with the
// tag still starts where no device exists: New returns ErrNoDevice
// (ibv_get_device_list returning none, or ENOSYS), and the caller falls back
// to TCP (Available says which).
//
// Model (docs/rdma.md):
//
//   - Addr is a TCP control endpoint. Connect dials it, authenticates both
//     ways with internal/peerauth (Config.Key, PurposeVerbs) and then
//     exchanges connection data (GID, QPN, PSN, MTU, LID) for each queue
//     pair: the initiator creates an RC QP, sends its data, the owner creates
//     its own QP, brings it INIT -> RTR -> RTS towards the initiator and
//     answers with its data; the initiator does the same. Queue pairs are
//     created on demand, at most Config.MaxQPsPerPeer per Peer handle (one
//     transfer at a time on each: the bound on outstanding transfers), kept
//     in a pool, and destroyed and rebuilt after any error completion. The
//     owner destroys every QP of a control connection when it closes (the
//     peer left).
//   - Register registers the buffer once with ibv_reg_mr; its descriptor is
//     (random 64-bit id, rkey, virtual address, length). Read and Write post
//     RDMA READ/WRITE work requests, cut into Config.SliceSize pieces, up to
//     Config.QueueDepth in flight per QP, straight between the registered
//     buffers: the owner's CPU does not touch the bytes.
//   - One goroutine per device, locked to its OS thread, polls the
//     completion queue in batches and sleeps on the completion channel when
//     it is empty.
//   - Checksums: a Read with Op.SumKnown checks the landed bytes against the
//     CRC-32C; a Write with Op.SumKnown asks the owner, over the control
//     connection, to check the written range. Without a sum the transport
//     relies on RoCE's ICRC (no software checksum).
//   - Deadlines: when ctx ends while work requests are posted, the QP is
//     moved to the error state, which flushes them; the call returns once
//     their completions arrived (the local range is no longer touched) and
//     the QP is rebuilt.
//   - Serve stats: the owner's CPU does not see one-sided transfers; each
//     initiator reports what it moved over the control connection, batched
//     every StatsInterval.
//
// # Files
//
// The binding is ibv.go (cgo). The transport, by concern: transport.go
// (Transport: New, Close, stats), regions.go (Register, RegisterAs,
// Deregister: one memory region per device), control.go (the control
// messages' codec), owner.go (the owner side of a control connection:
// accept, serve, resolve, check), peer.go (the initiator side: Connect,
// the control call, region resolution, stats reports), pool.go (a
// handle's queue pairs: get, connect, put, drop), transfer.go (Read and
// Write: slicing across devices, posting work requests, checksums),
// completion.go (each device's completion-queue poller), events.go
// (asynchronous events, device health), numa.go and numa_verbs.go (device
// order by NUMA node).
//
// # Locks
//
// Lock order (a lock may only be taken while holding locks listed before it):
//
//	Transport.life → peer.life → peer.ctlMu → peer.mu
//
// A transfer holds Transport.life and its handle's peer.life for reading
// from start to end; Transport.Close and peer.shutdown break every QP,
// then take them for writing to wait until no transfer touches a QP or a
// registered buffer. peer.ctlMu serializes the control connection and is
// held for a whole request and its answer (peer.call), during which call
// and markLost take peer.mu, which guards the handle's state: closed,
// lost, its QP pools and the set of its QPs.
//
// Leaves, never held while another lock is taken: Transport.mu (per-peer
// counters, open handles, inbound control connections), Transport.mrMu
// (registered regions), peer.rmu (resolved remote regions), devHealth.mu
// (event counts), device.mu (port state) and region.Table's locks. The
// event loop (onEvent) finds a QP in Transport.iqps and takes its peer.mu
// alone; the completion poller finds a transfer's channel in
// Transport.waiters (both sync.Maps) without a lock.
package verbs

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/tidepool-kv/tidepool/internal/peerauth"
)

// Sentinel errors.
var (
	// ErrNotBuilt: the binary was built without the "verbs" tag.
	ErrNotBuilt = errors.New("verbs: not built (build with -tags verbs)")
	// ErrNoDevice: no usable RDMA device (none, ENOSYS, the named one
	// missing, or its port not active).
	ErrNoDevice = errors.New("verbs: no RDMA device")
)

// Config configures a Transport. A zero field means its default (the
// value in DefaultConfig, applied by withDefaults), except where a field
// says zero is a value of its own (GIDIndex, QPTimeout, QPRetry); a
// negative value is an error unless a field says what it means.
type Config struct {
	// Device is the RDMA device to use ("rxe0", "mlx5_0"); empty: the
	// first device whose port is active.
	Device string
	// Devices, when set, lists several devices to use at once (Device is
	// then ignored): every region is registered with each, QPs are made
	// per peer and device (local device i with the owner's device i modulo
	// its count), and a transfer of at least SliceAcross bytes is cut into
	// one contiguous part per device, moved at once. Each must have an
	// active port.
	Devices []string
	// Port is the device port (1-based). Default 1.
	Port int
	// GIDIndex selects the GID; -1 (default): the first RoCE v2 GID with an
	// IPv4-mapped address, else the first RoCE v2 GID, else index 0 on
	// InfiniBand. Exception to zero = default: 0 is GID index 0 (a real
	// index), so a zero Config uses index 0, not auto; start from
	// DefaultConfig, or set -1, for auto. Below -1 is an error.
	GIDIndex int
	// ListenAddr is the TCP address of the control endpoint. Default
	// ":7951" (unless Listener is set).
	ListenAddr string
	// AdvertiseAddr is what Addr returns. Default: the listener's address.
	AdvertiseAddr string
	// Listener, when set, replaces listening on ListenAddr (test seam).
	Listener net.Listener
	// Key authenticates every control connection both ways; nil: insecure.
	Key *peerauth.Key
	// MaxQPsPerPeer bounds the QPs, hence concurrent transfers, of one Peer
	// handle. Default 16.
	MaxQPsPerPeer int
	// MaxQPsServed bounds the responder QPs one control connection may
	// ask for. Default 64.
	MaxQPsServed int
	// QueueDepth is the send queue depth of a QP: work requests in flight
	// per transfer. Default 16.
	QueueDepth int
	// SliceSize is the most bytes one work request moves. Default 1 MiB.
	// A summed read checks each slice as it lands while the next ones
	// move; cutting a 1 MiB block into 256 KiB slices for that did not pay
	// on Soft-RoCE (10 and 11 of 24 rounds won with 1 and 16 callers; docs/rdma.md).
	SliceSize int
	// MaxTransfer bounds Op.Len. Default 1 GiB.
	MaxTransfer uint64
	// DialTimeout bounds dialing, the handshake and each control exchange.
	// Default 3 s.
	DialTimeout time.Duration
	// IOTimeout bounds a transfer whose context has no deadline. Default
	// 30 s.
	IOTimeout time.Duration
	// QPTimeout and QPRetry are the RC ack timeout exponent (4.096 us *
	// 2^QPTimeout) and retry count. Defaults 14 and 7 (Mooncake's), in
	// DefaultConfig. Exception to zero = default: 0 is a valid value of
	// each (QPTimeout 0: the infinite ack timeout; QPRetry 0: no retry),
	// so a zero Config keeps them 0; start from DefaultConfig for 14 and 7.
	// QPTimeout must be in [0, 31], QPRetry in [0, 7].
	QPTimeout, QPRetry int
	// StatsInterval is how often an initiator reports its transfers to the
	// owner. Default 50 ms.
	StatsInterval time.Duration
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Port: 1, GIDIndex: -1, ListenAddr: ":7951",
		MaxQPsPerPeer: 16, MaxQPsServed: 64, QueueDepth: 16, SliceSize: 1 << 20,
		MaxTransfer: 1 << 30, DialTimeout: 3 * time.Second, IOTimeout: 30 * time.Second,
		QPTimeout: 14, QPRetry: 7, StatsInterval: 50 * time.Millisecond,
	}
}

// withDefaults fills the zero fields with their defaults: the one place a
// zero field becomes its default. GIDIndex, QPTimeout and QPRetry keep
// their zero (a real value each; see Config).
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Port == 0 {
		c.Port = d.Port
	}
	if c.ListenAddr == "" && c.Listener == nil {
		c.ListenAddr = d.ListenAddr
	}
	if c.MaxQPsPerPeer == 0 {
		c.MaxQPsPerPeer = d.MaxQPsPerPeer
	}
	if c.MaxQPsServed == 0 {
		c.MaxQPsServed = d.MaxQPsServed
	}
	if c.QueueDepth == 0 {
		c.QueueDepth = d.QueueDepth
	}
	if c.SliceSize == 0 {
		c.SliceSize = d.SliceSize
	}
	if c.MaxTransfer == 0 {
		c.MaxTransfer = d.MaxTransfer
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = d.DialTimeout
	}
	if c.IOTimeout == 0 {
		c.IOTimeout = d.IOTimeout
	}
	if c.StatsInterval == 0 {
		c.StatsInterval = d.StatsInterval
	}
	return c
}

// WithDefaults returns c with its zero fields defaulted (withDefaults), for
// configs that hold a verbs.Config (rdma/auto).
func (c Config) WithDefaults() Config { return c.withDefaults() }

// Validate reports every problem with c (after defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.Port < 1 || c.Port > 255 {
		errs = append(errs, fmt.Errorf("verbs: Port %d must be in [1, 255]", c.Port))
	}
	if len(c.Devices) > 32 {
		errs = append(errs, fmt.Errorf("verbs: %d Devices, at most 32", len(c.Devices)))
	}
	if c.GIDIndex < -1 {
		errs = append(errs, fmt.Errorf("verbs: GIDIndex %d must be >= -1", c.GIDIndex))
	}
	if c.ListenAddr == "" && c.Listener == nil {
		errs = append(errs, errors.New("verbs: ListenAddr or Listener is required"))
	}
	if c.MaxQPsPerPeer <= 0 || c.MaxQPsServed <= 0 {
		errs = append(errs, fmt.Errorf("verbs: MaxQPsPerPeer %d and MaxQPsServed %d must be > 0", c.MaxQPsPerPeer, c.MaxQPsServed))
	}
	if c.QueueDepth <= 0 || c.QueueDepth > 64 {
		errs = append(errs, fmt.Errorf("verbs: QueueDepth %d must be in [1, 64]", c.QueueDepth))
	}
	if c.SliceSize <= 0 || c.SliceSize > 1<<30 {
		errs = append(errs, fmt.Errorf("verbs: SliceSize %d must be in [1, 1 GiB]", c.SliceSize))
	}
	if c.MaxTransfer == 0 {
		errs = append(errs, errors.New("verbs: MaxTransfer must be > 0"))
	}
	if c.DialTimeout <= 0 || c.IOTimeout <= 0 || c.StatsInterval <= 0 {
		errs = append(errs, fmt.Errorf("verbs: DialTimeout %v, IOTimeout %v, StatsInterval %v must be > 0", c.DialTimeout, c.IOTimeout, c.StatsInterval))
	}
	if c.QPTimeout < 0 || c.QPTimeout > 31 || c.QPRetry < 0 || c.QPRetry > 7 {
		errs = append(errs, fmt.Errorf("verbs: QPTimeout %d must be in [0, 31], QPRetry %d in [0, 7]", c.QPTimeout, c.QPRetry))
	}
	return errors.Join(errs...)
}

// names lists the devices asked for (empty: any).
//
//lint:ignore U1000 used by the verbs build (ibv.go, transport.go)
func (c Config) names() []string {
	if len(c.Devices) > 0 {
		return c.Devices
	}
	if c.Device != "" {
		return []string{c.Device}
	}
	return nil
}

//lint:ignore U1000 used by the verbs build (ibv.go, transport.go)
func (c Config) wants(name string) bool {
	ns := c.names()
	if len(ns) == 0 {
		return true
	}
	for _, n := range ns {
		if n == name {
			return true
		}
	}
	return false
}

// DeviceInfo describes a device port as discovered at start.
type DeviceInfo struct {
	Name      string
	Port      int
	State     string // "PORT_ACTIVE", ...
	Active    bool
	LinkLayer string // "Ethernet" (RoCE) or "InfiniBand"
	ActiveMTU int    // bytes
	MaxMTU    int    // bytes
	LID       uint16
	NUMANode  int // -1: unknown (software devices)
	GIDIndex  int // the GID index chosen
	GID       [16]byte
	GIDs      []GIDEntry
	//lint:ignore U1000 used by the verbs build (ibv.go, transport.go)
	mtuEnum int
}

// DeviceHealth is a device's state as asynchronous events left it.
type DeviceHealth struct {
	Name     string
	NUMANode int
	// Usable: the port is active and no fatal event came; transfers use
	// only usable devices (none: they fail over to TCP in rdma/auto).
	Usable bool
	// Events counts asynchronous events by name (port_err, port_active,
	// qp_fatal, qp_req_err, qp_access_err, cq_err, device_fatal,
	// gid_change, ...).
	Events map[string]uint64
}

// GIDEntry is one populated GID table entry.
type GIDEntry struct {
	Index int
	GID   [16]byte
	Type  string // "RoCE v2", "RoCE v1", "IB"
}

//lint:ignore U1000 used by the verbs build (ibv.go, transport.go)
func (g GIDEntry) ipv4Mapped() bool {
	for _, b := range g.GID[:10] {
		if b != 0 {
			return false
		}
	}
	return g.GID[10] == 0xff && g.GID[11] == 0xff
}

// String renders a GID the way net.IP does.
func (g GIDEntry) String() string { return net.IP(g.GID[:]).String() }
