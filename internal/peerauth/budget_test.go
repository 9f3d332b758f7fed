package peerauth

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// flood holds n silent connections to addr, each reopened as soon as the
// listener closes it, until stop is closed; it returns a wait function.
func flood(addr string, n int, stop chan struct{}) (opened *atomic.Int64, wait func()) {
	opened = new(atomic.Int64)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.Dial("tcp", addr)
				if err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				opened.Add(1)
				start := time.Now()
				go func() { <-stop; c.Close() }()
				_, _ = io.Copy(io.Discard, c) // until the listener closes it
				c.Close()
				if time.Since(start) < 20*time.Millisecond {
					time.Sleep(20 * time.Millisecond) // displaced at once: reopen after a pause
				}
			}
		}()
	}
	return opened, wg.Wait
}

// TestListenerHandshakeBudget: strangers holding hundreds of silent
// connections open, from the members' own address and reopened as they are
// closed, take only the handshake budget (at most MaxHandshakesPerSource
// in their handshake at once); every member connection in the meantime
// authenticates, displacing a silent one; authenticated connections stay
// apart from the budget.
func TestListenerHandshakeBudget(t *testing.T) {
	k := mustKey(t, secret, "")
	l := listen(t, ListenerConfig{Key: k, Purpose: PurposePeerAPI, MaxConns: 32, HandshakeTimeout: 5 * time.Second})
	go func() { // the server: hold what is accepted
		for {
			if _, err := l.Accept(); err != nil {
				return
			}
		}
	}()
	stop := make(chan struct{})
	opened, wait := flood(l.Addr().String(), 300, stop)
	defer func() { close(stop); wait() }()
	waitStat(t, l, "the flood displacing its own", func(s ListenerStats) bool { return s.Displaced > 300 })
	var members []net.Conn
	defer func() {
		for _, c := range members {
			c.Close()
		}
	}()
	// A member whose goroutine waits behind the flood's hundreds between
	// its connect and its hello (they share this process's two threads)
	// can be displaced before its hello arrives: it tries again, as a
	// peer's next call does.
	retries := 0
	for i := 0; i < 20; i++ {
		var err error
		for try := 0; try < 3; try++ {
			var c net.Conn
			if c, err = net.Dial("tcp", l.Addr().String()); err != nil {
				t.Fatal(err)
			}
			if _, err = k.Client(c, PurposePeerAPI, time.Now().Add(5*time.Second)); err == nil {
				members = append(members, c)
				break
			}
			c.Close()
			retries++
		}
		if err != nil {
			t.Fatalf("member %d during the flood, three tries (%d stranger connections so far, %+v): %v", i, opened.Load(), l.Stats(), err)
		}
		if s := l.Stats(); s.Handshaking > 16 {
			t.Fatalf("%d handshakes at once from one source, budget 16", s.Handshaking)
		}
	}
	waitStat(t, l, "members served", func(s ListenerStats) bool { return s.Accepted == 20 && s.Active == 20 })
	t.Logf("%d stranger connections opened, %d member retries, %+v", opened.Load(), retries, l.Stats())
}

// TestListenerHandshakeBudgetOrder: over the budget, the oldest
// connection that sent nothing is displaced, not one whose hello arrived.
func TestListenerHandshakeBudgetOrder(t *testing.T) {
	k := mustKey(t, secret, "")
	l := listen(t, ListenerConfig{Key: k, Purpose: PurposeTransfer, MaxHandshakes: 4, MaxHandshakesPerSource: 4})
	// A stalled client: a valid hello, then nothing.
	stalled, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	var hello [helloLen]byte
	copy(hello[:], magic)
	hello[len(magic)] = byte(PurposeTransfer)
	if _, err := stalled.Write(hello[:]); err != nil {
		t.Fatal(err)
	}
	waitStat(t, l, "one handshake", func(s ListenerStats) bool { return s.Handshaking == 1 })
	var silent []net.Conn
	for i := 0; i < 6; i++ {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		silent = append(silent, c)
		waitStat(t, l, "handshakes within the budget", func(s ListenerStats) bool {
			return s.Handshaking == min(int64(i)+2, 4) && s.Displaced == max(int64(i)-2, 0)
		})
	}
	// The three oldest silent ones went; the stalled one and the newest stay.
	for i, c := range silent {
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		closed := err == io.EOF
		if want := i < 3; closed != want {
			t.Fatalf("silent connection %d: closed %v (%v), want %v", i, closed, err, want)
		}
	}
	stalled.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(stalled, make([]byte, nonceLen+macLen)); err != nil {
		t.Fatalf("the connection whose hello arrived was displaced: %v", err)
	}
}
