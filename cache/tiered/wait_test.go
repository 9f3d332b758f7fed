package tiered

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/poll"
)

// TestDemotionWaitKeepsEveryBlock: with DemotionWait, evictions that find a
// full queue wait for the writer instead of dropping; every evicted block
// reaches SSD and reads back whole.
func TestDemotionWaitKeepsEveryBlock(t *testing.T) {
	cfg := testConfig(t, 4*mib, t.TempDir())
	cfg.QueueBlocks = 2
	cfg.DemotionWait = time.Minute
	s := newStore(t, cfg)
	s.hookWrite = func() { time.Sleep(5 * time.Millisecond) } // a writer slower than the puts

	const n = 24
	var wg sync.WaitGroup
	for w := range 4 { // concurrent puts evict (and wait) at once
		wg.Go(func() {
			for i := w; i < n; i += 4 {
				if _, err := s.Put(ctx, "ns", key(i), value(uint64(i), mib), cache.PutOptions{}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	waitIdle(t, s)
	var m Movement
	poll.Until(t, 20*time.Second, "every eviction demoted", func() bool {
		m = s.Movement()
		return m.Demotions == s.dram.Stats().Tiers[0].Evictions
	})
	if m.DemotionsDropped != 0 || m.DemotionErrors != 0 {
		t.Fatalf("dropped %d, errors %d", m.DemotionsDropped, m.DemotionErrors)
	}
	if m.DemotionWaits == 0 || m.DemotionWaitTime <= 0 {
		t.Fatalf("no eviction waited: %+v", m)
	}
	for i := range n {
		v, _, err := s.Get(ctx, "ns", key(i), nil)
		if err != nil || !bytes.Equal(v, value(uint64(i), mib)) {
			t.Fatalf("block %d: %v", i, err)
		}
	}
}

// TestDemotionWaitIsBounded: with the writer stuck, an eviction waits
// DemotionWait, then drops the block; puts finish.
func TestDemotionWaitIsBounded(t *testing.T) {
	const wait = 30 * time.Millisecond
	s, release := stuckStore(t, wait)

	for i := range 12 {
		if _, err := s.Put(ctx, "ns", key(i), value(uint64(i), mib), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	m := s.Movement()
	if m.DemotionsDropped == 0 || m.DemotionWaits < m.DemotionsDropped {
		t.Fatalf("dropped %d after %d waits", m.DemotionsDropped, m.DemotionWaits)
	}
	// The writer never made room: every wait ran its whole length.
	if m.DemotionWaitTime < time.Duration(m.DemotionWaits)*wait {
		t.Fatalf("%d waits took %v in all, under %v each", m.DemotionWaits, m.DemotionWaitTime, wait)
	}
	release()
	waitIdle(t, s)
}

// stuckStore returns a store with DemotionWait wait, a demotion queue of
// one block, no watermark loop (puts evict inline: theirs are the waits),
// and a writer stuck before its first SSD write until release.
func stuckStore(t *testing.T, wait time.Duration) (s *Store, release func()) {
	t.Helper()
	cfg := testConfig(t, 4*mib, t.TempDir())
	cfg.QueueBlocks = 1
	cfg.DemotionWait = wait
	cfg.HighWatermark = -1
	s = newStore(t, cfg)
	gate := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	s.hookWrite = func() { <-gate }
	return s, release
}

// waitingEviction puts 16 blocks into a stuckStore from a goroutine until
// one eviction is with the writer, one queued and one waiting for room,
// and returns the waiting block's index and key, and the channel the
// goroutine's result arrives on once the puts go on.
func waitingEviction(t *testing.T, s *Store) (i int, victim []byte, done chan error) {
	t.Helper()
	done = make(chan error, 1)
	go func() {
		for i := range 16 {
			if _, err := s.Put(ctx, "ns", key(i), value(uint64(i), mib), cache.PutOptions{}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	var waiting string
	poll.Until(t, 20*time.Second, "an eviction waiting for room", func() bool {
		s.qmu.Lock()
		defer s.qmu.Unlock()
		for it := range s.evicting {
			if s.qslots == 0 { // not copying: waiting
				waiting = it.fk
				return true
			}
		}
		return false
	})
	// it.fk is uvarint(len(ns)) ‖ ns ‖ key, with ns "ns".
	victim = []byte(waiting[1+len("ns"):])
	if _, err := fmt.Sscanf(string(victim), "block-%06d", &i); err != nil {
		t.Fatal(err)
	}
	return i, victim, done
}

// TestDeleteCancelsWaitingEviction: a block deleted while its eviction
// waits for room is not written to SSD when room comes, the waiting put
// goes on at once, and the give-up is not counted as a drop.
func TestDeleteCancelsWaitingEviction(t *testing.T) {
	s, release := stuckStore(t, time.Minute)
	_, victim, done := waitingEviction(t, s)
	waiting := fkey("ns", victim)
	dropped := s.Movement().DemotionsDropped
	// Reads find the block while its eviction waits, so Delete finds it.
	if ok, err := s.Delete(ctx, "ns", victim); !ok || err != nil {
		t.Fatalf("Delete of %s while its eviction waits: %v %v", victim, ok, err)
	}
	// The put that was waiting goes on; later evictions wait again, so
	// let the writer run for the rest.
	poll.Until(t, 20*time.Second, "the cancelled eviction given up", func() bool {
		s.qmu.Lock()
		defer s.qmu.Unlock()
		for it := range s.evicting {
			if it.fk == waiting {
				return false
			}
		}
		return true
	})
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitIdle(t, s)
	if _, _, err := s.Get(ctx, "ns", victim, nil); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("deleted block %q came back: %v", victim, err)
	}
	if _, ok := s.ssd.Stat(ctx, "ns", victim); ok {
		t.Fatalf("deleted block %q written to SSD", victim)
	}
	if m := s.Movement(); m.DemotionsDropped != dropped {
		t.Fatalf("a cancelled eviction counted as dropped: %d → %d", dropped, m.DemotionsDropped)
	}
}

// fullQueueWithColdBlock returns a store with DemotionWait whose demotion
// queue is full (its writer stuck on one block until release, one queued),
// and the key of a block that is in SSD only.
func fullQueueWithColdBlock(t *testing.T) (s *Store, cold []byte, release func()) {
	t.Helper()
	s, release = stuckStore(t, time.Minute)

	// A durable block is in SSD already: its eviction queues nothing.
	cold = []byte("cold")
	if _, err := s.Put(ctx, "ns", cold, value(99, mib), cache.PutOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	// Puts until it is evicted, one eviction is with the stuck writer and
	// the queue's one place is taken.
	for i := 0; ; i++ {
		if i == 16 {
			t.Fatal("the queue never filled")
		}
		if _, err := s.Put(ctx, "ns", key(i), value(uint64(i), mib), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		// Let the writer take the first queued block (it stays on it), so
		// that the next eviction finds the queue's place free.
		var filled bool
		poll.Until(t, 20*time.Second, "the writer on its block", func() bool {
			s.qmu.Lock()
			defer s.qmu.Unlock()
			filled = len(s.pending) == 2 && len(s.queue) == 1
			return len(s.queue) == 0 || filled
		})
		if _, ok := s.dram.Stat(ctx, "ns", cold); !ok && filled {
			return s, cold, release
		}
	}
}

// TestReadsDoNotWaitForRoom: with DemotionWait and the demotion queue
// full, a read of a block in SSD is served without promoting it (a
// promotion would evict into the full queue and wait for the writer).
func TestReadsDoNotWaitForRoom(t *testing.T) {
	s, cold, release := fullQueueWithColdBlock(t)
	got := make(chan error, 1)
	go func() {
		v, _, err := s.Get(ctx, "ns", cold, nil)
		if err == nil && !bytes.Equal(v, value(99, mib)) {
			err = errors.New("wrong bytes")
		}
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a read waited for room in the demotion queue")
	}
	if _, ok := s.dram.Stat(ctx, "ns", cold); ok {
		t.Fatalf("promoted into DRAM with the demotion queue full: %+v full %v", s.Movement(), s.queueFull(mib))
	}
	release()
	waitIdle(t, s)
	// With room again, a read promotes as before.
	if _, _, err := s.Get(ctx, "ns", cold, nil); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 20*time.Second, "the block promoted", func() bool {
		_, ok := s.dram.Stat(ctx, "ns", cold)
		return ok
	})
}

// TestReadsFindWaitingEviction: a block whose eviction waits for room is
// in no tier (unlinked from DRAM, not queued, not in SSD), yet Stat finds
// it and Get returns its bytes, from the evicted block's memory.
func TestReadsFindWaitingEviction(t *testing.T) {
	s, release := stuckStore(t, time.Minute)
	i, victim, done := waitingEviction(t, s)
	if _, ok := s.dram.Stat(ctx, "ns", victim); ok {
		t.Fatalf("%s still in DRAM", victim)
	}
	if info, ok := s.Stat(ctx, "ns", victim); !ok || info.Size != mib {
		t.Fatalf("Stat of %s while its eviction waits: %+v %v", victim, info, ok)
	}
	v, _, err := s.Get(ctx, "ns", victim, nil)
	if err != nil || !bytes.Equal(v, value(uint64(i), mib)) {
		t.Fatalf("Get of %s while its eviction waits: %v", victim, err)
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitIdle(t, s)
}

// TestAcquirePromotesWithQueueFull: a pinned read needs the block in DRAM,
// so Acquire of a block in SSD promotes it even with the demotion queue
// full (waiting for room) rather than miss.
func TestAcquirePromotesWithQueueFull(t *testing.T) {
	s, cold, release := fullQueueWithColdBlock(t)
	type result struct {
		l   cache.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := s.Acquire(ctx, "ns", cold, time.Minute)
		got <- result{l, err}
	}()
	// It waits for room; the writer goes on after a while.
	select {
	case r := <-got:
		t.Fatalf("Acquire returned with the queue full: %v", r.err)
	case <-time.After(100 * time.Millisecond):
	}
	release()
	r := <-got
	if r.err != nil {
		t.Fatalf("Acquire of a block in SSD: %v", r.err)
	}
	defer r.l.Release()
	if !bytes.Equal(r.l.Bytes(), value(99, mib)) {
		t.Fatal("wrong bytes")
	}
	waitIdle(t, s)
}

// TestDeleteDuringEvictionWindow: an eviction unlinks its block from DRAM
// before its onEvict registers it, so a Delete (or Clear) can run entirely
// in between: it finds the block in no tier. The Delete must wait for that
// onEvict (dram's Delete), which must give the block up (the store's
// removing mark) rather than queue it, and the block must not come back.
// Without the wait the Delete returns at once; without the mark the block
// is written to SSD after it.
func TestDeleteDuringEvictionWindow(t *testing.T) {
	for _, op := range []string{"Delete", "Clear"} {
		t.Run(op, func(t *testing.T) {
			s := newStore(t, testConfig(t, 4*mib, t.TempDir()))
			// A writer slower than the Delete: a block queued meanwhile
			// would reach SSD after it.
			s.hookWrite = func() { time.Sleep(50 * time.Millisecond) }
			victim := []byte("victim")
			if _, err := s.Put(ctx, "ns", victim, value(7, mib), cache.PutOptions{}); err != nil {
				t.Fatal(err)
			}
			entered, gate := make(chan struct{}), make(chan struct{})
			var once sync.Once
			open := func() { once.Do(func() { close(gate) }) }
			t.Cleanup(open) // a failure must not leave the putter stuck
			s.hookEvict = func(_ string, k []byte) {
				if bytes.Equal(k, victim) {
					close(entered)
					<-gate // unlinked from DRAM, not registered yet
				}
			}
			puts := make(chan error, 1)
			go func() { // evicts the victim, and stops in its onEvict
				for i := range 8 {
					if _, err := s.Put(ctx, "other", key(i), value(uint64(i), mib), cache.PutOptions{}); err != nil {
						puts <- err
						return
					}
				}
				puts <- nil
			}()
			<-entered
			removed := make(chan error, 1)
			go func() {
				var err error
				if op == "Delete" {
					_, err = s.Delete(ctx, "ns", victim)
				} else {
					_, err = s.Clear(ctx, "ns")
				}
				removed <- err
			}()
			select {
			case err := <-removed:
				t.Fatalf("%s returned (%v) while an eviction of its block was still to demote it", op, err)
			case <-time.After(100 * time.Millisecond):
			}
			open()
			if err := <-removed; err != nil {
				t.Fatal(err)
			}
			if err := <-puts; err != nil {
				t.Fatal(err)
			}
			waitIdle(t, s)
			if _, ok := s.ssd.Stat(ctx, "ns", victim); ok {
				t.Fatalf("the block came back in SSD after %s", op)
			}
			if v, _, err := s.Get(ctx, "ns", victim, nil); !errors.Is(err, cache.ErrNotFound) {
				t.Fatalf("Get after %s: %d bytes, %v; want not found", op, len(v), err)
			}
			if m := s.Movement(); m.DemotionsDropped != 0 {
				t.Fatalf("the given-up demotion counted as dropped: %+v", m)
			}
		})
	}
}
