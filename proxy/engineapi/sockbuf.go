package engineapi

import (
	"context"
	"net"

	"github.com/cloudwego/kitex/pkg/remote"
	"syscall"
)

// replySendBuffer is the send buffer asked for each engine connection
// (SO_SNDBUF; Linux doubles it and caps the request at net.core.wmem_max,
// 208 KiB by default, 4 MiB on hosts tuned for throughput). On a Unix
// socket the sender's buffer bounds what is queued for the reader: with
// the default, a 1 MiB reply takes about five partial writes, each waiting
// for the engine to drain the queue and for the poller to wake the writer
// again; with a buffer above the reply size it is one write.
const replySendBuffer = 4 << 20

// sockBufHandler sets replySendBuffer on every accepted connection. Best
// effort: a refusal (or a cap) only costs speed.
type sockBufHandler struct{}

var _ remote.InboundHandler = sockBufHandler{}

func (sockBufHandler) OnActive(ctx context.Context, conn net.Conn) (context.Context, error) {
	if fc, ok := conn.(interface{ Fd() int }); ok {
		_ = syscall.SetsockoptInt(fc.Fd(), syscall.SOL_SOCKET, syscall.SO_SNDBUF, replySendBuffer)
	}
	return ctx, nil
}

func (sockBufHandler) OnInactive(ctx context.Context, conn net.Conn) context.Context { return ctx }

func (sockBufHandler) OnRead(ctx context.Context, conn net.Conn) (context.Context, error) {
	return ctx, nil
}

func (sockBufHandler) OnMessage(ctx context.Context, args, result remote.Message) (context.Context, error) {
	return ctx, nil
}
