// Package cluster is tidepool's view of its peers: gossip membership
// (hashicorp/memberlist; this is the only package that imports it), the
// versioned node metadata every node announces, and placement of keys onto
// members (Ring).
//
// memberlist's delegates never block here: they copy what they are given and
// hand it to a buffered channel consumed by one event loop, which keeps the
// member table and fans events out to subscribers. A graceful leave is
// announced first (a leaving message sent to every peer, and the Leaving
// flag in the node metadata) and only then performed, so that peers report
// the node as StateLeft rather than StateFailed.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/internal/peerauth"
)

// DefaultPort is the gossip port used when a Join entry names none.
const DefaultPort = 7946

// Errors.
var (
	ErrClosed     = errors.New("cluster: closed")
	ErrNotStarted = errors.New("cluster: not started")
	ErrJoin       = errors.New("cluster: join failed")
	ErrRefused    = errors.New("cluster: peer refused")
)

// Config configures a Cluster. Start from DefaultConfig or
// DefaultLocalConfig; durations are wall-clock.
type Config struct {
	// NodeName is this node's unique name in the cluster. Default: the host
	// name (a pod name in Kubernetes).
	NodeName string
	// BindAddr is the IP gossip listens on (TCP and UDP). Default "0.0.0.0".
	BindAddr string
	// BindPort is the gossip port; 0 picks a free one. Default 7946.
	BindPort int
	// AdvertiseAddr/AdvertisePort are what peers use to reach this node.
	// Default: derived from the bind address (first private IP for
	// 0.0.0.0) and BindPort.
	AdvertiseAddr string
	AdvertisePort int
	// Join lists addresses or DNS names of existing members ("host" or
	// "host:port", default port DefaultPort). Names resolve to all their
	// addresses: a Kubernetes headless Service resolves to every pod.
	Join []string
	// JoinRetryInterval is the pause between join rounds in Start, and the
	// first pause of the background join (BackgroundJoin). Default 1 s.
	JoinRetryInterval time.Duration
	// BackgroundJoin makes Start try one round of joins and return even when
	// no peer answered; joining then goes on in the background, the pause
	// doubling from JoinRetryInterval up to JoinRetryMax (each failed round
	// logged), until some other member is live — found by this node, or
	// one that joined it. After that the Join names are resolved again
	// every JoinRefreshInterval and addresses that are not live members
	// are joined, which merges nodes that started at the same moment and
	// each found only itself. This node's own address is skipped, so a
	// name that resolves to every pod, this one included, works (a
	// Kubernetes headless Service). Default false: Start retries until a
	// peer answers or ctx ends.
	BackgroundJoin bool
	// JoinRetryMax caps the background join's pause. Default 30 s.
	JoinRetryMax time.Duration
	// JoinWait bounds how long Start waits for the first background round:
	// a round dials every address in turn, and addresses of pods that are
	// gone may each take TCPTimeout. Past it Start returns and the round
	// finishes in the background. Default 5 s.
	JoinWait time.Duration
	// JoinRefreshInterval is how often a joined node resolves the Join
	// names again (BackgroundJoin only). Default 30 s; negative disables.
	JoinRefreshInterval time.Duration
	// SecretKey enables gossip encryption (AES, 16, 24 or 32 bytes; all
	// members must share it). Default none.
	SecretKey []byte
	// Label is the cluster label: packets and streams from members with
	// another label are refused. Default "" (no label).
	Label string
	// Auth, when set, signs this node's metadata with the cluster secret
	// (HMAC-SHA256 over the node name and the metadata) and refuses every
	// member whose metadata does not carry a valid signature: holding the
	// gossip key (SecretKey) is not enough to become a member. All
	// members must agree on it. Default nil (unsigned).
	Auth *peerauth.Key
	// Meta is this node's initial metadata. NodeID defaults to NodeName and
	// Protocol to ProtocolVersion.
	Meta Meta

	// Failure detection and gossip timings (see memberlist.Config).
	// Defaults are memberlist's LAN defaults.
	ProbeInterval    time.Duration // default 1 s
	ProbeTimeout     time.Duration // default 500 ms
	SuspicionMult    int           // default 4
	GossipInterval   time.Duration // default 200 ms
	GossipNodes      int           // default 3
	PushPullInterval time.Duration // default 30 s
	TCPTimeout       time.Duration // default 10 s
	RetransmitMult   int           // default 4
	IndirectChecks   int           // default 3
	// DeadNodeReclaimTime lets a dead node's name be taken by a new address
	// after this long (a restarted pod with a new IP). Default 10 s.
	DeadNodeReclaimTime time.Duration

	// EventBuffer is the capacity, in events, of the delegate hand-off
	// channel and of each subscriber channel. Default 4096.
	EventBuffer int
	// Tombstone is how long left and failed members stay in Members.
	// Default 10 min.
	Tombstone time.Duration
	// ReconnectInterval is how often this node tries to join members it
	// holds as failed (not left), so that a healed network partition merges
	// back: memberlist itself never probes a node it declared dead. 0 takes
	// the default, 10 s; negative disables. Attempts stop when the member's
	// tombstone expires.
	ReconnectInterval time.Duration
	// LogOutput receives memberlist's own log lines (bridge it to zap in
	// cmd/). Default: discarded.
	LogOutput io.Writer
	// LookupHost resolves a Join name to addresses. Default
	// net.DefaultResolver.LookupHost. A test seam.
	LookupHost func(ctx context.Context, host string) ([]string, error)
}

// DefaultConfig returns production defaults for a LAN.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		NodeName:            host,
		BindAddr:            "0.0.0.0",
		BindPort:            DefaultPort,
		JoinRetryInterval:   time.Second,
		JoinRetryMax:        30 * time.Second,
		JoinWait:            5 * time.Second,
		JoinRefreshInterval: 30 * time.Second,
		ProbeInterval:       time.Second,
		ProbeTimeout:        500 * time.Millisecond,
		SuspicionMult:       4,
		GossipInterval:      200 * time.Millisecond,
		GossipNodes:         3,
		PushPullInterval:    30 * time.Second,
		TCPTimeout:          10 * time.Second,
		RetransmitMult:      4,
		IndirectChecks:      3,
		DeadNodeReclaimTime: 10 * time.Second,
		EventBuffer:         4096,
		Tombstone:           10 * time.Minute,
		ReconnectInterval:   10 * time.Second,
	}
}

// DefaultLocalConfig is DefaultConfig for tests on loopback: a free port on
// 127.0.0.1 and fast probing (a dead node is noticed in about a second).
func DefaultLocalConfig(name string) Config {
	c := DefaultConfig()
	c.NodeName = name
	c.BindAddr = "127.0.0.1"
	c.BindPort = 0
	c.JoinRetryInterval = 100 * time.Millisecond
	c.JoinRetryMax = time.Second
	c.JoinWait = time.Second
	c.JoinRefreshInterval = time.Second
	c.ProbeInterval = 200 * time.Millisecond
	c.ProbeTimeout = 150 * time.Millisecond
	c.SuspicionMult = 3
	c.GossipInterval = 50 * time.Millisecond
	c.PushPullInterval = 500 * time.Millisecond
	c.TCPTimeout = time.Second
	c.RetransmitMult = 3
	c.IndirectChecks = 2
	c.DeadNodeReclaimTime = time.Second
	c.ReconnectInterval = 500 * time.Millisecond
	return c
}

// Validate reports every problem with c.
func (c Config) Validate() error {
	var errs []error
	bad := func(f string, a ...any) { errs = append(errs, fmt.Errorf("cluster: "+f, a...)) }
	if c.NodeName == "" {
		bad("NodeName is required")
	}
	if c.BindAddr == "" || net.ParseIP(c.BindAddr) == nil {
		bad("BindAddr %q must be an IP address", c.BindAddr)
	}
	if c.BindPort < 0 || c.BindPort > 65535 {
		bad("BindPort %d out of range", c.BindPort)
	}
	if c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		bad("AdvertisePort %d out of range", c.AdvertisePort)
	}
	if c.AdvertiseAddr != "" && net.ParseIP(c.AdvertiseAddr) == nil {
		bad("AdvertiseAddr %q must be an IP address", c.AdvertiseAddr)
	}
	for _, j := range c.Join {
		if j == "" {
			bad("empty Join entry")
		}
	}
	if n := len(c.SecretKey); n != 0 && n != 16 && n != 24 && n != 32 {
		bad("SecretKey is %d bytes, want 16, 24 or 32", n)
	}
	if len(c.Label) > memberlist.LabelMaxSize {
		bad("Label is %d bytes, max %d", len(c.Label), memberlist.LabelMaxSize)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"JoinRetryInterval", c.JoinRetryInterval}, {"JoinRetryMax", c.JoinRetryMax}, {"JoinWait", c.JoinWait}, {"ProbeInterval", c.ProbeInterval},
		{"ProbeTimeout", c.ProbeTimeout}, {"GossipInterval", c.GossipInterval},
		{"PushPullInterval", c.PushPullInterval}, {"TCPTimeout", c.TCPTimeout},
		{"DeadNodeReclaimTime", c.DeadNodeReclaimTime}, {"Tombstone", c.Tombstone},
	} {
		if d.v <= 0 {
			bad("%s %v must be > 0", d.name, d.v)
		}
	}
	if c.JoinRetryMax < c.JoinRetryInterval && c.JoinRetryMax > 0 {
		bad("JoinRetryMax %v must not be below JoinRetryInterval %v", c.JoinRetryMax, c.JoinRetryInterval)
	}
	if c.JoinRefreshInterval == 0 {
		bad("JoinRefreshInterval must be > 0 (negative disables)")
	}
	if c.ProbeTimeout > c.ProbeInterval && c.ProbeInterval > 0 {
		bad("ProbeTimeout %v must not exceed ProbeInterval %v", c.ProbeTimeout, c.ProbeInterval)
	}
	for _, n := range []struct {
		name string
		v    int
	}{
		{"SuspicionMult", c.SuspicionMult}, {"GossipNodes", c.GossipNodes},
		{"RetransmitMult", c.RetransmitMult}, {"EventBuffer", c.EventBuffer},
	} {
		if n.v <= 0 {
			bad("%s %d must be > 0", n.name, n.v)
		}
	}
	if c.IndirectChecks < 0 {
		bad("IndirectChecks %d must be >= 0", c.IndirectChecks)
	}
	m := c.meta()
	if _, err := m.Encode(); err != nil {
		errs = append(errs, fmt.Errorf("cluster: Meta: %w", err))
	}
	return errors.Join(errs...)
}

func (c Config) meta() Meta {
	m := c.Meta
	if m.NodeID == "" {
		m.NodeID = c.NodeName
	}
	if m.Protocol == 0 {
		m.Protocol = ProtocolVersion
	}
	m.Tiers = slices.Clone(m.Tiers)
	return m
}

// State is a member's state as this node sees it.
type State uint8

// States.
const (
	// StateAlive: a member in good standing.
	StateAlive State = iota + 1
	// StateSuspect: reserved. memberlist v0.7.0 has no suspicion event, so
	// a suspected member reads as alive until it is declared failed.
	StateSuspect
	// StateLeaving: announced a graceful leave (Meta.Leaving) and is
	// draining; route nothing new to it.
	StateLeaving
	// StateLeft: left gracefully.
	StateLeft
	// StateFailed: stopped answering (crash, kill, partition) without
	// announcing a leave.
	StateFailed
)

// String names a state.
func (s State) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateSuspect:
		return "suspect"
	case StateLeaving:
		return "leaving"
	case StateLeft:
		return "left"
	case StateFailed:
		return "failed"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Live reports whether a member in this state should own keys.
func (s State) Live() bool { return s == StateAlive || s == StateSuspect }

// Member is one node as this node sees it.
type Member struct {
	Name  string
	Addr  string // gossip host:port
	Meta  Meta
	State State
	Since time.Time // when State last changed, by this node's clock
	Local bool      // this node
}

// EventKind says what changed.
type EventKind uint8

// Event kinds.
const (
	EventJoin   EventKind = iota + 1 // a member appeared (or came back)
	EventUpdate                      // a member's metadata changed (incl. Leaving)
	EventLeft                        // a member left gracefully
	EventFailed                      // a member failed
)

// String names an event kind.
func (k EventKind) String() string {
	switch k {
	case EventJoin:
		return "join"
	case EventUpdate:
		return "update"
	case EventLeft:
		return "left"
	case EventFailed:
		return "failed"
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// Event is a change of one member. Seq increases by one per event the
// cluster publishes; a subscriber that sees a gap missed events (its buffer
// was full) and should re-read Members.
type Event struct {
	Seq    uint64
	Kind   EventKind
	Member Member
}

// Stats counts membership activity.
type Stats struct {
	Members      int    // members in the table (all states)
	Live         int    // members with State.Live
	Events       uint64 // events published
	Dropped      uint64 // events dropped by full subscriber buffers
	HandoffDrops uint64 // delegate notifications dropped (table resynced)
	RefusedPeers uint64 // alive messages or merges refused (label, protocol, metadata)
	JoinRounds   uint64 // join rounds made (Start and the background join)
	JoinFailures uint64 // of those, rounds where no address answered
	MetaUpdates  uint64 // local metadata updates
}

// Cluster is this node's membership. Safe for concurrent use.
type Cluster struct {
	cfg Config
	lg  *zap.Logger

	proto     uint16                 // our protocol version; peers must match
	metaBytes atomic.Pointer[[]byte] // what NodeMeta returns
	metaMu    sync.Mutex             // serialises UpdateMeta and Leave
	meta      Meta                   // guarded by metaMu

	handoff  chan nodeEvent // delegates -> loop
	resync   atomic.Bool    // a hand-off was dropped
	kick     chan struct{}  // wakes the loop for a resync
	ml       atomic.Pointer[memberlist.Memberlist]
	addr     atomic.Pointer[string] // advertised gossip address, set by Start
	started  atomic.Bool
	closed   atomic.Bool
	stop     chan struct{}
	loopDone chan struct{}
	reconn   sync.WaitGroup // the reconnect and background join loops

	mu      sync.RWMutex // guards members, subs, seq
	members map[string]*Member
	subs    map[*subscriber]struct{}
	seq     uint64

	events, dropped, handoffDrops, refused, metaUpdates atomic.Uint64
	joinRounds, joinFailures                            atomic.Uint64
}

type subscriber struct{ ch chan Event }

type nodeEvent struct {
	kind EventKind // EventJoin, EventUpdate or EventLeft (memberlist's leave: left or failed)
	name string
	addr string
	meta []byte
	at   time.Time
}

// New validates cfg and builds a Cluster; Start joins.
func New(cfg Config, lg *zap.Logger) (*Cluster, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if lg == nil {
		lg = zap.NewNop()
	}
	cfg.Join = slices.Clone(cfg.Join)
	cfg.SecretKey = slices.Clone(cfg.SecretKey)
	c := &Cluster{
		cfg:      cfg,
		lg:       lg.Named("cluster"),
		meta:     cfg.meta(),
		handoff:  make(chan nodeEvent, cfg.EventBuffer),
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		loopDone: make(chan struct{}),
		members:  make(map[string]*Member),
		subs:     make(map[*subscriber]struct{}),
	}
	c.proto = c.meta.Protocol
	b, err := c.meta.Encode()
	if err != nil {
		return nil, err
	}
	if b, err = c.sign(b); err != nil {
		return nil, err
	}
	c.metaBytes.Store(&b)
	return c, nil
}

// Start creates the gossip endpoint, starts the event loop and joins
// cfg.Join (if any). It retries rounds of joins every JoinRetryInterval until
// one address answers or ctx ends; on failure it returns an error wrapping
// ErrJoin, and the node keeps running on its own (call Join again, or Close).
// With BackgroundJoin it makes one round (waiting for it at most JoinWait,
// or until ctx ends) and returns nil whatever the outcome; joining goes on
// in the background until Close.
func (c *Cluster) Start(ctx context.Context) error {
	if c.closed.Load() {
		return ErrClosed
	}
	if c.started.Swap(true) {
		return errors.New("cluster: already started")
	}
	mc := memberlist.DefaultLANConfig()
	mc.Name = c.cfg.NodeName
	mc.BindAddr = c.cfg.BindAddr
	mc.BindPort = c.cfg.BindPort
	mc.AdvertiseAddr = c.cfg.AdvertiseAddr
	mc.AdvertisePort = c.cfg.AdvertisePort
	if mc.AdvertisePort == 0 {
		mc.AdvertisePort = c.cfg.BindPort
	}
	mc.Label = c.cfg.Label
	if len(c.cfg.SecretKey) > 0 {
		mc.SecretKey = c.cfg.SecretKey
	}
	mc.ProbeInterval = c.cfg.ProbeInterval
	mc.ProbeTimeout = c.cfg.ProbeTimeout
	mc.SuspicionMult = c.cfg.SuspicionMult
	mc.GossipInterval = c.cfg.GossipInterval
	mc.GossipNodes = c.cfg.GossipNodes
	mc.PushPullInterval = c.cfg.PushPullInterval
	mc.TCPTimeout = c.cfg.TCPTimeout
	mc.RetransmitMult = c.cfg.RetransmitMult
	mc.IndirectChecks = c.cfg.IndirectChecks
	mc.DeadNodeReclaimTime = c.cfg.DeadNodeReclaimTime
	mc.GossipToTheDeadTime = max(2*c.cfg.PushPullInterval, 5*c.cfg.ProbeInterval)
	d := delegate{c: c}
	mc.Delegate = d
	mc.Events = d
	mc.Alive = d
	mc.Merge = d
	out := c.cfg.LogOutput
	if out == nil {
		out = io.Discard
	}
	mc.Logger = log.New(out, "", log.LstdFlags)

	go c.loop()
	ml, err := memberlist.Create(mc)
	if err != nil {
		close(c.stop)
		<-c.loopDone
		c.closed.Store(true)
		return fmt.Errorf("cluster: start gossip on %s:%d: %w", c.cfg.BindAddr, c.cfg.BindPort, err)
	}
	n := ml.LocalNode() // read once: memberlist rewrites it on updates
	addr := net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
	c.addr.Store(&addr)
	c.ml.Store(ml)
	c.lg.Info("gossip started", zap.String("node", c.cfg.NodeName), zap.String("addr", c.Addr()))
	if iv := c.cfg.ReconnectInterval; iv >= 0 {
		if iv == 0 {
			iv = DefaultConfig().ReconnectInterval
		}
		c.reconn.Add(1)
		go c.reconnect(iv)
	}
	if len(c.cfg.Join) == 0 {
		return nil
	}
	if c.cfg.BackgroundJoin {
		first := make(chan struct{})
		c.reconn.Add(1)
		go func() {
			defer c.reconn.Done()
			// Name lookups end with Close.
			base, stop := context.WithCancel(context.Background())
			defer stop()
			go func() {
				select {
				case <-c.stop:
					stop()
				case <-base.Done():
				}
			}()
			lctx, cancel := context.WithTimeout(base, c.cfg.TCPTimeout)
			n, err := c.joinRound(lctx, false)
			cancel()
			if err == nil {
				c.lg.Info("joined", zap.Int("contacted", n))
			} else {
				c.lg.Warn("join failed; retrying in the background", zap.Strings("join", c.cfg.Join),
					zap.Duration("retry_in", c.cfg.JoinRetryInterval), zap.Error(err))
			}
			close(first)
			c.joinLoop(base)
		}()
		t := time.NewTimer(c.cfg.JoinWait)
		defer t.Stop()
		select {
		case <-first:
		case <-t.C:
			c.lg.Warn("first join round still running; going on without it", zap.Strings("join", c.cfg.Join), zap.Duration("join_wait", c.cfg.JoinWait))
		case <-ctx.Done():
		}
		return nil
	}
	for {
		n, err := c.Join(ctx, c.cfg.Join)
		c.joinRounds.Add(1)
		if err != nil {
			c.joinFailures.Add(1)
		}
		if err == nil {
			c.lg.Info("joined", zap.Int("contacted", n))
			return nil
		}
		c.lg.Warn("join failed, retrying", zap.Error(err))
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w (last: %v)", ErrJoin, ctx.Err(), err)
		case <-c.stop:
			return ErrClosed
		case <-time.After(c.cfg.JoinRetryInterval):
		}
	}
}

// reconnect periodically joins members held as failed, one at a time, so
// that the two sides of a healed partition merge again (serf's reconnect).
// A member that left gracefully is never contacted again.
func (c *Cluster) reconnect(every time.Duration) {
	defer c.reconn.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		ml := c.ml.Load()
		if ml == nil || c.closed.Load() {
			continue
		}
		var addrs []string
		c.mu.RLock()
		for _, m := range c.members {
			if m.State == StateFailed && !m.Local && m.Addr != "" {
				addrs = append(addrs, m.Addr)
			}
		}
		c.mu.RUnlock()
		for _, a := range addrs {
			select {
			case <-c.stop:
				return
			default:
			}
			if n, err := ml.Join([]string{a}); err == nil && n > 0 {
				c.lg.Info("reconnected to a failed member", zap.String("addr", a))
			}
		}
	}
}

// hasPeer reports whether some other member is live.
func (c *Cluster) hasPeer() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, m := range c.members {
		if !m.Local && m.State.Live() {
			return true
		}
	}
	return false
}

// joinRound resolves cfg.Join and joins every address other than this
// node's own; with onlyNew, live members' addresses are skipped too (and
// finding nothing to join is no error). It returns how many answered.
func (c *Cluster) joinRound(ctx context.Context, onlyNew bool) (int, error) {
	ml := c.ml.Load()
	if ml == nil {
		return 0, ErrNotStarted
	}
	c.joinRounds.Add(1)
	targets, rerr := c.resolve(ctx, c.cfg.Join)
	skip := map[string]bool{c.Addr(): true}
	if onlyNew {
		c.mu.RLock()
		for _, m := range c.members {
			if m.State.Live() {
				skip[m.Addr] = true
			}
		}
		c.mu.RUnlock()
	}
	targets = slices.DeleteFunc(targets, func(a string) bool { return skip[a] })
	if len(targets) == 0 {
		if onlyNew && rerr == nil {
			return 0, nil
		}
		c.joinFailures.Add(1)
		if rerr == nil {
			rerr = errors.New("the names resolve to this node only")
		}
		return 0, fmt.Errorf("%w: no other address to join: %w", ErrJoin, rerr)
	}
	n, err := ml.Join(targets)
	if n == 0 {
		c.joinFailures.Add(1)
		return 0, fmt.Errorf("%w: %v", ErrJoin, errors.Join(err, rerr))
	}
	return n, nil
}

// joinLoop is the background join (BackgroundJoin; ctx ends with Close): it retries with a
// doubling pause until another member is live, then resolves the names
// again every JoinRefreshInterval to merge with nodes it does not know.
func (c *Cluster) joinLoop(ctx context.Context) {
	wait := c.cfg.JoinRetryInterval
	for {
		joined := c.hasPeer()
		pause := wait
		if joined {
			if c.cfg.JoinRefreshInterval < 0 {
				return
			}
			pause = c.cfg.JoinRefreshInterval
		}
		t := time.NewTimer(pause)
		select {
		case <-c.stop:
			t.Stop()
			return
		case <-t.C:
		}
		lctx, lcancel := context.WithTimeout(ctx, c.cfg.TCPTimeout)
		n, err := c.joinRound(lctx, joined)
		lcancel()
		switch {
		case c.closed.Load():
			return
		case err == nil && n > 0:
			c.lg.Info("joined", zap.Int("contacted", n), zap.Bool("refresh", joined))
			wait = c.cfg.JoinRetryInterval
		case err != nil && !joined && !c.hasPeer():
			wait = min(2*wait, max(c.cfg.JoinRetryMax, c.cfg.JoinRetryInterval))
			c.lg.Warn("join failed; retrying in the background", zap.Strings("join", c.cfg.Join),
				zap.Duration("retry_in", wait), zap.Error(err))
		case err != nil:
			c.lg.Debug("join refresh failed", zap.Error(err))
		}
	}
}

// Join contacts the given addresses or DNS names (resolved to all their
// addresses) and merges state with every one that answers. It returns how
// many answered; the error wraps ErrJoin when none did.
func (c *Cluster) Join(ctx context.Context, addrs []string) (int, error) {
	ml := c.ml.Load()
	if ml == nil {
		return 0, ErrNotStarted
	}
	if c.closed.Load() {
		return 0, ErrClosed
	}
	targets, rerr := c.resolve(ctx, addrs)
	if len(targets) == 0 {
		return 0, fmt.Errorf("%w: no address to join: %w", ErrJoin, rerr)
	}
	n, err := ml.Join(targets)
	if n == 0 {
		return 0, fmt.Errorf("%w: %v", ErrJoin, errors.Join(err, rerr))
	}
	return n, nil
}

// resolve turns Join entries into ip:port strings.
func (c *Cluster) resolve(ctx context.Context, entries []string) ([]string, error) {
	lookup := c.cfg.LookupHost
	if lookup == nil {
		lookup = net.DefaultResolver.LookupHost
	}
	var out []string
	var errs []error
	for _, e := range entries {
		host, port := e, strconv.Itoa(DefaultPort)
		if h, p, err := net.SplitHostPort(e); err == nil {
			host, port = h, p
		}
		if ip := net.ParseIP(host); ip != nil {
			out = append(out, net.JoinHostPort(ip.String(), port))
			continue
		}
		ips, err := lookup(ctx, host)
		if err != nil {
			errs = append(errs, fmt.Errorf("resolve %s: %w", host, err))
			continue
		}
		for _, ip := range ips {
			out = append(out, net.JoinHostPort(ip, port))
		}
	}
	sort.Strings(out)
	return slices.Compact(out), errors.Join(errs...)
}

// Addr is this node's advertised gossip address (host:port), "" before
// Start. Use it in other nodes' Join.
func (c *Cluster) Addr() string {
	if a := c.addr.Load(); a != nil {
		return *a
	}
	return ""
}

// LocalMeta returns this node's current metadata.
func (c *Cluster) LocalMeta() Meta {
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	m := c.meta
	m.Tiers = slices.Clone(m.Tiers)
	return m
}

// UpdateMeta replaces this node's metadata (NodeID, Protocol and Leaving
// are kept as they are) and gossips it, waiting until the broadcast went out
// or ctx ends.
func (c *Cluster) UpdateMeta(ctx context.Context, m Meta) error {
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	m.NodeID, m.Protocol, m.Leaving = c.meta.NodeID, c.meta.Protocol, c.meta.Leaving
	m.Tiers = slices.Clone(m.Tiers)
	return c.setMetaLocked(ctx, m)
}

func (c *Cluster) setMetaLocked(ctx context.Context, m Meta) error {
	if c.closed.Load() {
		return ErrClosed
	}
	b, err := m.Encode()
	if err == nil {
		b, err = c.sign(b)
	}
	if err != nil {
		return err
	}
	c.meta = m
	c.metaBytes.Store(&b)
	c.metaUpdates.Add(1)
	ml := c.ml.Load()
	if ml == nil {
		return nil // announced at Start
	}
	if err := ml.UpdateNode(timeoutOf(ctx, 5*time.Second)); err != nil {
		return fmt.Errorf("cluster: gossip metadata: %w", err)
	}
	return nil
}

func timeoutOf(ctx context.Context, def time.Duration) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return max(time.Until(dl), time.Millisecond)
	}
	return def
}

// Leave leaves the cluster gracefully. memberlist's own events do not tell
// a leave from a failure, so the intent goes first: Leave sets Meta.Leaving,
// sends a leaving message to every live peer over TCP (a third of timeout),
// gossips the new metadata (another third), and only then performs
// memberlist's leave (the rest). Peers see this node StateLeaving, then
// StateLeft. Call Close afterwards. Safe to call twice.
func (c *Cluster) Leave(timeout time.Duration) error {
	ml := c.ml.Load()
	if ml == nil {
		return ErrNotStarted
	}
	if c.closed.Load() {
		return ErrClosed
	}
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	start := time.Now()
	var errs []error
	if !c.meta.Leaving {
		// 1. Tell every live peer directly (TCP), so that none of them can
		// hear the leave itself before the intent.
		m := c.meta
		m.Leaving = true
		b, err := m.Encode()
		if err == nil {
			b, err = c.sign(b)
		}
		if err != nil {
			return err
		}
		c.meta = m
		c.metaBytes.Store(&b)
		c.metaUpdates.Add(1)
		if err := c.announceLeaving(ml, timeout/3); err != nil {
			errs = append(errs, err)
		}
		// 2. Gossip the Leaving flag too (late joiners, missed sends).
		if err := ml.UpdateNode(timeout / 3); err != nil {
			errs = append(errs, fmt.Errorf("cluster: gossip leaving: %w", err))
		}
	}
	if err := ml.Leave(max(timeout-time.Since(start), time.Millisecond)); err != nil {
		errs = append(errs, fmt.Errorf("cluster: leave: %w", err))
	}
	c.lg.Info("left cluster", zap.Duration("took", time.Since(start)), zap.Errors("errors", errs))
	return errors.Join(errs...)
}

// announceLeaving sends a leaving message to every other live member over
// TCP, in parallel, within timeout.
func (c *Cluster) announceLeaving(ml *memberlist.Memberlist, timeout time.Duration) error {
	msg := encodeUserMsg(userMsgLeaving, c.cfg.NodeName)
	var wg sync.WaitGroup
	var failed atomic.Int64
	sem := make(chan struct{}, 32)
	deadline := time.After(timeout)
	// Targets come from our own table: the *Node values memberlist.Members
	// returns are updated by memberlist without a lock we can take.
	var targets []*memberlist.Node
	c.mu.RLock()
	for _, m := range c.members {
		if m.Local || !m.State.Live() && m.State != StateLeaving {
			continue
		}
		host, port, err := net.SplitHostPort(m.Addr)
		p, perr := strconv.ParseUint(port, 10, 16)
		if ip := net.ParseIP(host); err == nil && perr == nil && ip != nil {
			targets = append(targets, &memberlist.Node{Name: m.Name, Addr: ip, Port: uint16(p)})
		}
	}
	c.mu.RUnlock()
	for _, n := range targets {
		select {
		case sem <- struct{}{}:
		case <-deadline:
			failed.Add(1)
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := ml.SendReliable(n, msg); err != nil {
				failed.Add(1)
			}
		}()
	}
	wg.Wait() // each send is bounded by TCPTimeout
	if n := failed.Load(); n > 0 {
		return fmt.Errorf("cluster: leaving announcement failed for %d peers", n)
	}
	return nil
}

// Close stops gossip without leaving (peers will see this node fail unless
// Leave ran first) and ends subscriptions. Safe to call twice.
func (c *Cluster) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	var err error
	if ml := c.ml.Load(); ml != nil {
		err = ml.Shutdown()
	}
	if c.started.Load() {
		select {
		case <-c.stop:
		default:
			close(c.stop)
		}
		<-c.loopDone
		c.reconn.Wait()
	}
	c.mu.Lock()
	for s := range c.subs {
		close(s.ch)
	}
	c.subs = map[*subscriber]struct{}{}
	c.mu.Unlock()
	return err
}

// Members returns every member this node knows, itself included, sorted by
// name: live ones and, for Config.Tombstone, left and failed ones.
func (c *Cluster) Members() []Member {
	c.mu.RLock()
	out := make([]Member, 0, len(c.members))
	for _, m := range c.members {
		out = append(out, copyMember(*m))
	}
	c.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Member returns the member called name, if this node knows it (in any
// state, itself included).
func (c *Cluster) Member(name string) (Member, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	m, ok := c.members[name]
	if !ok {
		return Member{}, false
	}
	return copyMember(*m), true
}

// Ring places keys on the current live members (LiveNames of Members).
// Build a new one after each membership event.
func (c *Cluster) Ring(cfg RingConfig) (*Ring, error) {
	return NewRing(LiveNames(c.Members()), cfg)
}

// LiveNames returns the sorted names of the members that should own keys
// (State.Live), the input NewRing wants.
func LiveNames(ms []Member) []string {
	var out []string
	for _, m := range ms {
		if m.State.Live() {
			out = append(out, m.Name)
		}
	}
	sort.Strings(out)
	return out
}

// Subscribe returns a channel of membership events and a cancel function.
// The channel holds Config.EventBuffer events; when it is full further
// events for it are dropped (see Event.Seq). It is closed by cancel or
// Close.
func (c *Cluster) Subscribe() (<-chan Event, func()) {
	s := &subscriber{ch: make(chan Event, c.cfg.EventBuffer)}
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		close(s.ch)
		return s.ch, func() {}
	}
	c.subs[s] = struct{}{}
	c.mu.Unlock()
	var once sync.Once
	return s.ch, func() {
		once.Do(func() {
			c.mu.Lock()
			if _, ok := c.subs[s]; ok {
				delete(c.subs, s)
				close(s.ch)
			}
			c.mu.Unlock()
		})
	}
}

// Stats returns a snapshot of the counters.
func (c *Cluster) Stats() Stats {
	c.mu.RLock()
	s := Stats{Members: len(c.members)}
	for _, m := range c.members {
		if m.State.Live() {
			s.Live++
		}
	}
	c.mu.RUnlock()
	s.Events = c.events.Load()
	s.Dropped = c.dropped.Load()
	s.HandoffDrops = c.handoffDrops.Load()
	s.RefusedPeers = c.refused.Load()
	s.MetaUpdates = c.metaUpdates.Load()
	s.JoinRounds = c.joinRounds.Load()
	s.JoinFailures = c.joinFailures.Load()
	return s
}

func copyMember(m Member) Member {
	m.Meta.Tiers = slices.Clone(m.Meta.Tiers)
	if m.Meta.RDMA != nil {
		r := *m.Meta.RDMA
		m.Meta.RDMA = &r
	}
	return m
}

// ---- the event loop: the only writer of the member table ----

func (c *Cluster) loop() {
	defer close(c.loopDone)
	reap := time.NewTicker(max(c.cfg.Tombstone/4, time.Second))
	defer reap.Stop()
	for {
		select {
		case <-c.stop:
			return
		case ev := <-c.handoff:
			c.apply(ev)
		case <-c.kick:
		case now := <-reap.C:
			c.reapTombstones(now)
		}
		if c.resync.Swap(false) {
			c.resyncTable()
		}
	}
}

// evUserMsg marks a nodeEvent carrying a user message in meta.
const evUserMsg EventKind = 100

func (c *Cluster) apply(ev nodeEvent) {
	if ev.kind == evUserMsg {
		c.applyUserMsg(ev)
		return
	}
	meta, err := c.decodeMeta(ev.name, ev.meta)
	if err != nil && ev.kind != EventLeft {
		// The alive delegate refuses undecodable metadata, so this is a
		// node we already refused; ignore it.
		c.lg.Debug("ignoring member with bad metadata", zap.String("node", ev.name), zap.Error(err))
		return
	}
	local := ev.name == c.cfg.NodeName
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.members[ev.name]
	switch ev.kind {
	case EventJoin, EventUpdate:
		state := StateAlive
		if meta.Leaving {
			state = StateLeaving
		}
		kind := ev.kind
		if cur == nil || !cur.State.Live() && cur.State != StateLeaving {
			kind = EventJoin
		}
		m := &Member{Name: ev.name, Addr: ev.addr, Meta: meta, State: state, Since: ev.at, Local: local}
		if cur != nil && cur.State == state {
			m.Since = cur.Since
		}
		c.members[ev.name] = m
		c.publishLocked(kind, *m)
	case EventLeft:
		if cur == nil {
			return
		}
		m := *cur
		if cur.State == StateLeft || cur.State == StateFailed {
			return
		}
		kind := EventFailed
		m.State = StateFailed
		if cur.Meta.Leaving || err == nil && meta.Leaving {
			kind, m.State = EventLeft, StateLeft
		}
		m.Since = ev.at
		c.members[ev.name] = &m
		c.publishLocked(kind, m)
	}
}

func (c *Cluster) publishLocked(kind EventKind, m Member) {
	c.seq++
	c.events.Add(1)
	ev := Event{Seq: c.seq, Kind: kind, Member: m}
	c.lg.Debug("member event", zap.Stringer("kind", kind), zap.String("node", m.Name), zap.Stringer("state", m.State))
	for s := range c.subs {
		ev.Member = copyMember(m)
		select {
		case s.ch <- ev:
		default:
			c.dropped.Add(1)
		}
	}
}

// resyncTable rebuilds the table from memberlist after a dropped hand-off.
func (c *Cluster) resyncTable() {
	ml := c.ml.Load()
	if ml == nil {
		return
	}
	now := time.Now()
	seen := map[string]bool{}
	// Only after a dropped hand-off: memberlist may update these nodes while
	// we copy them (it offers no locked accessor), so this path is best
	// effort; the next join/update event corrects any torn read.
	for _, n := range ml.Members() {
		seen[n.Name] = true
		c.apply(nodeEvent{kind: EventUpdate, name: n.Name, addr: n.Address(), meta: slices.Clone(n.Meta), at: now})
	}
	c.mu.RLock()
	var gone []string
	for name, m := range c.members {
		if !seen[name] && m.State != StateLeft && m.State != StateFailed {
			gone = append(gone, name)
		}
	}
	c.mu.RUnlock()
	for _, name := range gone {
		c.apply(nodeEvent{kind: EventLeft, name: name, at: now})
	}
}

func (c *Cluster) reapTombstones(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, m := range c.members {
		if (m.State == StateLeft || m.State == StateFailed) && now.Sub(m.Since) > c.cfg.Tombstone {
			delete(c.members, name)
		}
	}
}

// ---- memberlist delegates: never block ----

type delegate struct{ c *Cluster }

var (
	_ memberlist.Delegate      = delegate{}
	_ memberlist.EventDelegate = delegate{}
	_ memberlist.AliveDelegate = delegate{}
	_ memberlist.MergeDelegate = delegate{}
)

func (d delegate) NodeMeta(limit int) []byte {
	b := *d.c.metaBytes.Load()
	if len(b) > limit {
		return nil // cannot happen: Encode bounds it by MetaMaxSize
	}
	return b
}

func (d delegate) NotifyMsg(b []byte) {
	d.c.handOff(nodeEvent{kind: evUserMsg, meta: slices.Clone(b), at: time.Now()})
}

func (delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (delegate) LocalState(join bool) []byte                { return nil }
func (delegate) MergeRemoteState(buf []byte, join bool)     {}

func (d delegate) hand(kind EventKind, n *memberlist.Node) {
	d.c.handOff(nodeEvent{kind: kind, name: n.Name, addr: n.Address(), meta: slices.Clone(n.Meta), at: time.Now()})
}

// handOff queues ev for the loop without blocking; when the queue is full
// the loop resyncs its table from memberlist instead.
func (c *Cluster) handOff(ev nodeEvent) {
	select {
	case c.handoff <- ev:
	default:
		c.handoffDrops.Add(1)
		c.resync.Store(true)
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
}

func (d delegate) NotifyJoin(n *memberlist.Node)   { d.hand(EventJoin, n) }
func (d delegate) NotifyUpdate(n *memberlist.Node) { d.hand(EventUpdate, n) }
func (d delegate) NotifyLeave(n *memberlist.Node)  { d.hand(EventLeft, n) }

// check refuses a peer whose metadata this build cannot decode, is not
// signed with the cluster secret (Config.Auth), or whose protocol version
// differs. (Another label never gets this far: memberlist
// drops its packets.)
func (d delegate) check(n *memberlist.Node) error {
	m, err := d.c.decodeMeta(n.Name, n.Meta)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrRefused, n.Name, err)
	}
	if m.Protocol != d.c.proto {
		return fmt.Errorf("%w: %s speaks protocol %d, this node %d", ErrRefused, n.Name, m.Protocol, d.c.proto)
	}
	return nil
}

func (d delegate) NotifyAlive(n *memberlist.Node) error {
	err := d.check(n)
	if err != nil {
		d.c.refused.Add(1)
	}
	return err
}

func (d delegate) NotifyMerge(peers []*memberlist.Node) error {
	for _, n := range peers {
		if n.State != memberlist.StateAlive && n.State != memberlist.StateSuspect {
			continue
		}
		if err := d.check(n); err != nil {
			d.c.refused.Add(1)
			return err
		}
	}
	return nil
}

// applyUserMsg handles a message a peer sent with SendReliable.
func (c *Cluster) applyUserMsg(ev nodeEvent) {
	typ, name, err := decodeUserMsg(ev.meta)
	if err != nil {
		c.lg.Debug("ignoring user message", zap.Error(err))
		return
	}
	if typ != userMsgLeaving {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.members[name]
	if cur == nil || cur.State != StateAlive && cur.State != StateSuspect {
		return
	}
	m := *cur
	m.Meta.Leaving = true
	m.State = StateLeaving
	m.Since = ev.at
	c.members[name] = &m
	c.publishLocked(EventUpdate, m)
}

// User messages (memberlist SendReliable payloads), version 1:
//
//	u8 version (1) | u8 type | u8 length + node name
const userMsgVersion = 1

const userMsgLeaving = 1 // the named node is about to leave gracefully

var errUserMsg = errors.New("cluster: bad user message")

func encodeUserMsg(typ uint8, name string) []byte {
	b := []byte{userMsgVersion, typ, byte(len(name))}
	return append(b, name...)
}

// decodeUserMsg is the only user-message decoder.
func decodeUserMsg(b []byte) (typ uint8, name string, err error) {
	if len(b) < 3 || b[0] != userMsgVersion {
		return 0, "", fmt.Errorf("%w: %d bytes", errUserMsg, len(b))
	}
	if n := int(b[2]); len(b) != 3+n {
		return 0, "", fmt.Errorf("%w: name length %d in %d bytes", errUserMsg, n, len(b))
	}
	return b[1], string(b[3:]), nil
}

// ErrUnsigned is metadata without a valid signature (Config.Auth): the
// node does not hold the cluster secret.
var ErrUnsigned = errors.New("cluster: metadata not signed with the cluster secret")

// metaSigLen is the length of the signature appended to signed metadata.
const metaSigLen = 32

func (c *Cluster) sigInput(name string, meta []byte) []byte {
	in := make([]byte, 0, len(name)+1+len(meta))
	in = append(in, name...)
	in = append(in, 0)
	return append(in, meta...)
}

// sign appends the metadata signature when Config.Auth is set.
func (c *Cluster) sign(b []byte) ([]byte, error) {
	if c.cfg.Auth == nil {
		return b, nil
	}
	if len(b)+metaSigLen > MetaMaxSize {
		return nil, fmt.Errorf("%w: %d bytes with the signature (max %d)", ErrMetaTooLarge, len(b)+metaSigLen, MetaMaxSize)
	}
	return append(b, c.cfg.Auth.Proof("member", c.sigInput(c.cfg.NodeName, b))...), nil
}

// decodeMeta verifies (with Config.Auth) and decodes a member's metadata.
func (c *Cluster) decodeMeta(name string, b []byte) (Meta, error) {
	if c.cfg.Auth != nil {
		if len(b) < metaSigLen {
			return Meta{}, ErrUnsigned
		}
		body, sig := b[:len(b)-metaSigLen], b[len(b)-metaSigLen:]
		if !c.cfg.Auth.Verify("member", c.sigInput(name, body), sig) {
			return Meta{}, ErrUnsigned
		}
		b = body
	}
	return DecodeMeta(b)
}
