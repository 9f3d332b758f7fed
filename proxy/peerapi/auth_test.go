package peerapi_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/fdtest"
	"github.com/tidepool-kv/tidepool/internal/poll"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/peerapi"
)

// TestClusterWithSecret: with a cluster secret, peers fetch from each
// other as before; a client without the secret is refused at the
// handshake, before the server decodes anything it sends (the server's
// per-call refusal counter does not move), and a hostile Thrift frame from
// a stranger is never decoded.
func TestClusterWithSecret(t *testing.T) {
	for _, encrypt := range []bool{false, true} {
		t.Run(map[bool]string{false: "authenticated", true: "encrypted"}[encrypt], func(t *testing.T) {
			testClusterWithSecret(t, encrypt)
		})
	}
}

func testClusterWithSecret(t *testing.T, encrypt bool) {
	const ns = "llama"
	nodes := newCluster(t, 2, nodeOpts{label: "prod", secret: "peerapi-test-cluster-secret", encrypt: encrypt})
	a, b := nodes[0], nodes[1]
	ctx := context.Background()

	k := keyOwnedBy(t, nodes, ns, "secure", a.name)
	v := value(9, 200<<10)
	if _, err := a.p.Put(ctx, ns, k, v, cache.PutOptions{Depth: 1}); err != nil {
		t.Fatal(err)
	}
	got, _, err := b.p.Get(ctx, ns, k, proxy.ScopeCluster)
	if err != nil || !bytes.Equal(got, v) {
		t.Fatalf("cluster get with the secret: %v (equal %v)", err, bytes.Equal(got, v))
	}

	// A client with the right label but no secret.
	cli, err := peerapi.NewClient(peerapi.ClientConfig{
		Credentials: peerapi.Credentials{NodeID: "intruder", Label: "prod"},
		Resolve:     b.view.Addrs, Transport: b.tr, Regions: b.regions,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	refused, fails := a.srv.Stats().Refused, a.srv.ListenerStats().AuthFailures
	if _, err := cli.Lookup(ctx, a.name, ns, [][]byte{k}); err == nil {
		t.Fatal("lookup without the secret succeeded")
	}
	if _, err := cli.Push(ctx, a.name, ns, []proxy.PutItem{{Key: []byte("evil"), Value: []byte("x")}}); err == nil {
		t.Fatal("push without the secret succeeded")
	}
	if got := a.srv.Stats().Refused; got != refused {
		t.Fatalf("the server decoded %d calls from a client without the secret", got-refused)
	}
	if _, ok, _ := a.p.Exists(ctx, ns, []byte("evil"), proxy.ScopeLocal); ok {
		t.Fatal("a push without the secret was stored")
	}

	// A stranger's hostile frame: a list claiming 2^31-1 elements.
	addr, _, _ := b.view.Addrs(a.name)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	frame := binary.BigEndian.AppendUint32(nil, 0x7fffffff)
	frame = binary.BigEndian.AppendUint32(frame, 0x80010001)
	frame = append(frame, bytes.Repeat([]byte{0x0f, 0x0c, 0x7f, 0xff, 0xff, 0xff}, 16)...)
	_, _ = c.Write(frame)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, _ := io.Copy(io.Discard, c); n != 0 {
		t.Fatalf("the server answered a stranger with %d bytes", n)
	}
	poll.Until(t, 5*time.Second, "the refusals to be counted", func() bool {
		return a.srv.ListenerStats().AuthFailures >= fails+2
	})
	if got := a.srv.Stats().Refused; got != refused {
		t.Fatalf("the server decoded %d calls from strangers", got-refused)
	}
	// Still serving its peers.
	if got, _, err := b.p.Get(ctx, ns, k, proxy.ScopeCluster); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("cluster get after the strangers: %v", err)
	}
}

// countingListener counts Close calls on the listener it wraps.
type countingListener struct {
	net.Listener
	closes atomic.Int32
}

func (l *countingListener) Close() error {
	l.closes.Add(1)
	return l.Listener.Close()
}

// TestServerClosesListenerOnce: the server owns its listener and closes it
// exactly once, whether it ran or not (a descriptor closed twice can close
// someone else's file that reused the number).
func TestServerClosesListenerOnce(t *testing.T) {
	n := newNode(t, "solo", nodeOpts{})
	for _, run := range []bool{true, false} {
		raw, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln := &countingListener{Listener: raw}
		srv, err := peerapi.NewServer(peerapi.ServerConfig{Credentials: n.cred, Transport: n.tr, Regions: n.regions}, n.p, ln, nil)
		if err != nil {
			t.Fatal(err)
		}
		if run {
			if err := srv.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			<-srv.Ready()
			c, err := net.Dial("tcp", raw.Addr().String()) // one connection served
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
		}
		srv.Close()
		srv.Close()
		if got := ln.closes.Load(); got != 1 {
			t.Fatalf("run %v: listener closed %d times, want once", run, got)
		}
	}
}

// TestPeerAPISurvivesEMFILE: the peer API's accept loop hitting "too many
// open files" backs off and keeps accepting: once descriptors are free
// again, peers call it.
func TestPeerAPISurvivesEMFILE(t *testing.T) {
	const ns = "llama"
	nodes := newCluster(t, 2, nodeOpts{label: "prod", secret: "peerapi-test-cluster-secret"})
	a, b := nodes[0], nodes[1]
	addr, _, _ := b.view.Addrs(a.name)
	release := fdtest.Exhaust(t, 1)
	c, err := net.Dial("tcp", addr) // takes the last descriptor
	if err != nil {
		release()
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "an accept error", func() bool { return a.srv.ListenerStats().AcceptErrors >= 1 })
	release()
	c.Close()
	// A fresh client: its call needs a new connection.
	cli, err := peerapi.NewClient(peerapi.ClientConfig{
		Credentials: b.cred, Resolve: b.view.Addrs, Transport: b.tr, Regions: b.regions,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	accepted := a.srv.ListenerStats().Accepted
	if _, err := cli.Lookup(context.Background(), a.name, ns, [][]byte{[]byte("k")}); err != nil {
		t.Fatalf("lookup after EMFILE: %v", err)
	}
	if got := a.srv.ListenerStats().Accepted; got <= accepted {
		t.Fatalf("accepted %d connections before the lookup, %d after", accepted, got)
	}
}

// TestCloseRightAfterStart: Close returns whether it comes right after
// Start (before Kitex's Run has built its server: Kitex's Stop is then a
// no-op and Run used to serve forever, so Close hung) or once the server
// runs, and the listener is closed once either way.
func TestCloseRightAfterStart(t *testing.T) {
	n := newNode(t, "solo", nodeOpts{})
	for i := range 30 {
		raw, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln := &countingListener{Listener: raw}
		srv, err := peerapi.NewServer(peerapi.ServerConfig{Credentials: n.cred, Transport: n.tr, Regions: n.regions}, n.p, ln, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			<-srv.Ready()
		}
		closed := make(chan error, 1)
		go func() { closed <- srv.Close() }()
		select {
		case <-closed:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: Close did not return", i)
		}
		if got := ln.closes.Load(); got != 1 {
			t.Fatalf("round %d: listener closed %d times, want once", i, got)
		}
	}
}
