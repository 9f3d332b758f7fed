package peerapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cloudwego/gopkg/bufiox"
	kclient "github.com/cloudwego/kitex/client"
	"github.com/cloudwego/kitex/pkg/remote"

	"github.com/tidepool-kv/tidepool/internal/peerauth"

	"github.com/tidepool-kv/tidepool/protocol/gen/peer"
)

// apiConn is a Kitex client for one peer's API. It calls through the
// generic kclient.Client (as the generated wrapper does) because the
// generated wrapper cannot be closed.
//
// Kitex panics on a call through a client that was closed ("client is
// already closed", and reads its closed flag unguarded), so the two never
// meet here: a call enters under mu and is refused with ErrClosed once
// Close began, and the Kitex client is closed by whichever comes last of
// Close and the last call in flight. Every call is also counted in the
// owner's calls, which Client.Close waits for.
type apiConn struct {
	kc    kclient.Client
	calls *sync.WaitGroup // the owning Client's calls in flight

	timeout time.Duration // bounds a call whose context has no earlier deadline

	mu       sync.Mutex
	inflight int  // calls entered and not yet returned
	closing  bool // Close began: no call enters
	shut     bool // kc is closed
	closeErr error
}

func newAPIConn(kc kclient.Client, calls *sync.WaitGroup, timeout time.Duration) *apiConn {
	return &apiConn{kc: kc, calls: calls, timeout: timeout}
}

// enter admits one call, or refuses it once Close began.
func (a *apiConn) enter() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closing {
		return false
	}
	a.inflight++
	a.calls.Add(1) // before Close marks closing: never races Client.Close's Wait
	return true
}

// exit ends a call entered by enter; the last call after Close closes kc.
func (a *apiConn) exit() {
	a.mu.Lock()
	a.inflight--
	last := a.closing && a.inflight == 0
	a.mu.Unlock()
	if last {
		a.shutKitex()
	}
	a.calls.Done()
}

// call makes one RPC; a declared PeerError comes back as err, a call on a
// closed connection as ErrClosed.
func (a *apiConn) call(ctx context.Context, method string, args any, res interface{ GetErr() *peer.PeerError }) error {
	if !a.enter() {
		return ErrClosed
	}
	defer a.exit()
	// Bounded on the connection (deadline.go): Kitex then calls on this
	// goroutine.
	b := callBounds{ctx: ctx, deadline: time.Now().Add(a.timeout)}
	own, ok := ctx.Deadline()
	if ok && own.Before(b.deadline) {
		b.deadline = own
	}
	if err := a.kc.Call(context.WithValue(context.WithoutCancel(ctx), callKey{}, b), method, args, res); err != nil {
		if ok && b.deadline == own && !time.Now().Before(own) {
			<-ctx.Done() // the caller's own deadline: let its context say so, as Kitex's timeout did
		}
		return err
	}
	if e := res.GetErr(); e != nil {
		return e
	}
	return nil
}

func (a *apiConn) Lookup(ctx context.Context, req *peer.LookupRequest) (*peer.LookupResponse, error) {
	args, res := peer.TidepoolPeerLookupArgs{Req: req}, peer.TidepoolPeerLookupResult{}
	if err := a.call(ctx, "Lookup", &args, &res); err != nil {
		return nil, err
	}
	if res.Success == nil {
		return &peer.LookupResponse{}, nil
	}
	return res.Success, nil
}

func (a *apiConn) Acquire(ctx context.Context, req *peer.AcquireRequest) (*peer.AcquireResponse, error) {
	args, res := peer.TidepoolPeerAcquireArgs{Req: req}, peer.TidepoolPeerAcquireResult{}
	if err := a.call(ctx, "Acquire", &args, &res); err != nil {
		return nil, err
	}
	if res.Success == nil {
		return &peer.AcquireResponse{}, nil
	}
	return res.Success, nil
}

func (a *apiConn) Release(ctx context.Context, req *peer.ReleaseRequest) (*peer.ReleaseResponse, error) {
	args, res := peer.TidepoolPeerReleaseArgs{Req: req}, peer.TidepoolPeerReleaseResult{}
	if err := a.call(ctx, "Release", &args, &res); err != nil {
		return nil, err
	}
	return &peer.ReleaseResponse{}, nil
}

func (a *apiConn) Put(ctx context.Context, req *peer.PutRequest) (*peer.PutResponse, error) {
	args, res := peer.TidepoolPeerPutArgs{Req: req}, peer.TidepoolPeerPutResult{}
	if err := a.call(ctx, "Put", &args, &res); err != nil {
		return nil, err
	}
	if res.Success == nil {
		return &peer.PutResponse{}, nil
	}
	return res.Success, nil
}

func (a *apiConn) Delete(ctx context.Context, req *peer.DeleteRequest) (*peer.DeleteResponse, error) {
	args, res := peer.TidepoolPeerDeleteArgs{Req: req}, peer.TidepoolPeerDeleteResult{}
	if err := a.call(ctx, "Delete", &args, &res); err != nil {
		return nil, err
	}
	if res.Success == nil {
		return &peer.DeleteResponse{}, nil
	}
	return res.Success, nil
}

func (a *apiConn) Clear(ctx context.Context, req *peer.ClearRequest) (*peer.ClearResponse, error) {
	args, res := peer.TidepoolPeerClearArgs{Req: req}, peer.TidepoolPeerClearResult{}
	if err := a.call(ctx, "Clear", &args, &res); err != nil {
		return nil, err
	}
	if res.Success == nil {
		return &peer.ClearResponse{}, nil
	}
	return res.Success, nil
}

// Close refuses calls from now on and closes the connections: at once when
// no call is in flight, else as the last one returns (Close does not wait
// for it; Client.Close does). Safe to call twice.
func (a *apiConn) Close() error {
	a.mu.Lock()
	if a.closing {
		a.mu.Unlock()
		return nil
	}
	a.closing = true
	idle := a.inflight == 0
	a.mu.Unlock()
	if idle {
		return a.shutKitex()
	}
	return nil
}

// shutKitex closes the Kitex client once (its connection pool reports a
// second Close as an error); no call is in flight or can enter.
func (a *apiConn) shutKitex() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.shut {
		a.shut = true
		if c, ok := a.kc.(interface{ Close() error }); ok {
			a.closeErr = c.Close()
		}
	}
	return a.closeErr
}

// authDialer dials a peer's API and, with a key, runs the client side of
// the handshake before Kitex writes anything: a server that cannot prove
// it holds the cluster secret never sees a call.
type authDialer struct{ key *peerauth.Key }

func (d authDialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	deadline := time.Now().Add(timeout)
	nd := net.Dialer{Deadline: deadline}
	nc, err := nd.Dial(network, address)
	if err != nil {
		return nil, err
	}
	raw := nc
	if d.key != nil {
		ac, err := d.key.Client(nc, peerauth.PurposePeerAPI, deadline)
		if err != nil {
			_ = nc.Close()
			return nil, fmt.Errorf("peerapi: %s: %w", address, err)
		}
		nc = ac
	}
	return newClientConn(nc, raw), nil
}

// clientConn is what Kitex's Go net transport expects of a connection
// (gonet's own is unexported): buffered, closed once, and able to tell the
// connection pool that the peer has closed it (IsActive).
type clientConn struct {
	net.Conn
	raw    net.Conn     // the TCP connection under any encryption
	dl     callDeadline // the bounds of the call holding it (deadline.go)
	r      *bufiox.DefaultReader
	w      *bufiox.DefaultWriter
	closed atomic.Bool
}

var _ remote.IsActive = (*clientConn)(nil)

func newClientConn(nc, raw net.Conn) *clientConn {
	// Answers are read whole frames at a time (frame.go).
	return &clientConn{Conn: nc, raw: raw, r: bufiox.NewDefaultReader(&frameReader{r: nc}), w: bufiox.NewDefaultWriter(nc)}
}

// IsActive reports whether the connection is still open at both ends:
// Kitex's pool calls it before reusing an idle connection, so that a peer
// that restarted (or closed an idle connection) costs no failed call. It
// peeks at the socket without blocking: end of stream or an error means
// the peer is gone.
func (c *clientConn) IsActive() bool {
	if c.closed.Load() {
		return false
	}
	sc, ok := c.raw.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := true
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case errors.Is(err, syscall.EAGAIN):
			// nothing to read: open
		case err != nil || n == 0:
			alive = false // error, or end of stream
		}
		return true // never wait
	})
	return alive && err == nil
}

func (c *clientConn) Reader() *bufiox.DefaultReader { return c.r }
func (c *clientConn) Writer() *bufiox.DefaultWriter { return c.w }
func (c *clientConn) Read(b []byte) (int, error)    { return c.r.Read(b) }

// Close closes the connection once.
func (c *clientConn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return net.ErrClosed
	}
	_ = c.r.Release(nil)
	return c.Conn.Close()
}
