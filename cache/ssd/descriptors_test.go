package ssd

import (
	"context"
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/clock"
)

// exhaustDescriptors lowers the process's soft descriptor limit to 1024 and
// opens /dev/null until the table is full; release closes them and restores
// the limit (also at the end of the test).
func exhaustDescriptors(t *testing.T) (release func()) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	low := old
	low.Cur = min(old.Cur, 1024)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	var fds []int
	for {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			if !errors.Is(err, unix.EMFILE) {
				t.Fatalf("filling the descriptor table: %v", err)
			}
			break
		}
		fds = append(fds, fd)
	}
	done := false
	release = func() {
		if done {
			return
		}
		done = true
		for _, fd := range fds {
			unix.Close(fd)
		}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(release)
	return release
}

// TestOutOfDescriptors runs the tier out of file descriptors while it
// takes durable puts (every write through the WAL, so that a memtable
// switch must create a new WAL file) of blocks kept in RocksDB. With the
// tier's check (the default) the tier refuses the write before RocksDB
// meets EMFILE; without it (as when another thread takes the last
// descriptors between the check and RocksDB's open) RocksDB fails to
// create the WAL, which in librocksdb 7.8 leaks a column family reference
// so that closing the database aborts the process. Either way: no abort,
// reads keep working and drop nothing, and once descriptors are back the
// tier recovers and serves every durable block.
func TestOutOfDescriptors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		check  bool
		wedges bool
	}{{"tier meets EMFILE first", true, false}, {"rocksdb meets EMFILE", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(t0)
			cfg := testConfig(t.TempDir())
			cfg.Clock = clk
			cfg.WriteBufferSize = 1 << 20 // memtables switch every few puts
			cfg.ValueLogMin = -1
			tr := newTier(t, cfg)
			if !tc.check {
				tr.closeNull()
			}
			ctx := context.Background()
			const size = 256 << 10
			durable := cache.PutOptions{Durable: true}
			mustPut(t, tr, "n", key(0), value(0, size), durable)
			mustPut(t, tr, "n", key(1), value(1, size), durable)
			stored := 2

			release := exhaustDescriptors(t)
			var putErr error
			for i := 2; i < 64; i++ {
				if _, putErr = tr.Put(ctx, "n", key(i), value(uint64(i), size), durable); putErr != nil {
					break
				}
				stored++
			}
			if !errors.Is(putErr, cache.ErrUnavailable) {
				t.Fatalf("puts without descriptors: %v, want ErrUnavailable", putErr)
			}
			h := tr.Health()
			if !h.Degraded || !strings.Contains(strings.ToLower(h.Reason), "too many open files") {
				t.Fatalf("health %+v: want degraded for lack of descriptors", h)
			}
			tr.dbMu.RLock()
			wedged := tr.st.wedged.Load()
			tr.dbMu.RUnlock()
			if wedged != tc.wedges {
				t.Fatalf("rocksdb wedged: %v, want %v (error %v)", wedged, tc.wedges, putErr)
			}
			// Reads while out of descriptors: exact bytes or a miss that
			// drops nothing.
			for i := range stored {
				got, _, err := tr.Get(ctx, "n", key(i), nil)
				if err == nil && string(got) != string(value(uint64(i), size)) {
					t.Fatalf("block %d: wrong bytes", i)
				}
				if err != nil && !errors.Is(err, cache.ErrUnavailable) {
					t.Fatalf("block %d without descriptors: %v, want a value or ErrUnavailable", i, err)
				}
			}
			if h := tr.Health(); h.ChecksumFailures != 0 {
				t.Fatalf("%d blocks dropped as corrupt for lack of descriptors", h.ChecksumFailures)
			}
			// A probe while still short of descriptors fails, and aborts
			// nothing.
			clk.Advance(cfg.ProbeInterval)
			if _, err := tr.Put(ctx, "n", key(100), value(100, size), durable); !errors.Is(err, cache.ErrUnavailable) {
				t.Fatalf("put while still out of descriptors: %v", err)
			}

			release()
			clk.Advance(cfg.ProbeInterval)
			mustPut(t, tr, "n", key(101), value(101, size), durable)
			if h := tr.Health(); h.Degraded || h.Recoveries != 1 || !h.Open {
				t.Fatalf("health after descriptors came back: %+v", h)
			}
			for i := range stored {
				mustGet(t, tr, "n", key(i), value(uint64(i), size))
			}
			mustGet(t, tr, "n", key(101), value(101, size))
			if err := tr.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			// The directory opens again in this process, all blocks there.
			cfg.Clock = clock.NewFake(t0)
			tr = newTier(t, cfg)
			for i := range stored {
				mustGet(t, tr, "n", key(i), value(uint64(i), size))
			}
			mustGet(t, tr, "n", key(101), value(101, size))
		})
	}
}

// TestDescriptorBudget checks MaxOpenFiles' default and Descriptors.
func TestDescriptorBudget(t *testing.T) {
	for _, tc := range []struct {
		limit uint64
		want  int
	}{{0, 4096}, {100, 64}, {1024, 256}, {20000, 4096}, {unix.RLIM_INFINITY, 4096}} {
		if got := defaultMaxOpenFiles(tc.limit); got != tc.want {
			t.Errorf("defaultMaxOpenFiles(%d) = %d, want %d", tc.limit, got, tc.want)
		}
	}
	cfg := DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.MaxOpenFiles = 100
	cfg.Capacity = 16 << 30
	// 256 segments of 64 MiB, 16 more past the hard limit, 4 spare.
	if got, want := cfg.Descriptors(), 100+256+16+4+descriptorOverhead+descriptorHeadroom; got != want {
		t.Errorf("Descriptors() = %d, want %d", got, want)
	}
	cfg.MaxOpenFiles = 10
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "MaxOpenFiles") {
		t.Errorf("MaxOpenFiles 10 accepted: %v", err)
	}
}
