//go:build linux

package dram

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
)

func reserve(t *testing.T, tr *Tier, ns, key string, size int64, ttl time.Duration) cache.Reservation {
	t.Helper()
	r, err := tr.Reserve(ctx, ns, []byte(key), size, cache.PutOptions{}, ttl)
	if err != nil {
		t.Fatalf("Reserve %s: %v", key, err)
	}
	return r
}

func TestReserveCommit(t *testing.T) {
	cfg, fc := testConfig(t, 4<<20)
	tr := newTier(t, cfg)
	val := pattern("k", 100<<10)

	r := reserve(t, tr, "ns", "k", int64(len(val)), 0)
	if r.Deadline() != fc.Now().Add(cfg.ReserveTimeout) {
		t.Fatalf("deadline %v, want now+%v", r.Deadline().Sub(fc.Now()), cfg.ReserveTimeout)
	}
	a, off, n := r.Location()
	if a != 0 || n != int64(len(val)) || off%pageSize != 0 {
		t.Fatalf("Location = %d, %d, %d", a, off, n)
	}
	// Invisible until Commit, but counted.
	copy(r.Bytes(), val)
	if _, ok := tr.Stat(ctx, "ns", []byte("k")); ok {
		t.Fatal("reserved block visible to Stat")
	}
	if _, _, err := tr.Get(ctx, "ns", []byte("k"), nil); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("Get of a reserved block: %v", err)
	}
	if _, err := tr.Acquire(ctx, "ns", []byte("k"), 0); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("Acquire of a reserved block: %v", err)
	}
	st := tr.Stats().Tiers[0]
	if st.UsedBytes != footprint(int64(len(val))) || st.Blocks != 0 {
		t.Fatalf("stats while reserved: %+v", st)
	}
	if rs := tr.ReserveStats(); rs.Open != 1 || rs.OpenBytes != st.UsedBytes {
		t.Fatalf("ReserveStats = %+v", rs)
	}

	existed, err := r.Commit(ctx, cache.Checksum(val), true)
	if existed || err != nil {
		t.Fatalf("Commit = %v, %v", existed, err)
	}
	got, info, err := tr.Get(ctx, "ns", []byte("k"), nil)
	if err != nil || !bytes.Equal(got, val) || info.Checksum != cache.Checksum(val) {
		t.Fatalf("Get after commit: %v, info %+v", err, info)
	}
	if rs := tr.ReserveStats(); rs.Open != 0 || rs.OpenBytes != 0 {
		t.Fatalf("ReserveStats after commit = %+v", rs)
	}
	if _, err := r.Commit(ctx, 0, false); !errors.Is(err, cache.ErrLeaseExpired) {
		t.Fatalf("double Commit = %v", err)
	}
	if err := r.Abort(); !errors.Is(err, cache.ErrLeaseExpired) {
		t.Fatalf("Abort after Commit = %v", err)
	}
	// Reserving a present key: nothing to write.
	if _, err := tr.Reserve(ctx, "ns", []byte("k"), 10, cache.PutOptions{}, 0); !errors.Is(err, cache.ErrExists) {
		t.Fatalf("Reserve of a present key = %v", err)
	}
}

func TestReserveErrors(t *testing.T) {
	cfg, fc := testConfig(t, 2<<20)
	tr := newTier(t, cfg)
	tests := []struct {
		name string
		key  string
		size int64
		want error
	}{
		{"empty key", "", 10, cache.ErrInvalidKey},
		{"negative size", "k", -1, cache.ErrTooLarge},
		{"over MaxValueSize", "k", cfg.MaxValueSize + 1, cache.ErrTooLarge},
		{"over capacity", "k", 3 << 20, cache.ErrNoSpace},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tr.Reserve(ctx, "ns", []byte(tc.key), tc.size, cache.PutOptions{}, 0); !errors.Is(err, tc.want) {
				t.Fatalf("Reserve = %v, want %v", err, tc.want)
			}
		})
	}

	t.Run("checksum mismatch frees the slot", func(t *testing.T) {
		r := reserve(t, tr, "ns", "c", 4096, 0)
		copy(r.Bytes(), pattern("c", 4096))
		if _, err := r.Commit(ctx, cache.Checksum(pattern("other", 4096)), true); !errors.Is(err, cache.ErrChecksum) {
			t.Fatalf("Commit = %v", err)
		}
		if _, ok := tr.Stat(ctx, "ns", []byte("c")); ok {
			t.Fatal("block published despite the mismatch")
		}
		if u := tr.Stats().Tiers[0].UsedBytes; u != 0 {
			t.Fatalf("used %d after a failed commit", u)
		}
	})

	t.Run("abort frees", func(t *testing.T) {
		r := reserve(t, tr, "ns", "a", 1<<20, 0)
		if err := r.Abort(); err != nil {
			t.Fatal(err)
		}
		if err := r.Abort(); !errors.Is(err, cache.ErrLeaseExpired) {
			t.Fatalf("second Abort = %v", err)
		}
		if u := tr.Stats().Tiers[0].UsedBytes; u != 0 {
			t.Fatalf("used %d after abort", u)
		}
	})

	t.Run("reserved space is not evictable", func(t *testing.T) {
		r := reserve(t, tr, "ns", "big", 3<<19, 0) // 1.5 MiB of 2 MiB
		if _, err := tr.Put(ctx, "ns", []byte("p"), pattern("p", 1<<20), cache.PutOptions{}); !errors.Is(err, cache.ErrNoSpace) {
			t.Fatalf("Put beside a reservation = %v", err)
		}
		if _, err := tr.Reserve(ctx, "ns", []byte("q"), 1<<20, cache.PutOptions{}, 0); !errors.Is(err, cache.ErrNoSpace) {
			t.Fatalf("Reserve beside a reservation = %v", err)
		}
		if err := r.Abort(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("expired reservation is reclaimed", func(t *testing.T) {
		r := reserve(t, tr, "ns", "x", 3<<19, time.Second)
		if r.Expired() {
			t.Fatal("expired at once")
		}
		fc.Advance(time.Second)
		if !r.Expired() {
			t.Fatal("not expired at its deadline")
		}
		before := tr.ReserveStats().Reclaimed
		// A put needing the space reclaims it.
		if _, err := tr.Put(ctx, "ns", []byte("p"), pattern("p", 1<<20), cache.PutOptions{}); err != nil {
			t.Fatalf("Put after the deadline: %v", err)
		}
		if rs := tr.ReserveStats(); rs.Reclaimed != before+1 || rs.Open != 0 || rs.OpenBytes != 0 {
			t.Fatalf("ReserveStats = %+v", rs)
		}
		if _, err := r.Commit(ctx, 0, false); !errors.Is(err, cache.ErrLeaseExpired) {
			t.Fatalf("Commit after reclaim = %v", err)
		}
		tr.Delete(ctx, "ns", []byte("p"))
	})

	t.Run("commit after the deadline", func(t *testing.T) {
		r := reserve(t, tr, "ns", "y", 4096, time.Second)
		fc.Advance(2 * time.Second)
		if _, err := r.Commit(ctx, 0, false); !errors.Is(err, cache.ErrLeaseExpired) {
			t.Fatalf("Commit = %v", err)
		}
		if u := tr.Stats().Tiers[0].UsedBytes; u != 0 {
			t.Fatalf("used %d", u)
		}
	})

	t.Run("Reap", func(t *testing.T) {
		reserve(t, tr, "ns", "z1", 4096, time.Second)
		reserve(t, tr, "ns", "z2", 4096, time.Minute)
		fc.Advance(2 * time.Second)
		if n := tr.Reap(); n != 1 {
			t.Fatalf("Reap = %d, want 1", n)
		}
		if rs := tr.ReserveStats(); rs.Open != 1 {
			t.Fatalf("ReserveStats = %+v", rs)
		}
	})

	t.Run("ttl capped", func(t *testing.T) {
		r := reserve(t, tr, "ns", "cap", 1, time.Hour)
		defer r.Abort()
		if want := fc.Now().Add(max(cfg.MaxLease, cfg.ReserveTimeout)); r.Deadline() != want {
			t.Fatalf("deadline now+%v", r.Deadline().Sub(fc.Now()))
		}
	})
}

// TestReserveRace: concurrent reservations, puts and commits of one key
// leave exactly one block with one of the written values, and free every
// losing slot.
func TestReserveRace(t *testing.T) {
	cfg, _ := testConfig(t, 8<<20)
	tr := newTier(t, cfg)
	const writers = 8
	for round := 0; round < 20; round++ {
		key := fmt.Sprintf("k%d", round)
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins := 0
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				val := pattern(key, 70<<10)
				var existed bool
				var err error
				if w%3 == 0 {
					existed, err = tr.Put(ctx, "ns", []byte(key), val, cache.PutOptions{})
				} else {
					r, rerr := tr.Reserve(ctx, "ns", []byte(key), int64(len(val)), cache.PutOptions{}, 0)
					if errors.Is(rerr, cache.ErrExists) {
						return
					}
					if rerr != nil {
						t.Error(rerr)
						return
					}
					copy(r.Bytes(), val)
					existed, err = r.Commit(ctx, cache.Checksum(val), true)
				}
				if err != nil {
					t.Error(err)
				}
				if !existed && err == nil {
					mu.Lock()
					wins++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if wins != 1 {
			t.Fatalf("round %d: %d winners", round, wins)
		}
	}
	st := tr.Stats().Tiers[0]
	if st.Blocks != 20 || st.UsedBytes != 20*footprint(70<<10) {
		t.Fatalf("stats %+v: losing slots leaked", st)
	}
}

func TestLeaseRenew(t *testing.T) {
	cfg, fc := testConfig(t, 4<<20)
	tr := newTier(t, cfg)
	val := pattern("k", 64<<10)
	if _, err := tr.Put(ctx, "ns", []byte("k"), val, cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	l, err := tr.Acquire(ctx, "ns", []byte("k"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	fc.Advance(900 * time.Millisecond)
	d, err := l.Renew(time.Second)
	if err != nil || d != fc.Now().Add(time.Second) || l.Deadline() != d {
		t.Fatalf("Renew = %v, %v", d, err)
	}
	fc.Advance(900 * time.Millisecond)
	if l.Expired() {
		t.Fatal("renewed lease expired early")
	}
	// Still pinned: filling the tier does not evict it.
	putN(t, tr, "fill", 70, 64<<10, cache.PutOptions{})
	if !bytes.Equal(l.Bytes(), val) {
		t.Fatal("renewed lease lost its bytes")
	}
	fc.Advance(200 * time.Millisecond)
	if !l.Expired() {
		t.Fatal("not expired")
	}
	if _, err := l.Renew(time.Second); !errors.Is(err, cache.ErrLeaseExpired) {
		t.Fatalf("Renew after the deadline = %v", err)
	}
	l.Release()
	l2, err := tr.Acquire(ctx, "fill", []byte("k69"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l2.Release()
	if _, err := l2.Renew(time.Second); !errors.Is(err, cache.ErrLeaseExpired) {
		t.Fatalf("Renew after Release = %v", err)
	}
}
