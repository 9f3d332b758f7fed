package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/tidepool-kv/tidepool/client"
)

// mountTmpfs mounts a tmpfs of size (as mount(8) takes it: "128m") on a
// fresh directory and unmounts it at the end of the test; it skips the test
// where mounting is not allowed.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", mnt).Run() })
	return mnt
}

// fillDisk appends to a file in dir until the filesystem refuses more
// bytes and returns its path.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: %v", dir, err)
			}
			break
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if free := int64(st.Bavail) * st.Bsize; free != 0 {
		t.Fatalf("%d bytes still free after filling %s", free, dir)
	}
	return path
}

// scrape returns the value of the sample named exactly name (with its
// labels, as exposed: `tidepool_tier_hits_total{tier="ssd"}`) in d's
// /metrics; absent samples fail the test.
func scrape(t *testing.T, d *daemon, names ...string) []float64 {
	t.Helper()
	body := httpGet(t, "http://"+d.metrics+"/metrics")
	vals := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			vals[line[:i]] = v
		}
	}
	out := make([]float64, len(names))
	for i, n := range names {
		v, ok := vals[n]
		if !ok {
			t.Fatalf("metric %s not exported", n)
		}
		out[i] = v
	}
	return out
}

// TestServeDiskFull runs a real sidecar with its data_dir on a small tmpfs:
// the disk fills while it serves, it is stopped and started again several
// times on the full disk, then space is freed. It must never abort (SIGTERM
// exits 0 every time), must refuse durable puts it cannot make durable, and
// must serve everything durable again once space is back.
func TestServeDiskFull(t *testing.T) {
	mnt := mountTmpfs(t, "160m")
	dataDir := filepath.Join(mnt, "data")
	ctx := context.Background()
	// More than 64 MiB on disk: a start on the full disk opens the tier
	// (before the fix this aborted in RocksDB's open).
	const durable = 72

	// Serving while the disk fills.
	d, _ := startServeIn(t, dataDir)
	c, err := client.New(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	for i := range durable {
		if _, err := c.PutWith(ctx, "df", rkey(i), restartValue(i, 1<<20), client.PutOptions{Durable: true}); err != nil {
			t.Fatalf("durable put %d: %v", i, err)
		}
	}
	filler := fillDisk(t, mnt)
	// Best-effort puts go on in DRAM; their demotions hit ENOSPC.
	for i := 100; i < 160; i++ {
		if _, err := c.PutWith(ctx, "df", rkey(i), restartValue(i, 1<<20), client.PutOptions{}); err != nil {
			t.Fatalf("best-effort put %d on a full disk: %v", i, err)
		}
	}
	_, err = c.PutWith(ctx, "df", rkey(1000), restartValue(1000, 1<<20), client.PutOptions{Durable: true})
	if client.CodeOf(err) != client.CodeUnavailable {
		t.Fatalf("durable put on a full disk: %v, want UNAVAILABLE", err)
	}
	if v := scrape(t, d, "tidepool_ssd_degraded"); v[0] != 1 {
		t.Fatalf("tidepool_ssd_degraded = %v on a full disk", v[0])
	}
	c.Close()
	d.stop(t, syscall.SIGTERM) // fails the test unless the exit is 0
	stops := 1

	// Starting and stopping on the full disk.
	const cycles = 3
	for cycle := range cycles {
		fillDisk(t, mnt) // a stop or a start may have freed a little
		d, _ := startServeIn(t, dataDir)
		ready := httpGet(t, "http://"+d.metrics+"/readyz")
		if !strings.HasPrefix(ready, "ready\n") || !strings.Contains(ready, "degraded: ssd tier") {
			t.Fatalf("cycle %d: /readyz %q", cycle, ready)
		}
		if v := scrape(t, d, "tidepool_ssd_degraded", "tidepool_ssd_open"); v[0] != 1 || v[1] != 0 {
			t.Fatalf("cycle %d: degraded %v, open %v", cycle, v[0], v[1])
		}
		c, err := client.New(d.socket)
		if err != nil {
			t.Fatal(err)
		}
		k := rkey(2000 + cycle)
		if _, err := c.PutWith(ctx, "df", k, restartValue(2000, 1<<20), client.PutOptions{Durable: true}); client.CodeOf(err) != client.CodeUnavailable {
			t.Fatalf("cycle %d: durable put: %v, want UNAVAILABLE", cycle, err)
		}
		if _, found, err := c.Get(ctx, "df", k); err != nil || found {
			t.Fatalf("cycle %d: refused durable put is readable (found %v, %v)", cycle, found, err)
		}
		if _, err := c.PutWith(ctx, "df", k, restartValue(2000, 1<<20), client.PutOptions{}); err != nil {
			t.Fatalf("cycle %d: best-effort put: %v", cycle, err)
		}
		if got, found, err := c.Get(ctx, "df", k); err != nil || !found || !bytes.Equal(got, restartValue(2000, 1<<20)) {
			t.Fatalf("cycle %d: get of a best-effort block: found %v, %v", cycle, found, err)
		}
		c.Close()
		d.stop(t, syscall.SIGTERM)
		stops++
	}

	// Space is back: every durable block is served again, and durable
	// puts are accepted.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	d, recovered := startServeIn(t, dataDir)
	if recovered < durable {
		t.Fatalf("recovered %d blocks after freeing space, want at least the %d durable ones", recovered, durable)
	}
	c, err = client.New(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range durable {
		got, found, err := c.Get(ctx, "df", rkey(i))
		if err != nil || !found || !bytes.Equal(got, restartValue(i, 1<<20)) {
			t.Fatalf("durable block %d after the full disk: found %v, %v", i, found, err)
		}
	}
	if _, err := c.PutWith(ctx, "df", rkey(3000), restartValue(3000, 1<<20), client.PutOptions{Durable: true}); err != nil {
		t.Fatalf("durable put once space is back: %v", err)
	}
	d.stop(t, syscall.SIGTERM)
	stops++
	t.Logf("%d clean stops (%d on a full disk), %d starts on a full disk, no abort", stops, stops-1, cycles)
}
