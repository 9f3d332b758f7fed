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
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"
)

// Errors.
var (
	ErrClosed     = errors.New("cluster: closed")
	ErrNotStarted = errors.New("cluster: not started")
	ErrJoin       = errors.New("cluster: join failed")
	ErrRefused    = errors.New("cluster: peer refused")
)

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

	mu      sync.RWMutex // guards members, live, subs, seq
	members map[string]*Member
	live    int // members with State.Live, kept by setMemberLocked
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
	cfg = cfg.withDefaults()
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
	mc.IndirectChecks = max(c.cfg.IndirectChecks, 0)
	mc.SuspicionMaxTimeoutMult = c.cfg.SuspicionMaxTimeoutMult
	mc.AwarenessMaxMultiplier = c.cfg.AwarenessMaxMultiplier
	mc.DeadNodeReclaimTime = c.cfg.DeadNodeReclaimTime
	mc.EnableCompression = c.cfg.Compression
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
	if iv := c.cfg.ReconnectInterval; iv > 0 {
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

// Addr is this node's advertised gossip address (host:port), "" before
// Start. Use it in other nodes' Join.
func (c *Cluster) Addr() string {
	if a := c.addr.Load(); a != nil {
		return *a
	}
	return ""
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
