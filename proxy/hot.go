package proxy

// Hotspot replication (DESIGN.md §6). A fetched block is normally kept as a
// low-priority copy, evicted before owned blocks. A block this node keeps
// fetching from other nodes (its copy was evicted, and it is read again) is
// hot here: once it was fetched HotThreshold times within about HotWindow,
// the next fetch commits it at full priority instead, as a hot replica, so
// that it stays and later reads are served here without asking its owner.
// Hot replicas are bounded (HotMaxReplicas, HotMaxBytes) and expire: after
// HotTTL a replica is demoted to a low-priority copy (or forgotten if this
// node has become an owner), and must earn its promotion again. Why the
// requester decides, and not the owner: docs/cluster.md.

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
)

// HotStats counts hot replicas.
type HotStats struct {
	Created   int64 // fetches that kept a block as a hot replica
	Expired   int64 // replicas demoted to low-priority copies after HotTTL (or now owned here)
	Lost      int64 // replicas the store evicted or deleted before they expired
	Full      int64 // promotions refused because the bounds were reached
	Live      int64 // hot replicas now
	LiveBytes int64 // their bytes
}

type hotReplica struct {
	ns    string
	key   []byte
	size  int64
	until time.Time
}

// hotTracker counts remote fetches per block and tracks the live hot
// replicas. One mutex: every operation is O(1) except the periodic sweep,
// which is O(live) ≤ HotMaxReplicas.
type hotTracker struct {
	cfg RouteConfig
	lg  *zap.Logger

	mu        sync.Mutex
	cur, old  map[string]int32 // fetches per block in this window, in the previous one
	winStart  time.Time
	live      map[string]*hotReplica
	liveBytes int64
	pending   int // promotions in flight, counted against HotMaxReplicas

	created, expired, lost, full atomic.Int64
}

func newHotTracker(cfg RouteConfig, lg *zap.Logger) *hotTracker {
	return &hotTracker{cfg: cfg, lg: lg, cur: map[string]int32{}, old: map[string]int32{},
		winStart: cfg.Clock.Now(), live: map[string]*hotReplica{}}
}

// startHot turns hot replication on when configured; a sweeper expires
// replicas until r.stop.
func (r *router) startHot() {
	if r.cfg.HotThreshold <= 0 {
		return
	}
	r.hot = newHotTracker(r.cfg, r.lg.Named("hot"))
	every := min(r.cfg.HotTTL, r.cfg.HotWindow) / 4
	every = min(max(every, 10*time.Millisecond), 5*time.Second)
	r.workers.Add(1)
	go func() {
		defer r.workers.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-t.C:
				r.sweepHot(context.Background())
			}
		}
	}()
}

// rotateLocked starts a new counting window when the current one is over.
func (h *hotTracker) rotateLocked(now time.Time) {
	switch el := now.Sub(h.winStart); {
	case el >= 2*h.cfg.HotWindow:
		h.cur, h.old = map[string]int32{}, map[string]int32{}
		h.winStart = now
	case el >= h.cfg.HotWindow:
		h.old, h.cur = h.cur, map[string]int32{}
		h.winStart = h.winStart.Add(h.cfg.HotWindow)
	}
}

// note counts one remote fetch of fk and reports whether it should keep
// the block as a hot replica. A true answer reserves a slot: done must
// follow. Safe on a nil tracker (off).
func (h *hotTracker) note(fk string) bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rotateLocked(h.cfg.Clock.Now())
	hot, full := h.hotLocked(fk)
	if _, live := h.live[fk]; !live {
		h.countLocked(fk)
	}
	if full {
		h.full.Add(1)
	}
	if hot {
		h.pending++
	}
	return hot
}

// noteDirect is note for a fetch that would land outside the store (a
// client's buffer, GetInto): it counts the fetch and reports false, or,
// when note would keep the block as a hot replica, reports true and
// counts nothing (the fetch then goes through the store, which notes it).
func (h *hotTracker) noteDirect(fk string) bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rotateLocked(h.cfg.Clock.Now())
	if hot, _ := h.hotLocked(fk); hot {
		return true
	}
	h.countLocked(fk)
	return false
}

// hotLocked reports whether a fetch of fk now keeps it as a hot replica:
// a live replica fetched again (the store lost it: fetched hot again into
// the slot it holds), or the fetch that brings its count in the window to
// HotThreshold with room for one more replica (full: at the threshold
// without room).
func (h *hotTracker) hotLocked(fk string) (hot, full bool) {
	if _, ok := h.live[fk]; ok {
		return true, false
	}
	if n := h.cur[fk] + h.old[fk] + 1; int(n) < h.cfg.HotThreshold {
		return false, false
	}
	if len(h.live)+h.pending >= h.cfg.HotMaxReplicas || h.liveBytes >= h.cfg.HotMaxBytes {
		return false, true
	}
	return true, false
}

// countLocked counts one fetch of fk in the current window (a key not yet
// counted there only while fewer than HotTracked are).
func (h *hotTracker) countLocked(fk string) {
	if _, ok := h.cur[fk]; ok || len(h.cur) < h.cfg.HotTracked {
		h.cur[fk]++
	}
}

// done ends a promotion note granted: when ok the block is now local at
// full priority (its size is read from the store).
func (h *hotTracker) done(ctx context.Context, fk, ns string, key []byte, ok bool, s Store) {
	var size int64
	if ok {
		info, present := s.Stat(ctx, ns, key)
		ok, size = present, info.Size
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pending--
	if !ok {
		return
	}
	if old, ok := h.live[fk]; ok {
		h.liveBytes -= old.size
	} else {
		h.created.Add(1)
	}
	h.live[fk] = &hotReplica{ns: ns, key: append([]byte(nil), key...), size: size, until: h.cfg.Clock.Now().Add(h.cfg.HotTTL)}
	h.liveBytes += size
	delete(h.cur, fk)
	delete(h.old, fk)
}

// sweepHot demotes the hot replicas whose TTL is over and forgets those the
// store no longer holds.
func (r *router) sweepHot(ctx context.Context) {
	h := r.hot
	if h == nil {
		return
	}
	now := h.cfg.Clock.Now()
	h.mu.Lock()
	h.rotateLocked(now)
	var due, check []*hotReplica
	var dueKeys, checkKeys []string
	for fk, rep := range h.live {
		if !now.Before(rep.until) {
			due, dueKeys = append(due, rep), append(dueKeys, fk)
		} else {
			check, checkKeys = append(check, rep), append(checkKeys, fk)
		}
	}
	h.mu.Unlock()
	for i, rep := range check {
		if _, ok := r.store.Stat(ctx, rep.ns, rep.key); !ok {
			h.forget(checkKeys[i], rep, &h.lost)
		}
	}
	for i, rep := range due {
		if !h.forget(dueKeys[i], rep, &h.expired) {
			continue
		}
		if r.owns(rep.ns, rep.key) {
			continue // an owned block now: it keeps full priority
		}
		if err := demote(ctx, r.store, rep.ns, rep.key); err != nil {
			h.lg.Debug("hot replica demotion failed", zap.String("ns", rep.ns), zap.Error(err))
		}
	}
}

// forget drops rep from the live set (if it is still the entry of fk) and
// counts it in c.
func (h *hotTracker) forget(fk string, rep *hotReplica, c *atomic.Int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.live[fk] != rep {
		return false
	}
	delete(h.live, fk)
	h.liveBytes -= rep.size
	c.Add(1)
	return true
}

func (h *hotTracker) stats() HotStats {
	if h == nil {
		return HotStats{}
	}
	h.mu.Lock()
	live, bytes := int64(len(h.live)), h.liveBytes
	h.mu.Unlock()
	return HotStats{Created: h.created.Load(), Expired: h.expired.Load(), Lost: h.lost.Load(),
		Full: h.full.Load(), Live: live, LiveBytes: bytes}
}

// demote turns a full-priority block into a low-priority copy: it is
// read, deleted and stored again with the same bytes and the checksum they
// were stored with (a Put refuses bytes that no longer match it).
// A concurrent read may miss in between and fetch the block from its
// owner: a cache miss, never wrong bytes.
func demote(ctx context.Context, s Store, ns string, key []byte) error {
	v, info, err := s.Get(ctx, ns, key, nil)
	if err != nil {
		return err
	}
	if _, err := s.Delete(ctx, ns, key); err != nil {
		return err
	}
	_, err = s.Put(ctx, ns, key, v, cache.PutOptions{Depth: info.Depth, LowPriority: true, Checksum: info.Checksum, HasChecksum: true})
	return err
}
