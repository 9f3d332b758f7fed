package cluster

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"
)

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
	c.setMemberLocked(name, &m)
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
