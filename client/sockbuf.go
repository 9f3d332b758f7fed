package client

import (
	"net"
	"syscall"
	"time"

	"github.com/cloudwego/kitex/pkg/remote"
	kitexnetpoll "github.com/cloudwego/kitex/pkg/remote/trans/netpoll"
)

// requestSendBuffer is the send buffer asked for each connection to the
// sidecar (SO_SNDBUF; Linux doubles it and caps the request at
// net.core.wmem_max, 208 KiB by default, 4 MiB on hosts tuned for
// throughput). On a Unix socket the sender's buffer bounds what is queued
// for the reader: with the default a 1 MiB inline put is written in about
// five pieces, each waiting for the sidecar to drain the queue and for
// the poller to wake the writer again; above the request's size it is one
// write. The sidecar does the same for its replies (engineapi/sockbuf.go).
const requestSendBuffer = 4 << 20

// sndbufDialer is Kitex's netpoll dialer, setting requestSendBuffer on
// every connection it makes. Best effort: a refusal only costs speed.
type sndbufDialer struct{ remote.Dialer }

func (d sndbufDialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	conn, err := d.Dialer.DialTimeout(network, address, timeout)
	if err != nil {
		return nil, err
	}
	if fc, ok := conn.(interface{ Fd() int }); ok {
		_ = syscall.SetsockoptInt(fc.Fd(), syscall.SOL_SOCKET, syscall.SO_SNDBUF, requestSendBuffer)
	}
	return conn, nil
}

func newDialer() remote.Dialer { return sndbufDialer{kitexnetpoll.NewDialer()} }
