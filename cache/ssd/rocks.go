package ssd

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/linxGnu/grocksdb"
)

// This file is the only one in tidepool that touches grocksdb. Every RocksDB
// object is created in exactly one function here and destroyed in exactly
// one other: the long-lived ones (Options, ReadOptions, WriteOptions,
// FlushOptions, CompactRangeOptions, the DB and its column-family handles) in
// openStore / store.close; the short-lived ones (WriteBatch, Iterator,
// PinnableSliceHandle) in the method that uses them, except a pinned read,
// which pinned.release destroys. The one WriteBatch is reused (see store.wb).

// Column families. "default" must exist in every RocksDB database; tidepool
// keeps only its probe record there.
const (
	cfDefaultName = "default"
	cfMetaName    = "meta" // encoded key -> metadata record (small, inline)
	cfDataName    = "data" // encoded key -> block bytes (BlobDB: blob files)
)

// probeKey is written to the default column family to find out whether the
// database accepts writes again after an error.
var probeKey = []byte("tidepool/probe")

// store owns one open RocksDB database.
type store struct {
	opts     *grocksdb.Options // DB-wide options, also used for "default"
	metaOpts *grocksdb.Options
	dataOpts *grocksdb.Options

	db     *grocksdb.DB
	cfDef  *grocksdb.ColumnFamilyHandle
	cfMeta *grocksdb.ColumnFamilyHandle
	cfData *grocksdb.ColumnFamilyHandle

	ro      *grocksdb.ReadOptions // point reads
	roScan  *grocksdb.ReadOptions // index rebuild: do not pollute caches
	woFast  *grocksdb.WriteOptions
	woSync  *grocksdb.WriteOptions
	woWAL   *grocksdb.WriteOptions // through the WAL, not synced
	fo      *grocksdb.FlushOptions
	compact *grocksdb.CompactRangeOptions

	// wb is reused by every write (callers serialize writes: Tier.wmu), so
	// its buffer, once as large as a block, is not allocated and
	// page-faulted again for each MiB-sized put.
	wb *grocksdb.WriteBatch

	// Every write runs on one goroutine locked to its OS thread (applyLoop):
	// RocksDB copies block bytes into memtable memory that it mallocs in
	// the writing thread, and glibc serves each thread from its own arena.
	// Writes from whatever thread the caller's goroutine happened to run on
	// spread the memtables over many arenas, each keeping its own freed
	// memory, so most memtable memory was fresh and page-faulted again; one
	// thread reuses one arena's memory.
	applyCh   chan applyReq
	applyErr  chan error
	applyDone chan struct{}

	// dir is the path the database was opened under (see dbPath).
	dir string
	// readOnly: opened with OpenForReadOnly (the disk was full): reads
	// only, apply and probe return errReadOnly without calling RocksDB,
	// flush and compactData do nothing.
	readOnly bool
	// wedged is set when a write failed to create a new WAL: librocksdb
	// 7.8 then leaves a column family referenced for good (descriptors.go),
	// RocksDB refuses every later write (a fatal background error, which
	// DB::Resume does not clear), and closing the database would abort the
	// process. close leaves such a database open, its background work
	// cancelled, and the tier opens a new instance of the same directory
	// (dbPath).
	wedged atomic.Bool
}

// wedgedDirs counts, per directory, the database instances this process
// left open because they were wedged. RocksDB refuses to open a
// directory whose LOCK its own process holds under the same name (it
// keeps a set of locked paths); the POSIX lock itself does not conflict
// within one process. A reopen therefore names the directory differently
// each time ("dir/.", "dir/./.", ...). The instance left open does
// nothing more: no writes reach it and its background work was cancelled.
var wedgedDirs = struct {
	sync.Mutex
	n map[string]int
}{n: map[string]int{}}

// dbPath is the name to open dir under: dir itself unless a wedged
// instance of it is still open in this process.
func dbPath(dir string) string {
	wedgedDirs.Lock()
	defer wedgedDirs.Unlock()
	return dir + strings.Repeat("/.", wedgedDirs.n[dir])
}

// isWALCreateFailure reports whether a write's error is RocksDB failing to
// create a new WAL file (RocksDB names it NNNNNN.log; the info log is
// "LOG").
func isWALCreateFailure(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	i := strings.Index(msg, "While open a file for appending: ")
	if i < 0 {
		return false
	}
	name, _, _ := strings.Cut(msg[i+len("While open a file for appending: "):], ":")
	return strings.HasSuffix(name, ".log")
}

type applyReq struct {
	b       *batch
	durable bool
}

// errReadOnly is returned by the writes of a store opened read-only.
var errReadOnly = errors.New("ssd: rocksdb open read-only (disk full)")

// openStore opens (creating if needed) the database in cfg.Dir. With
// readOnly it opens an existing database for reads only: RocksDB then
// writes nothing at all (no info LOG, WAL, MANIFEST or OPTIONS file; the
// WAL is replayed into memory), so it opens on a full disk.
func openStore(cfg *Config, readOnly bool) (_ *store, err error) {
	s := &store{dir: cfg.Dir, readOnly: readOnly}
	defer func() {
		if err != nil {
			s.close()
		}
	}()

	s.opts = grocksdb.NewDefaultOptions()
	s.opts.SetCreateIfMissing(true)
	s.opts.SetCreateIfMissingColumnFamilies(true)
	// Best-effort writes skip the WAL; atomic_flush keeps the data and meta
	// column families consistent with each other when they are flushed by
	// RocksDB (memtable full, shutdown), so a crash never leaves block bytes
	// without their metadata (space nobody could find again).
	s.opts.SetAtomicFlush(true)
	// Half of the background threads (at least one) flush memtables, the
	// rest compact. RocksDB's own split gives flushes a quarter, which is
	// one thread for 4 jobs: that one thread computing blob CRCs and
	// copying blob bytes into the page cache was what bounded the write
	// rate; with two, two memtables are written out at once (on 2 vCPUs:
	// 1 GiB of puts + flush from ~350-430 to ~420-570 MB/s, docs/ssd.md).
	// Flushes of a full memtable all have the same reason, so concurrent
	// atomic flushes do not meet the RocksDB 7.8 assertion described at
	// store.flush.
	// The two setters are deprecated in favour of max_background_jobs,
	// which would bring back RocksDB's own split.
	flushes := max(1, cfg.BackgroundJobs/2)
	//lint:ignore SA1019 the split is deliberate, see above
	s.opts.SetMaxBackgroundFlushes(flushes)
	//lint:ignore SA1019 the split is deliberate, see above
	s.opts.SetMaxBackgroundCompactions(max(1, cfg.BackgroundJobs-flushes))
	if cfg.BackgroundPriority == PriorityLow {
		// RocksDB's default Env, whose thread pools serve every database
		// of the process: each background thread sets itself to nice 19
		// when it next runs a job (docs/ssd.md, "Background priority").
		env := grocksdb.NewDefaultEnv()
		env.LowerThreadPoolCPUPriority()             // compactions
		env.LowerHighPriorityThreadPoolCPUPriority() // flushes
		s.opts.SetEnv(env)                           // s.opts owns env now
	}
	s.opts.SetBytesPerSync(1 << 20)
	s.opts.SetWALBytesPerSync(1 << 20)
	s.opts.SetMaxTotalWalSize(uint64(cfg.WriteBufferSize) * 2)
	s.opts.SetKeepLogFileNum(3)
	s.opts.SetMaxLogFileSize(8 << 20)
	// RocksDB's info LOG lives in Dir and its writer (EnvLogger in 7.8)
	// ignores write errors, but the next line written after a failed one
	// trips an assertion in WritableFileWriter (`sync_without_flush_called_`),
	// which Debian's librocksdb is built with: on a full disk that aborted
	// the process at open, at close and once while serving. Only header
	// lines (at open) and fatal ones are written; open is not attempted
	// without openMinFree bytes free (see openChecked), so the header
	// always fits. The tier logs its own disk errors through zap.
	s.opts.SetInfoLogLevel(grocksdb.FatalInfoLogLevel)
	s.opts.SetStatsDumpPeriodSec(0)
	s.opts.SetStatsPersistPeriodSec(0)
	s.opts.SetUseDirectReads(cfg.DirectReads)
	// SST and blob readers share the table cache this bounds (see
	// Config.MaxOpenFiles and descriptors.go).
	s.opts.SetMaxOpenFiles(cfg.MaxOpenFiles)
	s.opts.SetCompression(grocksdb.NoCompression)

	s.metaOpts = grocksdb.NewDefaultOptions()
	s.metaOpts.SetCompression(grocksdb.NoCompression)
	s.metaOpts.SetWriteBufferSize(8 << 20)
	// atomic_flush makes every flush switch the meta memtable together with
	// the data one: with RocksDB's default of 2 meta memtables, writes
	// stopped as soon as a second flush was queued, however many data
	// memtables were allowed.
	s.metaOpts.SetMaxWriteBufferNumber(cfg.MaxWriteBuffers)

	s.dataOpts = grocksdb.NewDefaultOptions()
	s.dataOpts.SetCompression(grocksdb.NoCompression)
	s.dataOpts.SetWriteBufferSize(uint64(cfg.WriteBufferSize))
	s.dataOpts.SetMaxWriteBufferNumber(cfg.MaxWriteBuffers)
	// Integrated BlobDB: values of MinBlobSize bytes or more go to blob
	// files written sequentially at flush time; the LSM tree holds only
	// small blob references, so compactions never rewrite block bytes
	// except when blob GC relocates the live blobs of old files.
	s.dataOpts.EnableBlobFiles(true)
	s.dataOpts.SetMinBlobSize(uint64(cfg.MinBlobSize))
	s.dataOpts.SetBlobFileSize(uint64(cfg.BlobFileSize))
	s.dataOpts.SetBlobCompressionType(grocksdb.NoCompression)
	// Blob GC stays off for RocksDB's own compactions: with it on, every
	// L0 compaction of blob references rewrote the live blobs of the
	// oldest BlobGCAgeCutoff of the blob files, garbage or not, so blocks
	// spilled from DRAM were written to disk twice and a quarter of the
	// sidecar's CPU during a spill went to that relocation (docs/ssd.md,
	// "The spill's write path"). compactData turns it on for the tier's own
	// compaction, which runs once CompactAfter bytes were dropped.
	s.dataOpts.EnableBlobGC(false)
	s.dataOpts.SetBlobGCAgeCutoff(cfg.BlobGCAgeCutoff)
	s.dataOpts.SetBlobGCForceThreshold(0.5)
	s.dataOpts.SetBlobCompactionReadaheadSize(2 << 20)

	names := []string{cfDefaultName, cfMetaName, cfDataName}
	cfOpts := []*grocksdb.Options{s.opts, s.metaOpts, s.dataOpts}
	var db *grocksdb.DB
	var cfs []*grocksdb.ColumnFamilyHandle
	if readOnly {
		db, cfs, err = grocksdb.OpenDbForReadOnlyColumnFamilies(s.opts, dbPath(cfg.Dir), names, cfOpts, false)
	} else {
		db, cfs, err = grocksdb.OpenDbColumnFamilies(s.opts, dbPath(cfg.Dir), names, cfOpts)
	}
	if err != nil {
		return nil, fmt.Errorf("ssd: open rocksdb in %s: %w", cfg.Dir, err)
	}
	s.db, s.cfDef, s.cfMeta, s.cfData = db, cfs[0], cfs[1], cfs[2]

	s.ro = grocksdb.NewDefaultReadOptions()
	// Point reads skip RocksDB's own checksums: the tier verifies the
	// CRC-32C of every value it returns (hardware-accelerated in Go), while
	// Debian's portable librocksdb computes CRC-32C with a table-driven
	// loop that took ~60% of the CPU of a 1 MiB read. A damaged blob or blob
	// reference then shows up as a CRC mismatch (or a RocksDB read error),
	// never as wrong bytes. The metadata scan keeps RocksDB's checks.
	s.ro.SetVerifyChecksums(false)
	s.roScan = grocksdb.NewDefaultReadOptions()
	s.roScan.SetFillCache(false)
	s.woFast = grocksdb.NewDefaultWriteOptions()
	s.woFast.DisableWAL(true)
	s.woSync = grocksdb.NewDefaultWriteOptions()
	s.woSync.SetSync(true)
	s.woWAL = grocksdb.NewDefaultWriteOptions()
	s.fo = grocksdb.NewDefaultFlushOptions()
	s.fo.SetWait(true)
	s.compact = grocksdb.NewCompactRangeOptions()
	s.compact.SetExclusiveManualCompaction(false)
	s.wb = grocksdb.NewWriteBatch()
	s.applyCh = make(chan applyReq)
	s.applyErr = make(chan error)
	s.applyDone = make(chan struct{})
	go s.applyLoop()
	return s, nil
}

// applyLoop performs every write of the store on one OS thread (see
// store.applyCh). It ends when close closes applyCh; the locked thread
// exits with it.
func (s *store) applyLoop() {
	runtime.LockOSThread()
	defer close(s.applyDone)
	for r := range s.applyCh {
		s.applyErr <- s.applyNow(r.b, r.durable)
	}
}

// close releases every RocksDB object; safe on a partly opened store and
// safe twice. Column-family handles go before the DB, the DB before the
// options it was opened with.
func (s *store) close() {
	if s == nil {
		return
	}
	if s.applyCh != nil {
		close(s.applyCh)
		<-s.applyDone
		s.applyCh = nil
	}
	if s.wedged.Load() && s.db != nil {
		// Closing it would abort the process (see store.wedged): stop its
		// background work and leave it, its handles and the options it
		// uses, open for good. The rest is ours to free.
		s.db.CancelAllBackgroundWork(true)
		s.db, s.cfData, s.cfMeta, s.cfDef = nil, nil, nil, nil
		s.opts, s.metaOpts, s.dataOpts = nil, nil, nil
		wedgedDirs.Lock()
		wedgedDirs.n[s.dir]++
		wedgedDirs.Unlock()
	}
	for _, cf := range []**grocksdb.ColumnFamilyHandle{&s.cfData, &s.cfMeta, &s.cfDef} {
		if *cf != nil {
			(*cf).Destroy()
			*cf = nil
		}
	}
	if s.db != nil {
		s.db.Close()
		s.db = nil
	}
	if s.ro != nil {
		s.ro.Destroy()
		s.ro = nil
	}
	if s.roScan != nil {
		s.roScan.Destroy()
		s.roScan = nil
	}
	if s.woFast != nil {
		s.woFast.Destroy()
		s.woFast = nil
	}
	if s.woSync != nil {
		s.woSync.Destroy()
		s.woSync = nil
	}
	if s.woWAL != nil {
		s.woWAL.Destroy()
		s.woWAL = nil
	}
	if s.fo != nil {
		s.fo.Destroy()
		s.fo = nil
	}
	if s.compact != nil {
		s.compact.Destroy()
		s.compact = nil
	}
	if s.wb != nil {
		s.wb.Destroy()
		s.wb = nil
	}
	for _, o := range []**grocksdb.Options{&s.dataOpts, &s.metaOpts, &s.opts} {
		if *o != nil {
			(*o).Destroy()
			*o = nil
		}
	}
}

// batch is one atomic write: block puts, block deletes and metadata-only
// rewrites, applied together or not at all.
type batch struct {
	// wal: write through the WAL (not synced) even when not durable: the
	// records of value log blocks, whose bytes are on disk already.
	wal     bool
	puts    []blockPut
	dels    [][]byte    // encoded keys removed from both column families
	metaSet [][2][]byte // encoded key, metadata record (no block bytes)
}

type blockPut struct {
	key, meta, value []byte
	logged           bool // the bytes are in the value log: no data record
}

// apply writes b atomically. durable writes go through the WAL and fsync it
// before returning; the others skip the WAL (see docs/ssd.md). Callers
// serialize apply (it reuses one WriteBatch and one reply channel).
func (s *store) apply(b *batch, durable bool) error {
	s.applyCh <- applyReq{b: b, durable: durable}
	return <-s.applyErr
}

// applyNow is apply on the write thread.
func (s *store) applyNow(b *batch, durable bool) error {
	if s.readOnly {
		return errReadOnly
	}
	wb := s.wb
	wb.Clear()
	for _, k := range b.dels {
		wb.DeleteCF(s.cfData, k)
		wb.DeleteCF(s.cfMeta, k)
	}
	for _, p := range b.puts {
		if !p.logged {
			wb.PutCF(s.cfData, p.key, p.value)
		}
		wb.PutCF(s.cfMeta, p.key, p.meta)
	}
	for _, m := range b.metaSet {
		wb.PutCF(s.cfMeta, m[0], m[1])
	}
	wo := s.woFast
	switch {
	case durable:
		wo = s.woSync
	case b.wal:
		wo = s.woWAL
	}
	err := s.db.Write(wo, wb)
	if isWALCreateFailure(err) {
		s.wedged.Store(true)
	}
	return err
}

// probe writes a small record through the WAL to learn whether the
// database accepts writes.
func (s *store) probe(stamp []byte) error {
	if s.readOnly {
		return errReadOnly
	}
	err := s.db.PutCF(s.woSync, s.cfDef, probeKey, stamp)
	if isWALCreateFailure(err) {
		s.wedged.Store(true)
	}
	return err
}

// pinned is a block read that still references RocksDB memory. Its bytes
// are valid until release, which MUST be called exactly once.
type pinned struct {
	h *grocksdb.PinnableSliceHandle
}

// bytes returns the pinned value (C memory; do not keep it past release).
func (p *pinned) bytes() []byte { return p.h.Data() }

// release destroys the handle.
func (p *pinned) release() {
	if p.h != nil {
		p.h.Destroy()
		p.h = nil
	}
}

// getPinned reads the block stored under key. found is false when RocksDB
// has no such key; then nothing needs releasing.
func (s *store) getPinned(key []byte) (p *pinned, found bool, err error) {
	h, err := s.db.GetPinnedCF(s.ro, s.cfData, key)
	if err != nil {
		return nil, false, err
	}
	if !h.Exists() {
		h.Destroy()
		return nil, false, nil
	}
	return &pinned{h: h}, true, nil
}

// scanMeta calls fn with every metadata record in key order. The slices are
// only valid during the call.
func (s *store) scanMeta(fn func(key, rec []byte)) error {
	it := s.db.NewIteratorCF(s.roScan, s.cfMeta)
	defer it.Close()
	for it.SeekToFirst(); it.Valid(); it.Next() {
		// Iterator key/value slices are owned by the iterator (Free is a
		// no-op on them); fn must copy what it keeps.
		fn(it.Key().Data(), it.Value().Data())
	}
	return it.Err()
}

// flush persists the memtables: metadata first, then data, so that a crash
// between the two leaves at worst metadata without bytes (found and dropped
// on read) rather than bytes without metadata (space lost until a rebuild).
// Flushes started by RocksDB itself are atomic across both families.
//
// librocksdb 7.8 keeps the flush reason per column family, and a manual
// flush of one family queued beside a flush of both (RocksDB's own, or the
// one CompactRange starts with) gives that flush two different reasons,
// which a RocksDB assertion turns into an abort of the process (Debian
// builds it with assertions on; fixed upstream in RocksDB 8.0,
// facebook/rocksdb#11111). So nothing else may queue a flush meanwhile:
// callers hold Tier.wmu (no write can) and no compactData runs (Flush
// waits for it, Close stops it), and the flushes RocksDB already queued
// are finished first.
func (s *store) flush() error {
	if s.readOnly {
		return nil
	}
	s.waitFlushesIdle()
	if err := s.db.FlushCF(s.cfMeta, s.fo); err != nil {
		return err
	}
	return s.db.FlushCF(s.cfData, s.fo)
}

// flushIdleTimeout bounds waitFlushesIdle; reached only if RocksDB stops
// flushing without reporting a background error.
const flushIdleTimeout = time.Minute

// waitFlushesIdle waits until no memtable flush is queued or running, or
// RocksDB reports a background error (its queued flushes will not run then),
// or flushIdleTimeout. RocksDB has no call to wait for its queue, so this
// polls two properties every millisecond; a flush of a full memtable takes
// tens of milliseconds or more.
func (s *store) waitFlushesIdle() {
	deadline := time.Now().Add(flushIdleTimeout)
	for time.Now().Before(deadline) {
		// Pending first, then running: a queued flush stops being pending
		// only once its job runs, so this order cannot miss one.
		pending := false
		for _, cf := range []*grocksdb.ColumnFamilyHandle{s.cfDef, s.cfMeta, s.cfData} {
			if n, ok := s.db.GetIntPropertyCF("rocksdb.mem-table-flush-pending", cf); ok && n > 0 {
				pending = true
			}
		}
		running, _ := s.db.GetIntProperty("rocksdb.num-running-flushes")
		if !pending && running == 0 {
			return
		}
		if n, ok := s.db.GetIntProperty("rocksdb.background-errors"); ok && n > 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// compactData compacts the whole data family so that blob references of
// deleted blocks are dropped and blob GC can delete or rewrite old blob
// files.
//
// Blob GC is on for the duration (it is off for RocksDB's own compactions,
// see openStore): the live blobs of the oldest BlobGCAgeCutoff of the blob
// files are relocated so that those files can go. Compactions RocksDB
// starts meanwhile GC too, which only frees space sooner.
func (s *store) compactData() {
	if s.readOnly {
		return
	}
	s.setBlobGC(true)
	defer s.setBlobGC(false)
	s.db.CompactRangeCFOpt(s.cfData, grocksdb.Range{}, s.compact)
}

const blobGCOption = "enable_blob_garbage_collection"

// setBlobGC turns blob GC of the data family on or off (a mutable column
// family option). A failure leaves it as it was: compaction still drops the
// references of dead blocks and deletes blob files that hold only those.
func (s *store) setBlobGC(on bool) {
	_ = s.db.SetOptionsCF(s.cfData, []string{blobGCOption}, []string{strconv.FormatBool(on)})
}

// pauseCompaction aborts a running manual compaction and makes later ones
// return at once; used before closing or reopening.
func (s *store) pauseCompaction() { s.db.DisableManualCompaction() }

// diskBytes is the size of the live SST and blob files of both families.
func (s *store) diskBytes() int64 {
	var n int64
	for _, cf := range []*grocksdb.ColumnFamilyHandle{s.cfMeta, s.cfData} {
		for _, p := range []string{"rocksdb.total-sst-files-size", "rocksdb.total-blob-file-size"} {
			v, err := strconv.ParseInt(s.db.GetPropertyCF(p, cf), 10, 64)
			if err == nil {
				n += v
			}
		}
	}
	return n
}

// isCorruption reports whether a RocksDB read error means the stored block
// is bad (checksum mismatch in a blob or SST, truncated or unreadable file)
// rather than the database being unavailable.
func isCorruption(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "Corruption") || strings.HasPrefix(msg, "IO error") ||
		strings.Contains(msg, "blob")
}

// errNoStore is returned while the database is closed for a reopen that
// failed; the tier is degraded then.
var errNoStore = errors.New("ssd: rocksdb not open")
