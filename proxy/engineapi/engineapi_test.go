package engineapi_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/cache/evict"
	"github.com/tidepool-kv/tidepool/client"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/engineapi"
)

type testServer struct {
	socket string
	srv    *engineapi.Server
	tier   *dram.Tier
	c      *client.Client
}

type serverOpts struct {
	capacity  int64
	maxValue  int64
	maxBatch  int
	maxReqest int
	wrap      func(proxy.Store) proxy.Store // optional store wrapper
	// reserveTimeout, if set, is the DRAM tier's ReserveTimeout.
	reserveTimeout time.Duration
	// noPutSocket serves the engine socket alone (by default the put
	// socket is served too, and the client's large Puts take it).
	noPutSocket bool
	// noBufferSocket: no buffer socket (served by default).
	noBufferSocket bool
}

func startServer(t testing.TB, o serverOpts) *testServer {
	t.Helper()
	if o.capacity == 0 {
		o.capacity = 64 << 20
	}
	if o.maxValue == 0 {
		o.maxValue = 8 << 20
	}
	if o.maxBatch == 0 {
		o.maxBatch = 64
	}
	// Unix socket paths are limited to 107 bytes; t.TempDir can be long.
	sockDir, err := os.MkdirTemp("", "tp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	socket := filepath.Join(sockDir, "tp.sock")

	dcfg := dram.DefaultConfig()
	dcfg.Dir = t.TempDir()
	dcfg.Capacity = o.capacity
	dcfg.ArenaSize = min(o.capacity, 32<<20)
	dcfg.MaxValueSize = o.maxValue
	dcfg.Policy = evict.NewLRU
	dcfg.ReserveTimeout = o.reserveTimeout
	tier, err := dram.New(dcfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	pcfg := proxy.DefaultConfig()
	pcfg.NodeID = "test-node"
	pcfg.MaxValueBytes = o.maxValue
	pcfg.MaxBatch = o.maxBatch
	deps := proxy.Deps{Store: tier, ZeroCopy: tier, Scan: tier}
	if o.wrap != nil {
		// A wrapped store stands alone: Gets go through its Get.
		deps = proxy.Deps{Store: o.wrap(tier)}
	}
	p, err := proxy.New(pcfg, deps, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := engineapi.Listen(socket, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	scfg := engineapi.DefaultConfig()
	if o.maxReqest > 0 {
		scfg.MaxRequestBytes = o.maxReqest
	}
	if !o.noPutSocket {
		if scfg.PutListener, err = engineapi.Listen(socket+engineapi.PutSocketSuffix, 0o600, -1); err != nil {
			t.Fatal(err)
		}
	}
	if !o.noBufferSocket {
		if scfg.BufferListener, err = engineapi.Listen(socket+engineapi.BufferSocketSuffix, 0o600, -1); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := engineapi.NewServer(scfg, p, ln, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-srv.Ready()
	c, err := client.New(socket)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{socket: socket, srv: srv, tier: tier, c: c}
	t.Cleanup(func() {
		c.Close()
		srv.Close()
		tier.Close()
	})
	waitServing(t, c)
	return ts
}

// waitServing polls Hello until the server answers (no fixed sleeps).
func waitServing(t testing.TB, c *client.Client) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Hello(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not answering: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func randBytes(seed int64, n int) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

func TestRoundTrip(t *testing.T) {
	ts := startServer(t, serverOpts{})
	ctx := context.Background()
	c := ts.c

	h, err := c.Hello(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h.ServerVersion < 1 || h.Limits.MaxKeyBytes != 128 || h.Limits.MaxValueBytes != 8<<20 || len(h.Tiers) == 0 || h.NodeId != "test-node" {
		t.Fatalf("Hello = %+v", h)
	}

	for i, size := range []int{1, 4 << 10, 1 << 20, 4 << 20} {
		key := []byte{byte(i), 'k'}
		val := randBytes(int64(i), size)
		existed, err := c.Put(ctx, "ns", key, val, int32(i))
		if err != nil || existed {
			t.Fatalf("Put %d bytes: existed=%v err=%v", size, existed, err)
		}
		got, found, err := c.Get(ctx, "ns", key)
		if err != nil || !found || !bytes.Equal(got, val) {
			t.Fatalf("Get %d bytes: found=%v err=%v equal=%v", size, found, err, bytes.Equal(got, val))
		}
		existed, err = c.Put(ctx, "ns", key, []byte("other"), 0)
		if err != nil || !existed {
			t.Fatalf("second Put: existed=%v err=%v", existed, err)
		}
		got, _, _ = c.Get(ctx, "ns", key)
		if !bytes.Equal(got, val) {
			t.Fatal("second Put changed the value")
		}
	}
	// Namespaces never collide.
	if _, found, err := c.Get(ctx, "ns2", []byte{0, 'k'}); err != nil || found {
		t.Fatalf("other namespace: found=%v err=%v", found, err)
	}
	if _, found, err := c.Get(ctx, "ns", []byte("missing")); err != nil || found {
		t.Fatalf("missing key: found=%v err=%v", found, err)
	}

	// Batches, lookup, exists.
	keys := [][]byte{[]byte("c0"), []byte("c1"), []byte("c2"), []byte("c3"), []byte("c4")}
	items := make([]client.Item, 3)
	for i := range items {
		items[i] = client.Item{Key: keys[i], Value: randBytes(int64(100+i), 10000), Depth: int32(i)}
	}
	res, err := c.BatchPut(ctx, "chain", items)
	if err != nil || len(res) != 3 || res[0] != nil || res[1] != nil || res[2] != nil {
		t.Fatalf("BatchPut = %v, %v", res, err)
	}
	if n, err := c.Lookup(ctx, "chain", keys); err != nil || n != 3 {
		t.Fatalf("Lookup = %d, %v; want 3", n, err)
	}
	gets, err := c.BatchGet(ctx, "chain", keys)
	if err != nil || len(gets) != 5 {
		t.Fatalf("BatchGet: %v", err)
	}
	for i, g := range gets {
		if i < 3 && (g.Code != client.CodeOK || !bytes.Equal(g.Value, items[i].Value) || g.Tier != "dram") {
			t.Fatalf("BatchGet[%d] = code %v, tier %q", i, g.Code, g.Tier)
		}
		if i >= 3 && g.Code != client.CodeNotFound {
			t.Fatalf("BatchGet[%d] code %v, want NOT_FOUND", i, g.Code)
		}
	}
	pres, err := c.BatchExists(ctx, "chain", keys)
	if err != nil || !pres[0].Present || pres[4].Present || pres[0].Tier != "dram" {
		t.Fatalf("BatchExists = %+v, %v", pres, err)
	}
	if p, err := c.Exists(ctx, "chain", keys[1]); err != nil || !p.Present || p.NodeID != "test-node" {
		t.Fatalf("Exists = %+v, %v", p, err)
	}
	if ok, err := c.Delete(ctx, "chain", keys[1]); err != nil || !ok {
		t.Fatalf("Delete = %v, %v", ok, err)
	}
	if n, _ := c.Lookup(ctx, "chain", keys); n != 1 {
		t.Fatalf("Lookup after delete = %d, want 1", n)
	}
	if ok, err := c.Delete(ctx, "chain", keys[1]); err != nil || ok {
		t.Fatalf("second Delete = %v, %v", ok, err)
	}
	st, err := c.Stats(ctx, "chain")
	if err != nil || len(st.Namespaces) != 1 || st.Namespaces[0].Blocks != 2 {
		t.Fatalf("Stats = %+v, %v", st, err)
	}
	if n, err := c.Clear(ctx, "chain"); err != nil || n != 2 {
		t.Fatalf("Clear = %d, %v", n, err)
	}
	if n, _ := c.Lookup(ctx, "chain", keys); n != 0 {
		t.Fatalf("Lookup after clear = %d", n)
	}
}

func TestBadInputOverTheWire(t *testing.T) {
	ts := startServer(t, serverOpts{capacity: 16 << 20, maxValue: 8 << 20, maxBatch: 4})
	ctx := context.Background()
	c := ts.c
	if _, err := c.Put(ctx, "ns", []byte("keep"), []byte("safe"), 0); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		call func() error
		want client.ErrorCode
	}{
		{"key over limit", func() error { _, err := c.Put(ctx, "ns", bytes.Repeat([]byte("k"), 129), []byte("v"), 0); return err }, client.CodeInvalidArgument},
		{"empty key", func() error { _, err := c.Put(ctx, "ns", nil, []byte("v"), 0); return err }, client.CodeInvalidArgument},
		{"empty namespace", func() error { _, err := c.Put(ctx, "", []byte("k"), []byte("v"), 0); return err }, client.CodeInvalidArgument},
		{"value over max", func() error { _, err := c.Put(ctx, "ns", []byte("big"), make([]byte, 8<<20+1), 0); return err }, client.CodeTooLarge},
		{"batch over max", func() error { _, err := c.BatchGet(ctx, "ns", make([][]byte, 5)); return err }, client.CodeBatchTooLarge},
		{"lookup over max", func() error { _, err := c.Lookup(ctx, "ns", make([][]byte, 5)); return err }, client.CodeBatchTooLarge},
		{"get empty key", func() error { _, _, err := c.Get(ctx, "ns", nil); return err }, client.CodeInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var e *client.Error
			if !errors.As(err, &e) || e.Code != tc.want || e.Message == "" {
				t.Fatalf("err = %v, want code %v with a message", err, tc.want)
			}
		})
	}
	// Nothing was stored by the rejected calls, and the good block is intact.
	st, err := c.Stats(ctx, "ns")
	if err != nil || st.Namespaces[0].Blocks != 1 {
		t.Fatalf("Stats after bad input = %+v, %v", st, err)
	}
	if v, ok, _ := c.Get(ctx, "ns", []byte("keep")); !ok || string(v) != "safe" {
		t.Fatal("good block lost")
	}
}

func TestNoSpaceWhenPinned(t *testing.T) {
	ts := startServer(t, serverOpts{capacity: 8 << 20, maxValue: 8 << 20})
	ctx := context.Background()
	// Pin everything the tier holds, then ask for more than is free.
	if _, err := ts.c.Put(ctx, "ns", []byte("a"), make([]byte, 6<<20), 0); err != nil {
		t.Fatal(err)
	}
	l, err := ts.tier.Acquire(ctx, "ns", []byte("a"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_, err = ts.c.Put(ctx, "ns", []byte("b"), make([]byte, 4<<20), 0)
	if client.CodeOf(err) != client.CodeNoSpace {
		t.Fatalf("put with the tier pinned: %v, want NO_SPACE", err)
	}
	l.Release()
	if _, err := ts.c.Put(ctx, "ns", []byte("b"), make([]byte, 4<<20), 0); err != nil {
		t.Fatalf("put after release: %v", err)
	}
}

// frame builds a framed, strict binary-protocol Thrift call with an empty
// argument struct.
func frame(method string, seq int32) []byte {
	var body bytes.Buffer
	binary.Write(&body, binary.BigEndian, uint32(0x80010001)) // version 1, CALL
	binary.Write(&body, binary.BigEndian, int32(len(method)))
	body.WriteString(method)
	binary.Write(&body, binary.BigEndian, seq)
	body.WriteByte(0) // field stop
	var out bytes.Buffer
	binary.Write(&out, binary.BigEndian, int32(body.Len()))
	out.Write(body.Bytes())
	return out.Bytes()
}

// expectClosedOrAnswer reads from conn until EOF or an answer; it fails only
// when the server neither answers nor closes within the deadline.
func readSome(t *testing.T, conn net.Conn) ([]byte, error) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4096)
	n, err := conn.Read(buf)
	return buf[:n], err
}

func TestMalformedTraffic(t *testing.T) {
	ts := startServer(t, serverOpts{maxReqest: 16 << 20})
	ctx := context.Background()
	want := randBytes(7, 100000)
	if _, err := ts.c.Put(ctx, "ns", []byte("k"), want, 0); err != nil {
		t.Fatal(err)
	}
	dial := func() net.Conn {
		conn, err := net.Dial("unix", ts.socket)
		if err != nil {
			t.Fatal(err)
		}
		return conn
	}

	t.Run("unknown method", func(t *testing.T) {
		conn := dial()
		defer conn.Close()
		conn.Write(frame("NoSuchCall", 7))
		resp, err := readSome(t, conn)
		if len(resp) == 0 {
			// Kitex may close the connection instead of answering; both keep
			// other clients safe.
			if err == nil {
				t.Fatal("no answer and no close")
			}
			return
		}
		if !bytes.Contains(resp, []byte("NoSuchCall")) {
			t.Fatalf("answer to unknown method does not name it: %q", resp)
		}
	})
	t.Run("garbage", func(t *testing.T) {
		conn := dial()
		defer conn.Close()
		conn.Write(randBytes(3, 4096))
		_, err := readSome(t, conn)
		if err == nil {
			t.Log("server answered garbage (an exception frame)")
		}
	})
	t.Run("huge frame length", func(t *testing.T) {
		conn := dial()
		defer conn.Close()
		var hdr [8]byte
		binary.BigEndian.PutUint32(hdr[:4], 0x7fffffff)
		binary.BigEndian.PutUint32(hdr[4:], 0x80010001)
		conn.Write(hdr[:])
		if _, err := readSome(t, conn); err == nil {
			t.Log("server answered an oversized frame")
		}
	})
	t.Run("truncated frame then close", func(t *testing.T) {
		conn := dial()
		f := frame("Put", 1)
		binary.BigEndian.PutUint32(f[:4], 1000) // claims more than sent
		conn.Write(f)
		conn.Close()
	})
	t.Run("disconnect mid put", func(t *testing.T) {
		// Start a real 4 MiB Put by hand and hang up half way.
		conn := dial()
		var body bytes.Buffer
		binary.Write(&body, binary.BigEndian, uint32(0x80010001))
		binary.Write(&body, binary.BigEndian, int32(3))
		body.WriteString("Put")
		binary.Write(&body, binary.BigEndian, int32(9))
		var out bytes.Buffer
		binary.Write(&out, binary.BigEndian, int32(body.Len()+4<<20+64))
		out.Write(body.Bytes())
		out.Write(make([]byte, 1<<20))
		conn.Write(out.Bytes())
		conn.Close()
	})

	// After all of that the server serves everyone, with nothing lost.
	for i := 0; i < 3; i++ {
		got, found, err := ts.c.Get(ctx, "ns", []byte("k"))
		if err != nil || !found || !bytes.Equal(got, want) {
			t.Fatalf("after malformed traffic: found=%v err=%v", found, err)
		}
	}
	c2, err := client.New(ts.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := c2.Hello(ctx); err != nil {
		t.Fatalf("new client after malformed traffic: %v", err)
	}
	st, _ := ts.c.Stats(ctx, "ns")
	if st.Namespaces[0].Blocks != 1 {
		t.Fatalf("blocks after malformed traffic = %d", st.Namespaces[0].Blocks)
	}
}

func TestConcurrentClients(t *testing.T) {
	ts := startServer(t, serverOpts{capacity: 256 << 20})
	ctx := context.Background()
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				key := []byte{byte(g), byte(i)}
				val := randBytes(int64(g*1000+i), 1000+g*7919+i*131)
				if _, err := ts.c.Put(ctx, "conc", key, val, 0); err != nil {
					errc <- err
					return
				}
				got, found, err := ts.c.Get(ctx, "conc", key)
				if err != nil || !found || !bytes.Equal(got, val) {
					errc <- errors.New("wrong bytes or miss under concurrency")
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
}

func TestListenSafety(t *testing.T) {
	dir, err := os.MkdirTemp("", "tpl")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "s.sock")

	ln, err := engineapi.Listen(path, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}
	if _, err := engineapi.Listen(path, 0o600, -1); !errors.Is(err, engineapi.ErrSocketInUse) {
		t.Fatalf("second Listen on a live socket: %v, want ErrSocketInUse", err)
	}
	// A stale socket (its listener gone without unlinking) is replaced.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("stale socket should remain for this test: %v", err)
	}
	ln2, err := engineapi.Listen(path, 0o660, -1)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o660 {
		t.Fatalf("mode %v, want 0660", fi.Mode().Perm())
	}
	ln2.Close()
	// Anything that is not a socket is never removed.
	plain := filepath.Join(dir, "file")
	os.WriteFile(plain, []byte("data"), 0o600)
	if _, err := engineapi.Listen(plain, 0o600, -1); err == nil {
		t.Fatal("Listen replaced a regular file")
	}
	if b, _ := os.ReadFile(plain); string(b) != "data" {
		t.Fatal("regular file changed")
	}
	if _, err := engineapi.Listen("relative.sock", 0o600, -1); err == nil {
		t.Fatal("relative path accepted")
	}
}

// gatedStore blocks Get until released, to hold a call in flight.
type gatedStore struct {
	proxy.Store
	entered chan struct{}
	release chan struct{}
}

func (g *gatedStore) Get(ctx context.Context, ns string, key, dst []byte) ([]byte, cache.Info, error) {
	g.entered <- struct{}{}
	<-g.release
	return g.Store.Get(ctx, ns, key, dst)
}

// TestDrainOnClose: Close waits for an in-flight call, which completes with
// the right bytes.
func TestDrainOnClose(t *testing.T) {
	gate := &gatedStore{entered: make(chan struct{}, 1), release: make(chan struct{})}
	ts := startServer(t, serverOpts{wrap: func(s proxy.Store) proxy.Store { gate.Store = s; return gate }})
	ctx := context.Background()
	val := randBytes(1, 4<<20)
	if _, err := ts.c.Put(ctx, "ns", []byte("big"), val, 0); err != nil {
		t.Fatal(err)
	}
	type result struct {
		v     []byte
		found bool
		err   error
	}
	got := make(chan result, 1)
	go func() {
		v, found, err := ts.c.Get(ctx, "ns", []byte("big"))
		got <- result{v, found, err}
	}()
	<-gate.entered // the call is inside the handler now
	closed := make(chan error, 1)
	go func() { closed <- ts.srv.Close() }()
	select {
	case <-closed:
		t.Fatal("Close returned while a call was in flight")
	case <-time.After(200 * time.Millisecond):
	}
	close(gate.release)
	r := <-got
	if r.err != nil || !r.found || !bytes.Equal(r.v, val) {
		t.Fatalf("in-flight Get during drain: found=%v err=%v", r.found, r.err)
	}
	select {
	case <-closed:
	case <-time.After(15 * time.Second):
		t.Fatal("Close did not return after the call finished")
	}
	if err := ts.srv.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := net.Dial("unix", ts.socket); err == nil {
		t.Fatal("socket still accepting after Close")
	}
}
