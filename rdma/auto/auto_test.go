package auto

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/tidepool-kv/tidepool/internal/peerauth"
	"github.com/tidepool-kv/tidepool/protocol/frame"
	"github.com/tidepool-kv/tidepool/rdma"
	"github.com/tidepool-kv/tidepool/rdma/rdmatest"
	"github.com/tidepool-kv/tidepool/rdma/tcp"
	"github.com/tidepool-kv/tidepool/rdma/verbs"
)

// wantRDMA: in the Soft-RoCE guest (TIDEPOOL_RDMA_DEVICE set) auto must
// find the device; elsewhere it runs TCP only.
func wantRDMA() string { return os.Getenv("TIDEPOOL_RDMA_DEVICE") }

func config(t testing.TB, mode string) Config {
	key, err := peerauth.NewKey([]byte("auto-transport-test-secret"), "test")
	if err != nil {
		t.Fatal(err)
	}
	c := Config{Mode: mode, TCP: tcp.DefaultLocalConfig(), Verbs: verbs.DefaultConfig()}
	c.TCP.Key = key
	if d := wantRDMA(); d != "" {
		c.Verbs.Devices = strings.Split(d, ",")
	}
	c.Verbs.QPTimeout, c.Verbs.QPRetry = 12, 3
	c.Verbs.DialTimeout = 5 * time.Second
	return c
}

func start(t *testing.T, cfg Config) *Transport {
	t.Helper()
	tr, err := New(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatalf("New(%s): %v", cfg.Mode, err)
	}
	if cfg.Mode != ModeTCP && wantRDMA() != "" && !tr.RDMA() {
		t.Fatalf("TIDEPOOL_RDMA_DEVICE=%s but the transport runs without RDMA", wantRDMA())
	}
	return tr
}

// TestConformance: the composite passes the suite: over verbs where a
// device exists (the guest), over TCP elsewhere.
func TestConformance(t *testing.T) {
	cfg := config(t, ModeAuto)
	rdmatest.Run(t, func(t *testing.T) (rdma.Transport, rdma.Transport) { return start(t, cfg), start(t, cfg) })
}

// TestMode: tcp never uses verbs; rdma refuses to start without a device;
// an unknown mode is refused.
func TestMode(t *testing.T) {
	tr := start(t, config(t, ModeTCP))
	if tr.RDMA() {
		t.Fatal("mode tcp runs RDMA")
	}
	_ = tr.Close()
	if _, err := New(config(t, "infiniband"), nil); !errors.Is(err, ErrMode) {
		t.Fatalf("mode infiniband: %v, want ErrMode", err)
	}
	if wantRDMA() == "" {
		if _, err := New(config(t, ModeRDMA), nil); !errors.Is(err, verbs.ErrNoDevice) && !errors.Is(err, verbs.ErrNotBuilt) {
			t.Fatalf("mode rdma without a device: %v, want ErrNoDevice or ErrNotBuilt", err)
		}
	}
}

type pair struct {
	a, b   *Transport
	p      rdma.Peer
	src    []byte
	remote rdma.RegionDesc
	local  rdma.RegionDesc
	dst    []byte
	sum    uint32
}

func newPair(t *testing.T, ca, cb Config, size int) *pair {
	x := &pair{a: start(t, ca), b: start(t, cb)}
	t.Cleanup(func() { _ = x.a.Close(); _ = x.b.Close() })
	x.src = make([]byte, size)
	for i := range x.src {
		x.src[i] = byte(i*31 + i>>8)
	}
	x.sum = frame.Checksum(x.src)
	var err error
	if x.remote, err = x.b.Register(x.src); err != nil {
		t.Fatal(err)
	}
	x.dst = make([]byte, 16*size)
	if x.local, err = x.a.Register(x.dst); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if x.p, err = x.a.Connect(ctx, x.b.Addr()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.p.Close() })
	return x
}

func (x *pair) read(slot int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n := uint64(len(x.src))
	return x.p.Read(ctx, rdma.Op{Local: x.local.ID, LocalOff: uint64(slot) * n, Remote: x.remote, Len: n, Sum: x.sum, SumKnown: true})
}

func (x *pair) landed(slot int) bool {
	n := len(x.src)
	return bytes.Equal(x.dst[slot*n:(slot+1)*n], x.src)
}

// TestPath: between two RDMA nodes a read goes over RDMA (the counters
// show RDMA bytes, no TCP bytes); to a TCP-only peer it goes over TCP.
func TestPath(t *testing.T) {
	const n = 1 << 20
	x := newPair(t, config(t, ModeAuto), config(t, ModeAuto), n)
	if err := x.read(0); err != nil || !x.landed(0) {
		t.Fatalf("read: %v (landed %v)", err, x.landed(0))
	}
	c := x.a.Counters()
	t.Logf("auto<->auto: %+v", c)
	if x.a.RDMA() {
		if c.RDMA.Bytes != n || c.TCP.Bytes != 0 || c.QPs == 0 {
			t.Fatalf("counters %+v: want %d RDMA bytes, no TCP bytes, a QP", c, n)
		}
	} else if c.TCP.Bytes != n || c.RDMA.Bytes != 0 {
		t.Fatalf("counters %+v: want %d TCP bytes", c, n)
	}

	y := newPair(t, config(t, ModeAuto), config(t, ModeTCP), n)
	if err := y.read(0); err != nil || !y.landed(0) {
		t.Fatalf("read from a TCP-only peer: %v", err)
	}
	if c := y.a.Counters(); c.TCP.Bytes != n || c.RDMA.Bytes != 0 {
		t.Fatalf("to a TCP-only peer: counters %+v, want %d TCP bytes only", c, n)
	}
}

// TestFallbackMidStream: the owner's RDMA side dies while 8 callers read
// (its verbs transport closes: QPs and registrations gone); every read
// either lands the right bytes, over RDMA or TCP, or fails cleanly, none
// hangs, and reads after it go over TCP.
func TestFallbackMidStream(t *testing.T) {
	if wantRDMA() == "" {
		t.Skip("needs an RDMA device (make test-rdma)")
	}
	const n, callers, per = 256 << 10, 8, 6
	x := newPair(t, config(t, ModeAuto), config(t, ModeAuto), n)
	var wg sync.WaitGroup
	errs := make(chan error, callers*per)
	started := make(chan struct{}, callers*per)
	for w := 0; w < callers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				clear(x.dst[w*n : (w+1)*n])
				started <- struct{}{}
				err := x.read(w)
				if err == nil && !x.landed(w) {
					err = errors.New("read succeeded with wrong bytes")
				}
				errs <- err
			}
		}()
	}
	for i := 0; i < callers; i++ {
		<-started
	}
	if err := x.b.vt.Close(); err != nil { // the owner's RDMA path goes away
		t.Fatalf("closing the owner's verbs side: %v", err)
	}
	wg.Wait()
	close(errs)
	var ok, failed int
	for err := range errs {
		if err == nil {
			ok++
			continue
		}
		failed++
		if errors.Is(err, rdma.ErrChecksum) {
			t.Fatalf("a lost path must not read as corruption: %v", err)
		}
		t.Logf("clean failure: %v", err)
	}
	c := x.a.Counters()
	t.Logf("%d ok, %d failed; counters %+v", ok, failed, c)
	if failed > 0 {
		t.Fatalf("%d reads failed; with TCP still up every read should fall back", failed)
	}
	if c.Fallbacks == 0 || c.TCP.Bytes == 0 {
		t.Fatalf("counters %+v: want fallbacks to TCP", c)
	}
	if err := x.read(0); err != nil || !x.landed(0) {
		t.Fatalf("read after the RDMA path died: %v", err)
	}
}

// TestLinkDown: the RoCE netdev goes down while a reader reads, then comes
// back; no read returns wrong bytes or hangs (set TIDEPOOL_RDMA_NETDEV).
func TestLinkDown(t *testing.T) {
	dev := os.Getenv("TIDEPOOL_RDMA_NETDEV")
	if wantRDMA() == "" || dev == "" {
		t.Skip("needs the Soft-RoCE guest (make test-rdma)")
	}
	const n = 256 << 10
	x := newPair(t, config(t, ModeAuto), config(t, ModeAuto), n)
	if err := x.read(0); err != nil {
		t.Fatal(err)
	}
	ip := func(args ...string) {
		if out, err := exec.Command("/usr/sbin/ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	done := make(chan error, 1)
	go func() {
		for i := 0; i < 20; i++ {
			clear(x.dst[:n])
			err := x.read(0)
			if err == nil && !x.landed(0) {
				done <- errors.New("wrong bytes")
				return
			}
			if err != nil && errors.Is(err, rdma.ErrChecksum) {
				done <- err
				return
			}
		}
		done <- nil
	}()
	ip("link", "set", dev, "down")
	defer ip("link", "set", dev, "up")
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("reads hung with the link down")
	}
	t.Logf("counters %+v", x.a.Counters())
}

// TestCongestion: the tcp transport's congestion control is set on the
// shared listening socket (the demux's sub-listener hands it over), so
// every connection accepted on the transfer port inherits it
// (rdma/tcp TestCongestion checks the inheritance), and a read between
// two nodes lands intact.
func TestCongestion(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cb := config(t, ModeAuto)
	cb.TCP.Listener = ln
	cb.TCP.Congestion = []string{"no_such_cc", "reno"} // reno: in every kernel, allowed to every process
	x := newPair(t, config(t, ModeAuto), cb, 1<<20)
	if name, err := tcp.CongestionOf(ln.(*net.TCPListener)); err != nil || name != "reno" {
		t.Fatalf("the transfer listener's congestion control: %q (%v), want reno", name, err)
	}
	if err := x.read(0); err != nil || !x.landed(0) {
		t.Fatalf("read: %v, landed %v", err, x.landed(0))
	}
}
