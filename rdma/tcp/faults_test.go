package tcp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/protocol/frame"
	"github.com/tidepool-kv/tidepool/rdma"
	"github.com/tidepool-kv/tidepool/rdma/internal/region"
)

// flipConn flips one bit of the byte at stream offset at, in the direction
// chosen: written by us (toServer) or read by us.
type flipConn struct {
	net.Conn
	toServer bool
	at       int64
	wn, rn   atomic.Int64
}

func (c *flipConn) Write(p []byte) (int, error) {
	if c.toServer {
		q := bytes.Clone(p)
		base := c.wn.Add(int64(len(p))) - int64(len(p))
		if i := c.at - base; i >= 0 && i < int64(len(q)) {
			q[i] ^= 0x10
		}
		return c.Conn.Write(q)
	}
	return c.Conn.Write(p)
}

func (c *flipConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.toServer {
		base := c.rn.Add(int64(n)) - int64(n)
		if i := c.at - base; i >= 0 && i < int64(n) {
			p[i] ^= 0x10
		}
	}
	return n, err
}

func flipDialer(toServer bool, at int64) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &flipConn{Conn: c, toServer: toServer, at: at}, nil
	}
}

func TestCorruptionDetected(t *testing.T) {
	const n = 256 << 10
	// Stream offsets past the hello (48 bytes each way) and the first
	// frame header land in the payload.
	const payloadByte = 2*frame.HeaderSize + 1000
	tests := []struct {
		name     string
		toServer bool
		write    bool
	}{
		{"write payload corrupted on the way", true, true},
		{"read payload corrupted on the way", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newLocal(t, func(c *Config) { c.Dial = flipDialer(tt.toServer, payloadByte) })
			b := newLocal(t, nil)
			src := bytes.Repeat([]byte("tidepool"), n/8)
			ld, _ := a.Register(bytes.Clone(src))
			rbuf := make([]byte, n)
			if !tt.write {
				copy(rbuf, src)
			}
			rd, _ := b.Register(rbuf)
			p, err := a.Connect(context.Background(), b.Addr())
			if err != nil {
				t.Fatal(err)
			}
			op := rdma.Op{Local: ld.ID, Remote: rd, Len: n}
			if tt.write {
				err = p.Write(context.Background(), op)
			} else {
				err = p.Read(context.Background(), op)
			}
			if !errors.Is(err, rdma.ErrChecksum) {
				t.Fatalf("got %v, want ErrChecksum", err)
			}
			if tt.write && !bytes.Equal(rbuf, make([]byte, n)) {
				t.Fatal("a corrupted write chunk was applied")
			}
			// The next transfer (a fresh stream offset) goes through.
			if err := p.Write(context.Background(), op); err != nil {
				t.Fatalf("transfer after corruption: %v", err)
			}
		})
	}
}

func TestConnectRefusesOtherVersion(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var hb [frame.HeaderSize]byte
		if _, err := io.ReadFull(c, hb[:]); err != nil {
			return
		}
		h, _ := frame.Decode(hb[:])
		out := frame.Encode(hb[:], frame.Header{Op: frame.OpHelloAck, RequestID: h.RequestID})
		out[4] = frame.Version + 1 // a future peer
		_, _ = c.Write(out)
		_, _ = io.Copy(io.Discard, c)
	}()
	a := newLocal(t, nil)
	_, err = a.Connect(context.Background(), ln.Addr().String())
	if !errors.Is(err, rdma.ErrUnreachable) || !errors.Is(err, rdma.ErrProtocol) || !strings.Contains(err.Error(), "version") {
		t.Fatalf("Connect to a peer of another frame version: %v", err)
	}
}

func TestIdleConnectionClosedByPeerIsRetried(t *testing.T) {
	a := newLocal(t, nil)
	b := newLocal(t, func(c *Config) { c.IdleTimeout = 50 * time.Millisecond })
	ld, _ := a.Register(make([]byte, 4096))
	rd, _ := b.Register(make([]byte, 4096))
	p, err := a.Connect(context.Background(), b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	// Wait until b dropped the idle connection.
	deadline := time.Now().Add(5 * time.Second)
	for b.Stats().Serve.Conns != 0 {
		if time.Now().After(deadline) {
			t.Fatal("b kept the idle connection")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := p.Write(context.Background(), rdma.Op{Local: ld.ID, Remote: rd, Len: 4096}); err != nil {
		t.Fatalf("write over a pooled connection the peer closed: %v", err)
	}
}

// slowConn delays every write, so that a 16 MiB transfer is surely in
// flight when the peer dies.
type slowConn struct{ net.Conn }

func (c slowConn) Write(p []byte) (int, error) {
	var n int
	for len(p) > 0 {
		m := min(len(p), 64<<10)
		time.Sleep(200 * time.Microsecond) // throttle, not a wait for a condition
		k, err := c.Conn.Write(p[:m])
		n += k
		if err != nil {
			return n, err
		}
		p = p[m:]
	}
	return n, nil
}

func TestPeerKilledMidWrite(t *testing.T) {
	a := newLocal(t, func(c *Config) {
		c.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			nc, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return slowConn{nc}, nil
		}
	})
	b := newLocal(t, nil)
	const n = 16 << 20
	ld, _ := a.Register(make([]byte, n))
	rd, _ := b.Register(make([]byte, n))
	p, err := a.Connect(context.Background(), b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Write(context.Background(), rdma.Op{Local: ld.ID, Remote: rd, Len: n}) }()
	deadline := time.Now().Add(10 * time.Second)
	for b.Stats().Serve.BytesIn == 0 {
		if time.Now().After(deadline) {
			t.Fatal("write never started")
		}
		time.Sleep(time.Millisecond)
	}
	_ = b.Close()
	select {
	case err := <-done:
		if !errors.Is(err, rdma.ErrPeerLost) {
			t.Fatalf("write to a peer killed mid-transfer: %v, want ErrPeerLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("write hung after the peer died")
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero config (all defaults): %v", err)
	}
	err := Config{ChunkSize: frame.MaxLength + 1, MaxConnsPerPeer: -1, DialTimeout: -1, IOTimeout: -1, IdleTimeout: -1}.Validate()
	for _, w := range []string{"MaxConnsPerPeer", "ChunkSize", "DialTimeout", "IOTimeout", "IdleTimeout"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Validate() = %v, missing %s", err, w)
		}
	}
}

// FuzzServeConn feeds arbitrary bytes, split at arbitrary points, to a
// served connection after a valid hello: the server must not panic, hang or
// touch memory outside its registered region.
func FuzzServeConn(f *testing.F) {
	var hb [frame.HeaderSize]byte
	w := func(h frame.Header, p []byte) []byte {
		h.Length, h.CRC = uint32(len(p)), frame.Checksum(p)
		return append(bytes.Clone(frame.Encode(hb[:], h)), p...)
	}
	const key = 0
	f.Add(w(frame.Header{Op: frame.OpWrite, Flags: frame.FlagLast, Region: 1, Key: key, Offset: 8}, []byte("hello")), uint16(7))
	f.Add(append(w(frame.Header{Op: frame.OpWrite, Region: 1, Key: key}, []byte("ab")),
		w(frame.Header{Op: frame.OpWrite, Flags: frame.FlagLast, Region: 1, Key: key, Offset: 2}, []byte("cd"))...), uint16(50))
	// Summed (end-to-end checked) writes and reads, and a write that mixes.
	f.Add(append(w(frame.Header{Op: frame.OpWrite, Flags: frame.FlagSummed, Region: 1, Key: key}, []byte("ab")),
		w(frame.Header{Op: frame.OpWrite, Flags: frame.FlagLast | frame.FlagSummed, Region: 1, Key: key, Offset: 2}, []byte("cd"))...), uint16(60))
	f.Add(append(w(frame.Header{Op: frame.OpWrite, Flags: frame.FlagSummed, Region: 1, Key: key}, []byte("ab")),
		w(frame.Header{Op: frame.OpWrite, Flags: frame.FlagLast, Region: 1, Key: key, Offset: 2}, []byte("cd"))...), uint16(10))
	f.Add(w(frame.Header{Op: frame.OpRead, Flags: frame.FlagSummed, Region: 1, Key: key, Offset: 100, Length: 300}, nil), uint16(5))
	f.Add(w(frame.Header{Op: frame.OpRead, Region: 1, Key: key, Offset: 4000, Length: 200}, nil), uint16(1))
	f.Add(w(frame.Header{Op: frame.OpRead, Region: 9, Key: key, Length: 1}, nil), uint16(3))
	f.Add([]byte("garbage"), uint16(2))
	// Named reads: answered from the region, past its end (refused by the
	// owner), metadata only.
	f.Add(w(frame.Header{Op: frame.OpFetch, RequestID: 4}, []byte{1, 2}), uint16(9))
	f.Add(w(frame.Header{Op: frame.OpFetch, RequestID: 5}, []byte{255, 255}), uint16(30))
	f.Add(append(w(frame.Header{Op: frame.OpFetch, RequestID: 6}, nil),
		w(frame.Header{Op: frame.OpRead, Region: 1, Key: key, Length: 10}, nil)...), uint16(48))
	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		tr, err := New(DefaultLocalConfig(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		tr.table = region.NewTableWithKeys(func() uint32 { return key })
		guard := make([]byte, 3*4096)
		if d, _ := tr.Register(guard[4096 : 2*4096 : 2*4096]); d.ID != 1 {
			t.Fatalf("region id %d, the seeds address 1", d.ID)
		}
		tr.HandleFetch(func(_ context.Context, req []byte) rdma.FetchAnswer {
			if len(req) >= 2 {
				return rdma.FetchAnswer{Meta: req, Region: 1, Offset: uint64(req[0]) * 16, Len: uint64(req[1]) * 32}
			}
			return rdma.FetchAnswer{Meta: req}
		})
		cli, srv := net.Pipe()
		tr.wg.Add(1)
		tr.mu.Lock()
		tr.inbound[srv] = struct{}{}
		tr.mu.Unlock()
		go tr.serveConn(srv)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = io.Copy(io.Discard, cli) }()
		_ = cli.SetDeadline(time.Now().Add(5 * time.Second))
		hello := frame.Encode(hb[:], frame.Header{Op: frame.OpHello, RequestID: 1})
		if _, err := cli.Write(hello); err != nil {
			t.Fatal(err)
		}
		for len(data) > 0 {
			n := min(len(data), max(1, int(split)))
			if _, err := cli.Write(data[:n]); err != nil {
				break // the server hung up on bad input
			}
			data = data[n:]
		}
		_ = cli.Close()
		wg.Wait()
		if !bytes.Equal(guard[:4096], make([]byte, 4096)) || !bytes.Equal(guard[2*4096:], make([]byte, 4096)) {
			t.Fatal("server wrote outside the registered region")
		}
	})
}
