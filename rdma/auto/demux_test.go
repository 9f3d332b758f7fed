package auto

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestDemux: the shared transfer port hands each connection to the tcp or
// the verbs side by its first bytes, replays those bytes, and drops a
// connection that stays silent.
func TestDemux(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := newDemux(ln, 300*time.Millisecond)
	defer d.Close()
	tests := []struct {
		name  string
		first []byte
		verbs bool
	}{
		{"verbs handshake", []byte("TPA2\x03rest"), true},
		{"tcp handshake", []byte("TPA2\x02rest"), false},
		{"tcp frame", []byte("TPXF\x00\x01rest"), false},
		{"verbs hello, unauthenticated", []byte("\x01\x00\x05TPVB\x01"), true},
		{"garbage goes to tcp (which refuses it)", []byte("GET / HTTP/1.1\r\n"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write(tt.first); err != nil {
				t.Fatal(err)
			}
			want, other := d.tcp, d.verbs
			if tt.verbs {
				want, other = d.verbs, d.tcp
			}
			select {
			case sc := <-want.ch:
				defer sc.Close()
				got := make([]byte, len(tt.first))
				_ = sc.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.ReadFull(sc, got); err != nil || string(got) != string(tt.first) {
					t.Fatalf("replayed %q, %v; want %q", got, err, tt.first)
				}
			case <-other.ch:
				t.Fatalf("%q went to the wrong side", tt.first)
			case <-time.After(10 * time.Second):
				t.Fatal("not delivered")
			}
		})
	}
	t.Run("silent connection dropped", func(t *testing.T) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("silent connection: %v, want EOF (closed by the demux)", err)
		}
	})
}
