package ssd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/clock"
)

// The child side of TestKill9: run when the test binary re-executes itself
// with these variables set.
const (
	envChild = "TIDEPOOL_SSD_KILL_CHILD"
	envDir   = "TIDEPOOL_SSD_KILL_DIR"
	envLog   = "TIDEPOOL_SSD_KILL_LOGMIN" // Config.ValueLogMin
	killSize = 256 << 10
	killN    = 8
)

// Namespaces of the three kinds of blocks the child writes.
const (
	nsFlushed  = "flushed"  // best-effort, then Flush
	nsDurable  = "durable"  // PutOptions.Durable
	nsVolatile = "volatile" // best-effort, never flushed
)

func killConfig(dir string, logMin int64) Config {
	cfg := testConfig(dir)
	cfg.Clock = clock.Real{}
	cfg.ValueLogMin = logMin
	return cfg
}

func runKillChild() error {
	logMin, err := strconv.ParseInt(os.Getenv(envLog), 10, 64)
	if err != nil {
		return err
	}
	tr, err := New(killConfig(os.Getenv(envDir), logMin), zap.NewNop())
	if err != nil {
		return err
	}
	ctx := context.Background()
	put := func(ns string, i int, durable bool) error {
		_, err := tr.Put(ctx, ns, key(i), value(uint64(i)+seedOf(ns), killSize), cache.PutOptions{Durable: durable})
		return err
	}
	for i := range killN {
		if err := put(nsFlushed, i, false); err != nil {
			return err
		}
	}
	if err := tr.Flush(ctx); err != nil {
		return err
	}
	for i := range killN {
		// Half the durable blocks were first put best-effort: the durable
		// put of a block already held must make it durable too.
		if i%2 == 0 {
			if err := put(nsDurable, i, false); err != nil {
				return err
			}
		}
		if err := put(nsDurable, i, true); err != nil {
			return err
		}
		if err := put(nsVolatile, i, false); err != nil {
			return err
		}
	}
	fmt.Println("READY")
	select {} // wait for SIGKILL
}

func seedOf(ns string) uint64 {
	switch ns {
	case nsFlushed:
		return 1000
	case nsDurable:
		return 2000
	}
	return 3000
}

// TestKill9 checks what docs/ssd.md promises after kill -9: flushed and
// durable blocks are all there with exact bytes; best-effort blocks written
// after the last flush may be missing but are never wrong, and those in
// the value log are all there (their records went through the WAL, their
// bytes to the disk).
func TestKill9(t *testing.T) {
	if asChild(envChild, runKillChild) {
		return
	}
	for _, sto := range stores {
		t.Run(sto.name, func(t *testing.T) { testKill9(t, sto.logMin) })
	}
}

func testKill9(t *testing.T, logMin int64) {
	dir := t.TempDir()
	cmd, out := startChild(t, "TestKill9", envChild+"=1", envDir+"="+dir, envLog+"="+strconv.FormatInt(logMin, 10))
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	deadline := time.After(60 * time.Second)
wait:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("child exited before READY")
			}
			if strings.HasPrefix(l, "CHILD ERROR") {
				t.Fatal(l)
			}
			if l == "READY" {
				break wait
			}
		case <-deadline:
			_ = cmd.Process.Kill()
			t.Fatal("child not ready in 60 s")
		}
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	_ = cmd.Wait()
	go func() {
		for range lines {
		}
	}()

	tr := newTier(t, killConfig(dir, logMin))
	ctx := context.Background()
	count := map[string]int{}
	for _, ns := range []string{nsFlushed, nsDurable, nsVolatile} {
		for i := range killN {
			got, _, err := tr.Get(ctx, ns, key(i), nil)
			switch {
			case err == nil:
				if !bytes.Equal(got, value(uint64(i)+seedOf(ns), killSize)) {
					t.Fatalf("%s/%d: WRONG BYTES after kill -9", ns, i)
				}
				count[ns]++
			case errors.Is(err, cache.ErrNotFound) && !errors.Is(err, cache.ErrChecksum):
			default:
				t.Fatalf("%s/%d: %v", ns, i, err)
			}
		}
	}
	blocks, _, took := tr.Recovered()
	t.Logf("after kill -9: %v blocks per namespace; recovered %d blocks in %v", count, blocks, took)
	if count[nsFlushed] != killN || count[nsDurable] != killN || (logMin >= 0 && count[nsVolatile] != killN) {
		t.Fatalf("flushed %d/%d, durable %d/%d survived", count[nsFlushed], killN, count[nsDurable], killN)
	}
	if want := int64(2*killN + count[nsVolatile]); blocks != want {
		t.Fatalf("recovered %d blocks, want %d", blocks, want)
	}
	if h := tr.Health(); h.ChecksumFailures != 0 || h.StaleEntries != 0 {
		t.Fatalf("health %+v", h)
	}
}

// The child side of TestKill9Relocating.
const envRelocChild = "TIDEPOOL_SSD_RELOC_CHILD"

func runRelocChild() error {
	cfg := killConfig(os.Getenv(envDir), 0)
	cfg.Capacity = 16 * mib
	cfg.ValueLogSegmentSize = mib
	cfg.CompactAfter = -1
	tr, err := New(cfg, zap.NewNop())
	if err != nil {
		return err
	}
	ctx := context.Background()
	const size = 128 << 10
	for i := 0; ; i++ {
		if _, err := tr.Put(ctx, "rk", key(i), value(uint64(i), size), cache.PutOptions{}); err != nil {
			return err
		}
		if i%4 != 0 {
			if _, err := tr.Delete(ctx, "rk", key(i)); err != nil {
				return err
			}
		}
		if i%64 == 63 {
			fmt.Println("WROTE", i+1, tr.Health().Relocations)
		}
	}
}

// TestKill9Relocating kills a process that keeps writing and deleting
// value log blocks, so that relocation and segment deletion run all the
// time: after reopening, every block still indexed reads back exactly, no
// read fails its checksum, and the value log's live bytes are the blocks'.
func TestKill9Relocating(t *testing.T) {
	if asChild(envRelocChild, runRelocChild) {
		return
	}
	dir := t.TempDir()
	cmd, out := startChild(t, "TestKill9Relocating", envRelocChild+"=1", envDir+"="+dir)
	var wrote, moved int
	sc := bufio.NewScanner(out)
	deadline := time.Now().Add(60 * time.Second)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "CHILD ERROR") {
			t.Fatal(l)
		}
		if _, err := fmt.Sscanf(l, "WROTE %d %d", &wrote, &moved); err == nil && (moved >= 50 || time.Now().After(deadline)) {
			break
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if moved == 0 {
		t.Fatalf("no relocation before the kill (%d blocks written)", wrote)
	}

	cfg := killConfig(dir, 0)
	cfg.Capacity = 16 * mib
	cfg.ValueLogSegmentSize = mib
	tr := newTier(t, cfg)
	good, bad, missing := readSome(t, tr, "rk", wrote+256, 128<<10)
	h := tr.Health()
	t.Logf("killed after %d puts, %d relocations: %d good, %d bad, %d missing; %+v", wrote, moved, good, bad, missing, h)
	if bad != 0 || h.ChecksumFailures != 0 {
		t.Fatalf("%d reads failed their checksum after kill -9", bad)
	}
	if good == 0 || int64(good) != tierStats(tr).Blocks {
		t.Fatalf("%d blocks read back of %d indexed", good, tierStats(tr).Blocks)
	}
	if h.ValueLogLiveBytes != int64(good)*(128<<10) {
		t.Fatalf("value log live bytes %d for %d blocks", h.ValueLogLiveBytes, good)
	}
}

// asChild runs child, then exits, when this process is the test binary
// re-executed as a child (envName set to 1); it reports whether it was.
// A child's failure is a "CHILD ERROR:" line on stdout for the parent.
func asChild(envName string, child func() error) bool {
	if os.Getenv(envName) != "1" {
		return false
	}
	if err := child(); err != nil {
		fmt.Println("CHILD ERROR:", err)
		os.Exit(1)
	}
	return true
}

// startChild re-executes the test binary to run test alone with env added,
// and returns the process and its stdout.
func startChild(t *testing.T, test string, env ...string) (*exec.Cmd, io.ReadCloser) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, out
}

// TestDurableEvictable: a durable put is written through and survives a
// restart, but it is a cache block like any other: the policy evicts it
// when room is needed (docs/ssd.md, "What --durable promises"), and each
// such eviction is counted, also for blocks recovered at open.
func TestDurableEvictable(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.Capacity = 8 * mib
	const size = 1 << 20
	ctx := context.Background()
	tr := newTier(t, cfg)
	for i := range 3 {
		mustPut(t, tr, "d", key(i), value(uint64(i), size), cache.PutOptions{Durable: true})
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	tr = newTier(t, cfg)
	for i := 3; i < 6; i++ {
		mustPut(t, tr, "d", key(i), value(uint64(i), size), cache.PutOptions{Durable: true})
	}
	// Best-effort blocks need the room: the oldest blocks go, durable or
	// not.
	for i := 100; i < 110; i++ {
		mustPut(t, tr, "d", key(i), value(uint64(i), size), cache.PutOptions{})
	}
	evicted := 0
	for i := range 6 {
		if _, _, err := tr.Get(ctx, "d", key(i), nil); err != nil {
			if !errors.Is(err, cache.ErrNotFound) {
				t.Fatalf("durable block %d: %v", i, err)
			}
			evicted++
		}
	}
	if evicted != 6 {
		t.Fatalf("%d of 6 durable blocks evicted, want all (LRU, 7 MiB of newer blocks)", evicted)
	}
	if h := tr.Health(); h.DurableEvictions != int64(evicted) {
		t.Fatalf("DurableEvictions %d, want %d", h.DurableEvictions, evicted)
	}
}
