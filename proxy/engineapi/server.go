package engineapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/cloudwego/kitex/pkg/endpoint"
	"github.com/cloudwego/kitex/pkg/rpcinfo"
	"github.com/cloudwego/kitex/server"
	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/internal/fdlimit"
	"github.com/tidepool-kv/tidepool/internal/fdlisten"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	tpsvc "github.com/tidepool-kv/tidepool/protocol/gen/tidepool/tidepool"
	"github.com/tidepool-kv/tidepool/protocol/safecodec"
	"github.com/tidepool-kv/tidepool/proxy"
)

// Observer is told about every call served; cmd uses it for Prometheus
// histograms. It must not block.
type Observer func(method string, took time.Duration, code string)

// Config configures the engine API server. A zero field takes its default
// (DefaultConfig, applied once in withDefaults); negative values are
// errors.
type Config struct {
	// MaxRequestBytes bounds the size of one framed request; larger frames
	// are refused before the body is read. Default 256 MiB.
	MaxRequestBytes int
	// DrainTimeout bounds how long Close waits for in-flight calls.
	// Default 10s.
	DrainTimeout time.Duration
	// MaxConnections bounds the engine connections open at once; one
	// more is closed as soon as it is accepted (and counted as refused).
	// Default 1024.
	MaxConnections int
	// IdleTimeout closes a connection that has carried no request for
	// this long. Default 10m.
	IdleTimeout time.Duration
	// Observer, if set, sees every call.
	Observer Observer
	// Build is the build string Hello reports (cmd passes the binary's
	// version). Default "dev".
	Build string
	// PutListener, if set, is the put socket's listener (putsock.go; made
	// with Listen at the engine socket's path plus PutSocketSuffix), and
	// Hello lists FeaturePutSocket. The server owns it, as it owns ln.
	PutListener net.Listener
	// BufferListener, if set, is the buffer socket's listener (bufsock.go;
	// made with Listen at the engine socket's path plus
	// BufferSocketSuffix), and Hello lists FeatureBufferSocket. The server
	// owns it, as it owns ln.
	BufferListener net.Listener
	// MaxBuffersPerConn bounds the buffers one buffer socket connection
	// holds registered; MaxBuffers those of all connections together.
	// Defaults 64 and 1024.
	MaxBuffersPerConn int
	MaxBuffers        int
	// PutReserveAhead bounds the bytes of arena slots the put socket
	// holds reserved for values whose bytes have not all arrived, all
	// connections together: a value that would pass it is read whole
	// first (one copy more), so that lengths claimed by requests whose
	// bytes do not come evict at most this much. Default 8 MiB; cmd
	// passes dram_capacity/16.
	PutReserveAhead int64
	// FDGuard, if set, keeps the descriptors clients make this process
	// hold (connections on the three sockets, descriptors passed to the
	// buffer socket) out of the process's descriptor reserve: one that
	// would enter it is closed at once (internal/fdlimit).
	FDGuard *fdlimit.Guard
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{MaxRequestBytes: 256 << 20, DrainTimeout: 10 * time.Second, MaxConnections: 1024, IdleTimeout: 10 * time.Minute, Build: "dev",
		MaxBuffersPerConn: 64, MaxBuffers: 1024, PutReserveAhead: 8 << 20}
}

// withDefaults fills the zero fields with their defaults: the one place a
// zero field becomes its default.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = d.MaxRequestBytes
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = d.DrainTimeout
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = d.MaxConnections
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = d.IdleTimeout
	}
	if c.MaxBuffersPerConn == 0 {
		c.MaxBuffersPerConn = d.MaxBuffersPerConn
	}
	if c.MaxBuffers == 0 {
		c.MaxBuffers = d.MaxBuffers
	}
	if c.PutReserveAhead == 0 {
		c.PutReserveAhead = d.PutReserveAhead
	}
	if c.Build == "" {
		c.Build = d.Build
	}
	return c
}

// Validate reports every problem with c (after defaults) at once.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.MaxRequestBytes < 0 {
		errs = append(errs, fmt.Errorf("engineapi: max request bytes %d must be positive", c.MaxRequestBytes))
	}
	if c.DrainTimeout < 0 || c.MaxConnections < 0 || c.IdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("engineapi: DrainTimeout %v, MaxConnections %d, IdleTimeout %v: none may be negative",
			c.DrainTimeout, c.MaxConnections, c.IdleTimeout))
	}
	if c.MaxBuffersPerConn < 0 || c.MaxBuffers < 0 || c.PutReserveAhead < 0 {
		errs = append(errs, fmt.Errorf("engineapi: MaxBuffersPerConn %d, MaxBuffers %d: neither may be negative", c.MaxBuffersPerConn, c.MaxBuffers))
	}
	return errors.Join(errs...)
}

// ConnStats counts the engine connections.
type ConnStats struct {
	// Active is connections open now.
	Active int64
	// Accepted is connections accepted since start (refused ones too).
	Accepted uint64
	// Refused is connections closed at once because MaxConnections were
	// open.
	Refused uint64
	// IdleClosed is connections closed after IdleTimeout without a call.
	IdleClosed uint64
	// AcceptErrors is accept(2) failures (EMFILE and the like), after
	// each of which accepting backs off and continues.
	AcceptErrors uint64
}

// Server serves the engine API over a listener.
type Server struct {
	lg    *zap.Logger
	ln    *fdlisten.Listener
	conns *connTracker
	// lender keeps inline puts' request buffers until their calls finish
	// (safecodec/borrow.go).
	lender *safecodec.Lender
	svr    server.Server
	puts   *putServer // nil without Config.PutListener
	bufs   *bufServer // nil without Config.BufferListener
	ready  chan struct{}
	done   chan struct{}
	exit   chan error // closed by Close: Kitex's Run returns, draining first
	err    error

	startOnce sync.Once

	closeOnce sync.Once
	closeErr  error
}

// NewServer makes a Kitex server for p on ln (a Unix or TCP listener).
// The server owns ln from now on, also when NewServer fails: it closes
// the descriptor exactly once, after Kitex has stopped using it
// (internal/fdlisten says why netpoll must not close it).
func NewServer(cfg Config, p *proxy.Proxy, ln net.Listener, lg *zap.Logger) (*Server, error) {
	closeOthers := func() {
		if cfg.PutListener != nil {
			cfg.PutListener.Close()
		}
		if cfg.BufferListener != nil {
			cfg.BufferListener.Close()
		}
	}
	if ln == nil {
		closeOthers()
		return nil, errors.New("engineapi: nil listener")
	}
	fail := func(err error) (*Server, error) {
		ln.Close()
		closeOthers()
		return nil, err
	}
	if p == nil {
		return fail(errors.New("engineapi: nil proxy"))
	}
	if err := cfg.Validate(); err != nil {
		return fail(err)
	}
	cfg = cfg.withDefaults()
	if lg == nil {
		lg = zap.NewNop()
	}
	fl, err := fdlisten.New(ln)
	if err != nil {
		return fail(fmt.Errorf("engineapi: %w", err))
	}
	fl.SetGuard(cfg.FDGuard)
	conns := newConnTracker(cfg.MaxConnections, cfg.IdleTimeout, lg)
	exit := make(chan error)
	lender := new(safecodec.Lender)
	opts := []server.Option{
		server.WithListener(fl),
		// The server stops when Close says so, never on a signal of its own
		// (Kitex's default listens for SIGTERM), and a Close that comes
		// before Run has got going still stops it: Kitex's Stop is a no-op
		// until Run has built its server, and Run would then serve forever.
		server.WithExitSignal(func() <-chan error { return exit }),
		server.WithCodec(safecodec.New(cfg.MaxRequestBytes)),
		server.WithExitWaitTime(cfg.DrainTimeout),
		server.WithServerBasicInfo(&rpcinfo.EndpointBasicInfo{ServiceName: "tidepool"}),
		// Get and BatchGet answer from the arenas in place; the tracer
		// releases the pins once the reply is written (pins.go).
		server.WithTracer(newPinTracer(lg)),
		// Inline puts are handled with their values in the request's own
		// buffer, released when the call is finished (safecodec/borrow.go).
		server.WithTracer(lender),
		server.WithBoundHandler(sockBufHandler{}),
		server.WithBoundHandler(conns),
	}
	if cfg.Observer != nil {
		opts = append(opts, server.WithMiddleware(observe(cfg.Observer)))
	}
	s := &Server{
		lg:     lg,
		ln:     fl,
		conns:  conns,
		lender: lender,
		svr: tpsvc.NewServer(&handler{p: p, build: cfg.Build, putSocket: cfg.PutListener != nil,
			bufferSocket: cfg.BufferListener != nil}, opts...),
		ready: make(chan struct{}),
		done:  make(chan struct{}),
		exit:  exit,
	}
	if cfg.PutListener != nil {
		s.puts = newPutServer(cfg.PutListener, p, conns, cfg, lg.Named("put-socket"))
	}
	if cfg.BufferListener != nil {
		s.bufs = newBufServer(cfg.BufferListener, p, cfg, lg.Named("buffer-socket"))
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
	s.startOnce.Do(func() {
		s.conns.start()
		if s.puts != nil {
			s.puts.start()
		}
		if s.bufs != nil {
			s.bufs.start()
		}
		go func() {
			select { // serving, or Run failed first
			case <-s.ln.Polled():
			case <-s.done:
			}
			close(s.ready)
		}()
		go func() {
			defer close(s.done)
			// Kitex's Run blocks until the exit signal (Close), then
			// drains and stops; it listens on the listener given.
			if err := s.svr.Run(); err != nil {
				s.lg.Error("engine api server stopped", zap.Error(err))
				s.err = err
			}
		}()
	})
	return nil
}

// Ready is closed when the server accepts calls.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Done is closed when the server has stopped.
func (s *Server) Done() <-chan struct{} { return s.done }

// Close stops accepting, drains in-flight calls (up to DrainTimeout) and
// then, Kitex done with it, closes the listening socket: the one close of
// its descriptor. Safe to call twice.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		started := true
		s.startOnce.Do(func() { close(s.ready); close(s.done); started = false }) // never started
		putsDone := make(chan struct{})
		switch {
		case s.puts == nil:
			close(putsDone)
		case started:
			go func() { s.puts.close(); close(putsDone) }() // its calls drain beside Kitex's
		default:
			s.puts.ln.Close()
			close(putsDone)
		}
		bufsDone := make(chan struct{})
		switch {
		case s.bufs == nil:
			close(bufsDone)
		case started:
			go func() { s.bufs.close(); close(bufsDone) }()
		default:
			s.bufs.ln.Close()
			close(bufsDone)
		}
		// Stop only once Kitex's start is over (see fdlisten.Polled).
		<-s.ready
		close(s.exit)
		<-s.done
		<-putsDone
		<-bufsDone
		s.closeErr = s.err
		s.conns.close()
		if err := s.ln.Release(); err != nil && s.closeErr == nil {
			s.closeErr = fmt.Errorf("engineapi: closing the listener: %w", err)
		}
	})
	return s.closeErr
}

// ConnStats returns the connection counters.
func (s *Server) ConnStats() ConnStats {
	ls := s.ln.Stats()
	st := ConnStats{
		Active:       s.conns.active.Load(),
		Accepted:     ls.Accepted,
		Refused:      s.conns.refused.Load(),
		IdleClosed:   s.conns.idleClosed.Load(),
		AcceptErrors: ls.Failed,
	}
	if s.puts != nil {
		st.Accepted += s.puts.accepted.Load()
		st.AcceptErrors += s.puts.acceptErrors.Load()
	}
	if s.bufs != nil {
		st.Accepted += s.bufs.accepted.Load()
		st.AcceptErrors += s.bufs.acceptErrors.Load()
		st.Refused += s.bufs.refused.Load()
		st.Active += int64(s.bufs.open())
	}
	return st
}

// BufferStats returns the buffer socket's counters (zero without one).
func (s *Server) BufferStats() BufferStats {
	if s.bufs == nil {
		return BufferStats{}
	}
	return s.bufs.stats()
}
