package tcp

import (
	"bufio"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/internal/fdtest"
	"github.com/tidepool-kv/tidepool/internal/peerauth"
	"github.com/tidepool-kv/tidepool/protocol/frame"
	"github.com/tidepool-kv/tidepool/rdma"
	"github.com/tidepool-kv/tidepool/rdma/rdmatest"
)

func testKey(t testing.TB, secret string) *peerauth.Key {
	t.Helper()
	k, err := peerauth.NewKey([]byte(secret), "test")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

const clusterSecret = "transfer-test-cluster-secret"

func waitGuard(t *testing.T, tr *Transport, what string, f func(GuardStats) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f(tr.GuardStats()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: never; stats %+v", what, tr.GuardStats())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestTransferPortNeedsKey: with a key, the port serves only initiators
// holding the same secret; a Peer without it (or with another) cannot
// connect, and the refusals are counted.
func TestTransferPortNeedsKey(t *testing.T) {
	key := testKey(t, clusterSecret)
	owner := newLocal(t, func(c *Config) { c.Key = key })
	buf := []byte("owner's block bytes")
	rd, err := owner.Register(buf)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		key  *peerauth.Key
		ok   bool
	}{
		{"same secret", key, true},
		{"no key", nil, false},
		{"other secret", testKey(t, "some-other-cluster-secret"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			init := newLocal(t, func(c *Config) { c.Key = tc.key })
			local := make([]byte, len(buf))
			ld, err := init.Register(local)
			if err != nil {
				t.Fatal(err)
			}
			p, err := init.Connect(context.Background(), owner.Addr())
			if !tc.ok {
				if err == nil {
					p.Close()
					t.Fatal("connected without the cluster secret")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if err := p.Read(context.Background(), rdma.Op{Local: ld.ID, Remote: rd, Len: uint64(len(buf))}); err != nil {
				t.Fatal(err)
			}
			if string(local) != string(buf) {
				t.Fatalf("read %q", local)
			}
		})
	}
	waitGuard(t, owner, "two refusals", func(s GuardStats) bool { return s.Listener.AuthFailures == 2 })
}

// TestWrongRegionKeysCutOff: requests naming a region with the wrong key,
// or an address outside it (no base), are refused (throttled), and the
// connection is closed after MaxKeyFailures of them.
func TestWrongRegionKeysCutOff(t *testing.T) {
	key := testKey(t, clusterSecret)
	owner := newLocal(t, func(c *Config) { c.Key = key; c.MaxKeyFailures = 3; c.KeyFailureDelay = time.Millisecond })
	rd, err := owner.Register(make([]byte, 4096))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.Dial("tcp", owner.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := key.Client(nc, peerauth.PurposeTransfer, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(nc)
	var hb, rb [frame.HeaderSize]byte
	send := func(h frame.Header) {
		t.Helper()
		if _, err := nc.Write(frame.Encode(hb[:], h)); err != nil {
			t.Fatal(err)
		}
	}
	send(frame.Header{Op: frame.OpHello, RequestID: 1})
	if h, err := frame.ReadHeader(br, &rb); err != nil || h.Op != frame.OpHelloAck {
		t.Fatalf("hello: %v %v", h.Op, err)
	}
	for i, req := range []frame.Header{
		{Region: uint64(rd.ID), Key: rd.Key + 1, Offset: rd.Addr}, // wrong key
		{Region: uint64(rd.ID), Key: rd.Key, Offset: 0},           // right key, offset without the region's base
		{Region: uint64(rd.ID), Key: rd.Key + 1, Offset: rd.Addr}, // wrong key: the third guess
	} {
		req.Op, req.RequestID, req.Length = frame.OpRead, uint64(10+i), 16
		send(req)
		h, err := frame.ReadHeader(br, &rb)
		if i < 2 {
			if err != nil || h.Op != frame.OpError {
				t.Fatalf("guess %d: %v %v %v, want an error", i, h.Op, h.Status, err)
			}
			if _, err := io.CopyN(io.Discard, br, int64(h.Length)); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err == nil {
			t.Fatalf("guess %d answered %v; want the connection cut off", i, h.Op)
		}
	}
	if s := owner.GuardStats(); s.KeyFails != 3 || s.KeyCutoffs != 1 {
		t.Fatalf("guard stats %+v, want 3 key failures and 1 cut-off", s)
	}
}

// TestTransferPortSurvivesEMFILE: accept failing with "too many open
// files" does not stop the port: once descriptors are free again, peers
// connect. (The old accept loop returned for good.)
func TestTransferPortSurvivesEMFILE(t *testing.T) {
	key := testKey(t, clusterSecret)
	owner := newLocal(t, func(c *Config) { c.Key = key })
	init := newLocal(t, func(c *Config) { c.Key = key })
	release := fdtest.Exhaust(t, 1)
	c, err := net.Dial("tcp", owner.Addr()) // takes the last descriptor
	if err != nil {
		release()
		t.Fatal(err)
	}
	waitGuard(t, owner, "accept error", func(s GuardStats) bool { return s.Listener.AcceptErrors >= 1 })
	release()
	c.Close()
	p, err := init.Connect(context.Background(), owner.Addr())
	if err != nil {
		t.Fatalf("connect after EMFILE: %v", err)
	}
	p.Close()
}

// TestConformanceAuthenticated and TestConformanceEncrypted run the
// transport conformance suite with every connection authenticated, and
// authenticated and encrypted.
func TestConformanceAuthenticated(t *testing.T) {
	key := testKey(t, clusterSecret)
	rdmatest.Run(t, func(t *testing.T) (rdma.Transport, rdma.Transport) {
		mod := func(c *Config) { c.Key = key }
		return newLocal(t, mod), newLocal(t, mod)
	})
}

func TestConformanceEncrypted(t *testing.T) {
	key := testKey(t, clusterSecret).Encrypting()
	rdmatest.Run(t, func(t *testing.T) (rdma.Transport, rdma.Transport) {
		mod := func(c *Config) { c.Key = key; c.ChunkSize = 64 << 10 }
		return newLocal(t, mod), newLocal(t, mod)
	})
}
