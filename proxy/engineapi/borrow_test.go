package engineapi_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/client"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/engineapi"
)

// holdingStore stops inline puts of namespace "held" on their way into
// the store until the test lets them go, so that other requests can run
// through the server (and through netpoll's buffers) while a put's value
// is still to be copied.
type holdingStore struct {
	proxy.Store
	entered chan struct{}
	resume  chan struct{}
}

func (s *holdingStore) Put(ctx context.Context, ns string, key, value []byte, opts cache.PutOptions) (bool, error) {
	if ns == "held" {
		s.entered <- struct{}{}
		<-s.resume
	}
	return s.Store.Put(ctx, ns, key, value, opts)
}

// TestPutValueSurvivesOtherTraffic: an inline put's value (Put, BatchPut)
// is decoded as a
// slice of its request's buffer (safecodec/borrow.go). While the put
// waits to be stored, other connections send and receive MiB values, so
// that netpoll recycles whatever buffers were released; the stored bytes
// must still be the ones sent. Framed requests (the Go client's) are lent
// their buffer until the call finishes; an unframed one has its value
// copied before Kitex releases the buffer.
func TestPutValueSurvivesOtherTraffic(t *testing.T) {
	for _, mode := range []string{"put", "batch", "unframed"} {
		t.Run(mode, func(t *testing.T) {
			framed := mode != "unframed"
			hs := &holdingStore{entered: make(chan struct{}), resume: make(chan struct{})}
			// The engine socket alone: the test is of Kitex's buffers.
			ts := startServer(t, serverOpts{capacity: 256 << 20, noPutSocket: true, wrap: func(s proxy.Store) proxy.Store {
				hs.Store = s
				return hs
			}})
			rng := rand.New(rand.NewSource(1))
			value := make([]byte, 1<<20)
			rng.Read(value)
			lentBefore := engineapi.LentRequests(ts.srv)

			done := make(chan error, 1)
			switch mode {
			case "put":
				go func() {
					_, err := ts.c.Put(context.Background(), "held", []byte("k"), value, 0)
					done <- err
				}()
			case "batch":
				go func() {
					_, err := ts.c.BatchPut(context.Background(), "held", []client.Item{{Key: []byte("k"), Value: value}})
					done <- err
				}()
			default:
				done <- nil
				conn := sendUnframedPut(t, ts.socket, "held", []byte("k"), value)
				defer conn.Close()
			}
			select {
			case <-hs.entered:
			case <-time.After(10 * time.Second):
				t.Fatal("the put never reached the store")
			}

			// Other traffic while the put is held: MiB puts and gets on
			// connections of their own.
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c, err := client.New(ts.socket)
					if err != nil {
						t.Error(err)
						return
					}
					defer c.Close()
					junk := make([]byte, 1<<20)
					for i := range 16 {
						for j := range junk {
							junk[j] = byte(g*31 + i)
						}
						key := []byte(fmt.Sprintf("junk-%d-%d", g, i))
						if _, err := c.Put(context.Background(), "other", key, junk, 0); err != nil {
							t.Error(err)
							return
						}
						if _, _, err := c.Get(context.Background(), "other", key); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(hs.resume)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			var got []byte
			deadline := time.Now().Add(10 * time.Second)
			for {
				v, found, err := ts.c.Get(context.Background(), "held", []byte("k"))
				if err != nil {
					t.Fatal(err)
				}
				if found || time.Now().After(deadline) {
					got = v
					break
				}
				time.Sleep(10 * time.Millisecond) // the unframed put is answered on its own connection
			}
			if !bytes.Equal(got, value) {
				t.Fatalf("stored value differs from the one sent (%d bytes, first difference at %d: %x vs %x)", len(got), firstDiff(got, value), got[:8], value[:8])
			}
			lent := engineapi.LentRequests(ts.srv) - lentBefore
			if framed && lent == 0 {
				t.Fatal("no request was decoded from a lent buffer")
			}
			if !framed && lent < 64 {
				t.Fatalf("%d requests lent; the other traffic's 64 puts should have been", lent)
			}
		})
	}
}

// sendUnframedPut writes a Put as an unframed ("buffered") Thrift call and
// returns the connection; the reply is read in the background.
func sendUnframedPut(t *testing.T, socket, ns string, key, value []byte) net.Conn {
	t.Helper()
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(unframedPut(&tp.PutRequest{Ns: ns, Key: key, Value: value})); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, conn)
	return conn
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
