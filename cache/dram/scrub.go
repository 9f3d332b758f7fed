package dram

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/clock"
)

// DefaultScrubRate is the default Scrubber rate, in bytes per second: about
// 2.6 % of one core. Scrubbing unthrottled, one core checks 12.6–12.8 GB
// per CPU second of 1 MiB blocks coming from memory with internal/crc32c
// (4.9–5.7 with hash/crc32 before it; BenchmarkScrubOneCore on the dev VM,
// AMD EPYC, 2026-12-03 07:44 UTC, both builds alternating); 320 MiB/s
// (335 MB/s) is 2.6 % of that. At that rate a pass over a full 4 GiB tier
// takes 13 s.
const DefaultScrubRate = 320 << 20

// ScrubConfig configures a Scrubber.
type ScrubConfig struct {
	// Rate is the average number of block bytes checksummed per second
	// (default DefaultScrubRate). A block is checked whole: the scrubber
	// runs ahead of the rate by at most one block and then waits.
	Rate int64
	// Tick is how often the scrubber wakes to check what the rate allows
	// since the last wake (default 100 ms). At most one pass over the tier
	// starts per tick, so a tier smaller than Rate × Tick is checked once a
	// tick, not faster.
	Tick time.Duration
	// Clock measures the time the rate is applied to (default: the tier's
	// clock).
	Clock clock.Clock
}

// DefaultScrubConfig returns the defaults documented on ScrubConfig (Clock
// stays nil: the tier's clock).
func DefaultScrubConfig() ScrubConfig {
	return ScrubConfig{Rate: DefaultScrubRate, Tick: 100 * time.Millisecond}
}

// withDefaults fills the zero fields with their defaults (Clock: the
// tier's, set by NewScrubber).
func (c ScrubConfig) withDefaults() ScrubConfig {
	d := DefaultScrubConfig()
	if c.Rate == 0 {
		c.Rate = d.Rate
	}
	if c.Tick == 0 {
		c.Tick = d.Tick
	}
	return c
}

// Validate reports every problem of c at once.
func (c ScrubConfig) Validate() error {
	var errs []error
	if c.Rate < 0 {
		errs = append(errs, fmt.Errorf("dram: scrub config: Rate %d is negative", c.Rate))
	}
	if c.Tick < 0 {
		errs = append(errs, fmt.Errorf("dram: scrub config: Tick %v is negative", c.Tick))
	}
	return errors.Join(errs...)
}

// ScrubStats is a snapshot of a Scrubber's counters.
type ScrubStats struct {
	Bytes    int64         // block bytes checksummed, ever
	Blocks   int64         // blocks checksummed, ever
	Failed   int64         // blocks whose bytes did not match their CRC-32C (removed), ever
	Passes   int64         // complete passes over the tier
	LastPass time.Duration // how long the last complete pass took (0 before the first)
}

// Scrubber re-checks the CRC-32C of the blocks resident in a DRAM tier in
// the background, at a bounded rate, and removes any block that fails (as a
// verified read would: Stat and Lookup stop reporting it, the next Put
// stores a good copy; counted in the tier's ChecksumFailures and in
// ScrubStats.Failed). Same-host reads do not verify by default
// (Config.VerifyReads); this is what catches a block damaged in place, for
// example by a writer scribbling through its own writable mapping of an
// arena (docs/security.md, "Integrity").
//
// A pass walks the index shard by shard: it copies one shard's block
// pointers under that shard's lock, then checks each block that is still
// linked, pinned (so that its bytes are not freed or reused meanwhile,
// and Close waits for the check) but not touched: scrubbing does not change
// what the eviction policy keeps.
type Scrubber struct {
	t    *Tier
	cfg  ScrubConfig
	clk  clock.Clock
	lg   *zap.Logger
	rate float64 // bytes per second

	// Guarded by mu (step runs on the scrubber's goroutine, or in tests).
	mu        sync.Mutex
	last      time.Time // when the budget was last refilled
	budget    float64   // bytes that may be checked now; negative: debt of the last block
	shard     int       // next shard to load into batch
	batch     []*block  // the blocks of the shard being checked
	passStart time.Time

	bytes, blocks, failed, passes, lastPass atomic.Int64

	startOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// NewScrubber returns a scrubber of t; Start runs it.
func NewScrubber(t *Tier, cfg ScrubConfig, lg *zap.Logger) (*Scrubber, error) {
	if t == nil {
		return nil, errors.New("dram: scrubber of a nil tier")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if cfg.Clock == nil {
		cfg.Clock = t.clk
	}
	if lg == nil {
		lg = zap.NewNop()
	}
	now := cfg.Clock.Now()
	return &Scrubber{
		t: t, cfg: cfg, clk: cfg.Clock, lg: lg.Named("cache.dram.scrub"),
		rate: float64(cfg.Rate),
		last: now, passStart: now,
		stop: make(chan struct{}), done: make(chan struct{}),
	}, nil
}

// Start runs the scrubber until ctx ends or Close. Calls after the first do
// nothing.
func (s *Scrubber) Start(ctx context.Context) {
	s.startOnce.Do(func() {
		s.mu.Lock()
		s.last = s.clk.Now() // no budget for the time before Start
		s.mu.Unlock()
		s.lg.Info("dram scrubber started", zap.Int64("rate_bytes_per_s", s.cfg.Rate), zap.Duration("tick", s.cfg.Tick))
		go s.run(ctx)
	})
}

func (s *Scrubber) run(ctx context.Context) {
	defer close(s.done)
	tk := time.NewTicker(s.cfg.Tick)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.stop:
			return
		case <-tk.C:
		}
		if s.t.closed.Load() {
			return
		}
		s.step()
	}
}

// Close stops the scrubber and waits for a check in progress to end. Safe
// to call twice, without Start, and on a nil *Scrubber.
func (s *Scrubber) Close() error {
	if s == nil {
		return nil
	}
	s.closeOnce.Do(func() {
		close(s.stop)
		started := true
		s.startOnce.Do(func() { started = false })
		if started {
			<-s.done
		}
	})
	return nil
}

// Rate returns the configured rate, in bytes per second.
func (s *Scrubber) Rate() int64 { return s.cfg.Rate }

// Stats returns the scrubber's counters.
func (s *Scrubber) Stats() ScrubStats {
	return ScrubStats{
		Bytes:    s.bytes.Load(),
		Blocks:   s.blocks.Load(),
		Failed:   s.failed.Load(),
		Passes:   s.passes.Load(),
		LastPass: time.Duration(s.lastPass.Load()),
	}
}

// step adds to the budget what the rate allows for the time since the last
// step (keeping at most one tick's worth unused), then checks blocks while
// the budget is positive, ending early at the end of a pass. A block is
// checked whole, so the budget may go negative by up to one block: the
// next steps pay that debt first. It returns the bytes checked.
func (s *Scrubber) step() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	if el := now.Sub(s.last); el > 0 {
		s.budget += s.rate * el.Seconds()
		s.last = now
	}
	if keep := s.rate * s.cfg.Tick.Seconds(); s.budget > keep {
		s.budget = keep
	}
	var checked int64
	for s.budget > 0 {
		b, passEnded := s.next(now)
		if passEnded {
			break
		}
		if b == nil {
			continue
		}
		if n, ok := s.check(b); ok {
			s.budget -= float64(n)
			checked += n
		}
	}
	return checked
}

// next returns the next block of the pass, or passEnded when the pass just
// ended (the cursor is back at the first shard). b is nil while it loads a
// shard with no blocks.
func (s *Scrubber) next(now time.Time) (b *block, passEnded bool) {
	if len(s.batch) > 0 {
		b = s.batch[0]
		s.batch[0] = nil
		s.batch = s.batch[1:]
		return b, false
	}
	if s.shard == numShards {
		s.shard = 0
		s.passes.Add(1)
		s.lastPass.Store(int64(now.Sub(s.passStart)))
		s.passStart = now
		return nil, true
	}
	sh := &s.t.shards[s.shard]
	s.shard++
	s.batch = s.batch[:0]
	sh.mu.Lock()
	for _, m := range sh.m {
		for _, b := range m {
			s.batch = append(s.batch, b)
		}
	}
	sh.mu.Unlock()
	return nil, false
}

// check verifies b's bytes against its CRC-32C and removes it when they
// differ. ok is false when b was no longer in the index (nothing checked).
func (s *Scrubber) check(b *block) (n int64, ok bool) {
	t := s.t
	sh := b.shard
	sh.mu.Lock()
	if sh.closed || !b.linked {
		sh.mu.Unlock()
		return 0, false
	}
	// Pinned as a read pins (not evicted, not freed), counted in ops so
	// that Close waits, but not recorded for the policy.
	deadline := t.clk.Now().Add(t.cfg.LeaseTimeout).UnixNano()
	sh.pinLocked(b, deadline, true)
	sh.ops++
	l := Lease{t: t, b: b, gen: b.gen, internal: true}
	sh.mu.Unlock()
	sum := cache.Checksum(t.bytes(b.off, b.size))
	if err := t.release(&l); err != nil {
		return 0, false // reclaimed meanwhile: the bytes checked may not be b's
	}
	s.bytes.Add(b.size)
	s.blocks.Add(1)
	if sum != b.crc {
		s.failed.Add(1)
		t.removeDamaged(b, sum, "scrub")
	}
	return b.size, true
}
