package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"
)

// reconnect periodically joins one member held as failed, picked at
// random, so that the two sides of a healed partition merge again (serf's
// reconnect): one push/pull with any member of the other side merges the
// whole of both tables. Joining every failed member each time would cost a
// fleet whose views collapsed (F members falsely failed) F push/pulls of
// the whole table per member per interval, O(F·N²) bytes in all, while
// the collapse lasts (docs/scale.md). A member that left gracefully is
// never contacted again.
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
		if len(addrs) == 0 {
			continue
		}
		a := addrs[rand.IntN(len(addrs))]
		if n, err := ml.Join([]string{a}); err == nil && n > 0 {
			c.lg.Info("reconnected to a failed member", zap.String("addr", a))
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

// joinRound resolves cfg.Join and joins (joinSome) the addresses other
// than this node's own; with onlyNew, live members' addresses are skipped too (and
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
	n, err := joinSome(ml, targets)
	if n == 0 {
		c.joinFailures.Add(1)
		return 0, fmt.Errorf("%w: %v", ErrJoin, errors.Join(err, rerr))
	}
	return n, nil
}

// joinFanout is how many addresses one join contacts at most while they
// answer. Each contacted member exchanges the whole member table with the
// joiner (a push/pull, ~300 bytes a member), and gossip spreads the join
// from there, so one answer is enough and three ride out a peer that
// dies meanwhile. Joining every address a headless Service resolves to
// would cost a 1,000-pod fleet 1,000 table exchanges per joining pod
// (docs/scale.md).
const joinFanout = 3

// joinSome joins targets in a random order, joinFanout at a time, until
// some answered or none is left; it returns how many answered.
func joinSome(ml *memberlist.Memberlist, targets []string) (int, error) {
	targets = slices.Clone(targets)
	rand.Shuffle(len(targets), func(i, j int) { targets[i], targets[j] = targets[j], targets[i] })
	var errs []error
	for len(targets) > 0 {
		k := min(joinFanout, len(targets))
		n, err := ml.Join(targets[:k])
		targets = targets[k:]
		if n > 0 {
			return n, nil
		}
		errs = append(errs, err)
	}
	return 0, errors.Join(errs...)
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
// addresses), in a random order and at most joinFanout at a time until
// some answered, and merges state with those. It returns how many
// answered; the error wraps ErrJoin when none did.
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
	n, err := joinSome(ml, targets)
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
