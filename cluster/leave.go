package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"
)

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
