// Package kvevents publishes what the sidecar holds as vLLM's KV events,
// so that KV-aware routers (llm-d's kv-cache indexer, NVIDIA Dynamo's
// router) can score a pod whose sidecar holds a prompt's prefix.
//
// It hears of blocks from the tiers (cache.Observer: a block entering or
// leaving DRAM or SSD, a namespace cleared) and of their token ids from the
// proxy (proxy.BlockNotes), keeps a table of what is held (key → mediums,
// description), and publishes each change as a vLLM KVEventBatch (msgpack)
// on a ZeroMQ PUB socket, three frames per batch (topic, 8-byte big-endian
// sequence number, payload), with vLLM's replay protocol on a ROUTER
// socket. Neither the tiers nor the proxy ever wait for it: changes go
// through a bounded queue, and when it is full they are dropped and
// counted (the sequence then skips a number, so a subscriber sees the gap
// and asks the replay socket, which answers a gap it cannot fill with a
// snapshot of the table). docs/events.md has the format and the rules.
package kvevents

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
)

// Mediums: a block in this sidecar's DRAM, on its SSD (vLLM's MEDIUM_CPU
// and MEDIUM_STORAGE).
const (
	MediumDRAM = "CPU"
	MediumSSD  = "STORAGE"
)

// Config configures a Publisher. A zero field takes its default.
type Config struct {
	// Endpoint is where the PUB socket listens: tcp://HOST:PORT ("*" or an
	// empty host: every interface). Required.
	Endpoint string
	// ReplayEndpoint is where the ROUTER (replay) socket listens; empty:
	// no replay socket.
	ReplayEndpoint string
	// Pod and Model make the topic kv@<Pod>@<Model>; an empty Model uses
	// the block's namespace.
	Pod, Model string
	// HashBytes publishes block keys as bytes; default (false): as vLLM's
	// integer block hashes (the key's last 8 bytes, big-endian), what
	// vLLM sends by default (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1).
	HashBytes bool
	// QueueEvents bounds the changes waiting to be published (default
	// 65536); past it changes are dropped and counted.
	QueueEvents int
	// BatchEvents is the most events in one batch (default 512).
	BatchEvents int
	// SubscriberQueue bounds the batches waiting for one subscriber
	// (default 4096); past it that subscriber misses batches (counted).
	SubscriberQueue int
	// MaxSubscribers caps the connections of each socket (default 64).
	MaxSubscribers int
	// ReplayBatches and ReplayBytes bound the batches kept for replay
	// (default 10000 batches, as vLLM's buffer_steps, and 64 MiB).
	ReplayBatches int
	ReplayBytes   int64
	// WriteTimeout bounds one write to a subscriber (default 10 s); a
	// subscriber that takes longer is disconnected.
	WriteTimeout time.Duration
	// SubscribeSnapshot sends each new subscription a snapshot of what is
	// held under its topic prefix before the live batches, for subscribers
	// that never ask the replay socket (llm-d's): after a restart of the
	// sidecar they would otherwise miss the startup snapshot. Off by
	// default: the snapshot's batches carry the last sequence number
	// published, which a subscriber that tracks numbers cannot tell from
	// the live batch of that number (docs/events.md).
	SubscribeSnapshot bool
}

// DefaultConfig returns the defaults (Endpoint still to set).
func DefaultConfig() Config {
	return Config{
		QueueEvents:     65536,
		BatchEvents:     512,
		SubscriberQueue: 4096,
		MaxSubscribers:  64,
		ReplayBatches:   10000,
		ReplayBytes:     64 << 20,
		WriteTimeout:    10 * time.Second,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.QueueEvents == 0 {
		c.QueueEvents = d.QueueEvents
	}
	if c.BatchEvents == 0 {
		c.BatchEvents = d.BatchEvents
	}
	if c.SubscriberQueue == 0 {
		c.SubscriberQueue = d.SubscriberQueue
	}
	if c.MaxSubscribers == 0 {
		c.MaxSubscribers = d.MaxSubscribers
	}
	if c.ReplayBatches == 0 {
		c.ReplayBatches = d.ReplayBatches
	}
	if c.ReplayBytes == 0 {
		c.ReplayBytes = d.ReplayBytes
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = d.WriteTimeout
	}
	return c
}

// Validate reports every problem of c (defaults applied) at once.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if _, err := listenAddr(c.Endpoint); err != nil {
		errs = append(errs, fmt.Errorf("endpoint: %w", err))
	}
	if c.ReplayEndpoint != "" {
		if _, err := listenAddr(c.ReplayEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("replay endpoint: %w", err))
		}
		if c.ReplayEndpoint == c.Endpoint && !strings.HasSuffix(c.Endpoint, ":0") {
			errs = append(errs, errors.New("replay endpoint equals the endpoint"))
		}
	}
	if strings.Contains(c.Pod, "@") || strings.Contains(c.Model, "@") {
		errs = append(errs, errors.New("pod and model must not contain '@' (the topic is kv@<pod>@<model>)"))
	}
	for _, v := range []struct {
		name string
		v    int64
	}{{"queue events", int64(c.QueueEvents)}, {"batch events", int64(c.BatchEvents)},
		{"subscriber queue", int64(c.SubscriberQueue)}, {"max subscribers", int64(c.MaxSubscribers)},
		{"replay batches", int64(c.ReplayBatches)}, {"replay bytes", c.ReplayBytes}, {"write timeout", int64(c.WriteTimeout)}} {
		if v.v < 0 {
			errs = append(errs, fmt.Errorf("%s: %d is negative", v.name, v.v))
		}
	}
	return errors.Join(errs...)
}

// listenAddr turns tcp://HOST:PORT into a net.Listen address.
func listenAddr(ep string) (string, error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", fmt.Errorf("%q: want tcp://HOST:PORT", ep)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", fmt.Errorf("%q: %w", ep, err)
	}
	if host == "*" {
		host = ""
	}
	return net.JoinHostPort(host, port), nil
}

// Stats are the publisher's counters.
type Stats struct {
	Published   int64 // batches published
	Events      int64 // events published
	Dropped     int64 // changes dropped: the queue was full
	SlowDropped int64 // batches a slow subscriber missed
	Replayed    int64 // batches sent by the replay socket (snapshots included)
	Snapshots   int64 // replay requests answered with a snapshot
	BadRequests int64 // replay requests that were not one
	Subscribers int64 // PUB connections now
	Held        int64 // blocks in the table
}

// Publisher publishes KV events. It implements cache.Observer and
// proxy.BlockNotes.
type Publisher struct {
	cfg   Config
	lg    *zap.Logger
	asInt bool

	mu    sync.Mutex
	table map[string]map[string]*held // ns → key → held
	// limbo lists blocks no tier holds, oldest first, whose description is
	// kept a while: a block evicted from DRAM is stored in SSD once its
	// demotion is written, and that BlockStored should carry its tokens.
	limbo   []nsKey
	started bool
	ch      chan *event
	lost    atomic.Bool // a change was dropped since the last batch

	pub, rep net.Listener

	smu   sync.Mutex
	subs  map[*subscriber]struct{}
	conns map[net.Conn]struct{} // every connection of both sockets, closed by Close

	rmu    sync.Mutex
	ring   []ringEntry // replay buffer, oldest first
	rbytes int64
	head   int64 // last sequence number published; -1: none yet

	published, events, dropped, slowDropped atomic.Int64
	replayed, snapshots, badRequests, held_ atomic.Int64

	// welcome takes new subscriptions to the run goroutine, which sends
	// each its snapshot (Config.SubscribeSnapshot) in order with the live
	// batches.
	welcome chan welcome

	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	snapMu    sync.Mutex // one snapshot replay at a time
}

type held struct {
	mediums uint8
	meta    *meta
}

// welcome is a new subscription of s to the topics that start with prefix.
type welcome struct {
	s      *subscriber
	prefix string
}

type nsKey struct{ ns, key string }

// limboBlocks bounds the descriptions kept for blocks no tier holds (a
// demotion queue's worth: cache/tiered's default QueueBlocks is 1024).
const limboBlocks = 16384

type ringEntry struct {
	seq     int64
	topic   []byte
	payload []byte
}

var (
	_ cache.Observer     = (*Publisher)(nil)
	_ cache.Descriptions = (*Publisher)(nil)
)

// New validates cfg; the sockets open at Start. Until Start the table
// fills (the blocks a restarted SSD tier finds are reported before the
// store is up) and nothing is queued.
func New(cfg Config, lg *zap.Logger) (*Publisher, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kvevents: %w", err)
	}
	if lg == nil {
		lg = zap.NewNop()
	}
	return &Publisher{
		cfg: cfg, lg: lg.Named("kvevents"), asInt: !cfg.HashBytes,
		table:   map[string]map[string]*held{},
		ch:      make(chan *event, cfg.QueueEvents),
		subs:    map[*subscriber]struct{}{},
		conns:   map[net.Conn]struct{}{},
		head:    -1,
		welcome: make(chan welcome, cfg.MaxSubscribers),
		stop:    make(chan struct{}),
	}, nil
}

func mediumBit(tier string) (uint8, string) {
	switch tier {
	case "dram":
		return 1, MediumDRAM
	case "ssd":
		return 2, MediumSSD
	}
	return 0, ""
}

func mediumOf(bit uint8) string {
	if bit == 1 {
		return MediumDRAM
	}
	return MediumSSD
}

// enqueueLocked hands ev to the publishing goroutine without waiting; a
// full queue drops it. mu held.
func (p *Publisher) enqueueLocked(ev *event) {
	if !p.started {
		return
	}
	select {
	case p.ch <- ev:
	default:
		p.dropped.Add(1)
		p.lost.Store(true)
	}
}

// Describe records a block's description before it is stored.
func (p *Publisher) Describe(ns string, key []byte, m *cache.BlockMeta) {
	if m == nil {
		return
	}
	p.mu.Lock()
	p.heldLocked(ns, string(key)).describe(m, true)
	p.mu.Unlock()
}

// describe takes m as h's description: always when newer (a put's),
// else (a tier's record of it) only where h has none with token ids.
func (h *held) describe(m *cache.BlockMeta, newer bool) {
	switch {
	case m == nil:
	case h.meta == nil, len(m.Tokens) > 0 && (newer || len(h.meta.tokens) == 0):
		h.meta = &meta{tokens: append([]uint32(nil), m.Tokens...), parent: append([]byte(nil), m.Parent...), blockSize: m.BlockSize}
	}
}

// Description is cache.Descriptions': the description of a block held or
// just removed (kept a while: limboBlocks), so that its copy into SSD (a
// demotion, the stop spill) keeps it in its record. nil: none known.
func (p *Publisher) Description(ns string, key []byte) *cache.BlockMeta {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.table[ns][string(key)]
	if h == nil || h.meta == nil {
		return nil
	}
	// h.meta is never modified once set (describe replaces it), so the
	// slices can be shared.
	return &cache.BlockMeta{Tokens: h.meta.tokens, Parent: h.meta.parent, BlockSize: h.meta.blockSize}
}

// Forget drops the description of a block whose put failed, unless the
// block is held.
func (p *Publisher) Forget(ns string, key []byte) {
	p.mu.Lock()
	if t := p.table[ns]; t != nil {
		if h := t[string(key)]; h != nil && h.mediums == 0 {
			p.deleteLocked(ns, t, string(key))
		}
	}
	p.mu.Unlock()
}

func (p *Publisher) heldLocked(ns, key string) *held {
	t := p.table[ns]
	if t == nil {
		t = map[string]*held{}
		p.table[ns] = t
	}
	h := t[key]
	if h == nil {
		h = &held{}
		t[key] = h
		p.held_.Add(1)
	}
	return h
}

// toLimboLocked keeps the description of a block no tier holds now for a
// while (limboBlocks), dropping the oldest such block's. mu held.
func (p *Publisher) toLimboLocked(ns, key string, h *held) {
	if h.meta == nil {
		p.deleteLocked(ns, p.table[ns], key)
		return
	}
	p.limbo = append(p.limbo, nsKey{ns, key})
	for len(p.limbo) > limboBlocks {
		old := p.limbo[0]
		p.limbo = p.limbo[1:]
		if t := p.table[old.ns]; t != nil {
			if o := t[old.key]; o != nil && o.mediums == 0 {
				p.deleteLocked(old.ns, t, old.key)
			}
		}
	}
}

func (p *Publisher) deleteLocked(ns string, t map[string]*held, key string) {
	delete(t, key)
	p.held_.Add(-1)
	if len(t) == 0 {
		delete(p.table, ns)
	}
}

// Stored is cache.Observer's: the block entered a tier. m, the tier's
// record of the block's description (the SSD's, also for the blocks it
// finds at start), describes it where nothing better is known.
func (p *Publisher) Stored(ns string, key []byte, tier string, m *cache.BlockMeta) {
	bit, medium := mediumBit(tier)
	if bit == 0 {
		return
	}
	p.mu.Lock()
	h := p.heldLocked(ns, string(key))
	h.describe(m, false)
	if h.mediums&bit == 0 {
		h.mediums |= bit
		p.enqueueLocked(&event{kind: stored, ns: ns, key: string(key), medium: medium, meta: h.meta})
	}
	p.mu.Unlock()
}

// Removed is cache.Observer's: the block left a tier.
func (p *Publisher) Removed(ns string, key []byte, tier string) {
	bit, medium := mediumBit(tier)
	if bit == 0 {
		return
	}
	p.mu.Lock()
	if t := p.table[ns]; t != nil {
		if h := t[string(key)]; h != nil && h.mediums&bit != 0 {
			h.mediums &^= bit
			if h.mediums == 0 {
				p.toLimboLocked(ns, string(key), h)
			}
			p.enqueueLocked(&event{kind: removed, ns: ns, key: string(key), medium: medium})
		}
	}
	p.mu.Unlock()
}

// Cleared is cache.Observer's: every block of ns left a tier. It is
// published as one AllBlocksCleared.
func (p *Publisher) Cleared(ns string, tier string) {
	bit, _ := mediumBit(tier)
	if bit == 0 {
		return
	}
	p.mu.Lock()
	if t := p.table[ns]; t != nil {
		for k, h := range t {
			h.mediums &^= bit
			if h.mediums == 0 {
				p.deleteLocked(ns, t, k)
			}
		}
	}
	p.enqueueLocked(&event{kind: cleared, ns: ns})
	p.mu.Unlock()
}

func (p *Publisher) topic(ns string) string {
	model := p.cfg.Model
	if model == "" {
		model = ns
	}
	return "kv@" + p.cfg.Pod + "@" + model
}

// Start opens the sockets, publishes a snapshot of what is held (the
// startup snapshot: sequence numbers from 0), then publishes changes as
// they come.
func (p *Publisher) Start(ctx context.Context) error {
	addr, _ := listenAddr(p.cfg.Endpoint)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("kvevents: listen %s: %w", p.cfg.Endpoint, err)
	}
	p.pub = ln
	if p.cfg.ReplayEndpoint != "" {
		raddr, _ := listenAddr(p.cfg.ReplayEndpoint)
		rl, err := net.Listen("tcp", raddr)
		if err != nil {
			ln.Close()
			return fmt.Errorf("kvevents: listen %s: %w", p.cfg.ReplayEndpoint, err)
		}
		p.rep = rl
	}
	p.mu.Lock()
	snap := p.snapshotLocked()
	p.started = true
	p.mu.Unlock()
	p.publishSnapshot(snap)
	p.wg.Add(1)
	go p.run()
	p.wg.Add(1)
	go p.acceptLoop(p.pub, p.servePub)
	if p.rep != nil {
		p.wg.Add(1)
		go p.acceptLoop(p.rep, p.serveReplay)
	}
	p.lg.Info("publishing KV events", zap.String("endpoint", p.cfg.Endpoint),
		zap.String("replay_endpoint", p.cfg.ReplayEndpoint), zap.String("pod", p.cfg.Pod))
	return nil
}

// Addr and ReplayAddr are the sockets' addresses (after Start).
func (p *Publisher) Addr() net.Addr { return p.pub.Addr() }

// ReplayAddr is the replay socket's address, nil without one.
func (p *Publisher) ReplayAddr() net.Addr {
	if p.rep == nil {
		return nil
	}
	return p.rep.Addr()
}

// snapshotLocked lists every held block as a BlockStored event per medium,
// each block after the one its description names as its parent (when that
// is held too): llm-d skips a block whose parent it has not indexed, so a
// chain listed in another order would be indexed up to its head only.
func (p *Publisher) snapshotLocked() []*event {
	var out []*event
	for ns, t := range p.table {
		listed := make(map[string]bool, len(t))
		var chain []string // a block, its parent, its parent's parent...
		for k := range t {
			chain = chain[:0]
			for c := k; !listed[c]; {
				listed[c] = true
				chain = append(chain, c)
				h := t[c]
				if h.meta == nil || len(h.meta.parent) == 0 || t[string(h.meta.parent)] == nil {
					break
				}
				c = string(h.meta.parent)
			}
			for i := len(chain) - 1; i >= 0; i-- {
				h := t[chain[i]]
				for bit := uint8(1); bit <= 2; bit <<= 1 {
					if h.mediums&bit != 0 {
						out = append(out, &event{kind: stored, ns: ns, key: chain[i], medium: mediumOf(bit), meta: h.meta})
					}
				}
			}
		}
	}
	return out
}

// publishSnapshot publishes evs as the first batches (at least one, empty
// when nothing is held, so that sequence 0 always exists).
func (p *Publisher) publishSnapshot(evs []*event) {
	if len(evs) == 0 {
		p.publish(p.topic(""), nil)
		return
	}
	p.publishAll(evs)
}

// publishAll publishes evs in order, one batch per run of one topic of at
// most BatchEvents events.
func (p *Publisher) publishAll(evs []*event) {
	for len(evs) > 0 {
		t, n := p.nextRun(evs)
		p.publish(t, evs[:n])
		evs = evs[n:]
	}
}

// nextRun is the topic of evs[0] and how many events from it make one
// batch: the same topic, at most BatchEvents.
func (p *Publisher) nextRun(evs []*event) (topic string, n int) {
	topic, n = p.topic(evs[0].ns), 1
	for n < len(evs) && n < p.cfg.BatchEvents && p.topic(evs[n].ns) == topic {
		n++
	}
	return topic, n
}

// publish encodes and sends one batch to every subscriber of its topic
// and keeps it for replay. Only the run goroutine (and Start before it)
// calls it.
func (p *Publisher) publish(topic string, evs []*event) {
	payload := encodeBatch(nil, float64(time.Now().UnixNano())/1e9, evs, p.asInt)
	p.rmu.Lock()
	seq := p.head + 1
	if p.lost.Swap(false) {
		seq++ // the skipped number tells subscribers that changes were lost
	}
	p.head = seq
	tb := []byte(topic)
	p.ring = append(p.ring, ringEntry{seq: seq, topic: tb, payload: payload})
	p.rbytes += int64(len(payload))
	for len(p.ring) > p.cfg.ReplayBatches || (p.rbytes > p.cfg.ReplayBytes && len(p.ring) > 1) {
		p.rbytes -= int64(len(p.ring[0].payload))
		p.ring[0] = ringEntry{}
		p.ring = p.ring[1:]
	}
	p.rmu.Unlock()
	p.published.Add(1)
	p.events.Add(int64(len(evs)))
	m := &message{topic: tb, seq: seqBytes(seq), payload: payload}
	p.smu.Lock()
	for s := range p.subs {
		if !s.wants(topic) {
			continue
		}
		select {
		case s.q <- m:
		default:
			p.slowDropped.Add(1)
		}
	}
	p.smu.Unlock()
}

func seqBytes(seq int64) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(seq))
}

// run publishes queued changes: it takes what is queued (up to
// BatchEvents) and publishes it in topic runs.
func (p *Publisher) run() {
	defer p.wg.Done()
	buf := make([]*event, 0, p.cfg.BatchEvents)
	for {
		select {
		case <-p.stop:
			return
		case w := <-p.welcome:
			p.sendWelcome(w)
		case ev := <-p.ch:
			buf = append(buf[:0], ev)
		more:
			for len(buf) < p.cfg.BatchEvents {
				select {
				case ev := <-p.ch:
					buf = append(buf, ev)
				default:
					break more
				}
			}
			p.publishAll(buf)
			clear(buf)
		}
	}
}

// sendWelcome queues for w.s a snapshot of what is held under its new
// subscription's prefix, numbered with the last sequence number published
// (as a replay's snapshot is). Only the run goroutine calls it, between
// batches: what was published before is older than the snapshot, what is
// published after is newer, so the subscriber's view ends up exact (it
// may see a block stored twice). A subscriber whose queue is full misses
// the rest, counted as a slow subscriber's batches.
func (p *Publisher) sendWelcome(w welcome) {
	p.mu.Lock()
	all := p.snapshotLocked()
	p.mu.Unlock()
	evs := all[:0]
	for _, ev := range all {
		if strings.HasPrefix(p.topic(ev.ns), w.prefix) {
			evs = append(evs, ev)
		}
	}
	p.rmu.Lock()
	seq := seqBytes(max(p.head, 0))
	p.rmu.Unlock()
	for len(evs) > 0 {
		t, n := p.nextRun(evs)
		payload := encodeBatch(nil, float64(time.Now().UnixNano())/1e9, evs[:n], p.asInt)
		select {
		case w.s.q <- &message{topic: []byte(t), seq: seq, payload: payload}:
		default:
			p.slowDropped.Add(1)
		}
		evs = evs[n:]
	}
}

// Close stops publishing and closes every connection. Safe to call twice.
func (p *Publisher) Close() error {
	p.closeOnce.Do(func() {
		close(p.stop)
		if p.pub != nil {
			p.pub.Close()
		}
		if p.rep != nil {
			p.rep.Close()
		}
		p.smu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.smu.Unlock()
		p.wg.Wait()
	})
	return nil
}

// Stats returns the counters.
func (p *Publisher) Stats() Stats {
	p.smu.Lock()
	n := int64(len(p.subs))
	p.smu.Unlock()
	return Stats{
		Published: p.published.Load(), Events: p.events.Load(), Dropped: p.dropped.Load(),
		SlowDropped: p.slowDropped.Load(), Replayed: p.replayed.Load(), Snapshots: p.snapshots.Load(),
		BadRequests: p.badRequests.Load(), Subscribers: n, Held: p.held_.Load(),
	}
}

// acceptLoop accepts connections on ln and serves each with serve, at most
// MaxSubscribers at a time per socket.
func (p *Publisher) acceptLoop(ln net.Listener, serve func(net.Conn)) {
	defer p.wg.Done()
	sem := make(chan struct{}, p.cfg.MaxSubscribers)
	for {
		c, err := ln.Accept()
		if err != nil {
			select {
			case <-p.stop:
				return
			default:
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			p.lg.Warn("accept failed", zap.Error(err))
			time.Sleep(50 * time.Millisecond)
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			p.lg.Warn("too many connections; refusing one", zap.Int("cap", p.cfg.MaxSubscribers))
			c.Close()
			continue
		}
		p.smu.Lock()
		p.conns[c] = struct{}{}
		p.smu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() { <-sem }()
			defer func() {
				c.Close()
				p.smu.Lock()
				delete(p.conns, c)
				p.smu.Unlock()
			}()
			select {
			case <-p.stop: // Close ran between Accept and the registration
				return
			default:
			}
			serve(c)
		}()
	}
}

// message is one published batch's frames.
type message struct{ topic, seq, payload []byte }

type subscriber struct {
	c    net.Conn
	q    chan *message
	mu   sync.Mutex
	subs []string // subscribed prefixes
}

func (s *subscriber) wants(topic string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.subs {
		if strings.HasPrefix(topic, p) {
			return true
		}
	}
	return false
}

func (s *subscriber) subscribe(prefix string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		if len(s.subs) < 64 {
			s.subs = append(s.subs, prefix)
		}
		return
	}
	for i, p := range s.subs {
		if p == prefix {
			s.subs = append(s.subs[:i], s.subs[i+1:]...)
			return
		}
	}
}

// servePub serves one PUB peer: reads its subscriptions, writes the
// batches queued for it.
func (p *Publisher) servePub(c net.Conn) {
	r, w := bufio.NewReader(c), bufio.NewWriterSize(c, 64<<10)
	peer, err := handshake(c, r, w, "PUB")
	if err != nil || (peer != "SUB" && peer != "XSUB") {
		p.lg.Debug("subscriber refused", zap.String("peer", peer), zap.Error(err))
		return
	}
	s := &subscriber{c: c, q: make(chan *message, p.cfg.SubscriberQueue)}
	p.smu.Lock()
	p.subs[s] = struct{}{}
	p.smu.Unlock()
	defer func() {
		p.smu.Lock()
		delete(p.subs, s)
		p.smu.Unlock()
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		welcomed := false
		for {
			parts, cmd, err := readMessage(r)
			if err != nil {
				c.Close()
				return
			}
			var prefix string
			on := false
			switch {
			case cmd && commandName(parts[0]) == "SUBSCRIBE":
				prefix, on = string(parts[0][10:]), true
			case cmd && commandName(parts[0]) == "CANCEL":
				prefix = string(parts[0][7:])
			case !cmd && len(parts) == 1 && len(parts[0]) > 0 && parts[0][0] <= 1:
				prefix, on = string(parts[0][1:]), parts[0][0] == 1
			default:
				continue
			}
			s.subscribe(prefix, on)
			if on && p.cfg.SubscribeSnapshot && !welcomed {
				// One snapshot per connection, for its first
				// subscription: a snapshot walks the whole table.
				welcomed = true
				select {
				case p.welcome <- welcome{s: s, prefix: prefix}:
				default: // as many waiting as subscribers: one is stuck
				}
			}
		}
	}()
	for {
		select {
		case <-done:
			return
		case <-p.stop:
			return
		case m := <-s.q:
			_ = c.SetWriteDeadline(time.Now().Add(p.cfg.WriteTimeout))
			err := writeMessage(w, m.topic, m.seq, m.payload)
			for err == nil && len(s.q) > 0 {
				m = <-s.q
				err = writeMessage(w, m.topic, m.seq, m.payload)
			}
			if err == nil {
				err = w.Flush()
			}
			if err != nil {
				c.Close()
				<-done
				return
			}
		}
	}
}

// endSeq ends a replay: sequence -1, as vLLM's publisher sends it.
var endSeq = seqBytes(-1)

// serveReplay serves one ROUTER peer: each request is an 8-byte
// big-endian start sequence number (after an empty delimiter frame, as a
// DEALER or REQ sends it); the answer is every batch from that number
// still kept, or, when the buffer cannot fill the gap, a snapshot of what
// is held, each as (topic, seq, payload), then ("", -1, ""). A request
// that is not one is dropped and counted.
func (p *Publisher) serveReplay(c net.Conn) {
	r, w := bufio.NewReader(c), bufio.NewWriterSize(c, 64<<10)
	peer, err := handshake(c, r, w, "ROUTER")
	if err != nil || (peer != "DEALER" && peer != "REQ") {
		p.lg.Debug("replay peer refused", zap.String("peer", peer), zap.Error(err))
		return
	}
	for {
		parts, cmd, err := readMessage(r)
		if err != nil {
			return
		}
		if cmd {
			continue
		}
		var delim [][]byte
		switch {
		case len(parts) == 2 && len(parts[0]) == 0 && len(parts[1]) == 8:
			delim = [][]byte{{}}
		case len(parts) == 1 && len(parts[0]) == 8 && peer == "DEALER":
		default:
			p.badRequests.Add(1)
			p.lg.Debug("bad replay request dropped", zap.Int("frames", len(parts)))
			continue
		}
		start := int64(binary.BigEndian.Uint64(parts[len(parts)-1]))
		if err := p.replay(c, w, delim, start); err != nil {
			return
		}
	}
}

func (p *Publisher) replay(c net.Conn, w *bufio.Writer, delim [][]byte, start int64) error {
	send := func(topic, seq, payload []byte) error {
		_ = c.SetWriteDeadline(time.Now().Add(p.cfg.WriteTimeout))
		return writeMessage(w, append(delim, topic, seq, payload)...)
	}
	p.rmu.Lock()
	var kept []ringEntry
	ok := start >= 0
	if ok && start <= p.head {
		ok = len(p.ring) > 0 && p.ring[0].seq <= start
		next := start
		for _, e := range p.ring {
			if e.seq < start {
				continue
			}
			if e.seq != next {
				ok = false // a hole: changes were lost there
				break
			}
			kept = append(kept, e)
			next++
		}
	}
	head := p.head
	p.rmu.Unlock()
	if ok {
		for _, e := range kept {
			if err := send(e.topic, seqBytes(e.seq), e.payload); err != nil {
				return err
			}
			p.replayed.Add(1)
		}
	} else if err := p.sendSnapshot(send, head); err != nil {
		return err
	}
	if err := send(nil, endSeq, nil); err != nil {
		return err
	}
	return w.Flush()
}

// sendSnapshot sends what is held now as BlockStored batches, each
// numbered head (the last batch published): the changes still queued
// are published after it with higher numbers, and repeat nothing a
// subscriber cannot apply twice.
func (p *Publisher) sendSnapshot(send func(topic, seq, payload []byte) error, head int64) error {
	p.snapMu.Lock()
	defer p.snapMu.Unlock()
	p.snapshots.Add(1)
	p.mu.Lock()
	evs := p.snapshotLocked()
	p.mu.Unlock()
	seq := seqBytes(head)
	for len(evs) > 0 {
		t, n := p.nextRun(evs)
		payload := encodeBatch(nil, float64(time.Now().UnixNano())/1e9, evs[:n], p.asInt)
		if err := send([]byte(t), seq, payload); err != nil {
			return err
		}
		p.replayed.Add(1)
		evs = evs[n:]
	}
	return nil
}
