//go:build verbs

package verbs

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/internal/poll"
	"github.com/tidepool-kv/tidepool/protocol/frame"
	"github.com/tidepool-kv/tidepool/rdma"
)

// rig is a pair of transports, an owner region src and a local region dst
// of n bytes, connected.
type rig struct {
	a, b *Transport
	p    rdma.Peer
	src  []byte
	dst  []byte
	op   rdma.Op
	ctx  context.Context
}

func newRig(t *testing.T, cfg Config, n int) *rig {
	t.Helper()
	a, b := newPair(t, cfg)
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	x := &rig{a: a, b: b, src: make([]byte, n), dst: make([]byte, n)}
	for i := range x.src {
		x.src[i] = byte(i*31 + i>>9)
	}
	rd, err := b.Register(x.src)
	if err != nil {
		t.Fatal(err)
	}
	ld, err := a.Register(x.dst)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	x.ctx = ctx
	if x.p, err = a.Connect(ctx, b.Addr()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.p.Close() })
	x.op = rdma.Op{Local: ld.ID, Remote: rd, Len: uint64(n), Sum: frame.Checksum(x.src), SumKnown: true}
	return x
}

// read reads the whole region into a cleared dst and checks the bytes.
func (x *rig) read(t *testing.T, n int) {
	t.Helper()
	clear(x.dst)
	op := x.op
	op.Len = uint64(n)
	op.Sum = frame.Checksum(x.src[:n])
	if err := x.p.Read(x.ctx, op); err != nil {
		t.Fatalf("read of %d bytes: %v", n, err)
	}
	if !bytes.Equal(x.dst[:n], x.src[:n]) {
		t.Fatalf("read of %d bytes: wrong bytes", n)
	}
}

// TestSliceRetriedOnOtherDevice: with two devices, the QP of the part on
// the second device is moved to the error state just before its READs are
// posted (they flush); the part is moved again on the first device and the
// read returns the right bytes, without falling back anywhere. Small reads
// (one part) whose device breaks are retried the same way. The broken QPs
// are rebuilt: later reads use both devices again.
func TestSliceRetriedOnOtherDevice(t *testing.T) {
	cfg := testConfig(t)
	if len(cfg.Devices) < 2 {
		t.Skip("needs two devices (TIDEPOOL_RDMA_DEVICE=rxe0,rxe1)")
	}
	const n = 4<<20 + 4096
	x := newRig(t, cfg, n)
	x.read(t, n) // warm: a QP on each device
	var breaks atomic.Int32
	x.a.testBreak = func(dev int) bool { return dev == 1 && breaks.Add(1) <= 3 }
	for i := 0; i < 3; i++ {
		x.read(t, n)
	}
	if got := x.a.SliceRetries(); got != 3 {
		t.Fatalf("SliceRetries %d after 3 broken parts, want 3", got)
	}
	// One part, on the device the region prefers first (0): break it there.
	breaks.Store(0)
	x.a.testBreak = func(dev int) bool { return dev == 0 && breaks.Add(1) <= 1 }
	x.read(t, 8192)
	if got := x.a.SliceRetries(); got != 4 {
		t.Fatalf("SliceRetries %d after a broken one-part read, want 4", got)
	}
	x.a.testBreak = nil
	x.read(t, n)
	if c := x.p.Stats().Conns; c < 2 {
		t.Fatalf("%d QPs after the retries, want one per device again", c)
	}
	// A write's part is retried too.
	x.a.testBreak = func(dev int) bool { return dev == 1 && breaks.Add(1) <= 2 }
	back := make([]byte, n)
	bd, err := x.b.Register(back)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.p.Write(x.ctx, rdma.Op{Local: x.op.Local, Remote: bd, Len: n, Sum: x.op.Sum, SumKnown: true}); err != nil || !bytes.Equal(back, x.src) {
		t.Fatalf("write with a broken part: %v", err)
	}
}

// TestOneDeviceBrokenPartFails: with one device there is nowhere to move
// a failed part: the read fails with ErrPeerLost (rdma/auto then falls
// back to TCP), and the next read works on a rebuilt QP.
func TestOneDeviceBrokenPartFails(t *testing.T) {
	cfg := testConfig(t)
	cfg.Devices = cfg.Devices[:min(1, len(cfg.Devices))]
	x := newRig(t, cfg, 1<<20)
	x.read(t, 1<<20)
	var once atomic.Bool
	x.a.testBreak = func(int) bool { return !once.Swap(true) }
	clear(x.dst)
	if err := x.p.Read(x.ctx, x.op); !errors.Is(err, rdma.ErrPeerLost) {
		t.Fatalf("read with its QP broken: %v, want ErrPeerLost", err)
	}
	if x.a.SliceRetries() != 0 {
		t.Fatalf("SliceRetries %d with one device", x.a.SliceRetries())
	}
	x.read(t, 1<<20)
}

// TestQPEvent: an asynchronous QP error (qp_fatal, as a device reports it;
// delivered here to the transport's handler for a live QP, since rxe
// raises none on demand) marks that QP broken and moves it to the error
// state; the event is counted, the QP is destroyed instead of reused, and
// the next read gets a new one and the right bytes. A device_fatal event
// makes that device unusable: reads go on the other device (or fail over
// when there is none).
func TestQPEvent(t *testing.T) {
	cfg := testConfig(t)
	x := newRig(t, cfg, 1<<20)
	x.read(t, 1<<20)
	var live []qpKey
	x.a.iqps.Range(func(k, _ any) bool { live = append(live, k.(qpKey)); return true })
	if len(live) == 0 {
		t.Fatal("no initiator QP after a read")
	}
	k := live[0]
	x.a.onEvent(k.dev, asyncEvent{name: "qp_fatal", qpn: k.qpn})
	if got := x.a.Health()[k.dev].Events["qp_fatal"]; got != 1 {
		t.Fatalf("qp_fatal counted %d times, want 1", got)
	}
	x.read(t, 1<<20)
	if _, still := x.a.iqps.Load(k); still {
		t.Fatalf("QP %d still in use after qp_fatal", k.qpn)
	}
	if !x.a.Health()[k.dev].Usable {
		t.Fatal("a QP event made the device unusable")
	}
	if len(cfg.Devices) < 2 {
		x.a.onEvent(0, asyncEvent{name: "device_fatal"})
		if err := x.p.Read(x.ctx, x.op); !errors.Is(err, rdma.ErrPeerLost) {
			t.Fatalf("read with the only device failed: %v, want ErrPeerLost", err)
		}
		return
	}
	x.a.onEvent(1, asyncEvent{name: "device_fatal"})
	if x.a.Health()[1].Usable {
		t.Fatal("device usable after device_fatal")
	}
	x.read(t, 1<<20)
	// A port event does not revive a fatally failed device.
	x.a.onEvent(1, asyncEvent{name: "port_active", port: cfg.Port})
	if x.a.Health()[1].Usable {
		t.Fatal("device_fatal undone by port_active")
	}
}

// TestPortEvents: taking the link of the second device down
// (TIDEPOOL_RDMA_EVENT_LINK, the veth peer of its netdev) raises a real
// port_err event that is read, counted and makes the device unusable;
// reads go on with the right bytes on the other device; the link coming
// back raises port_active and the device is used again.
func TestPortEvents(t *testing.T) {
	link := os.Getenv("TIDEPOOL_RDMA_EVENT_LINK")
	cfg := testConfig(t)
	if link == "" || len(cfg.Devices) < 2 {
		t.Skip("needs two devices and TIDEPOOL_RDMA_EVENT_LINK (make test-rdma)")
	}
	ip := func(args ...string) {
		if out, err := exec.Command("/usr/sbin/ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	const n = 2 << 20
	x := newRig(t, cfg, n)
	x.read(t, n)
	ip("link", "set", link, "down")
	up := false
	defer func() {
		if !up {
			ip("link", "set", link, "up")
		}
	}()
	poll.Until(t, 30*time.Second, "port_err on the second device", func() bool {
		h := x.a.Health()[1]
		return h.Events["port_err"] >= 1 && !h.Usable
	})
	if !x.a.Health()[0].Usable {
		t.Fatal("first device unusable after the second one's link went down")
	}
	for i := 0; i < 3; i++ {
		x.read(t, n)
	}
	ip("link", "set", link, "up")
	up = true
	poll.Until(t, 30*time.Second, "port_active on the second device", func() bool {
		h := x.a.Health()[1]
		return h.Events["port_active"] >= 1 && h.Usable
	})
	x.read(t, n)
	t.Logf("health %+v", x.a.Health())
}

// TestForkInit: ibv_fork_init ran before the first registration (the
// kernel here copies pinned pages on fork, so it reports "unneeded", or
// it made registrations fork-safe: "enabled"), and child processes
// started with os/exec while reads are in flight disturb nothing.
func TestForkInit(t *testing.T) {
	cfg := testConfig(t)
	x := newRig(t, cfg, 1<<20)
	if s := ForkSafety(); s != "enabled" && s != "unneeded" {
		t.Fatalf("ForkSafety %q after New, want enabled or unneeded", s)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var execs atomic.Int32
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := exec.Command("true").Run(); err == nil {
				execs.Add(1)
			}
		}
	}()
	for i := 0; i < 10; i++ {
		x.read(t, 1<<20)
	}
	close(stop)
	wg.Wait()
	t.Logf("fork safety %s, %d children while reading", ForkSafety(), execs.Load())
}
