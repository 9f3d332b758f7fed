// Package ssd is tidepool's SSD tier: blocks in RocksDB (through grocksdb,
// the only package of tidepool that imports it), with large values
// separated from the LSM tree by RocksDB's integrated BlobDB so that
// multi-MiB blocks are written sequentially to blob files, block metadata in
// a column family of its own so that the in-memory index is rebuilt on start
// without reading block bytes, a byte budget enforced through an
// evict.Policy, CRC-32C checked on every read, and a degraded mode (no
// admissions, reads still served) when the disk is full or failing. A full
// disk never aborts the process (see openStore and openMinFree), and a
// database RocksDB finds corrupt at start is moved aside (quarantined)
// rather than failing New.
//
// Its method set is the DRAM tier's (Put, Get, Stat, Delete, Clear, Stats,
// Close), so a store can demote DRAM evictions into it and promote its hits.
// What survives a crash in each durability mode is written down in
// docs/ssd.md.
//
// # Locks
//
// Lock order: wmu → dbMu → mu. The read flights' lock (internal/flight)
// is a leaf (held only to look up or update the flight table, never while
// taking another lock).
//
//   - wmu serializes every write to RocksDB and every index change that
//     follows one (Put, Delete, Clear, dropping bad blocks, degraded-mode
//     probes, reopen, Close). RocksDB serializes writes in its write thread
//     anyway, and blocks are MiB-sized, so one writer at a time costs
//     nothing measurable and makes "check, evict, write, index" atomic.
//   - dbMu guards the store pointer: RLock to use it, Lock to close or
//     replace it. A read holds RLock until its pinned bytes are released.
//   - mu guards the index, the policy and the accounting. It is one lock,
//     not shards: every operation of this tier costs a RocksDB call on MiB
//     of data (tens of µs at least), against ~100 ns under mu.
package ssd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/evict"
	"github.com/tidepool-kv/tidepool/internal/clock"
	"github.com/tidepool-kv/tidepool/internal/flight"
)

// TierName is the name of this tier in cache.Info and cache.TierStats.
const TierName = "ssd"

// Errors of this package (the cache sentinels are used for everything a
// caller acts on).
var (
	// ErrCorrupt is wrapped, together with cache.ErrChecksum and
	// cache.ErrNotFound, in the error of a read whose block was bad on
	// disk; the block has been deleted and callers treat it as a miss.
	ErrCorrupt = errors.New("ssd: stored block is corrupt")
)

// entry is the in-memory index record of one block.
type entry struct {
	id      uint64
	ns      string
	skey    string // encoded key (index key)
	size    int64
	foot    int64
	sum     uint32
	depth   int32
	lowPri  bool
	durable bool // written by a durable put
	created int64
	access  int64  // Unix ns of the last read or write
	dirty   bool   // access changed since it was last persisted
	seg     uint32 // value log segment of the bytes; 0: in RocksDB
	off     int64  // offset in seg
	// desc is the block's description (cache.PutOptions.Meta of the put
	// that wrote it), kept in its record; nil: none. Never modified once
	// set: a later put of the same block leaves it.
	desc *cache.BlockMeta
}

func (e *entry) encKey() []byte { return []byte(e.skey) }

// blobBytes is what dropping e leaves in RocksDB's blob files for a
// compaction to reclaim (noteGarbageLocked): its size, or 0 for a block in
// the value log, whose space the value log reclaims itself.
func (e *entry) blobBytes() int64 {
	if e.seg != 0 {
		return 0
	}
	return e.size
}

func (e *entry) meta() meta {
	return meta{size: e.size, sum: e.sum, depth: e.depth, lowPri: e.lowPri, durable: e.durable, access: e.access, created: e.created,
		seg: e.seg, off: e.off, desc: e.desc}
}

func (e *entry) info() cache.Info {
	return cache.Info{Size: e.size, Checksum: e.sum, Depth: e.depth, Tier: TierName}
}

type nsStats struct {
	blocks, bytes                 int64
	hits, misses, puts, evictions int64
}

// Tier is the SSD tier. Safe for concurrent use. It runs no goroutine of
// its own except a background compaction started on demand (see
// Config.CompactAfter), which Close aborts and waits for; RocksDB runs its
// own flush and compaction threads.
type Tier struct {
	cfg Config
	lg  *zap.Logger
	clk clock.Clock

	wmu  sync.Mutex
	dbMu sync.RWMutex
	st   *store // guarded by dbMu; replaced only with wmu held too
	// vlog holds the bytes of large blocks (vlog.go). Opened with the
	// first database (nil while the tier has never had one); set with
	// wmu and dbMu held, so either lock is enough to read it. Appended
	// to with wmu held.
	vlog *valueLog
	// relocating is true while a relocation of value log blocks runs
	// (relocate.go); relocDone, guarded by relocMu, is closed when the
	// last one started has ended.
	relocating atomic.Bool
	relocMu    sync.Mutex
	relocDone  chan struct{}

	mu     sync.Mutex
	index  map[string]*entry // by encoded key
	byID   map[uint64]*entry
	policy evict.Policy
	nextID uint64
	used   int64 // sum of footprints, including a put being written
	nss    map[string]*nsStats

	flights *flight.Group[string, shared]

	closed    atomic.Bool
	degraded  atomic.Bool
	nextProbe time.Time // guarded by wmu
	garbage   int64     // guarded by wmu: bytes dropped since the last compaction
	compactOn atomic.Bool
	bg        sync.WaitGroup

	recBlocks, recBytes int64
	recTook             time.Duration

	hits, misses, evictions, bytesIn, bytesOut atomic.Int64
	checksumFailures, readErrors, writeErrors  atomic.Int64
	degradedEvents, recoveries, stale          atomic.Int64
	compactions, relocations, spaceEvictions   atomic.Int64
	durableEvictions                           atomic.Int64
	quarantines                                atomic.Int64
	quarantinedTo                              atomic.Value // string
	// degradedWhy is why the tier last became degraded (a short text with
	// the error), for Health.
	degradedWhy atomic.Value // string

	// null is a descriptor of /dev/null that checkDescriptors duplicates
	// before each write; -1 turns the check off (tests, or /dev/null
	// missing).
	null int

	// Test seams; nil in production.
	hookFreeSpace   func(dir string) (int64, error)
	hookBeforeWrite func() error
	hookBeforeRead  func()

	reads atomic.Int64 // RocksDB block reads (one per flight)
}

// New validates cfg, opens (or creates) the database in cfg.Dir and
// rebuilds the index from the metadata family.
//
// A full disk does not fail New: when the filesystem has less than
// openMinFree bytes free, or RocksDB cannot open for lack of space, the
// tier starts degraded and without a database (no blocks; puts refused
// with cache.ErrUnavailable) and a put after ProbeInterval opens it once
// space is back. A database RocksDB reports as corrupt (a damaged SST or
// MANIFEST, a truncated CURRENT) does not fail New either: it is moved
// aside to Dir + ".quarantine-<UTC time>", logged, counted
// (Health().Quarantines) and the tier starts empty. Other errors (bad
// config, the database locked by another process) fail New.
func New(cfg Config, lg *zap.Logger) (*Tier, error) {
	if lg == nil {
		lg = zap.NewNop()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("ssd: create dir: %w", err)
	}
	start := time.Now()
	t := &Tier{
		cfg: cfg,
		lg:  lg.Named("cache.ssd"),
		clk: cfg.Clock,
		nss: make(map[string]*nsStats),
	}
	var err error
	if t.null, err = unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		t.null = -1
	}
	t.flights = flight.New[string](t.releaseRead)
	t.resetIndex()
	blocks, bytes, err := t.openAtStart()
	if err != nil {
		t.closeNull()
		return nil, err
	}
	t.recBlocks, t.recBytes, t.recTook = blocks, bytes, time.Since(start)
	t.lg.Info("ssd tier opened",
		zap.String("dir", cfg.Dir),
		zap.Int64("recovered_blocks", blocks),
		zap.Int64("recovered_bytes", bytes),
		zap.Duration("took", t.recTook),
		zap.Int64("capacity", cfg.Capacity),
		zap.Int("max_open_files", cfg.MaxOpenFiles),
		zap.Int("descriptors", cfg.Descriptors()),
		zap.Bool("degraded", t.degraded.Load()),
		zap.String("rocksdb_crc32c", rocksCRC()))
	return t, nil
}

// openMinFree is the free space below which the tier does not open (or
// reopen) RocksDB: opening writes the info LOG header, a MANIFEST, an
// OPTIONS file and a WAL, and librocksdb 7.8 aborts the process when its
// info LOG writer is used again after a failed write (see openStore).
const openMinFree = 4 << 20

// errDiskFull is returned by openChecked when the disk lacks openMinFree.
var errDiskFull = errors.New("ssd: disk full")

// openChecked opens the store, read-only when the disk is (nearly) full
// and a database is there to read (see openStore); errDiskFull when it is
// full and there is none.
func (t *Tier) openChecked() (*store, error) {
	if err := checkDescriptors(t.null); err != nil {
		return nil, err
	}
	if free, ok := t.diskFree(); ok && free < openMinFree {
		if _, err := os.Stat(filepath.Join(t.cfg.Dir, "CURRENT")); err != nil {
			return nil, fmt.Errorf("%w: %d bytes free in %s (opening needs %d)", errDiskFull, free, t.cfg.Dir, openMinFree)
		}
		return openStore(&t.cfg, true)
	}
	return openStore(&t.cfg, false)
}

// readOnlyLocked reports whether the store is open read-only. wmu or dbMu
// held.
func (t *Tier) readOnlyLocked() bool { return t.st != nil && t.st.readOnly }

// openAtStart opens the database and rebuilds the index for New, starting
// degraded on a full disk and quarantining a corrupt database.
func (t *Tier) openAtStart() (blocks, bytes int64, err error) {
	for attempt := 0; ; attempt++ {
		var st *store
		st, err = t.openChecked()
		if err == nil && t.vlog == nil {
			if t.vlog, err = openValueLog(t.cfg.Dir, t.segmentSize()); err != nil {
				st.close()
			}
		}
		if err == nil {
			t.st = st
			if blocks, bytes, err = t.rebuild(); err == nil {
				break
			}
			t.st = nil
			st.close()
		}
		if t.vlog != nil {
			t.vlog.close()
			t.vlog = nil
		}
		switch {
		case isNoSpace(err):
			t.wmu.Lock()
			t.degradeLocked("disk full at start: no database open", zap.Error(err))
			t.wmu.Unlock()
			return 0, 0, nil
		case isCorruptStore(err) && attempt == 0:
			if qerr := t.quarantine(err); qerr != nil {
				return 0, 0, qerr
			}
			continue
		default:
			return 0, 0, err
		}
	}
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if t.readOnlyLocked() {
		t.degradeLocked("disk full at start: database open read-only, its blocks served")
	} else if free, ok := t.freeSpace(); ok && free < max(t.cfg.MinFreeBytes, 0) {
		t.degradeLocked("low free space at start", zap.Int64("free_bytes", free))
	}
	return blocks, bytes, nil
}

// quarantine moves the corrupt database in Dir aside and creates an empty
// Dir. The moved copy is kept for inspection; delete it by hand (it still
// takes disk space).
func (t *Tier) quarantine(cause error) error {
	dir := filepath.Clean(t.cfg.Dir)
	to := dir + ".quarantine-" + time.Now().UTC().Format("20060102T150405.000Z")
	if err := os.Rename(dir, to); err != nil {
		return fmt.Errorf("ssd: quarantine corrupt database (%v): %w", cause, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("ssd: create dir after quarantine: %w", err)
	}
	t.quarantines.Add(1)
	t.quarantinedTo.Store(to)
	t.lg.Error("ssd database corrupt: moved aside, starting with an empty ssd tier",
		zap.Error(cause), zap.String("dir", dir), zap.String("moved_to", to))
	return nil
}

// isNoSpace reports whether err means the disk is full. RocksDB's C API
// reports a Status as text only (grocksdb returns errors.New of it), so
// for RocksDB's own errors its fixed status prefixes are the only
// classification there is; errors of ours are tested with errors.Is.
func isNoSpace(err error) bool {
	return errors.Is(err, errDiskFull) || errors.Is(err, syscall.ENOSPC) ||
		(err != nil && strings.Contains(err.Error(), "No space left on device"))
}

// isCorruptStore reports whether opening or scanning the database failed
// because RocksDB found its files damaged.
func isCorruptStore(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Corruption:")
}

// diskFree returns the bytes available to us on Dir's filesystem (always
// checked, unlike freeSpace); ok is false when statfs fails.
func (t *Tier) diskFree() (int64, bool) {
	if t.hookFreeSpace != nil {
		n, err := t.hookFreeSpace(t.cfg.Dir)
		return n, err == nil
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(t.cfg.Dir, &fs); err != nil {
		return 0, false
	}
	return int64(fs.Bavail) * int64(fs.Bsize), true
}

// Recovered reports what New found on disk: blocks, their value bytes, and
// how long opening and rebuilding the index took.
func (t *Tier) Recovered() (blocks, bytes int64, took time.Duration) {
	return t.recBlocks, t.recBytes, t.recTook
}

// Degraded reports whether the tier refuses new blocks (disk full or
// failing). Reads are still served.
func (t *Tier) Degraded() bool { return t.degraded.Load() }

func (t *Tier) checkKey(ns string, key []byte) error {
	if len(key) == 0 || len(key) > t.cfg.MaxKeySize {
		return fmt.Errorf("%w: key of %d bytes (1..%d)", cache.ErrInvalidKey, len(key), t.cfg.MaxKeySize)
	}
	if len(ns) > t.cfg.MaxNamespaceSize {
		return fmt.Errorf("%w: namespace of %d bytes (max %d)", cache.ErrInvalidKey, len(ns), t.cfg.MaxNamespaceSize)
	}
	return nil
}

// Put stores value under (ns, key). A key already present is left as it is
// and reported with existed = true (values are immutable); a durable put of
// a block held from a best-effort put writes it again through the synced
// WAL, so that it is durable too. It evicts blocks
// chosen by the policy until the new one fits the budget. Errors:
// cache.ErrInvalidKey, cache.ErrTooLarge, cache.ErrClosed, and
// cache.ErrUnavailable while the tier is degraded. With opts.Durable the
// block is in the synced WAL when Put returns; otherwise it is durable only
// after the next flush (see docs/ssd.md). With opts.HasChecksum (a block
// moved down from DRAM carries the checksum it was stored with) bytes that
// no longer match it are refused with cache.ErrChecksum, so damage done in
// DRAM is never stored under a fresh checksum.
func (t *Tier) Put(ctx context.Context, ns string, key, value []byte, opts cache.PutOptions) (existed bool, err error) {
	return t.put(ctx, ns, key, value, opts, 0, false)
}

// PutVerified is Put for a caller that has already checked value against
// sum itself, on a private copy nobody else can write (the tiered store's
// demotion queue checks each evicted block's copy against its DRAM
// checksum while the copy is still in the CPU cache): the tier stores sum
// as the block's CRC-32C without another pass over the bytes.
// opts.Checksum and opts.HasChecksum are ignored. Reads verify the bytes
// against sum as for any block, so a wrong sum makes the block unreadable
// (a miss), never wrong bytes.
func (t *Tier) PutVerified(ctx context.Context, ns string, key, value []byte, sum uint32, opts cache.PutOptions) (existed bool, err error) {
	return t.put(ctx, ns, key, value, opts, sum, true)
}

// put is Put; with verified, sum is the value's CRC-32C, known already.
func (t *Tier) put(ctx context.Context, ns string, key, value []byte, opts cache.PutOptions, sum uint32, verified bool) (existed bool, err error) {
	if err := t.checkKey(ns, key); err != nil {
		return false, err
	}
	if int64(len(value)) > t.cfg.MaxValueSize {
		return false, fmt.Errorf("%w: %d bytes (max %d)", cache.ErrTooLarge, len(value), t.cfg.MaxValueSize)
	}
	ek := encodeKey(ns, key)
	desc := keepDesc(opts.Meta)
	foot := footprint(len(ek), int64(len(value)), desc)
	if foot > t.cfg.Capacity {
		return false, fmt.Errorf("%w: block of %d bytes exceeds the tier capacity %d", cache.ErrTooLarge, foot, t.cfg.Capacity)
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if !verified {
		sum = cache.Checksum(value)
	}
	if !verified && opts.HasChecksum && sum != opts.Checksum {
		return false, fmt.Errorf("%w: value of %d bytes has CRC-32C %08x, its block %08x", cache.ErrChecksum, len(value), sum, opts.Checksum)
	}

	t.wmu.Lock()
	defer t.wmu.Unlock()
	if t.closed.Load() {
		return false, cache.ErrClosed
	}
	t.mu.Lock()
	old := t.index[string(ek)]
	t.mu.Unlock()
	if old != nil {
		if opts.Durable && !old.durable {
			return true, t.makeDurableLocked(old, value, sum)
		}
		return true, nil
	}
	if t.degraded.Load() && !t.tryRecoverLocked() {
		return false, fmt.Errorf("%w: ssd tier degraded", cache.ErrUnavailable)
	}
	if free, ok := t.freeSpace(); ok && free < max(t.cfg.MinFreeBytes, 0)+int64(len(value)) {
		t.degradeLocked("low free space", zap.Int64("free_bytes", free))
		return false, fmt.Errorf("%w: ssd: %d bytes free on disk", cache.ErrUnavailable, free)
	}

	// Make room, reserving the footprint before the write.
	t.mu.Lock()
	var victims []*entry
	for t.used+foot > t.cfg.Capacity {
		id, ok := t.policy.Victim(noSkip)
		if !ok {
			break
		}
		v := t.byID[id]
		if v == nil { // policy and index disagree: forget the id
			t.policy.Remove(id)
			continue
		}
		t.removeLocked(v)
		victims = append(victims, v)
	}
	if t.used+foot > t.cfg.Capacity {
		t.restoreLocked(victims)
		t.mu.Unlock()
		return false, fmt.Errorf("%w: ssd: cannot make room for %d bytes", cache.ErrNoSpace, foot)
	}
	t.used += foot
	t.mu.Unlock()

	now := t.clk.Now().UnixNano()
	e := &entry{
		ns: ns, skey: string(ek), size: int64(len(value)), foot: foot, sum: sum,
		depth: opts.Depth, lowPri: opts.LowPriority, durable: opts.Durable, created: now, access: now,
		desc: desc,
	}
	bp := blockPut{key: ek, value: value}
	if t.vlog != nil && t.cfg.ValueLogMin >= 0 && int64(len(value)) >= t.cfg.ValueLogMin {
		// The bytes go to the value log first, then the record that
		// points to them, through the WAL (not synced unless durable), so
		// that a crash of the process does not lose a block whose bytes
		// are on disk already.
		if e.seg, e.off, err = t.vlog.append(value); err == nil && opts.Durable {
			if err = t.vlog.sync(); err != nil {
				t.vlog.free(e.seg, e.off, e.size)
			}
		}
		bp.value, bp.logged = nil, true
	}
	var b *batch
	if err == nil {
		m := e.meta()
		bp.meta = m.encode()
		b = &batch{puts: []blockPut{bp}, wal: bp.logged}
		for _, v := range victims {
			b.dels = append(b.dels, v.encKey())
		}
		if err = t.write(b, opts.Durable); err != nil && e.seg != 0 {
			t.vlog.free(e.seg, e.off, e.size)
		}
	}
	if err != nil {
		t.mu.Lock()
		t.used -= foot
		// The batch was atomic: the victims are still on disk. They go
		// back into the index (as most recently used, which only delays
		// their eviction).
		t.restoreLocked(victims)
		t.mu.Unlock()
		t.writeErrors.Add(1)
		t.degradeLocked("write failed", zap.Error(err))
		return false, fmt.Errorf("%w: ssd: put: %v", cache.ErrUnavailable, err)
	}

	t.mu.Lock()
	t.used -= foot // insertLocked counts it again
	t.insertLocked(e)
	ss := t.nsLocked(ns)
	ss.puts++
	var dropped int64
	for _, v := range victims {
		t.nsLocked(v.ns).evictions++
		dropped += v.blobBytes()
	}
	t.countDurableEvictions(victims)
	t.mu.Unlock()
	t.evictions.Add(int64(len(victims)))
	t.bytesIn.Add(int64(len(value)))
	t.freeValuesLocked(victims)
	t.noteGarbageLocked(dropped)
	return false, nil
}

var noSkip = func(uint64) bool { return false }

// write applies b to the store, through the test seam.
func (t *Tier) write(b *batch, durable bool) error {
	if t.hookBeforeWrite != nil {
		if err := t.hookBeforeWrite(); err != nil {
			return err
		}
	}
	if err := checkDescriptors(t.null); err != nil {
		return err
	}
	t.dbMu.RLock()
	defer t.dbMu.RUnlock()
	if t.st == nil {
		return errNoStore
	}
	return t.st.apply(b, durable)
}

// Get copies the value of (ns, key) into dst (reusing its capacity:
// append(dst[:0], value...)) and returns it with its metadata. The bytes
// are verified against the stored CRC-32C first; a block that fails (or
// that RocksDB cannot read) is deleted, counted in ChecksumFailures, and
// reported with an error matching cache.ErrChecksum AND cache.ErrNotFound:
// callers treat it as a miss. Concurrent Gets of one block share one read.
func (t *Tier) Get(ctx context.Context, ns string, key []byte, dst []byte) ([]byte, cache.Info, error) {
	if err := t.checkKey(ns, key); err != nil {
		return dst[:0], cache.Info{}, err
	}
	if t.closed.Load() {
		return dst[:0], cache.Info{}, cache.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return dst[:0], cache.Info{}, err
	}
	ek := encodeKey(ns, key)
	sk := string(ek)
	t.mu.Lock()
	if t.index[sk] == nil {
		t.missLocked(ns)
		t.mu.Unlock()
		return dst[:0], cache.Info{}, cache.ErrNotFound
	}
	t.mu.Unlock()

	f, leader := t.flights.Join(sk)
	var r shared
	var err error
	if leader {
		var drop *entry
		r, drop, err = t.read(sk, ek)
		f.Finish(r, err)
		if drop != nil {
			t.dropBad(drop)
		}
	} else if r, err = f.Wait(ctx); err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		// Gave up waiting (a read never fails with a context error).
		f.Leave()
		return dst[:0], cache.Info{}, err
	}
	if err != nil {
		f.Leave()
		if !errors.Is(err, cache.ErrUnavailable) {
			t.mu.Lock()
			t.missLocked(ns)
			t.mu.Unlock()
		}
		return dst[:0], cache.Info{}, err
	}
	out := append(dst[:0], r.data...)
	info, e := r.info, r.entry
	f.Leave()

	now := t.clk.Now().UnixNano()
	t.mu.Lock()
	if t.index[sk] == e {
		t.policy.Touch(e.id)
		e.access, e.dirty = now, true
	}
	t.nsLocked(ns).hits++
	t.mu.Unlock()
	t.hits.Add(1)
	t.bytesOut.Add(int64(len(out)))
	return out, info, nil
}

// missLocked counts a miss of ns, also for a namespace that has never had
// a block here: in the store, every read that misses DRAM asks this tier,
// so its namespace misses are the store's. mu held.
func (t *Tier) missLocked(ns string) {
	t.misses.Add(1)
	t.nsLocked(ns).misses++
}

// Stat returns the metadata of (ns, key) without reading the block.
func (t *Tier) Stat(ctx context.Context, ns string, key []byte) (cache.Info, bool) {
	if t.checkKey(ns, key) != nil || t.closed.Load() {
		return cache.Info{}, false
	}
	ek := encodeKey(ns, key)
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.index[string(ek)]
	if e == nil {
		return cache.Info{}, false
	}
	return e.info(), true
}

// Delete removes (ns, key). It reports whether the block was present. The
// block is gone from this tier once Delete returns; if the disk write of
// the tombstone fails (degraded disk), the bytes stay on disk and may come
// back after a restart, which is harmless for immutable blocks.
func (t *Tier) Delete(ctx context.Context, ns string, key []byte) (bool, error) {
	if err := t.checkKey(ns, key); err != nil {
		return false, err
	}
	ek := encodeKey(ns, key)
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if t.closed.Load() {
		return false, cache.ErrClosed
	}
	t.mu.Lock()
	e := t.index[string(ek)]
	if e == nil {
		t.mu.Unlock()
		return false, nil
	}
	t.removeLocked(e)
	t.mu.Unlock()
	t.deleteOnDiskLocked([][]byte{ek})
	t.freeValuesLocked([]*entry{e})
	t.noteGarbageLocked(e.blobBytes())
	return true, nil
}

// Clear removes every block of namespace ns and returns how many there
// were.
func (t *Tier) Clear(ctx context.Context, ns string) (int64, error) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if t.closed.Load() {
		return 0, cache.ErrClosed
	}
	t.mu.Lock()
	var keys [][]byte
	var gone []*entry
	var dropped int64
	for _, e := range t.index {
		if e.ns == ns {
			keys = append(keys, e.encKey())
			gone = append(gone, e)
			dropped += e.blobBytes()
		}
	}
	for _, e := range gone {
		t.unindexLocked(e)
	}
	if o := t.cfg.Observer; o != nil && len(gone) > 0 {
		o.Cleared(ns, tierName)
	}
	t.mu.Unlock()
	count := int64(len(keys))
	const chunk = 1024
	for len(keys) > 0 {
		n := min(chunk, len(keys))
		t.deleteOnDiskLocked(keys[:n])
		keys = keys[n:]
	}
	t.freeValuesLocked(gone)
	t.noteGarbageLocked(dropped)
	return count, nil
}

// deleteOnDiskLocked deletes blocks already removed from the index. wmu
// held. A failure is logged and counted, not returned (see Delete).
func (t *Tier) deleteOnDiskLocked(keys [][]byte) {
	if len(keys) == 0 {
		return
	}
	if err := t.write(&batch{dels: keys}, false); err != nil {
		t.writeErrors.Add(1)
		t.degradeLocked("delete failed", zap.Error(err))
	}
}

// Flush makes every block written so far durable (flushes the memtables
// to SST and blob files). It first waits for a running compaction of the
// tier's own to end (see store.flush).
func (t *Tier) Flush(ctx context.Context) error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if t.closed.Load() {
		return cache.ErrClosed
	}
	// No new compaction starts while wmu is held.
	t.bg.Wait()
	t.dbMu.RLock()
	err := errNoStore
	if t.st != nil {
		// The value log first: a record made durable by the flush must
		// not point to bytes that are not.
		err = nil
		if t.vlog != nil {
			err = t.vlog.sync()
		}
		if err == nil {
			err = t.st.flush()
		}
	}
	t.dbMu.RUnlock()
	if err != nil {
		t.writeErrors.Add(1)
		t.degradeLocked("flush failed", zap.Error(err))
		return fmt.Errorf("%w: ssd: flush: %v", cache.ErrUnavailable, err)
	}
	return nil
}

// Stats returns one TierStats named "ssd" and per-namespace counters
// (sorted by namespace).
func (t *Tier) Stats() cache.Stats {
	t.mu.Lock()
	ts := cache.TierStats{
		Name:          TierName,
		CapacityBytes: t.cfg.Capacity,
		UsedBytes:     t.used,
		Blocks:        int64(len(t.index)),
	}
	nss := make([]cache.NamespaceStats, 0, len(t.nss))
	for name, s := range t.nss {
		nss = append(nss, cache.NamespaceStats{
			Namespace: name, Blocks: s.blocks, Bytes: s.bytes, Hits: s.hits,
			Misses: s.misses, Puts: s.puts, Evictions: s.evictions,
		})
	}
	t.mu.Unlock()
	sort.Slice(nss, func(i, j int) bool { return nss[i].Namespace < nss[j].Namespace })
	ts.Hits = t.hits.Load()
	ts.Misses = t.misses.Load()
	ts.Evictions = t.evictions.Load()
	ts.BytesIn = t.bytesIn.Load()
	ts.BytesOut = t.bytesOut.Load()
	ts.ChecksumFailures = t.checksumFailures.Load()
	return cache.Stats{Tiers: []cache.TierStats{ts}, Namespaces: nss}
}

// Health is a snapshot of the tier's disk state and error counters.
type Health struct {
	// Degraded is true while the tier refuses new blocks.
	Degraded bool
	// DegradedEvents counts entries into degraded mode; Recoveries exits.
	DegradedEvents, Recoveries int64
	// ChecksumFailures counts reads whose block was bad: bytes that did not
	// match their CRC-32C, or a RocksDB corruption/read error on the blob.
	ChecksumFailures int64
	// ReadErrors counts RocksDB read errors: those of damaged blocks
	// (dropped, also in ChecksumFailures) and those for lack of
	// descriptors (a miss; the block is kept).
	ReadErrors int64
	// WriteErrors counts failed RocksDB writes and flushes.
	WriteErrors int64
	// StaleEntries counts index entries whose bytes were missing on read.
	StaleEntries int64
	// Compactions counts the background compactions the tier started.
	Compactions int64
	// DiskBytes is the size of the live SST and blob files (RocksDB's
	// view; excludes WAL, logs and memtables) and of the value log's
	// segment files.
	DiskBytes int64
	// ValueLogBytes is the size of the value log's segment files,
	// ValueLogLiveBytes the part of it blocks live in (rounded up to 4 KiB
	// each), ValueLogSegments how many files there are.
	ValueLogBytes, ValueLogLiveBytes int64
	ValueLogSegments                 int
	// Relocations counts blocks moved out of value log segments at most
	// half live, SpaceEvictions the blocks evicted from fuller ones, to
	// keep the value log's dead space within its limit (docs/ssd.md).
	Relocations, SpaceEvictions int64
	// Open is false while the tier has no database open (the disk was
	// full at start with no database there, or a reopen failed); it is
	// degraded then.
	Open bool
	// ReadOnly is true while the database is open for reads only (the
	// disk was full when it was opened): its blocks are served, puts
	// refused (degraded) until a probe finds space and reopens it
	// writable.
	ReadOnly bool
	// DurableEvictions counts evicted blocks that a durable put wrote
	// (docs/ssd.md: a durable block survives a crash, not eviction).
	DurableEvictions int64
	// Reason says why the tier last became degraded (with the error);
	// empty if it never was.
	Reason string
	// Quarantines counts corrupt databases New moved aside (0 or 1);
	// QuarantinedTo is where the last one went.
	Quarantines   int64
	QuarantinedTo string
}

// Health returns the tier's disk state and error counters.
func (t *Tier) Health() Health {
	h := Health{
		Degraded:         t.degraded.Load(),
		DegradedEvents:   t.degradedEvents.Load(),
		Recoveries:       t.recoveries.Load(),
		ChecksumFailures: t.checksumFailures.Load(),
		ReadErrors:       t.readErrors.Load(),
		WriteErrors:      t.writeErrors.Load(),
		StaleEntries:     t.stale.Load(),
		Compactions:      t.compactions.Load(),
		Relocations:      t.relocations.Load(),
		SpaceEvictions:   t.spaceEvictions.Load(),
		DurableEvictions: t.durableEvictions.Load(),
		Quarantines:      t.quarantines.Load(),
	}
	h.QuarantinedTo, _ = t.quarantinedTo.Load().(string)
	h.Reason, _ = t.degradedWhy.Load().(string)
	t.dbMu.RLock()
	if t.vlog != nil {
		h.ValueLogBytes, h.ValueLogLiveBytes = t.vlog.usage()
		h.ValueLogSegments = t.vlog.segments()
	}
	if t.st != nil {
		h.DiskBytes = t.st.diskBytes() + h.ValueLogBytes
		h.Open = true
		h.ReadOnly = t.st.readOnly
	}
	t.dbMu.RUnlock()
	return h
}

// Close persists the access times of blocks read since they were loaded,
// flushes the memtables (so best-effort blocks survive), and closes the
// database. Safe to call twice; later calls return nil.
func (t *Tier) Close() error {
	if !t.closed.CompareAndSwap(false, true) {
		return nil
	}
	// No relocation starts once closed is set (maybeRelocateLocked checks
	// it under relocMu); one running stops at its next block. It takes
	// wmu for each block, so wait for it before taking wmu.
	t.relocMu.Lock()
	done := t.relocDone
	t.relocMu.Unlock()
	if done != nil {
		<-done
	}
	t.wmu.Lock()
	defer t.wmu.Unlock()
	defer t.closeNull()
	t.stopCompactionLocked()
	t.dbMu.Lock()
	defer t.dbMu.Unlock()
	if t.vlog != nil {
		defer t.vlog.close()
	}
	if t.st == nil {
		return nil
	}
	var err error
	t.mu.Lock()
	b := &batch{}
	for _, e := range t.index {
		if e.dirty {
			m := e.meta()
			b.metaSet = append(b.metaSet, [2][]byte{e.encKey(), m.encode()})
			e.dirty = false
		}
	}
	t.mu.Unlock()
	if len(b.metaSet) > 0 && !t.st.readOnly {
		err = t.st.apply(b, false)
	}
	if !t.degraded.Load() && !t.st.wedged.Load() {
		if t.vlog != nil {
			err = errors.Join(err, t.vlog.sync())
		}
		err = errors.Join(err, t.st.flush())
	}
	t.st.close()
	t.st = nil
	if err != nil {
		return fmt.Errorf("ssd: close: %w", err)
	}
	return nil
}

// closeNull closes the descriptor checkDescriptors duplicates.
func (t *Tier) closeNull() {
	if t.null >= 0 {
		unix.Close(t.null)
		t.null = -1
	}
}

// countDurableEvictions counts the evicted blocks of es that a durable put
// wrote.
func (t *Tier) countDurableEvictions(es []*entry) {
	for _, e := range es {
		if e.durable {
			t.durableEvictions.Add(1)
		}
	}
}

// makeDurableLocked answers a durable put of a block the tier holds from a
// best-effort one (maybe only in a memtable, without the WAL): it writes
// the block again through the synced WAL (for a block in the value log,
// after syncing its segment, only its record), so that the acknowledged
// durable put survives a crash like any other. value must be the block's
// bytes (sum their CRC-32C); other bytes under the key are left as they
// are (values are immutable) and the put is refused. wmu held.
func (t *Tier) makeDurableLocked(e *entry, value []byte, sum uint32) error {
	if sum != e.sum || int64(len(value)) != e.size {
		return fmt.Errorf("%w: ssd: durable put of other bytes than the block held", cache.ErrUnavailable)
	}
	if t.degraded.Load() && !t.tryRecoverLocked() {
		return fmt.Errorf("%w: ssd tier degraded", cache.ErrUnavailable)
	}
	t.mu.Lock()
	m := e.meta()
	t.mu.Unlock()
	m.durable = true
	bp := blockPut{key: e.encKey(), meta: m.encode(), value: value}
	var err error
	if e.seg != 0 {
		bp.value, bp.logged = nil, true
		err = t.vlog.sync()
	}
	if err == nil {
		err = t.write(&batch{puts: []blockPut{bp}, wal: true}, true)
	}
	if err != nil {
		t.writeErrors.Add(1)
		t.degradeLocked("write failed", zap.Error(err))
		return fmt.Errorf("%w: ssd: durable put: %v", cache.ErrUnavailable, err)
	}
	t.mu.Lock()
	if t.index[e.skey] == e {
		e.durable = true
	}
	t.mu.Unlock()
	// A copy RocksDB had flushed to a blob file is garbage now.
	t.noteGarbageLocked(e.blobBytes())
	return nil
}
