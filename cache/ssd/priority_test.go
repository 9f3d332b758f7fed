//go:build linux

package ssd

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/proctest"
)

// priorityChildEnv names the BackgroundPriority a child process of
// TestBackgroundPriority opens its tier with.
const priorityChildEnv = "TIDEPOOL_SSD_PRIORITY_CHILD"

// TestBackgroundPriority checks the nice value of RocksDB's background
// threads after a tier opened with each BackgroundPriority has flushed and
// compacted. RocksDB's thread pools belong to the process and are only ever
// lowered, so each case runs in a process of its own (this test binary,
// running TestBackgroundPriorityChild).
func TestBackgroundPriority(t *testing.T) {
	// "normal" is the process's own nice value (the test may run under
	// nice(1)); the raw getpriority syscall returns 20 - nice.
	raw, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	if err != nil {
		t.Fatal(err)
	}
	own := 20 - raw
	for _, c := range []struct {
		priority string
		nice     int
	}{{PriorityLow, 19}, {PriorityNormal, own}, {"", own}} {
		t.Run(fmt.Sprintf("priority=%q", c.priority), func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run", "^TestBackgroundPriorityChild$", "-test.v", "-test.count", "1")
			cmd.Env = append(os.Environ(), priorityChildEnv+"="+c.priority, "TMPDIR="+t.TempDir())
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			var threads []string
			for _, line := range strings.Split(string(out), "\n") {
				name, nice, ok := strings.Cut(strings.TrimPrefix(line, "thread "), " nice=")
				if !ok || !strings.HasPrefix(line, "thread ") {
					continue
				}
				threads = append(threads, line)
				if n, _ := strconv.Atoi(nice); n != c.nice {
					t.Errorf("%s runs at nice %d, want %d", name, n, c.nice)
				}
			}
			// Both pools ran a job: the flushes' (high) and the
			// compactions' (low).
			for _, pool := range []string{"thread rocksdb:high(", "thread rocksdb:low("} {
				if !strings.Contains(string(out), pool) {
					t.Errorf("the child listed no %s...) thread:\n%s", pool, out)
				}
			}
			t.Logf("%s", strings.Join(threads, "; "))
		})
	}
}

// TestBackgroundPriorityChild opens a tier with the priority its parent
// names, makes RocksDB flush and compact, and prints the name and nice value
// of every RocksDB background thread of the process.
func TestBackgroundPriorityChild(t *testing.T) {
	priority, ok := os.LookupEnv(priorityChildEnv)
	if !ok {
		t.Skip("run by TestBackgroundPriority")
	}
	cfg := testConfig(filepath.Join(t.TempDir(), "db"))
	cfg.BackgroundPriority = priority
	cfg.CompactAfter = 4 * mib
	cfg.ValueLogMin = -1 // the blocks go through RocksDB's flushes and compactions
	tr := newTier(t, cfg)
	ctx := context.Background()
	// Three memtables' worth, each key then deleted: flushes, and the
	// tier's compaction after CompactAfter deleted bytes.
	for i := range 24 {
		key := []byte(fmt.Sprint(i))
		if _, err := tr.Put(ctx, "ns", key, value(uint64(i), mib), cache.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			if _, err := tr.Delete(ctx, "ns", key); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil { // waits for the compaction
		t.Fatal(err)
	}
	for _, th := range proctest.Threads(t, "self") {
		if strings.HasPrefix(th.Name, "rocksdb:") {
			fmt.Printf("thread %s(%s) nice=%d\n", th.Name, th.TID, th.Nice)
		}
	}
}
