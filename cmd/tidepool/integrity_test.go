package main

import (
	"bytes"
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/client"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
)

// buggyWriter stores blocks as an engine does with zero-copy puts
// (Reserve, write the slot, Commit with the CRC-32C of what it wrote), and
// keeps where each one went, so that it can scribble into it afterwards
// through its own writable mapping of the arena: the bug the scrubber and
// verified reads are there to catch.
type buggyWriter struct {
	t     *testing.T
	c     *client.Client
	slots map[string]client.Slot
}

func (w *buggyWriter) put(ns, key string, val []byte) {
	w.t.Helper()
	ctx := context.Background()
	rs, err := w.c.Reserve(ctx, ns, []client.ReserveItem{{Key: []byte(key), Size: int64(len(val))}}, 0)
	if err != nil || rs[0].Code != client.CodeOK {
		w.t.Fatalf("Reserve %s/%s: %v %+v", ns, key, err, rs)
	}
	crc, err := w.c.WriteSlot(ctx, rs[0].Slot, val)
	if err != nil {
		w.t.Fatal(err)
	}
	errs, err := w.c.Commit(ctx, []client.CommitItem{{Token: rs[0].Token, Checksum: crc, HasChecksum: true}})
	if err != nil || errs[0] != nil {
		w.t.Fatalf("Commit %s/%s: %v %v", ns, key, err, errs)
	}
	w.slots[ns+"/"+key] = rs[0].Slot
}

// scribble flips a byte of a committed block through a MAP_SHARED
// read-write mapping of its arena file, as a writer that kept its mapping
// (client.WriteMapped) and wrote past its own slot would.
func (w *buggyWriter) scribble(ns, key string, at int64) {
	w.t.Helper()
	s, ok := w.slots[ns+"/"+key]
	if !ok {
		w.t.Fatalf("no slot for %s/%s", ns, key)
	}
	h, err := w.c.Hello(context.Background())
	if err != nil {
		w.t.Fatal(err)
	}
	a := h.Arenas[s.Arena]
	f, err := os.OpenFile(a.Path, os.O_RDWR, 0)
	if err != nil {
		w.t.Fatal(err)
	}
	defer f.Close()
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(a.Size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		w.t.Fatal(err)
	}
	mem[s.Offset+at] ^= 0x5a
	if err := syscall.Munmap(mem); err != nil {
		w.t.Fatal(err)
	}
}

// pollMetric waits (deadline 30 s) until the sample name reaches want.
func pollMetric(t *testing.T, d *daemon, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v := scrape(t, d, name)[0]
		if v >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v after 30s, want %v", name, v, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestServeScrubberFindsScribble: a writer scribbles into a committed
// block through its own writable mapping of the arena. Same-host reads do
// not verify by default, so the scrubber of a real `tidepool serve` must
// find the block, remove it (Lookup and Exists stop reporting it, the
// other blocks stay) and count it in tidepool_scrub_failed_blocks_total
// and tidepool_tier_checksum_failures_total{tier="dram"}.
func TestServeScrubberFindsScribble(t *testing.T) {
	d := startDaemon(t, "--ssd-capacity", "0", "--scrub-rate", "256MiB")
	c, w := scribbler(t, d)
	ctx := context.Background()
	keys := []string{"a", "b", "c"}
	vals := map[string][]byte{}
	for i, k := range keys {
		vals[k] = restartValue(40+i, 256<<10)
		w.put("sc", k, vals[k])
	}
	if v := scrape(t, d, "tidepool_scrub_failed_blocks_total", "tidepool_scrub_rate_bytes"); v[0] != 0 || v[1] != 256<<20 {
		t.Fatalf("before the scribble: failed %v, rate %v", v[0], v[1])
	}
	w.scribble("sc", "b", 1234)
	pollMetric(t, d, "tidepool_scrub_failed_blocks_total", 1)

	bkeys := [][]byte{[]byte("a"), []byte("b"), []byte("c")}
	if n, err := c.Lookup(ctx, "sc", bkeys); err != nil || n != 1 {
		t.Fatalf("Lookup after the scrub: %d, %v (want 1: b is gone)", n, err)
	}
	ex, err := c.BatchExists(ctx, "sc", bkeys)
	if err != nil || len(ex) != 3 || !ex[0].Present || ex[1].Present || !ex[2].Present {
		t.Fatalf("Exists after the scrub: %+v, %v", ex, err)
	}
	for _, k := range []string{"a", "c"} {
		buf := make([]byte, len(vals[k]))
		if n, found, err := c.GetInto(ctx, "sc", []byte(k), buf); err != nil || !found || n != len(buf) || !bytes.Equal(buf, vals[k]) {
			t.Fatalf("GetInto %s after the scrub: %d %v %v", k, n, found, err)
		}
	}
	if _, found, err := c.Get(ctx, "sc", []byte("b")); found || err != nil {
		t.Fatalf("Get of the removed block: found %v, %v", found, err)
	}
	v := scrape(t, d, "tidepool_scrub_failed_blocks_total", `tidepool_tier_checksum_failures_total{tier="dram"}`,
		"tidepool_scrub_bytes_total", "tidepool_scrub_blocks_total", `tidepool_tier_blocks{tier="dram"}`)
	if v[0] != 1 || v[1] != 1 || v[2] < 256<<10 || v[3] < 1 || v[4] != 2 {
		t.Fatalf("failed %v, checksum failures %v, scrubbed bytes %v, blocks %v, dram blocks %v", v[0], v[1], v[2], v[3], v[4])
	}
	// A pass ends and is timed; the good blocks keep passing.
	pollMetric(t, d, "tidepool_scrub_passes_total", 2)
	if v := scrape(t, d, "tidepool_scrub_pass_seconds", "tidepool_scrub_failed_blocks_total"); v[0] <= 0 || v[1] != 1 {
		t.Fatalf("pass seconds %v, failed %v", v[0], v[1])
	}
	// The engine stores a good copy again.
	if existed, err := c.PutFrom(ctx, "sc", []byte("b"), vals["b"], 0); err != nil || existed {
		t.Fatalf("re-PutFrom: %v %v", existed, err)
	}
	buf := make([]byte, len(vals["b"]))
	if _, found, err := c.GetInto(ctx, "sc", []byte("b"), buf); err != nil || !found || !bytes.Equal(buf, vals["b"]) {
		t.Fatalf("GetInto after the re-put: %v %v", found, err)
	}
}

// TestServeVerifyReadsRefusesScribble: with the scrubber off, a reader
// that verifies refuses a scribbled block with CHECKSUM_MISMATCH: the
// sidecar for a namespace in verify_reads_namespaces (Acquire, so every
// client's GetInto; inline Get answers a miss), and the Go client itself
// with SetVerifyReads(true) for any namespace. The sidecar removes the
// block it refused.
func TestServeVerifyReadsRefusesScribble(t *testing.T) {
	d := startDaemon(t, "--ssd-capacity", "0", "--scrub-rate", "0", "--verify-reads-namespaces", "vr,other")
	c, w := scribbler(t, d)
	ctx := context.Background()
	val := restartValue(50, 200<<10)
	for _, ns := range []string{"vr", "plain"} {
		for _, k := range []string{"x", "y"} {
			w.put(ns, k, val)
			w.scribble(ns, k, 777)
		}
	}
	buf := make([]byte, len(val))

	// The sidecar verifies "vr": GetInto (Acquire) and Get refuse.
	if _, found, err := c.GetInto(ctx, "vr", []byte("x"), buf); found || client.CodeOf(err) != tp.ErrorCode_CHECKSUM_MISMATCH {
		t.Fatalf("GetInto of a scribbled block in a verified namespace: found %v, %v; want CHECKSUM_MISMATCH", found, err)
	}
	got, found, err := c.Get(ctx, "vr", []byte("y"))
	if found || (err != nil && client.CodeOf(err) != tp.ErrorCode_CHECKSUM_MISMATCH) {
		t.Fatalf("Get of a scribbled block in a verified namespace: found %v (same bytes %v), %v; want a miss", found, bytes.Equal(got, val), err)
	}
	if n, err := c.Lookup(ctx, "vr", [][]byte{[]byte("x")}); err != nil || n != 0 {
		t.Fatalf("Lookup vr/x after the refusal: %d, %v", n, err)
	}
	if n, err := c.Lookup(ctx, "vr", [][]byte{[]byte("y")}); err != nil || n != 0 {
		t.Fatalf("Lookup vr/y after the refusal: %d, %v", n, err)
	}
	if v := scrape(t, d, `tidepool_tier_checksum_failures_total{tier="dram"}`, "tidepool_scrub_rate_bytes", "tidepool_scrub_bytes_total"); v[0] != 2 || v[1] != 0 || v[2] != 0 {
		t.Fatalf("checksum failures %v, scrub rate %v, scrubbed %v", v[0], v[1], v[2])
	}

	// "plain" is not verified by the sidecar: a client that verifies
	// refuses it on its own side.
	vc, err := client.New(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer vc.Close()
	vc.SetVerifyReads(true)
	if _, found, err := vc.GetInto(ctx, "plain", []byte("x"), buf); found || client.CodeOf(err) != tp.ErrorCode_CHECKSUM_MISMATCH {
		t.Fatalf("verifying client's GetInto of a scribbled block: found %v, %v; want CHECKSUM_MISMATCH", found, err)
	}
	// The default client does not check: what it reads is what the
	// scribbler left (the scrubber, off here, is what removes it).
	if n, found, err := c.GetInto(ctx, "plain", []byte("y"), buf); err != nil || !found || n != len(val) || bytes.Equal(buf, val) {
		t.Fatalf("unverified GetInto: %d %v %v (want the scribbled bytes)", n, found, err)
	}
}

// scribbler connects a client to d and a buggyWriter through it; the
// client closes with the test.
func scribbler(t *testing.T, d *daemon) (*client.Client, *buggyWriter) {
	t.Helper()
	c, err := client.New(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, &buggyWriter{t: t, c: c, slots: map[string]client.Slot{}}
}

// TestServeCopyingReadsRefuseScribble: with the scrubber off and no
// namespace verified, the reads that copy a block check what they copy:
// inline Get, BatchGet and a read into a registered buffer each refuse a
// scribbled block (a miss, or CHECKSUM_MISMATCH), the block is removed
// (Lookup stops before it) and the next reader sees a miss. A zero-copy
// read in place (GetInto, through Acquire) still returns the bytes as
// they lie, as docs/zerocopy.md says.
func TestServeCopyingReadsRefuseScribble(t *testing.T) {
	d := startDaemon(t, "--ssd-capacity", "0", "--scrub-rate", "0")
	c, w := scribbler(t, d)
	ctx := context.Background()
	val := restartValue(51, 200<<10)
	for _, k := range []string{"get", "batch", "buf", "inplace"} {
		w.put("ns", k, val)
		w.scribble("ns", k, 999)
	}
	refused := func(what string, found bool, err error) {
		t.Helper()
		if found || (err != nil && client.CodeOf(err) != tp.ErrorCode_CHECKSUM_MISMATCH) {
			t.Fatalf("%s of a scribbled block: found %v, %v; want a miss or CHECKSUM_MISMATCH", what, found, err)
		}
	}
	_, found, err := c.Get(ctx, "ns", []byte("get"))
	refused("Get", found, err)
	rs, err := c.BatchGet(ctx, "ns", [][]byte{[]byte("batch")})
	if err != nil || len(rs) != 1 {
		t.Fatalf("BatchGet: %v", err)
	}
	refused("BatchGet", rs[0].Code == client.CodeOK, nil)
	rb, err := c.RegisterBuffer(ctx, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Close()
	_, found, err = rb.Get(ctx, "ns", []byte("buf"), 0, 1<<20, client.ScopeLocal)
	refused("a read into a registered buffer", found, err)
	for _, k := range []string{"get", "batch", "buf"} {
		if n, err := c.Lookup(ctx, "ns", [][]byte{[]byte(k)}); err != nil || n != 0 {
			t.Fatalf("Lookup %s after the refusal: %d, %v", k, n, err)
		}
		if _, found, err := c.Get(ctx, "ns", []byte(k)); found || err != nil {
			t.Fatalf("the next Get of %s: found %v, %v; want a miss", k, found, err)
		}
	}
	if v := scrape(t, d, `tidepool_tier_checksum_failures_total{tier="dram"}`); v[0] != 3 {
		t.Fatalf("checksum failures %v, want 3", v[0])
	}
	buf := make([]byte, len(val))
	if n, found, err := c.GetInto(ctx, "ns", []byte("inplace"), buf); err != nil || !found || n != len(val) || bytes.Equal(buf, val) {
		t.Fatalf("zero-copy GetInto: %d %v %v (want the scribbled bytes, unchecked by default)", n, found, err)
	}
}
