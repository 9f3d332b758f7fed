// Package rdmatest is the conformance suite every rdma.Transport passes.
//
//	func TestConformance(t *testing.T) {
//		rdmatest.Run(t, func(t *testing.T) (a, b rdma.Transport) { ... })
//	}
//
// mk returns two fresh transports that can reach each other; Run closes
// them when each subtest ends.
package rdmatest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/protocol/frame"
	"github.com/tidepool-kv/tidepool/rdma"
)

// Timeout bounds every transfer in the suite: a call that has not returned
// by then is a hang.
const Timeout = 20 * time.Second

// Run runs the conformance suite against the transports made by mk.
func Run(t *testing.T, mk func(t *testing.T) (a, b rdma.Transport)) {
	tests := []struct {
		name string
		fn   func(*testing.T, rdma.Transport, rdma.Transport)
	}{
		{"RoundTrip", testRoundTrip},
		{"EndToEndSum", testEndToEndSum},
		{"OutOfRange", testOutOfRange},
		{"UnknownRegion", testUnknownRegion},
		{"Concurrent", testConcurrent},
		{"DeadlineRespected", testDeadline},
		{"PeerDiesMidTransfer", testPeerDies},
		{"CloseSemantics", testClose},
		{"Stats", testStats},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := mk(t)
			t.Cleanup(func() {
				if err := a.Close(); err != nil {
					t.Errorf("close a: %v", err)
				}
				if err := b.Close(); err != nil {
					t.Errorf("close b: %v", err)
				}
			})
			tt.fn(t, a, b)
		})
	}
}

func random(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

func register(t *testing.T, tr rdma.Transport, buf []byte) rdma.RegionDesc {
	t.Helper()
	d, err := tr.Register(buf)
	if err != nil {
		t.Fatalf("Register(%d bytes): %v", len(buf), err)
	}
	if d.Len != uint64(len(buf)) {
		t.Fatalf("Register: desc len %d, want %d", d.Len, len(buf))
	}
	return d
}

func connect(t *testing.T, a, b rdma.Transport) rdma.Peer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	p, err := a.Connect(ctx, b.Addr())
	if err != nil {
		t.Fatalf("Connect(%s): %v", b.Addr(), err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	t.Cleanup(cancel)
	return ctx
}

func testRoundTrip(t *testing.T, a, b rdma.Transport) {
	p := connect(t, a, b)
	for i, n := range []int{0, 1, 4 << 10, 1 << 20, 16 << 20} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			const off = 3
			src := random(n+2*off, uint64(i+1))
			dst := make([]byte, n+2*off)
			back := make([]byte, n+2*off)
			ls := register(t, a, src)
			rd := register(t, b, dst)
			lb := register(t, a, back)
			op := rdma.Op{Local: ls.ID, LocalOff: off, Remote: rd, RemoteOff: off, Len: uint64(n)}
			if err := p.Write(ctxT(t), op); err != nil {
				t.Fatalf("Write: %v", err)
			}
			if !bytes.Equal(dst[off:off+n], src[off:off+n]) {
				t.Fatalf("Write: remote bytes differ")
			}
			if dst[0] != 0 || dst[len(dst)-1] != 0 {
				t.Fatalf("Write touched bytes outside its range")
			}
			op.Local = lb.ID
			if err := p.Read(ctxT(t), op); err != nil {
				t.Fatalf("Read: %v", err)
			}
			if !bytes.Equal(back[off:off+n], src[off:off+n]) {
				t.Fatalf("Read: local bytes differ")
			}
			if back[0] != 0 || back[len(back)-1] != 0 {
				t.Fatalf("Read touched bytes outside its range")
			}
			for _, d := range []rdma.RegionDesc{ls, lb} {
				if err := a.Deregister(d.ID); err != nil {
					t.Fatalf("Deregister: %v", err)
				}
			}
			if err := b.Deregister(rd.ID); err != nil {
				t.Fatalf("Deregister: %v", err)
			}
		})
	}
}

// testEndToEndSum: a transfer whose CRC-32C the initiator states
// (Op.SumKnown) succeeds when the bytes match it, at sizes that span several
// chunks, and fails with ErrChecksum when they do not; the connection keeps
// working after a mismatch.
func testEndToEndSum(t *testing.T, a, b rdma.Transport) {
	p := connect(t, a, b)
	for i, n := range []int{0, 1, 5000, 1 << 20, 3<<20 + 7} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			src := random(n, uint64(100+i))
			dst := make([]byte, n)
			back := make([]byte, n)
			ls, rd, lb := register(t, a, src), register(t, b, dst), register(t, a, back)
			defer func() {
				_ = a.Deregister(ls.ID)
				_ = a.Deregister(lb.ID)
				_ = b.Deregister(rd.ID)
			}()
			sum := frame.Checksum(src)
			op := rdma.Op{Local: ls.ID, Remote: rd, Len: uint64(n), Sum: sum, SumKnown: true}
			if err := p.Write(ctxT(t), op); err != nil {
				t.Fatalf("Write with the right sum: %v", err)
			}
			if !bytes.Equal(dst, src) {
				t.Fatal("Write: remote bytes differ")
			}
			op.Local = lb.ID
			if err := p.Read(ctxT(t), op); err != nil {
				t.Fatalf("Read with the right sum: %v", err)
			}
			if !bytes.Equal(back, src) {
				t.Fatal("Read: local bytes differ")
			}
			bad := op
			bad.Sum = sum ^ 1
			if err := p.Read(ctxT(t), bad); !errors.Is(err, rdma.ErrChecksum) {
				t.Fatalf("Read with a wrong sum: %v, want ErrChecksum", err)
			}
			bad.Local = ls.ID
			if err := p.Write(ctxT(t), bad); !errors.Is(err, rdma.ErrChecksum) {
				t.Fatalf("Write with a wrong sum: %v, want ErrChecksum", err)
			}
			// Still usable, with and without a sum.
			if err := p.Read(ctxT(t), op); err != nil {
				t.Fatalf("Read after a mismatch: %v", err)
			}
			op.SumKnown = false
			if err := p.Read(ctxT(t), op); err != nil {
				t.Fatalf("unsummed Read after a mismatch: %v", err)
			}
		})
	}
}

func testOutOfRange(t *testing.T, a, b rdma.Transport) {
	p := connect(t, a, b)
	ld := register(t, a, make([]byte, 4096))
	rd := register(t, b, make([]byte, 4096))
	tests := []struct {
		name          string
		loff, roff, n uint64
	}{
		{"remote offset past end", 0, 4097, 0},
		{"remote range past end", 0, 4000, 100},
		{"remote length overflows", 0, 1, ^uint64(0)},
		{"remote offset huge", 0, ^uint64(0), 1},
		{"local offset past end", 4097, 0, 0},
		{"local range past end", 4000, 0, 100},
		{"local offset huge", ^uint64(0) - 1, 0, 2},
	}
	for _, tt := range tests {
		for _, write := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/write=%v", tt.name, write), func(t *testing.T) {
				op := rdma.Op{Local: ld.ID, LocalOff: tt.loff, Remote: rd, RemoteOff: tt.roff, Len: tt.n}
				do := p.Read
				if write {
					do = p.Write
				}
				err := do(ctxT(t), op)
				if !errors.Is(err, rdma.ErrOutOfRange) && !errors.Is(err, rdma.ErrTooLarge) {
					t.Fatalf("got %v, want ErrOutOfRange", err)
				}
				if err == rdma.ErrOutOfRange || err == rdma.ErrTooLarge { // the bare sentinel, not wrapped with the range
					t.Fatalf("error %q says nothing about which range", err)
				}
			})
		}
	}
	// The full region is fine.
	if err := p.Write(ctxT(t), rdma.Op{Local: ld.ID, Remote: rd, Len: 4096}); err != nil {
		t.Fatalf("whole-region write: %v", err)
	}
}

func testUnknownRegion(t *testing.T, a, b rdma.Transport) {
	p := connect(t, a, b)
	ld := register(t, a, make([]byte, 64))
	rd := register(t, b, make([]byte, 64))
	stale := register(t, b, make([]byte, 64))
	if err := b.Deregister(stale.ID); err != nil {
		t.Fatalf("Deregister: %v", err)
	}
	if err := b.Deregister(stale.ID); !errors.Is(err, rdma.ErrUnknownRegion) {
		t.Fatalf("second Deregister: %v, want ErrUnknownRegion", err)
	}
	badKey := rd
	badKey.Key++
	tests := []struct {
		name string
		op   rdma.Op
	}{
		{"remote id never registered", rdma.Op{Local: ld.ID, Remote: rdma.RegionDesc{ID: 1 << 40, Len: 64}, Len: 8}},
		{"remote deregistered", rdma.Op{Local: ld.ID, Remote: stale, Len: 8}},
		{"remote key mismatch", rdma.Op{Local: ld.ID, Remote: badKey, Len: 8}},
		{"local id never registered", rdma.Op{Local: 1 << 40, Remote: rd, Len: 8}},
	}
	for _, tt := range tests {
		for _, write := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/write=%v", tt.name, write), func(t *testing.T) {
				do := p.Read
				if write {
					do = p.Write
				}
				if err := do(ctxT(t), tt.op); !errors.Is(err, rdma.ErrUnknownRegion) {
					t.Fatalf("got %v, want ErrUnknownRegion", err)
				}
			})
		}
	}
	// The peer handle still works after refused requests.
	if err := p.Write(ctxT(t), rdma.Op{Local: ld.ID, Remote: rd, Len: 64}); err != nil {
		t.Fatalf("write after refusals: %v", err)
	}
}

func testConcurrent(t *testing.T, a, b rdma.Transport) {
	p := connect(t, a, b)
	const workers, per, size = 16, 8, 64 << 10
	src := random(workers*per*size, 7)
	dst := make([]byte, len(src))
	back := make([]byte, len(src))
	sd, dd, bd := register(t, a, src), register(t, b, dst), register(t, a, back)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				off := uint64((w*per + i) * size)
				op := rdma.Op{Local: sd.ID, LocalOff: off, Remote: dd, RemoteOff: off, Len: size}
				if err := p.Write(ctxT(t), op); err != nil {
					errs <- err
					return
				}
				op.Local = bd.ID
				if err := p.Read(ctxT(t), op); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent transfer: %v", err)
	}
	if !bytes.Equal(dst, src) || !bytes.Equal(back, src) {
		t.Fatalf("concurrent transfers corrupted data")
	}
}

func testDeadline(t *testing.T, a, b rdma.Transport) {
	p := connect(t, a, b)
	const n = 16 << 20
	ld := register(t, a, random(n, 3))
	rd := register(t, b, make([]byte, n))
	op := rdma.Op{Local: ld.ID, Remote: rd, Len: n}

	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if err := p.Write(expired, op); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Write with an expired context: %v", err)
	}
	if err := p.Read(expired, op); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Read with an expired context: %v", err)
	}
	canceled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := p.Read(canceled, op); !errors.Is(err, context.Canceled) {
		t.Fatalf("Read with a canceled context: %v", err)
	}
	// A deadline that may fall mid-transfer: the call returns soon after it,
	// either done or with the deadline error.
	// Each attempt targets its own remote region: a write abandoned at its
	// deadline may still land later (see the package rdma guarantees).
	for _, d := range []time.Duration{time.Microsecond, 100 * time.Microsecond, time.Millisecond} {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		start := time.Now()
		op.Remote = register(t, b, make([]byte, n))
		err := p.Write(ctx, op)
		cancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Write with a %v deadline: %v", d, err)
		}
		if el := time.Since(start); el > Timeout/2 {
			t.Fatalf("Write with a %v deadline returned after %v", d, el)
		}
	}
	// The handle still works after deadline failures.
	op.Remote = register(t, b, make([]byte, n))
	if err := p.Write(ctxT(t), op); err != nil {
		t.Fatalf("write after deadline failures: %v", err)
	}
}

func testPeerDies(t *testing.T, a, b rdma.Transport) {
	p := connect(t, a, b)
	const n = 16 << 20
	src := random(n, 5)
	ld := register(t, a, src)
	back := make([]byte, n)
	bd := register(t, a, back)
	rbuf := make([]byte, n)
	copy(rbuf, src)
	rd := register(t, b, rbuf)

	type result struct {
		err  error
		took time.Duration
	}
	read := make(chan result, 1)
	base := b.Stats().Serve.BytesOut
	go func() {
		start := time.Now()
		err := p.Read(ctxT(t), rdma.Op{Local: bd.ID, Remote: rd, Len: n})
		read <- result{err, time.Since(start)}
	}()
	// Kill b once the read is moving (or done).
	deadline := time.Now().Add(Timeout)
	var res *result
	for b.Stats().Serve.BytesOut == base && res == nil && time.Now().Before(deadline) {
		select {
		case r := <-read:
			res = &r
		default:
			runtime.Gosched()
		}
	}
	midFlight := res == nil
	if err := b.Close(); err != nil {
		t.Fatalf("close b: %v", err)
	}
	if res == nil {
		select {
		case r := <-read:
			res = &r
		case <-time.After(Timeout):
			t.Fatalf("Read did not return within %v after the peer died", Timeout)
		}
	}
	t.Logf("killed mid-flight=%v: read returned %v after %v", midFlight, res.err, res.took)
	if res.err == nil && !bytes.Equal(back, src) {
		t.Fatalf("Read reported success with wrong bytes")
	}
	if res.err != nil && errors.Is(res.err, rdma.ErrChecksum) {
		t.Fatalf("a dead peer must read as lost, not as corruption: %v", res.err)
	}
	// Later calls fail fast and cleanly.
	err := p.Write(ctxT(t), rdma.Op{Local: ld.ID, Remote: rd, Len: n})
	if err == nil {
		t.Fatalf("Write to a closed peer succeeded")
	}
	if !errors.Is(err, rdma.ErrPeerLost) && !errors.Is(err, rdma.ErrUnreachable) {
		t.Fatalf("Write to a closed peer: %v, want ErrPeerLost or ErrUnreachable", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := a.Connect(ctx, b.Addr()); err == nil {
		t.Fatalf("Connect to a closed peer succeeded")
	}
}

func testClose(t *testing.T, a, b rdma.Transport) {
	p := connect(t, a, b)
	ld := register(t, a, make([]byte, 64))
	rd := register(t, b, make([]byte, 64))
	if err := p.Close(); err != nil {
		t.Fatalf("Peer.Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Peer.Close: %v", err)
	}
	if err := p.Write(ctxT(t), rdma.Op{Local: ld.ID, Remote: rd, Len: 8}); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("Write on a closed handle: %v, want ErrClosed", err)
	}
	p2 := connect(t, a, b)
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := p2.Read(ctxT(t), rdma.Op{Local: ld.ID, Remote: rd, Len: 8}); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("Read after the transport closed: %v, want ErrClosed", err)
	}
	if _, err := a.Register(make([]byte, 8)); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("Register after Close: %v, want ErrClosed", err)
	}
	if _, err := a.Connect(ctxT(t), b.Addr()); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("Connect after Close: %v, want ErrClosed", err)
	}
}

func testStats(t *testing.T, a, b rdma.Transport) {
	p := connect(t, a, b)
	ld := register(t, a, make([]byte, 1000))
	rd := register(t, b, make([]byte, 1000))
	for i := 0; i < 3; i++ {
		if err := p.Write(ctxT(t), rdma.Op{Local: ld.ID, Remote: rd, Len: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Read(ctxT(t), rdma.Op{Local: ld.ID, Remote: rd, Len: 500}); err != nil {
		t.Fatal(err)
	}
	_ = p.Read(ctxT(t), rdma.Op{Local: ld.ID, Remote: rd, Len: 5000})
	s := p.Stats()
	if s.Writes != 3 || s.BytesOut != 3000 || s.Reads != 1 || s.BytesIn != 500 || s.Failures != 1 {
		t.Fatalf("peer stats %+v: want 3 writes/3000 B out, 1 read/500 B in, 1 failure", s)
	}
	if s.Latency <= 0 || s.MeanLatency() <= 0 {
		t.Fatalf("peer stats %+v: no latency recorded", s)
	}
	as := a.Stats()
	if len(as.Peers) != 1 || as.Peers[0].Addr != b.Addr() || as.Peers[0].Writes != 3 {
		t.Fatalf("transport peer stats %+v", as.Peers)
	}
	if as.Regions != 1 || as.RegionBytes != 1000 {
		t.Fatalf("regions %d/%d B, want 1/1000", as.Regions, as.RegionBytes)
	}
	// The owner counts a read after its last byte is sent, which may be
	// after the initiator returned: poll.
	want := func(s rdma.ServeStats) bool {
		return s.Writes == 3 && s.BytesIn == 3000 && s.Reads == 1 && s.BytesOut == 500
	}
	deadline := time.Now().Add(Timeout)
	bs := b.Stats().Serve
	for !want(bs) && time.Now().Before(deadline) {
		runtime.Gosched()
		bs = b.Stats().Serve
	}
	if !want(bs) {
		t.Fatalf("serve stats %+v: want 3 writes/3000 B in, 1 read/500 B out", bs)
	}
}
