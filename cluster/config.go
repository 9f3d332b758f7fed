package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/tidepool-kv/tidepool/internal/peerauth"
)

// DefaultPort is the gossip port used when a Join entry names none.
const DefaultPort = 7946

// Config configures a Cluster. A zero field takes its default
// (DefaultConfig, applied once in withDefaults by New and Validate); "off"
// is a negative value where a field allows it. The one exception is
// BindPort, where 0 keeps the operating system's meaning (a free port).
// Durations are wall-clock; DefaultLocalConfig shortens them for tests.
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
	// addresses: a Kubernetes headless Service resolves to every pod. A
	// join contacts three of them at a time, in a random order, until one
	// answers (each answer is a whole member-table exchange).
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

	// Failure detection and gossip timings (see memberlist.Config). The
	// defaults are tuned for a failure seen within about 3 s on a LAN
	// (docs/scale.md): memberlist declares a suspect failed after
	// SuspicionMult x max(1, log10(members)) x ProbeInterval, so the
	// defaults detect a killed member in about 1.8 s at 10 members, 2.8 s
	// at 100 and 3.8 s at 1,000, where memberlist's LAN defaults (1 s,
	// 500 ms, 4, 200 ms) took 5-6 s at 3 members. A probe waits the whole
	// ProbeInterval for a late or indirect answer, so a member stalled for
	// less than that (a 300 ms pause) is not suspected.
	ProbeInterval    time.Duration // default 500 ms
	ProbeTimeout     time.Duration // default 250 ms (then indirect probes)
	SuspicionMult    int           // default 2
	GossipInterval   time.Duration // default 100 ms
	GossipNodes      int           // default 3
	PushPullInterval time.Duration // default 30 s
	TCPTimeout       time.Duration // default 10 s
	RetransmitMult   int           // default 4
	IndirectChecks   int           // default 3; negative: none
	// SuspicionMaxTimeoutMult is Lifeguard's upper bound on a suspicion:
	// a member suspected by one node alone is declared failed after this
	// many times the minimum suspicion timeout; each independent
	// confirmation (SuspicionMult-2 expected) shortens it toward the
	// minimum. Default 6.
	SuspicionMaxTimeoutMult int
	// AwarenessMaxMultiplier is Lifeguard's local health awareness: a node
	// that misses its own acks (it is the slow one) stretches its probe
	// interval and timeout up to this factor instead of suspecting
	// others. Default 8.
	AwarenessMaxMultiplier int
	// Compression LZW-compresses gossip packets and push/pull state
	// (memberlist's EnableCompression, on in its own defaults). Default
	// false: on a LAN the bytes saved are a few hundred a second per
	// member, while memberlist allocates a 64 KiB LZW table for every
	// packet it compresses, about a quarter of a member's gossip CPU
	// (docs/scale.md). Members with and without it interoperate.
	Compression bool
	// DeadNodeReclaimTime lets a dead node's name be taken by a new address
	// after this long (a restarted pod with a new IP). Default 10 s.
	DeadNodeReclaimTime time.Duration

	// EventBuffer is the capacity, in events, of the delegate hand-off
	// channel and of each subscriber channel. Default 4096.
	EventBuffer int
	// Tombstone is how long left and failed members stay in Members.
	// Default 10 min.
	Tombstone time.Duration
	// ReconnectInterval is how often this node tries to join one member it
	// holds as failed (not left), picked at random, so that a healed network
	// partition merges back: memberlist itself never probes a node it declared dead. Default
	// 10 s; negative disables. Attempts stop when the member's tombstone
	// expires.
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
		NodeName:                host,
		BindAddr:                "0.0.0.0",
		BindPort:                DefaultPort,
		JoinRetryInterval:       time.Second,
		JoinRetryMax:            30 * time.Second,
		JoinWait:                5 * time.Second,
		JoinRefreshInterval:     30 * time.Second,
		ProbeInterval:           500 * time.Millisecond,
		ProbeTimeout:            250 * time.Millisecond,
		SuspicionMult:           2,
		GossipInterval:          100 * time.Millisecond,
		GossipNodes:             3,
		PushPullInterval:        30 * time.Second,
		TCPTimeout:              10 * time.Second,
		RetransmitMult:          4,
		IndirectChecks:          3,
		SuspicionMaxTimeoutMult: 6,
		AwarenessMaxMultiplier:  8,
		DeadNodeReclaimTime:     10 * time.Second,
		EventBuffer:             4096,
		Tombstone:               10 * time.Minute,
		ReconnectInterval:       10 * time.Second,
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

// withDefaults fills the zero fields with their defaults: the one place a
// zero field becomes its default.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.NodeName == "" {
		c.NodeName = d.NodeName
	}
	if c.BindAddr == "" {
		c.BindAddr = d.BindAddr
	}
	for _, f := range []struct{ p, def *time.Duration }{
		{&c.JoinRetryInterval, &d.JoinRetryInterval}, {&c.JoinRetryMax, &d.JoinRetryMax},
		{&c.JoinWait, &d.JoinWait}, {&c.JoinRefreshInterval, &d.JoinRefreshInterval},
		{&c.ProbeInterval, &d.ProbeInterval}, {&c.ProbeTimeout, &d.ProbeTimeout},
		{&c.GossipInterval, &d.GossipInterval}, {&c.PushPullInterval, &d.PushPullInterval},
		{&c.TCPTimeout, &d.TCPTimeout}, {&c.DeadNodeReclaimTime, &d.DeadNodeReclaimTime},
		{&c.Tombstone, &d.Tombstone}, {&c.ReconnectInterval, &d.ReconnectInterval},
	} {
		if *f.p == 0 {
			*f.p = *f.def
		}
	}
	for _, f := range []struct{ p, def *int }{
		{&c.SuspicionMult, &d.SuspicionMult}, {&c.GossipNodes, &d.GossipNodes},
		{&c.RetransmitMult, &d.RetransmitMult}, {&c.IndirectChecks, &d.IndirectChecks},
		{&c.EventBuffer, &d.EventBuffer},
		{&c.SuspicionMaxTimeoutMult, &d.SuspicionMaxTimeoutMult}, {&c.AwarenessMaxMultiplier, &d.AwarenessMaxMultiplier},
	} {
		if *f.p == 0 {
			*f.p = *f.def
		}
	}
	return c
}

// Validate reports every problem with c (after defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
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
	if c.ProbeTimeout > c.ProbeInterval && c.ProbeInterval > 0 {
		bad("ProbeTimeout %v must not exceed ProbeInterval %v", c.ProbeTimeout, c.ProbeInterval)
	}
	for _, n := range []struct {
		name string
		v    int
	}{
		{"SuspicionMult", c.SuspicionMult}, {"GossipNodes", c.GossipNodes},
		{"RetransmitMult", c.RetransmitMult}, {"EventBuffer", c.EventBuffer},
		{"SuspicionMaxTimeoutMult", c.SuspicionMaxTimeoutMult}, {"AwarenessMaxMultiplier", c.AwarenessMaxMultiplier},
	} {
		if n.v <= 0 {
			bad("%s %d must be > 0", n.name, n.v)
		}
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
