package engineapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/cloudwego/kitex/pkg/endpoint"
	"github.com/cloudwego/kitex/pkg/remote/codec"
	"github.com/cloudwego/kitex/pkg/rpcinfo"
	"github.com/cloudwego/kitex/server"
	"go.uber.org/zap"

	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	tpsvc "github.com/tidepool-kv/tidepool/protocol/gen/tidepool/tidepool"
	"github.com/tidepool-kv/tidepool/proxy"
)

// Observer is told about every call served; cmd uses it for Prometheus
// histograms. It must not block.
type Observer func(method string, took time.Duration, code string)

// Config configures the engine API server.
type Config struct {
	// MaxRequestBytes bounds the size of one framed request; larger frames
	// are refused before the body is read. Default 256 MiB.
	MaxRequestBytes int
	// DrainTimeout bounds how long Close waits for in-flight calls.
	// Default 10s.
	DrainTimeout time.Duration
	// Observer, if set, sees every call.
	Observer Observer
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{MaxRequestBytes: 256 << 20, DrainTimeout: 10 * time.Second}
}

// Server serves the engine API over a listener.
type Server struct {
	lg    *zap.Logger
	svr   server.Server
	ready chan struct{}
	done  chan struct{}
	err   error

	closeOnce sync.Once
	closeErr  error
}

// NewServer makes a Kitex server for p on ln. The server owns ln from now on.
func NewServer(cfg Config, p *proxy.Proxy, ln net.Listener, lg *zap.Logger) (*Server, error) {
	if p == nil || ln == nil {
		return nil, errors.New("engineapi: nil proxy or listener")
	}
	if cfg.MaxRequestBytes <= 0 {
		return nil, fmt.Errorf("engineapi: max request bytes %d must be positive", cfg.MaxRequestBytes)
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = DefaultConfig().DrainTimeout
	}
	if lg == nil {
		lg = zap.NewNop()
	}
	opts := []server.Option{
		server.WithListener(ln),
		server.WithCodec(codec.NewDefaultCodecWithSizeLimit(cfg.MaxRequestBytes)),
		server.WithExitWaitTime(cfg.DrainTimeout),
		server.WithServerBasicInfo(&rpcinfo.EndpointBasicInfo{ServiceName: "tidepool"}),
		// Get and BatchGet answer from the arenas in place; the tracer
		// releases the pins once the reply is written (pins.go).
		server.WithTracer(newPinTracer(lg)),
		server.WithBoundHandler(sockBufHandler{}),
	}
	if cfg.Observer != nil {
		opts = append(opts, server.WithMiddleware(observe(cfg.Observer)))
	}
	s := &Server{
		lg:    lg,
		svr:   tpsvc.NewServer(&handler{p: p}, opts...),
		ready: make(chan struct{}),
		done:  make(chan struct{}),
	}
	return s, nil
}

// observe times each call and reports its outcome code.
func observe(obs Observer) endpoint.Middleware {
	return func(next endpoint.Endpoint) endpoint.Endpoint {
		return func(ctx context.Context, req, resp interface{}) error {
			start := time.Now()
			err := next(ctx, req, resp)
			method := "unknown"
			if ri := rpcinfo.GetRPCInfo(ctx); ri != nil && ri.To() != nil {
				method = ri.To().Method()
			}
			code := codeOf(err)
			if err == nil {
				// Declared exceptions travel in the result, not as err.
				if r, ok := resp.(interface{ GetErr() *tp.TidepoolError }); ok && r.GetErr() != nil {
					code = r.GetErr().Code.String()
				}
			}
			obs(method, time.Since(start), code)
			return err
		}
	}
}

// Start serves in the background. Ready is closed once the server runs.
func (s *Server) Start(ctx context.Context) error {
	go func() {
		defer close(s.done)
		// Kitex's Run blocks until Stop; it listens on the listener given.
		close(s.ready)
		if err := s.svr.Run(); err != nil {
			s.lg.Error("engine api server stopped", zap.Error(err))
			s.err = err
		}
	}()
	return nil
}

// Ready is closed when the server accepts calls.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Done is closed when the server has stopped.
func (s *Server) Done() <-chan struct{} { return s.done }

// Close stops accepting, drains in-flight calls (up to DrainTimeout) and
// closes the listener. Safe to call twice.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.closeErr = s.svr.Stop()
		<-s.done
	})
	return s.closeErr
}
