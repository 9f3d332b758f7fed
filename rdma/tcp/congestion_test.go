package tcp

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/tidepool-kv/tidepool/internal/peerauth"
	"github.com/tidepool-kv/tidepool/rdma"
)

// connLog records the TCP connections a transport dialed or accepted.
type connLog struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (l *connLog) add(nc net.Conn) {
	l.mu.Lock()
	l.conns = append(l.conns, nc)
	l.mu.Unlock()
}

func (l *connLog) all() []net.Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]net.Conn(nil), l.conns...)
}

// loggingListener is a TCP listener (congestion controls are set on it)
// that records what it accepts.
type loggingListener struct {
	*net.TCPListener
	log *connLog
}

func (l loggingListener) Accept() (net.Conn, error) {
	nc, err := l.TCPListener.Accept()
	if err == nil {
		l.log.add(nc)
	}
	return nc, err
}

func systemCongestion(t *testing.T) string {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	if err != nil {
		t.Skipf("no system default to compare with: %v", err)
	}
	return strings.TrimSpace(string(b))
}

// TestCongestion: every transfer connection, on both ends, gets the first
// congestion control of the list the kernel accepts; a name refused once is
// not tried again; "system", or a list refused whole, keeps the system's
// default, and bytes move all the same.
func TestCongestion(t *testing.T) {
	sys := systemCongestion(t)
	encrypting := testKey(t, clusterSecret).Encrypting()
	for _, tc := range []struct {
		name  string
		list  []string
		key   *peerauth.Key
		want  string
		next  int32 // first name not refused, after the connections
		warns bool
	}{
		// reno is built into every kernel and allowed to every process.
		{"refused then reno", []string{"no_such_cc", "reno"}, nil, "reno", 1, false},
		{"encrypted", []string{"no_such_cc", "reno"}, encrypting, "reno", 1, false},
		{"system", []string{SystemCongestion, "reno"}, nil, sys, 0, false},
		{"all refused", []string{"no_such_cc"}, nil, sys, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dialed, accepted connLog
			data := bytes.Repeat([]byte("congestion"), 40<<10)
			o := newFetchOwner(t, func(c *Config) {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				c.Listener = loggingListener{ln.(*net.TCPListener), &accepted}
				c.Congestion = tc.list
				c.Key = tc.key
			}, data)
			a := newLocal(t, func(c *Config) {
				c.Congestion = tc.list
				c.Key = tc.key
				c.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
					var d net.Dialer
					nc, err := d.DialContext(ctx, network, addr)
					if err == nil {
						dialed.add(nc)
					}
					return nc, err
				}
			})
			p, err := a.Connect(context.Background(), o.tr.Addr())
			if err != nil {
				t.Fatal(err)
			}
			// Two at once: two connections.
			var wg sync.WaitGroup
			errs := make(chan error, 2)
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					mem := make([]byte, len(data))
					_, err := p.(rdma.MemFetcher).FetchMem(context.Background(), []byte("block"), func(_ []byte, n uint64, _ uint32) ([]byte, error) {
						return mem[:n], nil
					})
					if err == nil && !bytes.Equal(mem[:len(data)-16], data[16:]) {
						err = errors.New("bytes differ")
					}
					errs <- err
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			ends := append(dialed.all(), accepted.all()...)
			if len(dialed.all()) == 0 || len(accepted.all()) == 0 {
				t.Fatalf("%d connections dialed, %d accepted", len(dialed.all()), len(accepted.all()))
			}
			for _, nc := range ends {
				if got, err := CongestionOf(nc.(*net.TCPConn)); err != nil || got != tc.want {
					t.Errorf("%s -> %s: congestion %q (%v), want %q", nc.LocalAddr(), nc.RemoteAddr(), got, err, tc.want)
				}
			}
			for _, tr := range []*Transport{o.tr, a} {
				if n := tr.ccNext.Load(); n != tc.next {
					t.Errorf("first name not refused: %d, want %d", n, tc.next)
				}
				if tr.ccWarned.Load() != tc.warns {
					t.Errorf("warned %v, want %v", tr.ccWarned.Load(), tc.warns)
				}
			}
		})
	}
}

func TestCongestionNames(t *testing.T) {
	for _, bad := range [][]string{{"BBR"}, {"cubic", ""}, {"a_name_far_too_long"}, {"re no"}} {
		c := DefaultLocalConfig()
		c.Congestion = bad
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "Congestion") {
			t.Errorf("%q: %v, want a Congestion error", bad, err)
		}
	}
	for _, good := range [][]string{nil, {"system"}, {"dctcp", "cubic", "reno"}} {
		c := DefaultLocalConfig()
		c.Congestion = good
		if err := c.Validate(); err != nil {
			t.Errorf("%q: %v", good, err)
		}
	}
}
