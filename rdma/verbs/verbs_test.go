//go:build verbs

package verbs

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/tidepool-kv/tidepool/internal/peerauth"
	"github.com/tidepool-kv/tidepool/rdma"
	"github.com/tidepool-kv/tidepool/rdma/rdmatest"
)

// device returns the device the tests run on. Where TIDEPOOL_RDMA_DEVICE
// is set (the Soft-RoCE guest of scripts/test-rdma.sh) a missing device
// fails the test; elsewhere the test is skipped.
func testDevice(t testing.TB) string {
	t.Helper()
	want := os.Getenv("TIDEPOOL_RDMA_DEVICE")
	cfg := DefaultConfig()
	cfg.Device = want
	if _, err := Probe(cfg); err != nil {
		if want != "" {
			t.Fatalf("TIDEPOOL_RDMA_DEVICE=%s but Probe: %v", want, err)
		}
		t.Skipf("no RDMA device here (%v): run make test-rdma", err)
	}
	return want
}

func testConfig(t testing.TB) Config {
	cfg := DefaultConfig()
	cfg.Device = testDevice(t)
	cfg.ListenAddr = "127.0.0.1:0"
	cfg.DialTimeout = 5 * time.Second
	cfg.IOTimeout = 20 * time.Second
	// A short RC timeout so that a dead owner is noticed in well under a
	// second (4.096 us * 2^12 * retries).
	cfg.QPTimeout = 12
	cfg.QPRetry = 3
	return cfg
}

func newPair(t *testing.T, cfg Config) (*Transport, *Transport) {
	a, err := NewTransport(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatalf("NewTransport: %v", err)
	}
	b, err := NewTransport(cfg, zaptest.NewLogger(t))
	if err != nil {
		_ = a.Close()
		t.Fatalf("NewTransport: %v", err)
	}
	return a, b
}

// TestConformance runs the suite rdma/tcp and rdma/inproc pass over real
// verbs, with authenticated control connections.
func TestConformance(t *testing.T) {
	cfg := testConfig(t)
	key, err := peerauth.NewKey([]byte("verbs-conformance-secret"), "test")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Key = key
	rdmatest.Run(t, func(t *testing.T) (rdma.Transport, rdma.Transport) { return newPair(t, cfg) })
}

// TestProbe: the device is discovered with an active port, a RoCE v2 GID
// on Ethernet, and an MTU.
func TestProbe(t *testing.T) {
	cfg := testConfig(t)
	infos, err := Probe(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range infos {
		t.Logf("%s port %d: %s, link %s, MTU %d/%d, NUMA %d, GID[%d] %s", d.Name, d.Port, d.State, d.LinkLayer,
			d.ActiveMTU, d.MaxMTU, d.NUMANode, d.GIDIndex, GIDEntry{GID: d.GID})
		if !d.Active || d.ActiveMTU < 256 || d.GIDIndex < 0 {
			t.Errorf("device %+v: want an active port, an MTU and a GID", d)
		}
		if d.LinkLayer == "Ethernet" {
			for _, g := range d.GIDs {
				if g.Index == d.GIDIndex && g.Type != "RoCE v2" {
					t.Errorf("GID %d chosen is %s, want RoCE v2", g.Index, g.Type)
				}
			}
		}
	}
	bad := cfg
	bad.Device = "no-such-device"
	if _, err := Probe(bad); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Probe(no-such-device): %v, want ErrNoDevice", err)
	}
	bad = cfg
	bad.GIDIndex = 1000
	if _, err := NewTransport(bad, nil); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("NewTransport(GID index 1000): %v, want ErrNoDevice", err)
	}
}

// TestWrongKeyRefused: a control connection without the cluster secret
// gets no queue pair.
func TestWrongKeyRefused(t *testing.T) {
	cfg := testConfig(t)
	k1, _ := peerauth.NewKey([]byte("verbs-secret-number-one"), "test")
	k2, _ := peerauth.NewKey([]byte("verbs-secret-number-two"), "test")
	ca, cb := cfg, cfg
	ca.Key, cb.Key = k1, k2
	a, err := NewTransport(ca, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := NewTransport(cb, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.Connect(ctx, b.Addr()); !errors.Is(err, rdma.ErrUnreachable) {
		t.Fatalf("Connect with another secret: %v, want ErrUnreachable", err)
	}
	if b.QPs() != 0 {
		t.Fatalf("%d QPs on the owner after a refused handshake", b.QPs())
	}
}

// TestNoDeviceFallsBack: on a machine without RDMA (the build host), a
// binary built with the tag starts: New reports ErrNoDevice, which the
// caller takes as "use TCP".
func TestNoDeviceFallsBack(t *testing.T) {
	if os.Getenv("TIDEPOOL_RDMA_DEVICE") != "" {
		t.Skip("a device is expected here")
	}
	if _, err := listDevices(); err == nil {
		t.Skip("this machine has RDMA devices")
	}
	cfg := DefaultConfig()
	cfg.ListenAddr = "127.0.0.1:0"
	if _, err := New(cfg, nil); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("New without devices: %v, want ErrNoDevice", err)
	}
}
