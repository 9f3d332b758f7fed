// Package dram is tidepool's DRAM tier: block bytes in large mmap-ed,
// file-backed arenas (never on the Go heap), carved by a size-class
// allocator, found through a sharded index, evicted through an evict.Policy.
//
// API CONTRACT (fixed; the implementation is being written):
package dram

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/evict"
	"github.com/tidepool-kv/tidepool/internal/clock"
)

// Config configures a Tier.
type Config struct {
	// Dir holds the arena files (arena-NNNN.mem). Created 0700 if missing.
	Dir string
	// Capacity is the byte budget of the tier.
	Capacity int64
	// ArenaSize is the size of one arena file in bytes (default 256 MiB,
	// capped at Capacity).
	ArenaSize int64
	// MaxValueSize is the largest value accepted, in bytes.
	MaxValueSize int64
	// MaxKeySize is the largest key accepted, in bytes (default 128).
	MaxKeySize int
	// LeaseTimeout bounds how long a read may pin a block (default 5s).
	LeaseTimeout time.Duration
	// Policy makes the eviction policy (default evict.NewLRU).
	Policy evict.Factory
	// Clock is the time source (default clock.Real).
	Clock clock.Clock
	// OnEvict, if set, is called (outside any tier lock? see impl doc) with
	// each evicted block, so that a tier below can take it (demotion).
	OnEvict func(ns string, key []byte, value []byte, info cache.Info) 
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config { panic("unimplemented") }

// Tier is the DRAM tier.
type Tier struct{}

// New validates cfg, creates and maps the arenas.
func New(cfg Config, lg *zap.Logger) (*Tier, error) { panic("unimplemented") }

func (t *Tier) Put(ctx context.Context, ns string, key, value []byte, opts cache.PutOptions) (existed bool, err error) {
	panic("unimplemented")
}
func (t *Tier) Get(ctx context.Context, ns string, key []byte, dst []byte) ([]byte, cache.Info, error) {
	panic("unimplemented")
}
func (t *Tier) Stat(ctx context.Context, ns string, key []byte) (cache.Info, bool) {
	panic("unimplemented")
}
func (t *Tier) Delete(ctx context.Context, ns string, key []byte) (bool, error) {
	panic("unimplemented")
}
func (t *Tier) Clear(ctx context.Context, ns string) (int64, error) { panic("unimplemented") }
func (t *Tier) Stats() cache.Stats                                  { panic("unimplemented") }
func (t *Tier) Close() error                                        { panic("unimplemented") }
