package peerauth

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/internal/fdtest"
)

func mustKey(t *testing.T, secret, label string) *Key {
	t.Helper()
	k, err := NewKey([]byte(secret), label)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

const secret = "0123456789abcdef-cluster-secret"

func TestNewKeyRefusesShortSecret(t *testing.T) {
	if _, err := NewKey([]byte("short"), ""); !errors.Is(err, ErrSecret) {
		t.Fatalf("NewKey(short): %v, want ErrSecret", err)
	}
}

// TestHandshake: both sides succeed only with the same secret, label and
// purpose; otherwise both fail (the server never hands the connection out).
func TestHandshake(t *testing.T) {
	srv := mustKey(t, secret, "prod")
	for _, tc := range []struct {
		name    string
		client  *Key
		purpose Purpose
		ok      bool
	}{
		{"same credentials", mustKey(t, secret, "prod"), PurposePeerAPI, true},
		{"other secret", mustKey(t, secret+"x", "prod"), PurposePeerAPI, false},
		{"other label", mustKey(t, secret, "staging"), PurposePeerAPI, false},
		{"other port", mustKey(t, secret, "prod"), PurposeTransfer, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			done := make(chan error, 1)
			go func() {
				_, err := srv.Server(b, PurposePeerAPI, time.Now().Add(5*time.Second))
				if err != nil {
					b.Close()
				}
				done <- err
			}()
			_, cerr := tc.client.Client(a, tc.purpose, time.Now().Add(5*time.Second))
			if cerr != nil {
				a.Close() // as a dialer does
			}
			serr := <-done
			if (cerr == nil) != tc.ok || (serr == nil) != tc.ok {
				t.Fatalf("client %v, server %v; want success %v", cerr, serr, tc.ok)
			}
			if !tc.ok && !errors.Is(serr, ErrRefused) {
				t.Fatalf("server error %v, want ErrRefused", serr)
			}
		})
	}
}

func TestMembershipProof(t *testing.T) {
	k := mustKey(t, secret, "prod")
	p := k.Proof("member", []byte("node-a"))
	if !k.Verify("member", []byte("node-a"), p) {
		t.Fatal("own proof refused")
	}
	for _, other := range []struct {
		k    *Key
		what string
		msg  string
	}{{mustKey(t, secret+"x", "prod"), "member", "node-a"}, {k, "member", "node-b"}, {k, "other", "node-a"}} {
		if other.k.Verify(other.what, []byte(other.msg), p) {
			t.Fatalf("proof accepted for %q %q", other.what, other.msg)
		}
	}
}

func listen(t *testing.T, cfg ListenerConfig) *Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := NewListener(ln, cfg, nil)
	t.Cleanup(func() { l.Close() })
	return l
}

func waitStat(t *testing.T, l *Listener, what string, f func(ListenerStats) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f(l.Stats()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: never; stats %+v", what, l.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestListenerRefusesStrangers: bytes from a client without the secret are
// never handed to the server; the connection is closed and counted.
func TestListenerRefusesStrangers(t *testing.T) {
	l := listen(t, ListenerConfig{Key: mustKey(t, secret, ""), Purpose: PurposePeerAPI})
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	garbage := make([]byte, 4096)
	for i := range garbage {
		garbage[i] = 0xff
	}
	c.Write(garbage)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, _ := io.Copy(io.Discard, c); n != 0 {
		t.Fatalf("got %d bytes back", n)
	}
	waitStat(t, l, "auth failure counted", func(s ListenerStats) bool { return s.AuthFailures == 1 && s.Active == 0 })
	if s := l.Stats(); s.Accepted != 0 {
		t.Fatalf("stranger accepted: %+v", s)
	}
}

// TestListenerCapsConnections: with MaxConns open, the next connection is
// closed at once and counted; once one closes, a new one is served.
func TestListenerCapsConnections(t *testing.T) {
	k := mustKey(t, secret, "")
	l := listen(t, ListenerConfig{Key: k, Purpose: PurposeTransfer, MaxConns: 2})
	go func() { // the server: hold what is accepted
		for {
			if _, err := l.Accept(); err != nil {
				return
			}
		}
	}()
	dial := func() (net.Conn, error) {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			return nil, err
		}
		_, err = k.Client(c, PurposeTransfer, time.Now().Add(5*time.Second))
		return c, err
	}
	var held []net.Conn
	for i := 0; i < 2; i++ {
		c, err := dial()
		if err != nil {
			t.Fatalf("connection %d under the cap: %v", i, err)
		}
		held = append(held, c)
	}
	c, err := dial()
	if err == nil {
		t.Fatal("third connection over a cap of 2 authenticated")
	}
	c.Close()
	waitStat(t, l, "one over the limit, two served", func(s ListenerStats) bool {
		return s.OverLimit == 1 && s.Accepted == 2 && s.Active == 2
	})
	for _, c := range held {
		c.Close()
	}
}

// TestListenerIdleTimeout: an accepted connection that sends nothing is
// cut by its reader's capped deadline, whatever deadline the server asked.
func TestListenerIdleTimeout(t *testing.T) {
	k := mustKey(t, secret, "")
	l := listen(t, ListenerConfig{Key: k, Purpose: PurposePeerAPI, IdleTimeout: 100 * time.Millisecond})
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := k.Client(c, PurposePeerAPI, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	sc, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	sc.SetReadDeadline(time.Time{}) // "no deadline" is capped at the idle timeout
	_, err = sc.Read(make([]byte, 1))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read on an idle connection: %v, want a timeout", err)
	}
	sc.Close()
	sc.Close() // closed once: the count stays right
	waitStat(t, l, "released", func(s ListenerStats) bool { return s.Active == 0 })
}

// TestListenerSurvivesEMFILE: accept failing with "too many open files"
// backs off and keeps accepting once descriptors are free again.
func TestListenerSurvivesEMFILE(t *testing.T) {
	k := mustKey(t, secret, "")
	l := listen(t, ListenerConfig{Key: k, Purpose: PurposeTransfer})
	release := fdtest.Exhaust(t, 1)
	c, err := net.Dial("tcp", l.Addr().String()) // takes the last descriptor
	if err != nil {
		release()
		t.Fatal(err)
	}
	defer c.Close()
	waitStat(t, l, "accept error survived", func(s ListenerStats) bool { return s.AcceptErrors >= 1 })
	release()
	if _, err := k.Client(c, PurposeTransfer, time.Now().Add(10*time.Second)); err != nil {
		t.Fatalf("handshake after EMFILE: %v", err)
	}
	if _, err := l.Accept(); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkHandshake: one authenticated connection set up on loopback
// (dial, handshake, accept), the cost paid once per pooled connection.
//
//	go test -run XXX -bench Handshake ./internal/peerauth/
func BenchmarkHandshake(b *testing.B) {
	k, err := NewKey([]byte(secret), "bench")
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		key  *Key
	}{{"plain", nil}, {"secret", k}} {
		b.Run(tc.name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			l := NewListener(ln, ListenerConfig{Key: tc.key, Purpose: PurposePeerAPI}, nil)
			defer l.Close()
			for i := 0; i < b.N; i++ {
				c, err := net.Dial("tcp", l.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				if tc.key != nil {
					if _, err := tc.key.Client(c, PurposePeerAPI, time.Now().Add(5*time.Second)); err != nil {
						b.Fatal(err)
					}
				}
				sc, err := l.Accept()
				if err != nil {
					b.Fatal(err)
				}
				sc.Close()
				c.Close()
			}
		})
	}
}

// recordConn records what is written through it.
type recordConn struct {
	net.Conn
	mu  sync.Mutex
	out []byte
	// flip, when >= 0, flips a bit of the byte at that written offset.
	flip int
}

func (c *recordConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	q := bytes.Clone(p)
	if i := c.flip - len(c.out); c.flip >= 0 && i >= 0 && i < len(q) {
		q[i] ^= 0x04
	}
	c.out = append(c.out, q...)
	c.mu.Unlock()
	return c.Conn.Write(q)
}

// encryptedPair returns both ends of an encrypted connection over loopback
// TCP; the client's raw writes after the handshake are recorded.
func encryptedPair(t *testing.T, flipAt int) (cli, srv net.Conn, rec *recordConn) {
	t.Helper()
	k := mustKey(t, secret, "").Encrypting()
	l := listen(t, ListenerConfig{Key: k, Purpose: PurposeTransfer})
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rec = &recordConn{Conn: c, flip: -1}
	if cli, err = k.Client(rec, PurposeTransfer, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	rec.out = nil // the handshake
	if flipAt >= 0 {
		rec.flip = flipAt
	}
	rec.mu.Unlock()
	if srv, err = l.Accept(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return cli, srv, rec
}

// TestEncryptedConnection: with Encrypting keys the bytes travel as
// AES-GCM records (no plaintext on the wire), arrive intact in both
// directions, and a flipped bit breaks the connection instead of
// delivering other bytes.
func TestEncryptedConnection(t *testing.T) {
	msg := bytes.Repeat([]byte("block-bytes-in-the-clear "), 5000) // 125 KB: several records
	cli, srv, rec := encryptedPair(t, -1)
	go func() { _, _ = cli.Write(msg) }()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(srv, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("server read %v (equal %v)", err, bytes.Equal(got, msg))
	}
	rec.mu.Lock()
	wire := bytes.Clone(rec.out)
	rec.mu.Unlock()
	if bytes.Contains(wire, []byte("block-bytes")) {
		t.Fatal("plaintext on the wire")
	}
	go func() { _, _ = srv.Write([]byte("reply")) }()
	reply := make([]byte, 5)
	if _, err := io.ReadFull(cli, reply); err != nil || string(reply) != "reply" {
		t.Fatalf("client read %q %v", reply, err)
	}

	cli, srv, _ = encryptedPair(t, 100) // a bit flipped inside the first record
	go func() { _, _ = cli.Write(msg[:1000]) }()
	if _, err := io.ReadFull(srv, make([]byte, 1000)); !errors.Is(err, ErrRecord) {
		t.Fatalf("tampered record: %v, want ErrRecord", err)
	}
}

// TestEncryptionSettingsMustAgree: an encrypting end and a plain end with
// the same secret do not connect.
func TestEncryptionSettingsMustAgree(t *testing.T) {
	k := mustKey(t, secret, "")
	for _, tc := range []struct{ srv, cli *Key }{{k, k.Encrypting()}, {k.Encrypting(), k}} {
		l := listen(t, ListenerConfig{Key: tc.srv, Purpose: PurposePeerAPI})
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tc.cli.Client(c, PurposePeerAPI, time.Now().Add(5*time.Second)); !errors.Is(err, ErrRefused) {
			t.Fatalf("server encrypts %v, client %v: %v, want ErrRefused", tc.srv.Encrypts(), tc.cli.Encrypts(), err)
		}
		c.Close()
		waitStat(t, l, "refusal", func(s ListenerStats) bool { return s.AuthFailures == 1 })
	}
}

// BenchmarkRecordCrypto: sealing and opening one full record (AES-256-GCM,
// 16 KiB), the CPU cost encryption adds per byte on each end.
//
//	go test -run XXX -bench RecordCrypto ./internal/peerauth/
func BenchmarkRecordCrypto(b *testing.B) {
	k := bytes.Repeat([]byte{7}, 32)
	w, _ := gcm(k)
	r, _ := gcm(k)
	plain := make([]byte, maxRecord)
	buf := make([]byte, 0, maxRecord+w.Overhead())
	var nb [12]byte
	b.SetBytes(maxRecord)
	for i := 0; i < b.N; i++ {
		ct := w.Seal(buf[:0], nonce(nb[:], uint64(i)), plain, nil)
		if _, err := r.Open(ct[:0], nonce(nb[:], uint64(i)), ct, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// TestEncryptedRecordLengthBounded: a record header claiming 2^31-1 bytes
// is refused at once; nothing of that size is read or allocated.
func TestEncryptedRecordLengthBounded(t *testing.T) {
	for _, n := range []uint32{0x7fffffff, 0xffffffff, 3} {
		_, srv, rec := encryptedPair(t, -1)
		var hdr [4]byte
		hdr[0], hdr[1], hdr[2], hdr[3] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
		if _, err := rec.Conn.Write(hdr[:]); err != nil { // under the sealing layer
			t.Fatal(err)
		}
		if _, err := srv.Read(make([]byte, 16)); !errors.Is(err, ErrRecord) {
			t.Fatalf("length %#x: %v, want ErrRecord", n, err)
		}
		if _, err := srv.Read(make([]byte, 16)); !errors.Is(err, ErrRecord) {
			t.Fatalf("length %#x, second read: %v, want the same error", n, err)
		}
	}
}
