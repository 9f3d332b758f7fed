package ssd

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// File descriptors. RocksDB opens files while it serves (a new WAL when a
// memtable is switched, SST and blob files for flushes and compactions,
// table readers for reads) and librocksdb 7.8 does not survive every one of
// those opens failing: a WAL that cannot be created during a memtable
// switch leaves a column family referenced forever (DBImpl::ScheduleFlushes
// stops unreferencing at the first failure, fixed upstream in RocksDB 8.10,
// facebook/rocksdb#12176), and closing that database then aborts the
// process (`ColumnFamilySet::~ColumnFamilySet(): Assertion 'last_ref'
// failed`). So the tier
//
//   - bounds what RocksDB keeps open (Config.MaxOpenFiles) and says what it
//     needs in all (Descriptors), for the process to keep that many free;
//   - checks before every write that descriptorHeadroom descriptors are
//     still free (checkDescriptors), and refuses the write (degraded) when
//     not, so that the tier, not RocksDB, meets EMFILE;
//   - never closes a database whose WAL switch failed anyway (a race with
//     another thread taking the last descriptors): see store.wedged.

// descriptorHeadroom is how many free descriptors a write needs: a new WAL,
// and the SST and blob file of each of the flushes it may start.
const descriptorHeadroom = 8

// descriptorOverhead is what the tier keeps open besides the table cache
// and the value log's segments: the WAL (two while one is switched), the
// MANIFEST, the info LOG, LOCK, directories, the flushes' and compactions'
// output files, and its own /dev/null descriptor.
const descriptorOverhead = 32

// nofileLimit returns the process's RLIMIT_NOFILE soft limit (0 if
// unknown).
func nofileLimit() uint64 {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	return lim.Cur
}

// defaultMaxOpenFiles is Config.MaxOpenFiles's default for a process whose
// soft descriptor limit is limit: a quarter of it, within 64..4096. The
// SST and blob files of a tier number a few hundred at most (128 MiB blob
// files, 64 MiB SSTs), so 4096 keeps them all open on any real disk.
func defaultMaxOpenFiles(limit uint64) int {
	if limit == 0 || limit == unix.RLIM_INFINITY {
		return 4096
	}
	return int(min(max(limit/4, 64), 4096))
}

// Descriptors is the most file descriptors a tier with this config holds
// open at once: RocksDB's table cache (MaxOpenFiles), one per value log
// segment (the files stay within Capacity + its hard limit + two segments,
// see docs/ssd.md "Value log"), descriptorOverhead, and the
// descriptorHeadroom every write asks to be free. A process that runs the
// tier keeps at least this many descriptors for it under its
// RLIMIT_NOFILE.
func (c Config) Descriptors() int {
	c = c.withDefaults()
	seg := min(c.ValueLogSegmentSize, max(c.Capacity/16, 1<<20))
	segments := c.Capacity/seg + c.Capacity/16/seg + 4
	return c.MaxOpenFiles + int(segments) + descriptorOverhead + descriptorHeadroom
}

// errDescriptors is returned by checkDescriptors; it matches
// syscall.EMFILE.
var errDescriptors = fmt.Errorf("ssd: fewer than %d file descriptors free: %w", descriptorHeadroom, syscall.EMFILE)

// checkDescriptors reports errDescriptors unless descriptorHeadroom more
// descriptors can be opened now (it duplicates null that many times and
// closes the copies: a few microseconds, against the milliseconds a put of
// a block takes).
func checkDescriptors(null int) error {
	if null < 0 {
		return nil
	}
	var fds [descriptorHeadroom]int
	n := 0
	defer func() {
		for _, fd := range fds[:n] {
			unix.Close(fd)
		}
	}()
	for n < len(fds) {
		fd, err := unix.FcntlInt(uintptr(null), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			if err == unix.EMFILE || err == unix.ENFILE {
				return errDescriptors
			}
			return nil // not a shortage of descriptors: let the write say
		}
		fds[n] = fd
		n++
	}
	return nil
}

// isOutOfDescriptors reports whether err (RocksDB's text or ours) means the
// process or the system ran out of file descriptors: a passing condition,
// not damage to the block being read.
func isOutOfDescriptors(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
		return true
	}
	// RocksDB reports strerror: "Too many open files" (EMFILE) and "Too
	// many open files in system" (ENFILE).
	return strings.Contains(strings.ToLower(err.Error()), "too many open files")
}
