package ssd

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/clock"
)

// blobFiles returns the blob files of dir, largest first.
func blobFiles(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.blob"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no blob files in %s (%v)", dir, err)
	}
	sort.Slice(files, func(i, j int) bool { return fileSize(files[i]) > fileSize(files[j]) })
	return files
}

// segmentFiles returns the value log's segment files of dir, largest
// first.
func segmentFiles(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, valuesDir, "*.seg"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no value log segments in %s (%v)", dir, err)
	}
	sort.Slice(files, func(i, j int) bool { return fileSize(files[i]) > fileSize(files[j]) })
	return files
}

// stores are the two places a block's bytes can be: the value log (the
// default for blocks of ValueLogMin and up) and RocksDB's blob files.
var stores = []struct {
	name   string
	logMin int64
}{{"value log", 0}, {"rocksdb", -1}}

func fileSize(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// putBlocks puts blocks 0..n-1 of ns: key(i), value(i, size).
func putBlocks(t *testing.T, tr *Tier, ns string, n, size int) {
	t.Helper()
	for i := range n {
		mustPut(t, tr, ns, key(i), value(uint64(i), size), cache.PutOptions{})
	}
}

// readAll reads blocks 0..n-1 of ns and sorts them into good (exact bytes)
// and bad (an error matching both cache.ErrChecksum and cache.ErrNotFound).
// Any other outcome, wrong bytes above all, fails the test.
func readAll(t *testing.T, tr *Tier, ns string, n, size int) (good, bad int) {
	t.Helper()
	good, bad, missing := readSome(t, tr, ns, n, size)
	if missing != 0 {
		t.Fatalf("%d blocks missing", missing)
	}
	return good, bad
}

// readSome is readAll where plain misses are allowed and counted.
func readSome(t *testing.T, tr *Tier, ns string, n, size int) (good, bad, missing int) {
	t.Helper()
	for i := range n {
		got, _, err := tr.Get(context.Background(), ns, key(i), nil)
		switch {
		case err == nil:
			if !bytes.Equal(got, value(uint64(i), size)) {
				t.Fatalf("block %d: WRONG BYTES returned", i)
			}
			good++
		case errors.Is(err, cache.ErrNotFound) && !errors.Is(err, cache.ErrChecksum):
			missing++
		case errors.Is(err, cache.ErrChecksum) && errors.Is(err, cache.ErrNotFound):
			bad++
			if _, ok := tr.Stat(context.Background(), ns, key(i)); ok {
				t.Fatalf("block %d: still indexed after a failed read", i)
			}
			if _, _, err := tr.Get(context.Background(), ns, key(i), nil); !errors.Is(err, cache.ErrNotFound) || errors.Is(err, cache.ErrChecksum) {
				t.Fatalf("block %d: second read %v, want a plain miss", i, err)
			}
		default:
			t.Fatalf("block %d: %v", i, err)
		}
	}
	return good, bad, missing
}

func TestCorruptBlobFile(t *testing.T) {
	tests := []struct {
		name    string
		corrupt func(t *testing.T, path string, size int64)
	}{
		{"flipped bytes", func(t *testing.T, path string, size int64) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, off := range []int64{size / 3, size / 2} {
				b := make([]byte, 16)
				if _, err := f.ReadAt(b, off); err != nil {
					t.Fatal(err)
				}
				for i := range b {
					b[i] ^= 0xff
				}
				if _, err := f.WriteAt(b, off); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"truncated", func(t *testing.T, path string, size int64) {
			if err := os.Truncate(path, size*2/3); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, sto := range stores {
		for _, tc := range tests {
			t.Run(sto.name+"/"+tc.name, func(t *testing.T) {
				dir := t.TempDir()
				cfg := testConfig(dir)
				cfg.ValueLogMin = sto.logMin
				tr := newTier(t, cfg)
				const n, size = 8, 512 << 10
				putBlocks(t, tr, "cb", n, size)
				if err := tr.Close(); err != nil {
					t.Fatal(err)
				}
				if sto.logMin < 0 {
					f := blobFiles(t, dir)[0]
					tc.corrupt(t, f, fileSize(f))
				} else {
					// The segment's file is allocated ahead: damage what
					// was written.
					tc.corrupt(t, segmentFiles(t, dir)[0], n*size)
				}

				tr2 := newTier(t, cfg)
				// A value log block past a truncated segment's end is
				// dropped when the index is rebuilt: a plain miss.
				good, bad, missing := readSome(t, tr2, "cb", n, size)
				t.Logf("%d good, %d bad, %d missing; health %+v", good, bad, missing, tr2.Health())
				if bad+missing == 0 || (missing > 0 && (sto.logMin < 0 || tc.name != "truncated")) {
					t.Fatal("corruption not detected, or blocks missing")
				}
				if got := tierStats(tr2).ChecksumFailures; got != int64(bad) {
					t.Fatalf("ChecksumFailures = %d, want %d", got, bad)
				}
				if ts := tierStats(tr2); ts.Blocks != int64(good) {
					t.Fatalf("blocks = %d, want %d", ts.Blocks, good)
				}
			})
		}
	}
}

// TestChecksumMismatch changes block bytes behind the tier's back in a way
// RocksDB cannot notice (a valid write of other bytes under the same key):
// the tier's own CRC-32C must catch it.
func TestChecksumMismatch(t *testing.T) {
	for _, sto := range stores {
		t.Run(sto.name, func(t *testing.T) { testChecksumMismatch(t, sto.logMin) })
	}
}

func testChecksumMismatch(t *testing.T, logMin int64) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.ValueLogMin = logMin
	tr := newTier(t, cfg)
	const n, size = 4, 64 << 10
	putBlocks(t, tr, "cm", n, size)
	tr.mu.Lock()
	e := *tr.index[string(encodeKey("cm", key(2)))]
	tr.mu.Unlock()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	evil := value(99, size)
	if logMin < 0 {
		st, err := openStore(&cfg, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.db.PutCF(st.woSync, st.cfData, encodeKey("cm", key(2)), evil); err != nil {
			t.Fatal(err)
		}
		st.close()
	} else {
		if e.seg == 0 {
			t.Fatal("block not in the value log")
		}
		f, err := os.OpenFile(filepath.Join(dir, valuesDir, segName(e.seg)), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(evil, e.off); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}

	tr2 := newTier(t, cfg)
	good, bad := readAll(t, tr2, "cm", n, size)
	h := tr2.Health()
	if good != n-1 || bad != 1 || h.ChecksumFailures != 1 || h.ReadErrors != 0 {
		t.Fatalf("good %d bad %d health %+v", good, bad, h)
	}
}

// TestDegraded drives degraded mode through the seams: a failing write
// (as RocksDB reports ENOSPC or EIO) and low free space.
func TestDegraded(t *testing.T) {
	var errDisk = errors.New("IO error: No space left on device")
	tests := []struct {
		name    string
		breakIt func(tr *Tier, broken *bool)
	}{
		{"write error", func(tr *Tier, broken *bool) {
			tr.hookBeforeWrite = func() error {
				if *broken {
					return errDisk
				}
				return nil
			}
		}},
		{"low free space", func(tr *Tier, broken *bool) {
			tr.cfg.MinFreeBytes = 64 * mib
			tr.hookFreeSpace = func(string) (int64, error) {
				if *broken {
					return mib, nil
				}
				return 1 << 40, nil
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			cfg.ProbeInterval = time.Second
			clk := cfg.Clock.(*clock.Fake)
			tr := newTier(t, cfg)
			broken := false
			tc.breakIt(tr, &broken)
			ctx := context.Background()
			mustPut(t, tr, "dg", key(0), value(0, 100<<10), cache.PutOptions{})

			broken = true
			_, err := tr.Put(ctx, "dg", key(1), value(1, 100<<10), cache.PutOptions{})
			if !errors.Is(err, cache.ErrUnavailable) || !tr.Degraded() {
				t.Fatalf("Put on a broken disk: %v, degraded %v", err, tr.Degraded())
			}
			if ts := tierStats(tr); ts.Blocks != 1 || ts.UsedBytes != footprint(len(encodeKey("dg", key(0))), 100<<10, nil) {
				t.Fatalf("failed put changed the accounting: %+v", ts)
			}
			mustGet(t, tr, "dg", key(0), value(0, 100<<10)) // reads still served

			// Space returns, but the probe waits for its interval.
			broken = false
			if _, err := tr.Put(ctx, "dg", key(1), value(1, 100<<10), cache.PutOptions{}); !errors.Is(err, cache.ErrUnavailable) {
				t.Fatalf("Put before the probe interval: %v", err)
			}
			clk.Advance(time.Second)
			mustPut(t, tr, "dg", key(1), value(1, 100<<10), cache.PutOptions{})
			h := tr.Health()
			if tr.Degraded() || h.DegradedEvents != 1 || h.Recoveries != 1 {
				t.Fatalf("after recovery: %+v", h)
			}
			mustGet(t, tr, "dg", key(0), value(0, 100<<10))
			mustGet(t, tr, "dg", key(1), value(1, 100<<10))
		})
	}
}

// TestDiskFull runs the tier on a 64 MiB tmpfs until RocksDB hits ENOSPC,
// then frees space and checks that the tier recovers.
func TestDiskFull(t *testing.T) {
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", mnt).Run() })
	filler := filepath.Join(mnt, "filler")
	if err := os.WriteFile(filler, make([]byte, 36*mib), 0o600); err != nil {
		t.Fatal(err)
	}

	cfg := testConfig(filepath.Join(mnt, "db"))
	cfg.WriteBufferSize = 2 * mib
	cfg.MaxWriteBuffers = 2
	cfg.BlobFileSize = 4 * mib
	cfg.ProbeInterval = time.Second
	clk := cfg.Clock.(*clock.Fake)
	tr := newTier(t, cfg)
	ctx := context.Background()

	const size = 512 << 10
	var stored int
	var err error
	for stored = 0; stored < 200; stored++ {
		if _, err = tr.Put(ctx, "df", key(stored), value(uint64(stored), size), cache.PutOptions{}); err != nil {
			break
		}
	}
	t.Logf("%d blocks stored before: %v", stored, err)
	if !errors.Is(err, cache.ErrUnavailable) || !tr.Degraded() {
		t.Fatalf("disk full: err %v, degraded %v", err, tr.Degraded())
	}
	// Reads are still served while degraded, never with wrong bytes.
	good, bad := readAll(t, tr, "df", stored, size)
	t.Logf("while degraded: %d readable, %d bad", good, bad)
	if good == 0 || bad != 0 {
		t.Fatalf("while degraded: %d readable, %d bad", good, bad)
	}
	if _, err := tr.Put(ctx, "df", key(1000), value(1000, size), cache.PutOptions{}); !errors.Is(err, cache.ErrUnavailable) {
		t.Fatalf("Put while degraded: %v", err)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	mustPut(t, tr, "df", key(1000), value(1000, size), cache.PutOptions{})
	if tr.Degraded() || tr.Health().Recoveries != 1 {
		t.Fatalf("after space returned: %+v", tr.Health())
	}
	mustGet(t, tr, "df", key(1000), value(1000, size))
	// Blocks still in memtables when the flush failed are gone (the
	// database was reopened); the others are intact.
	good, bad, missing := readSome(t, tr, "df", stored, size)
	t.Logf("after recovery: %d of %d earlier blocks readable, %d lost", good, stored, missing)
	if bad != 0 || good == 0 {
		t.Fatalf("%d bad blocks after recovery", bad)
	}
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestOpenDiskFull opens the tier on a full tmpfs: New must not fail (nor
// abort in RocksDB), the tier starts degraded without a database, refuses
// puts, and a put after the probe interval opens the database once space
// is back, serving what was stored before.
func TestOpenDiskFull(t *testing.T) {
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", mnt).Run() })
	cfg := testConfig(filepath.Join(mnt, "db"))
	cfg.WriteBufferSize = 2 * mib
	cfg.MaxWriteBuffers = 2
	cfg.BlobFileSize = 4 * mib
	cfg.ProbeInterval = time.Second
	clk := cfg.Clock.(*clock.Fake)
	ctx := context.Background()
	const n, size = 8, 256 << 10

	tr, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		mustPut(t, tr, "of", key(i), value(uint64(i), size), cache.PutOptions{Durable: i%2 == 0})
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(mnt, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for chunk := make([]byte, 64<<10); ; {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	f.Close()

	// The database opens read-only: every block on disk is served, no
	// put is admitted, and nothing aborts.
	tr2 := newTier(t, cfg)
	h := tr2.Health()
	if !tr2.Degraded() || !h.Open || !h.ReadOnly || h.DegradedEvents != 1 {
		t.Fatalf("opened on a full disk: degraded %v, %+v", tr2.Degraded(), h)
	}
	if _, err := tr2.Put(ctx, "of", key(100), value(100, size), cache.PutOptions{Durable: true}); !errors.Is(err, cache.ErrUnavailable) {
		t.Fatalf("durable put on a read-only database: %v", err)
	}
	if good, bad := readAll(t, tr2, "of", n, size); good != n || bad != 0 {
		t.Fatalf("read-only on a full disk: %d good, %d bad of %d", good, bad, n)
	}
	// A probe while the disk is still full keeps it read-only.
	clk.Advance(time.Second)
	if _, err := tr2.Put(ctx, "of", key(100), value(100, size), cache.PutOptions{Durable: true}); !errors.Is(err, cache.ErrUnavailable) {
		t.Fatalf("durable put on a full disk after a probe: %v", err)
	}
	if h := tr2.Health(); !h.ReadOnly || !h.Open {
		t.Fatalf("after a probe on the full disk: %+v", h)
	}
	// Close and open again on the full disk: still read-only, still all
	// blocks.
	if err := tr2.Close(); err != nil {
		t.Fatalf("close of a read-only tier: %v", err)
	}
	tr2 = newTier(t, cfg)
	if good, bad := readAll(t, tr2, "of", n, size); good != n || bad != 0 {
		t.Fatalf("second read-only open: %d good, %d bad of %d", good, bad, n)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	mustPut(t, tr2, "of", key(100), value(100, size), cache.PutOptions{Durable: true})
	if h := tr2.Health(); tr2.Degraded() || !h.Open || h.ReadOnly || h.Recoveries != 1 {
		t.Fatalf("after space came back: degraded %v, %+v", tr2.Degraded(), h)
	}
	good, bad := readAll(t, tr2, "of", n, size)
	if good != n || bad != 0 {
		t.Fatalf("after reopening: %d good, %d bad of %d", good, bad, n)
	}
	mustGet(t, tr2, "of", key(100), value(100, size))
}

// TestQuarantine damages a closed database; New must move it aside,
// count it, and open an empty tier that works.
func TestQuarantine(t *testing.T) {
	tests := []struct {
		name   string
		damage func(t *testing.T, dir string)
	}{
		{"truncated CURRENT", func(t *testing.T, dir string) {
			if err := os.Truncate(filepath.Join(dir, "CURRENT"), 3); err != nil {
				t.Fatal(err)
			}
		}},
		{"flipped MANIFEST byte", func(t *testing.T, dir string) {
			ms, _ := filepath.Glob(filepath.Join(dir, "MANIFEST-*"))
			if len(ms) == 0 {
				t.Fatal("no MANIFEST")
			}
			b, err := os.ReadFile(ms[0])
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/2] ^= 0x01
			if err := os.WriteFile(ms[0], b, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(filepath.Join(t.TempDir(), "db"))
			tr := newTier(t, cfg)
			for i := range 4 {
				mustPut(t, tr, "qu", key(i), value(uint64(i), 64<<10), cache.PutOptions{Durable: true})
			}
			if err := tr.Close(); err != nil {
				t.Fatal(err)
			}
			tc.damage(t, cfg.Dir)

			tr2 := newTier(t, cfg)
			h := tr2.Health()
			if h.Quarantines != 1 || !strings.HasPrefix(h.QuarantinedTo, cfg.Dir+".quarantine-") || !h.Open || tr2.Degraded() {
				t.Fatalf("health after opening a damaged database: %+v", h)
			}
			if _, err := os.Stat(filepath.Join(h.QuarantinedTo, "CURRENT")); err != nil {
				t.Fatalf("quarantined copy: %v", err)
			}
			if blocks, _, _ := tr2.Recovered(); blocks != 0 {
				t.Fatalf("recovered %d blocks from a damaged database", blocks)
			}
			mustPut(t, tr2, "qu", key(9), value(9, 64<<10), cache.PutOptions{Durable: true})
			mustGet(t, tr2, "qu", key(9), value(9, 64<<10))
		})
	}
}

// TestPutVerifiedStoresItsSum: PutVerified stores the caller's checksum
// without reading the bytes again; a block stored under a sum that does
// not match its bytes is refused on read (a miss, counted), never returned.
func TestPutVerifiedStoresItsSum(t *testing.T) {
	tr := newTier(t, testConfig(t.TempDir()))
	const size = 256 << 10
	good, bad := value(1, size), value(2, size)
	if _, err := tr.PutVerified(context.Background(), "pv", key(1), good, cache.Checksum(good), cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.PutVerified(context.Background(), "pv", key(2), bad, cache.Checksum(bad)^1, cache.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if info, ok := tr.Stat(context.Background(), "pv", key(1)); !ok || info.Checksum != cache.Checksum(good) {
		t.Fatalf("stat of the good block: %+v %v", info, ok)
	}
	mustGet(t, tr, "pv", key(1), good)
	v, _, err := tr.Get(context.Background(), "pv", key(2), nil)
	if !errors.Is(err, cache.ErrChecksum) || !errors.Is(err, cache.ErrNotFound) || len(v) != 0 {
		t.Fatalf("get of the block stored under a wrong sum: %d bytes, %v", len(v), err)
	}
	if n := tr.Health().ChecksumFailures; n != 1 {
		t.Fatalf("checksum failures %d, want 1", n)
	}
}
