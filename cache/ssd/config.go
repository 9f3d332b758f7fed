package ssd

import (
	"errors"
	"fmt"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/evict"
	"github.com/tidepool-kv/tidepool/internal/clock"
)

// Config configures a Tier. A zero field takes its default (DefaultConfig,
// applied once by New and Validate); where a feature can be turned off, a
// negative value does it. Dir has no default.
type Config struct {
	// Dir is the RocksDB directory. Created 0700 if missing; an existing
	// database there is reopened and its blocks served again. Required.
	Dir string
	// Capacity is the byte budget of the tier: the sum of the footprints
	// (value + 2×encoded key + 38-byte record + 64 bytes) of the blocks held.
	// Disk usage can exceed it by the garbage RocksDB has not reclaimed yet
	// (see docs/ssd.md). Default 16 GiB.
	Capacity int64
	// MaxValueSize is the largest value accepted, in bytes. Default
	// cache.DefaultMaxValueBytes (64 MiB). A store behind the proxy gets
	// the proxy's cache.Limits (MaxValueBytes, MaxKeyBytes,
	// MaxNamespaceBytes) for this field and the next two.
	MaxValueSize int64
	// MaxKeySize is the largest key accepted, in bytes. Default
	// cache.DefaultMaxKeyBytes (128).
	MaxKeySize int
	// MaxNamespaceSize is the longest namespace accepted, in bytes.
	// Default cache.DefaultMaxNamespaceBytes (256, as the proxy).
	MaxNamespaceSize int

	// WriteBufferSize is the size of one memtable of the data family, in
	// bytes: block bytes wait there until a flush writes them to a blob
	// file. Default 32 MiB (64 MiB measured no faster and costs more
	// memory that is touched for the first time: see docs/ssd.md).
	WriteBufferSize int64
	// MaxWriteBuffers is how many data memtables may exist at once
	// (filling + waiting for flush); RAM use is up to
	// WriteBufferSize×MaxWriteBuffers. Default 4.
	MaxWriteBuffers int
	// MinBlobSize: values of at least this many bytes go to blob files;
	// smaller ones stay inline in SST files. Default 4 KiB.
	MinBlobSize int64
	// BlobFileSize is the size at which a blob file is closed and a new one
	// started, in bytes. Smaller files let space be reclaimed sooner.
	// Default 128 MiB.
	BlobFileSize int64
	// BlobGCAgeCutoff is the fraction (0..1] of the oldest blob files whose
	// live blobs the tier's compaction (CompactAfter) relocates so the
	// files can be deleted; RocksDB's own compactions do not (docs/ssd.md).
	// Default 0.25.
	BlobGCAgeCutoff float64
	// CompactAfter: after this many bytes of blocks kept in RocksDB (not
	// in the value log) were evicted or deleted, the tier compacts the
	// data family in the background so RocksDB drops
	// the dead blob references and deletes blob files. Default (0):
	// Capacity/8; negative disables it, and with it blob GC (blob files
	// with some dead blocks are then never rewritten).
	CompactAfter int64
	// BackgroundJobs is the number of RocksDB background threads: half of
	// them (at least one) flush memtables, the others compact. Default 4.
	BackgroundJobs int
	// BackgroundPriority is the CPU priority of RocksDB's background
	// threads (the flushes that write spilled blocks into blob files, and
	// compactions). PriorityNormal (the default) leaves them at the
	// process's priority. PriorityLow runs them at nice 19, so that on a
	// busy node reads and puts get the CPU first and the spill takes what
	// is left: evicted blocks it cannot keep up with are dropped from the
	// cache past the demotion queue, and a dropped block that is read again
	// is a miss (docs/ssd.md, "Background priority"). RocksDB's thread
	// pools are shared by the whole process and lowering them cannot be
	// undone: the first tier opened with PriorityLow lowers them for every
	// tier of the process.
	BackgroundPriority string
	// MaxOpenFiles bounds the SST and blob files RocksDB keeps open (its
	// max_open_files; both share its table cache), so that the tier's
	// descriptors stay within Descriptors() and RocksDB is never the one
	// that exhausts the process's table. Default (0): a quarter of the
	// process's RLIMIT_NOFILE soft limit when the defaults are taken
	// (DefaultConfig, New), within 64..4096.
	// At least 20 (RocksDB's own floor).
	MaxOpenFiles int

	// DirectReads opens files with O_DIRECT for reads (bypasses the page
	// cache; the filesystem must support it). Default false.
	DirectReads bool

	// ValueLogMin: blocks of at least this many bytes are written to the
	// value log (segment files in Dir/values written with O_DIRECT,
	// docs/ssd.md "Value log") instead of RocksDB's blob files; RocksDB
	// keeps their metadata. Default 64 KiB; negative: every block goes to
	// RocksDB (blocks already in the value log are still read).
	ValueLogMin int64
	// ValueLogSegmentSize is the size a value log segment file grows to
	// (allocated 8 MiB at a time as it fills), at most Capacity/16. A
	// segment is deleted once no block lives in it; the live blocks of a
	// segment that is mostly dead are moved so that it can be. Default
	// 64 MiB.
	ValueLogSegmentSize int64

	// MinFreeBytes: when the filesystem holding Dir has less free space
	// than this, the tier stops admitting blocks (degraded) before RocksDB
	// hits ENOSPC. Default 1 GiB; negative disables the check (ENOSPC
	// from RocksDB still degrades).
	MinFreeBytes int64
	// ProbeInterval is how long a degraded tier waits before a put tries
	// the disk again. Default 5 s.
	ProbeInterval time.Duration

	// Policy makes the eviction policy (default evict.NewLRU).
	Policy evict.Factory
	// Clock is the time source for access times and probe backoff
	// (default clock.Real).
	Clock clock.Clock
	// Observer, if set, hears of every block inserted into and removed
	// from the index (tier name "ssd"), with the index lock held (see
	// cache.Observer). The blocks found at start are reported as they are
	// indexed. nil: nobody is told.
	Observer cache.Observer
}

// The values of Config.BackgroundPriority.
const (
	PriorityLow    = "low"
	PriorityNormal = "normal"
)

// DefaultConfig returns the defaults; Dir must still be set.
func DefaultConfig() Config {
	return Config{
		Capacity:            16 << 30,
		MaxValueSize:        cache.DefaultMaxValueBytes,
		MaxKeySize:          cache.DefaultMaxKeyBytes,
		MaxNamespaceSize:    cache.DefaultMaxNamespaceBytes,
		WriteBufferSize:     32 << 20,
		MaxWriteBuffers:     4,
		MinBlobSize:         4 << 10,
		BlobFileSize:        128 << 20,
		BlobGCAgeCutoff:     0.25,
		BackgroundJobs:      4,
		BackgroundPriority:  PriorityNormal,
		ValueLogMin:         64 << 10,
		ValueLogSegmentSize: 64 << 20,
		MinFreeBytes:        1 << 30,
		ProbeInterval:       5 * time.Second,
		MaxOpenFiles:        defaultMaxOpenFiles(nofileLimit()),
		Policy:              evict.NewLRU,
		Clock:               clock.Real{},
	}
}

// withDefaults fills the zero fields from DefaultConfig: the one place a
// zero field becomes its default.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	fill(&c.Capacity, d.Capacity)
	fill(&c.MaxValueSize, d.MaxValueSize)
	fill(&c.MaxKeySize, d.MaxKeySize)
	fill(&c.MaxNamespaceSize, d.MaxNamespaceSize)
	fill(&c.WriteBufferSize, d.WriteBufferSize)
	fill(&c.MaxWriteBuffers, d.MaxWriteBuffers)
	fill(&c.MinBlobSize, d.MinBlobSize)
	fill(&c.BlobFileSize, d.BlobFileSize)
	fill(&c.BlobGCAgeCutoff, d.BlobGCAgeCutoff)
	fill(&c.BackgroundJobs, d.BackgroundJobs)
	fill(&c.BackgroundPriority, d.BackgroundPriority)
	fill(&c.ValueLogMin, d.ValueLogMin)
	fill(&c.ValueLogSegmentSize, d.ValueLogSegmentSize)
	fill(&c.MinFreeBytes, d.MinFreeBytes)
	fill(&c.ProbeInterval, d.ProbeInterval)
	fill(&c.MaxOpenFiles, d.MaxOpenFiles)
	if c.Policy == nil {
		c.Policy = d.Policy
	}
	if c.Clock == nil {
		c.Clock = d.Clock
	}
	return c
}

// fill sets *p to def when it is zero.
func fill[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}

// Validate reports every problem with c (after defaults) at once.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("ssd: config: "+format, args...))
	}
	if c.Dir == "" {
		bad("Dir is required")
	}
	if c.Capacity <= 0 {
		bad("Capacity must be > 0, got %d", c.Capacity)
	}
	if c.MaxValueSize <= 0 {
		bad("MaxValueSize must be > 0, got %d", c.MaxValueSize)
	} else if c.Capacity > 0 && c.MaxValueSize > c.Capacity {
		bad("MaxValueSize (%d) exceeds Capacity (%d)", c.MaxValueSize, c.Capacity)
	}
	if c.MaxKeySize <= 0 {
		bad("MaxKeySize must be > 0, got %d", c.MaxKeySize)
	}
	if c.MaxNamespaceSize <= 0 {
		bad("MaxNamespaceSize must be > 0, got %d", c.MaxNamespaceSize)
	}
	if c.WriteBufferSize < 1<<20 {
		bad("WriteBufferSize must be >= 1 MiB, got %d", c.WriteBufferSize)
	}
	if c.MinBlobSize < 0 {
		bad("MinBlobSize must be > 0, got %d", c.MinBlobSize)
	}
	if c.MaxWriteBuffers < 2 {
		bad("MaxWriteBuffers must be >= 2, got %d", c.MaxWriteBuffers)
	}
	if c.BlobFileSize < 1<<20 {
		bad("BlobFileSize must be >= 1 MiB, got %d", c.BlobFileSize)
	}
	if c.BlobGCAgeCutoff <= 0 || c.BlobGCAgeCutoff > 1 {
		bad("BlobGCAgeCutoff must be in (0, 1], got %g", c.BlobGCAgeCutoff)
	}
	if c.BackgroundJobs < 2 {
		bad("BackgroundJobs must be >= 2, got %d", c.BackgroundJobs)
	}
	if c.BackgroundPriority != PriorityLow && c.BackgroundPriority != PriorityNormal {
		bad("BackgroundPriority must be %q or %q, got %q", PriorityLow, PriorityNormal, c.BackgroundPriority)
	}
	if c.ValueLogSegmentSize < 1<<20 || c.ValueLogSegmentSize%dioAlign != 0 {
		bad("ValueLogSegmentSize must be >= 1 MiB and a multiple of %d, got %d", dioAlign, c.ValueLogSegmentSize)
	}
	if c.MaxOpenFiles < 20 {
		bad("MaxOpenFiles must be >= 20, got %d", c.MaxOpenFiles)
	}
	if c.ProbeInterval <= 0 {
		bad("ProbeInterval must be > 0, got %v", c.ProbeInterval)
	}
	return errors.Join(errs...)
}
