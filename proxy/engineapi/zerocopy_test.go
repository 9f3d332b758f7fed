//go:build linux

package engineapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/client"
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func TestZeroCopyHello(t *testing.T) {
	ts := startServer(t, serverOpts{capacity: 64 << 20})
	h, err := ts.c.Hello(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := ts.tier.Arenas()
	if h.LayoutVersion != client.ArenaLayoutVersion || len(h.Arenas) != len(want) || len(want) != 2 {
		t.Fatalf("Hello arenas %v layout %d, tier has %v", h.Arenas, h.LayoutVersion, want)
	}
	for i, a := range h.Arenas {
		if int(a.Id) != i || a.Path != want[i].Path || a.Size != want[i].Size {
			t.Errorf("arena %d = %+v, want %+v", i, a, want[i])
		}
		st, err := os.Stat(a.Path)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("arena file %s: mode %v, %v (want 0600)", a.Path, st.Mode(), err)
		}
	}
}

// TestZeroCopyOverTheWire: the calls and their codes on a real socket,
// with the bytes written and read through the client's mappings.
func TestZeroCopyOverTheWire(t *testing.T) {
	ts := startServer(t, serverOpts{capacity: 8 << 20, maxValue: 4 << 20, maxBatch: 8})
	ctx := context.Background()
	c := ts.c
	val := randBytes(7, 1<<20)

	rs, err := c.Reserve(ctx, "ns", []client.ReserveItem{
		{Key: []byte("a"), Size: int64(len(val))},
		{Key: []byte("big"), Size: 4<<20 + 1},
		{Key: []byte("neg"), Size: -1},
		{Key: nil, Size: 1},
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantCodes := []client.ErrorCode{client.CodeOK, client.CodeTooLarge, client.CodeInvalidArgument, client.CodeInvalidArgument}
	for i, r := range rs {
		if r.Code != wantCodes[i] {
			t.Errorf("Reserve item %d: %v %s, want %v", i, r.Code, r.Message, wantCodes[i])
		}
	}
	if rs[0].Deadline.Before(time.Now()) || rs[0].Slot.Length != int64(len(val)) {
		t.Fatalf("reservation %+v", rs[0])
	}
	crc, err := c.WriteSlot(ctx, rs[0].Slot, val)
	if err != nil {
		t.Fatal(err)
	}
	if crc != crc32.Checksum(val, crcTable) {
		t.Fatal("WriteSlot checksum")
	}
	cs, err := c.Commit(ctx, []client.CommitItem{{Token: rs[0].Token, Checksum: crc, HasChecksum: true}, {Token: rs[0].Token}, {Token: 99}})
	if err != nil {
		t.Fatal(err)
	}
	if cs[0] != nil || client.CodeOf(cs[1]) != client.CodeLeaseExpired || client.CodeOf(cs[2]) != client.CodeLeaseExpired {
		t.Fatalf("Commit, double commit, unknown token = %v", cs)
	}
	if v, found, err := c.Get(ctx, "ns", []byte("a")); err != nil || !found || !bytes.Equal(v, val) {
		t.Fatalf("inline Get of a committed block: %v %v", found, err)
	}

	// Reserve of a present key: EXISTS, nothing to write.
	rs, _ = c.Reserve(ctx, "ns", []client.ReserveItem{{Key: []byte("a"), Size: 1}}, 0)
	if rs[0].Code != client.CodeExists {
		t.Fatalf("Reserve of a present key = %v", rs[0].Code)
	}
	// Wrong checksum: CHECKSUM_MISMATCH, the slot is freed.
	rs, _ = c.Reserve(ctx, "ns", []client.ReserveItem{{Key: []byte("b"), Size: 10}}, 0)
	cs, _ = c.Commit(ctx, []client.CommitItem{{Token: rs[0].Token, Checksum: 12345, HasChecksum: true}})
	if client.CodeOf(cs[0]) != client.CodeChecksum {
		t.Fatalf("Commit with a wrong checksum = %v", cs[0])
	}
	// Abort, then abort again.
	rs, _ = c.Reserve(ctx, "ns", []client.ReserveItem{{Key: []byte("c"), Size: 10}}, 0)
	as, _ := c.Abort(ctx, []int64{rs[0].Token, rs[0].Token})
	if as[0] != nil || client.CodeOf(as[1]) != client.CodeLeaseExpired {
		t.Fatalf("Abort twice = %v", as)
	}

	ls, deadline, err := c.Acquire(ctx, "ns", [][]byte{[]byte("a"), []byte("zz")}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ls[0].Code != client.CodeOK || ls[1].Code != client.CodeNotFound || ls[0].Tier != "dram" || ls[0].Checksum != crc {
		t.Fatalf("Acquire = %+v", ls)
	}
	if d := time.Until(deadline); d < time.Second || d > 3*time.Second {
		t.Fatalf("deadline in %v", d)
	}
	buf := make([]byte, len(val))
	if got, err := c.ReadSlot(ctx, ls[0].Slot, buf); err != nil || got != crc || !bytes.Equal(buf, val) {
		t.Fatalf("ReadSlot: %v", err)
	}
	if res, _, err := c.Renew(ctx, []int64{ls[0].LeaseID, 5}, time.Second); err != nil || res[0] != nil || client.CodeOf(res[1]) != client.CodeLeaseExpired {
		t.Fatalf("Renew = %v %v", res, err)
	}
	rel, _ := c.Release(ctx, []int64{ls[0].LeaseID, ls[0].LeaseID})
	if rel[0] != nil || client.CodeOf(rel[1]) != client.CodeLeaseExpired {
		t.Fatalf("Release twice = %v", rel)
	}
	// More than the free space: the rest is reserved (this may evict "a").
	rs, _ = c.Reserve(ctx, "ns", []client.ReserveItem{{Key: []byte("d"), Size: 4 << 20}, {Key: []byte("e"), Size: 4 << 20}}, 0)
	if rs[0].Code != client.CodeOK || rs[1].Code != client.CodeNoSpace {
		t.Fatalf("Reserve beyond free space = %v %v", rs[0].Code, rs[1].Code)
	}
	c.Abort(ctx, []int64{rs[0].Token})
	// Request-level errors.
	if _, _, err := c.Acquire(ctx, "", [][]byte{[]byte("a")}, 0); client.CodeOf(err) != client.CodeInvalidArgument {
		t.Fatalf("Acquire with an empty namespace = %v", err)
	}
	if _, err := c.Release(ctx, make([]int64, 9)); client.CodeOf(err) != client.CodeBatchTooLarge {
		t.Fatalf("Release of 9 ids, max batch 8 = %v", err)
	}
}

// TestZeroCopyReservationDeadline: a client that reserves and disconnects
// leaves nothing behind after the deadline.
func TestZeroCopyReservationDeadline(t *testing.T) {
	ts := startServer(t, serverOpts{capacity: 4 << 20, maxValue: 4 << 20})
	ctx := context.Background()
	c, err := client.New(ts.socket)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := c.Reserve(ctx, "ns", []client.ReserveItem{{Key: []byte("k"), Size: 3 << 20}}, 50*time.Millisecond)
	if err != nil || rs[0].Code != client.CodeOK {
		t.Fatal(err, rs)
	}
	c.Close() // disconnects
	// Poll (bounded) until the tier has reclaimed it.
	deadline := time.Now().Add(10 * time.Second)
	for ts.tier.Reap(); ts.tier.ReserveStats().Open != 0; ts.tier.Reap() {
		if time.Now().After(deadline) {
			t.Fatalf("reservation not reclaimed: %+v", ts.tier.ReserveStats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if u := ts.tier.Stats().Tiers[0].UsedBytes; u != 0 {
		t.Fatalf("used %d after reclamation", u)
	}
	cs, _ := ts.c.Commit(ctx, []client.CommitItem{{Token: rs[0].Token}})
	if client.CodeOf(cs[0]) != client.CodeLeaseExpired {
		t.Fatalf("late Commit = %v", cs[0])
	}
	if _, err := ts.c.PutFrom(ctx, "ns", []byte("k2"), randBytes(1, 3<<20), 0); err != nil {
		t.Fatalf("PutFrom into the reclaimed space: %v", err)
	}
}

// TestZeroCopyDyingClient: a process that maps the arenas, takes leases and
// dies without releasing them pins nothing once the leases expire, and
// another client's blocks are unaffected.
func TestZeroCopyDyingClient(t *testing.T) {
	t.Parallel() // its own server; most of it is waiting for a lease to expire
	ts := startServer(t, serverOpts{capacity: 4 << 20, maxValue: 4 << 20})
	ctx := context.Background()
	mine := randBytes(3, 1<<20)
	if _, err := ts.c.PutFrom(ctx, "ns", []byte("mine"), mine, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.c.PutFrom(ctx, "ns", []byte("theirs"), randBytes(4, 2<<20), 0); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestZeroCopyHelperProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "TIDEPOOL_ZC_HELPER_SOCKET="+ts.socket)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	// While its lease lives, "theirs" (2 MiB of 4) is pinned: a 3 MiB put
	// cannot fit. Once the lease expires, the put evicts it.
	if _, err := ts.c.Put(ctx, "ns", []byte("p1"), randBytes(5, 3<<20), 0); client.CodeOf(err) != client.CodeNoSpace {
		t.Fatalf("Put beside a live dead-client lease = %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := ts.c.Put(ctx, "ns", []byte("p1"), randBytes(5, 3<<20), 0)
		if err == nil {
			break
		}
		if client.CodeOf(err) != client.CodeNoSpace || time.Now().After(deadline) {
			t.Fatalf("Put after the dead client's lease expired: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v, found, err := ts.c.Get(ctx, "ns", []byte("p1")); err != nil || !found || len(v) != 3<<20 {
		t.Fatalf("Get p1: %v %v", found, err)
	}
}

// TestZeroCopyHelperProcess is the dying client of TestZeroCopyDyingClient;
// it runs only in the helper process.
func TestZeroCopyHelperProcess(t *testing.T) {
	socket := os.Getenv("TIDEPOOL_ZC_HELPER_SOCKET")
	if socket == "" {
		t.Skip("helper process only")
	}
	ctx := context.Background()
	c, err := client.New(socket)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	ls, _, err := c.Acquire(ctx, "ns", [][]byte{[]byte("theirs")}, 3*time.Second)
	if err != nil || ls[0].Code != client.CodeOK {
		fmt.Println(err, ls)
		os.Exit(1)
	}
	buf := make([]byte, ls[0].Slot.Length)
	if crc, err := c.ReadSlot(ctx, ls[0].Slot, buf); err != nil || crc != ls[0].Checksum {
		fmt.Println("read", err)
		os.Exit(1)
	}
	os.Exit(3) // dies holding the lease and the mapping
}

// TestZeroCopyGoHelpers: PutFrom and GetInto keep the semantics of Put and
// Get, in every write mode.
func TestZeroCopyGoHelpers(t *testing.T) {
	ts := startServer(t, serverOpts{capacity: 16 << 20, maxValue: 4 << 20})
	ctx := context.Background()
	for _, mode := range []client.WriteMode{client.WritePwrite, client.WriteMapped, client.WriteKeyed} {
		t.Run(fmt.Sprint("mode", mode), func(t *testing.T) {
			ts.c.SetWriteMode(mode)
			ns := fmt.Sprint("ns", mode)
			for i, size := range []int{0, 1, 5000, 64 << 10, 1<<20 + 3} {
				key := []byte(fmt.Sprint("k", i))
				val := randBytes(int64(i), size)
				if existed, err := ts.c.PutFrom(ctx, ns, key, val, int32(i)); existed || err != nil {
					t.Fatalf("PutFrom %d bytes: %v %v", size, existed, err)
				}
				if existed, err := ts.c.PutFrom(ctx, ns, key, val, 0); !existed || err != nil {
					t.Fatalf("second PutFrom: %v %v", existed, err)
				}
				if v, found, err := ts.c.Get(ctx, ns, key); err != nil || !found || !bytes.Equal(v, val) {
					t.Fatalf("inline Get after PutFrom: %v %v", found, err)
				}
				buf := make([]byte, size+10)
				n, found, err := ts.c.GetInto(ctx, ns, key, buf)
				if err != nil || !found || n != size || !bytes.Equal(buf[:n], val) {
					t.Fatalf("GetInto: %d %v %v", n, found, err)
				}
				if size > 0 {
					n, found, err = ts.c.GetInto(ctx, ns, key, buf[:size-1])
					if client.CodeOf(err) != client.CodeTooLarge || n != size || found {
						t.Fatalf("GetInto with a short buffer: %d %v %v", n, found, err)
					}
				}
			}
			if n, found, err := ts.c.GetInto(ctx, ns, []byte("missing"), nil); n != 0 || found || err != nil {
				t.Fatalf("GetInto of a miss: %d %v %v", n, found, err)
			}
			if _, err := ts.c.PutFrom(ctx, ns, []byte("huge"), make([]byte, 4<<20+1), 0); client.CodeOf(err) != client.CodeTooLarge {
				t.Fatalf("PutFrom over the limit: %v", err)
			}
		})
	}
	// The client keeps slots reserved ahead for its next puts, and aborts
	// them when it closes: nothing is left reserved.
	if rs := ts.tier.ReserveStats(); rs.Open == 0 {
		t.Fatalf("no slot reserved ahead: %+v", rs)
	}
	ts.c.Close()
	if rs := ts.tier.ReserveStats(); rs.Open != 0 {
		t.Fatalf("reservations left: %+v", rs)
	}
}
