// Package client is the Go client of tidepool's engine API: it talks to the
// sidecar over its Unix socket with Kitex. Go engines and tools (the
// tidepool CLI among them) use it; other languages generate a Thrift client
// from idl/tidepool.thrift.
//
//	c, err := client.New("/run/tidepool/tidepool.sock")
//	...
//	defer c.Close()
//	existed, err := c.Put(ctx, "llama3-70b/tp8", key, value, 0)
//	value, found, err := c.Get(ctx, "llama3-70b/tp8", key)
package client

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	kclient "github.com/cloudwego/kitex/client"
	"github.com/cloudwego/kitex/pkg/connpool"
	"github.com/cloudwego/kitex/pkg/klog"
	"github.com/cloudwego/kitex/pkg/remote/codec"
	"github.com/cloudwego/kitex/pkg/rpcinfo"

	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	tpsvc "github.com/tidepool-kv/tidepool/protocol/gen/tidepool/tidepool"
)

// ErrorCode is the API's error enum.
type ErrorCode = tp.ErrorCode

// Codes a caller commonly tests for.
const (
	CodeOK              = tp.ErrorCode_OK
	CodeNotFound        = tp.ErrorCode_NOT_FOUND
	CodeExists          = tp.ErrorCode_EXISTS
	CodeTooLarge        = tp.ErrorCode_TOO_LARGE
	CodeInvalidArgument = tp.ErrorCode_INVALID_ARGUMENT
	CodeNoSpace         = tp.ErrorCode_NO_SPACE
	CodeUnavailable     = tp.ErrorCode_UNAVAILABLE
	CodeUnknownNS       = tp.ErrorCode_UNKNOWN_NAMESPACE
	CodeBatchTooLarge   = tp.ErrorCode_BATCH_TOO_LARGE
	CodeInternal        = tp.ErrorCode_INTERNAL
)

// Error is an error answered by the server, with its protocol code.
type Error struct {
	Code    ErrorCode
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("tidepool: %s: %s", e.Code, e.Message) }

// CodeOf returns the protocol code of an error returned by this package:
// OK for nil, the server's code for an *Error, UNAVAILABLE for transport
// failures.
func CodeOf(err error) ErrorCode {
	if err == nil {
		return CodeOK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeUnavailable
}

// Config configures a Client.
//
// A zero field means its default (DefaultConfig, applied by withDefaults);
// a negative value is an error from NewWithConfig (no field gives a
// negative a meaning).
type Config struct {
	// Socket is the absolute path of the sidecar's Unix socket. Required.
	Socket string
	// Timeout bounds each call. Default 30s.
	Timeout time.Duration
	// ConnectTimeout bounds dialing the socket. Default 1s.
	ConnectTimeout time.Duration
	// MaxIdleConns is how many idle connections are kept for reuse; set it
	// to the number of concurrent callers. Default 64. AppendGet keeps as
	// many again of its own (it reads replies itself, rawget.go), and so
	// does Put on the sidecar's put socket (rawput.go): a client of n
	// concurrent callers holds up to 3n connections against the sidecar's
	// engine_max_connections.
	MaxIdleConns int
	// MaxResponseBytes bounds one framed response. Default 1 GiB.
	MaxResponseBytes int
	// ZeroCopyInFlight is how many Acquire calls of GetInto, and how many
	// Reserve calls of PutFrom, the client keeps in flight per namespace;
	// callers that find that many in flight queue, and go out together in
	// one batched call when one returns (docs/zerocopy.md). Default 1, the
	// most batching. Raise it when GetInto often reads blocks from the SSD
	// tier or another node: the server brings a call's blocks into DRAM one
	// after the other. Commit calls of PutFrom may be in flight up to this
	// or twice GOMAXPROCS, whichever is more (the server checksums a call's
	// blocks one after the other).
	ZeroCopyInFlight int
	// ReserveAhead is how many slots reserved ahead (unbound reservations,
	// docs/zerocopy.md) the client keeps for PutFrom: each Commit asks for
	// the slot of the next put of its namespace and size, so that a put
	// takes one round trip instead of a Reserve and a Commit. Default 64
	// (one per concurrent writer is enough); Off (-1) keeps none. Slots
	// kept and not used hold their memory in the sidecar until Close or
	// their deadline (the sidecar's reserve_timeout).
	ReserveAhead int
}

// Off turns off a Config field whose zero value means its default.
const Off = -1

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig(socket string) Config {
	return Config{Socket: socket, Timeout: 30 * time.Second, ConnectTimeout: time.Second, MaxIdleConns: 64, MaxResponseBytes: 1 << 30, ZeroCopyInFlight: 1, ReserveAhead: 64}
}

// withDefaults fills the zero fields with their defaults: the one place a
// zero field becomes its default.
func (c Config) withDefaults() Config {
	d := DefaultConfig(c.Socket)
	if c.Timeout == 0 {
		c.Timeout = d.Timeout
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = d.ConnectTimeout
	}
	if c.MaxIdleConns == 0 {
		c.MaxIdleConns = d.MaxIdleConns
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = d.MaxResponseBytes
	}
	if c.ZeroCopyInFlight == 0 {
		c.ZeroCopyInFlight = d.ZeroCopyInFlight
	}
	if c.ReserveAhead == 0 {
		c.ReserveAhead = d.ReserveAhead
	}
	return c
}

// Validate reports every problem with c (after defaults): a socket path
// that is not absolute, and any negative field.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if !filepath.IsAbs(c.Socket) {
		errs = append(errs, fmt.Errorf("client: socket path %q must be absolute", c.Socket))
	}
	if c.Timeout < 0 || c.ConnectTimeout < 0 {
		errs = append(errs, fmt.Errorf("client: Timeout %v, ConnectTimeout %v: neither may be negative", c.Timeout, c.ConnectTimeout))
	}
	if c.MaxIdleConns < 0 || c.MaxResponseBytes < 0 || c.ZeroCopyInFlight < 0 {
		errs = append(errs, fmt.Errorf("client: MaxIdleConns %d, MaxResponseBytes %d, ZeroCopyInFlight %d: none may be negative",
			c.MaxIdleConns, c.MaxResponseBytes, c.ZeroCopyInFlight))
	}
	if c.ReserveAhead < Off {
		errs = append(errs, fmt.Errorf("client: ReserveAhead %d: a count, or Off (-1)", c.ReserveAhead))
	}
	return errors.Join(errs...)
}

// Client calls one sidecar. Safe for concurrent use.
type Client struct {
	kc  kclient.Client
	zc  zeroCopy // the zero-copy state and mapped arenas (zerocopy.go, arena.go)
	raw rawPool  // the connections of Get and AppendGet (rawget.go)
	// puts is Put's connections to the put socket (rawput.go).
	puts putSocket

	// life: calls hold it for reading, Close for writing. Kitex panics on a
	// call through a closed client ("client is already closed"); a call
	// after Close gets errClientClosed instead.
	life     sync.RWMutex
	closed   bool
	closeErr error
}

// errClientClosed answers a call made after Close.
var errClientClosed = &Error{Code: tp.ErrorCode_UNAVAILABLE, Message: "the client is closed"}

// New connects lazily to the sidecar at socket with the default config.
func New(socket string) (*Client, error) { return NewWithConfig(DefaultConfig(socket)) }

// NewWithConfig makes a client from cfg.
func NewWithConfig(cfg Config) (*Client, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	kc, err := newKitex(cfg, cfg.MaxIdleConns, time.Minute, "tidepool-client")
	if err != nil {
		return nil, err
	}
	c := &Client{kc: kc, raw: rawPool{socket: cfg.Socket, dialTimeout: cfg.ConnectTimeout, timeout: cfg.Timeout,
		maxIdle: cfg.MaxIdleConns, maxValue: cfg.MaxResponseBytes}}
	c.puts.pool = rawPool{socket: cfg.Socket + ".put", dialTimeout: cfg.ConnectTimeout, timeout: cfg.Timeout, maxIdle: cfg.MaxIdleConns}
	c.initZeroCopy(cfg.ZeroCopyInFlight)
	c.zc.maxSpares = max(cfg.ReserveAhead, 0)
	return c, nil
}

// QuietKitexLogs keeps Kitex's own warnings off stderr for a command-line
// tool: Kitex's client logs one per automatic retry ("auto retry retryable
// error", six for a socket that does not exist yet) before the call
// returns the error, which says the same once. It sets Kitex's
// process-wide log level to errors.
func QuietKitexLogs() {
	klog.SetLevel(klog.LevelError)
}

// newKitex makes the Kitex client of the engine socket, keeping up to
// maxIdle connections idle for up to idle.
func newKitex(cfg Config, maxIdle int, idle time.Duration, name string) (kclient.Client, error) {
	kc, err := kclient.NewClient(tpsvc.NewServiceInfoForClient(),
		kclient.WithDestService("tidepool"),
		kclient.WithHostPorts(cfg.Socket),
		kclient.WithRPCTimeout(cfg.Timeout),
		kclient.WithConnectTimeout(cfg.ConnectTimeout),
		kclient.WithDialer(newDialer()),
		kclient.WithLongConnection(connpool.IdleConfig{MaxIdlePerAddress: maxIdle, MaxIdleGlobal: maxIdle, MaxIdleTimeout: idle}),
		kclient.WithCodec(codec.NewDefaultCodecWithSizeLimit(cfg.MaxResponseBytes)),
		kclient.WithClientBasicInfo(&rpcinfo.EndpointBasicInfo{ServiceName: name}),
	)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return kc, nil
}

// Close releases the client's connections, after the calls in flight
// return; later calls fail with UNAVAILABLE. Safe to call twice.
func (c *Client) Close() error {
	c.life.RLock()
	closed := c.closed
	c.life.RUnlock()
	if !closed {
		// These make calls (Abort, Release): before the lock below.
		c.abortQuietly(c.zc.dropSpares()) // PutFrom's unbound reservations
		c.zc.close()                      // releases the queued leases
	}
	c.life.Lock()
	defer c.life.Unlock()
	if c.closed {
		// Once: the Kitex client's connection pool reports a second Close
		// as an error.
		return c.closeErr
	}
	c.closed = true
	c.raw.close()
	c.puts.pool.close()
	c.closeErr = c.kc.(interface{ Close() error }).Close()
	return c.closeErr
}

// call makes one RPC and turns a declared exception into *Error.
func (c *Client) call(ctx context.Context, method string, args interface{}, res interface{ GetErr() *tp.TidepoolError }) error {
	c.life.RLock()
	defer c.life.RUnlock()
	if c.closed {
		return errClientClosed
	}
	if err := c.kc.Call(ctx, method, args, res); err != nil {
		return wrap(err)
	}
	if e := res.GetErr(); e != nil {
		return &Error{Code: e.Code, Message: e.Message}
	}
	return nil
}

// wrap converts a Kitex error to *Error where the server answered one.
func wrap(err error) error {
	if err == nil {
		return nil
	}
	var te *tp.TidepoolError
	if errors.As(err, &te) {
		return &Error{Code: te.Code, Message: te.Message}
	}
	return fmt.Errorf("tidepool: %w", err)
}

// Hello returns the server's version, limits and tiers.
func (c *Client) Hello(ctx context.Context) (*tp.HelloResponse, error) {
	var res tp.TidepoolHelloResult
	err := c.call(ctx, "Hello", &tp.TidepoolHelloArgs{Req: &tp.HelloRequest{ClientVersion: 1, ClientName: "tidepool-go"}}, &res)
	return res.GetSuccess(), err
}

// Put stores one block. existed is true when the key was already present
// (the put was a no-op). A value of PutSocketMin bytes or more goes through
// the sidecar's put socket where it has one (rawput.go), read by the
// sidecar straight into its arena; value is only read, and only until Put
// returns.
func (c *Client) Put(ctx context.Context, ns string, key, value []byte, depth int32) (existed bool, err error) {
	req := &tp.PutRequest{Ns: ns, Key: key, Value: value, Depth: depth}
	if existed, ok, err := c.putViaSocket(ctx, req); ok {
		return existed, err
	}
	var res tp.TidepoolPutResult
	err = c.call(ctx, "Put", &tp.TidepoolPutArgs{Req: req}, &res)
	r := res.GetSuccess()
	if err != nil {
		return false, err
	}
	return r.Existed, nil
}

// Item is one block of a BatchPut.
type Item struct {
	Key   []byte
	Value []byte
	Depth int32
	Meta  *BlockMeta // for KV events; nil: none
}

// BatchPut stores several blocks; the per-item results are nil, an *Error
// with CodeExists for a no-op, or the item's error.
func (c *Client) BatchPut(ctx context.Context, ns string, items []Item) ([]error, error) {
	req := &tp.BatchPutRequest{Ns: ns, Items: make([]*tp.PutItem, len(items))}
	for i, it := range items {
		req.Items[i] = &tp.PutItem{Key: it.Key, Value: it.Value, Depth: it.Depth}
		req.Items[i].TokenIds, req.Items[i].ParentKey, req.Items[i].BlockSize = it.Meta.fields()
	}
	var res tp.TidepoolBatchPutResult
	err := c.call(ctx, "BatchPut", &tp.TidepoolBatchPutArgs{Req: req}, &res)
	r := res.GetSuccess()
	if err != nil {
		return nil, err
	}
	out := make([]error, len(r.Results))
	for i, s := range r.Results {
		if s != nil && s.Code != CodeOK {
			out[i] = &Error{Code: s.Code, Message: s.Message}
		}
	}
	return out, nil
}

// Get returns one block's bytes, in a new slice; found is false on a
// miss. A scope (at most one; ScopeDefault without) says where it looks.
// It is AppendGet into a pooled buffer, copied out into a slice of the
// value's size.
func (c *Client) Get(ctx context.Context, ns string, key []byte, scope ...Scope) (value []byte, found bool, err error) {
	bp := getBufs.Get().(*[]byte)
	v, found, err := c.AppendGet(ctx, (*bp)[:0], ns, key, scope...)
	if found {
		value = make([]byte, len(v))
		copy(value, v)
	}
	if cap(v) <= getBufMax {
		*bp = v[:0]
		getBufs.Put(bp)
	}
	return value, found, err
}

// getBufs holds the buffers Get reads values into. Read into a new slice,
// a value would grow from nothing as its bytes arrive (a length on the
// wire is only a claim: thriftstream's AppendN doubles from 64 KiB), and a
// 1 MiB Get ran at 0.6-0.7× the Kitex decoder's speed (docs/PERFORMANCE.md
// §16); with a pooled buffer and one copy out into a slice of the
// value's size it is as fast as the Kitex decoder.
var getBufs = sync.Pool{New: func() any { return new([]byte) }}

// getBufMax is the largest buffer getBufs keeps.
const getBufMax = 64 << 20

// GetResult is one block of a BatchGet.
type GetResult struct {
	Value []byte
	Code  ErrorCode // CodeOK, CodeNotFound, ...
	Tier  string
}

// BatchGet returns several blocks, in the order of keys (scope as Get's).
func (c *Client) BatchGet(ctx context.Context, ns string, keys [][]byte, scope ...Scope) ([]GetResult, error) {
	var res tp.TidepoolBatchGetResult
	err := c.call(ctx, "BatchGet", &tp.TidepoolBatchGetArgs{Req: &tp.BatchGetRequest{Ns: ns, Keys: keys, Scope: scopeOf(scope)}}, &res)
	r := res.GetSuccess()
	if err != nil {
		return nil, err
	}
	out := make([]GetResult, len(r.Results))
	for i, g := range r.Results {
		if g != nil {
			out[i] = GetResult{Value: g.Value, Code: g.Code, Tier: g.Tier}
		}
	}
	return out, nil
}

// Presence tells whether a block is present and where.
type Presence struct {
	Present bool
	Tier    string
	NodeID  string
}

// Exists reports whether one block is present.
func (c *Client) Exists(ctx context.Context, ns string, key []byte) (Presence, error) {
	var res tp.TidepoolExistsResult
	err := c.call(ctx, "Exists", &tp.TidepoolExistsArgs{Req: &tp.ExistsRequest{Ns: ns, Key: key}}, &res)
	r := res.GetSuccess()
	if err != nil {
		return Presence{}, err
	}
	return Presence{Present: r.Present, Tier: r.Tier, NodeID: r.NodeId}, nil
}

// BatchExists reports presence for several keys, in order (scope as
// Get's).
func (c *Client) BatchExists(ctx context.Context, ns string, keys [][]byte, scope ...Scope) ([]Presence, error) {
	var res tp.TidepoolBatchExistsResult
	err := c.call(ctx, "BatchExists", &tp.TidepoolBatchExistsArgs{Req: &tp.BatchExistsRequest{Ns: ns, Keys: keys, Scope: scopeOf(scope)}}, &res)
	r := res.GetSuccess()
	if err != nil {
		return nil, err
	}
	out := make([]Presence, len(r.Results))
	for i, e := range r.Results {
		if e != nil {
			out[i] = Presence{Present: e.Present, Tier: e.Tier, NodeID: e.NodeId}
		}
	}
	return out, nil
}

// Lookup returns how many leading keys of a chain are present (scope as
// Get's).
func (c *Client) Lookup(ctx context.Context, ns string, keys [][]byte, scope ...Scope) (int, error) {
	var res tp.TidepoolLookupResult
	err := c.call(ctx, "Lookup", &tp.TidepoolLookupArgs{Req: &tp.LookupRequest{Ns: ns, Keys: keys, Scope: scopeOf(scope)}}, &res)
	r := res.GetSuccess()
	if err != nil {
		return 0, err
	}
	return int(r.Matched), nil
}

// Delete removes one block; deleted is false when it was absent.
// ScopeCluster (the default on a clustered node) deletes it on every live
// member, ScopeLocal in this sidecar's tiers only.
func (c *Client) Delete(ctx context.Context, ns string, key []byte, scope ...Scope) (bool, error) {
	var res tp.TidepoolDeleteResult
	err := c.call(ctx, "Delete", &tp.TidepoolDeleteArgs{Req: &tp.DeleteRequest{Ns: ns, Key: key, Scope: scopeOf(scope)}}, &res)
	r := res.GetSuccess()
	if err != nil {
		return false, err
	}
	return r.Deleted, nil
}

// Clear removes every block of a namespace and returns how many; scope as
// Delete's.
func (c *Client) Clear(ctx context.Context, ns string, scope ...Scope) (int64, error) {
	var res tp.TidepoolClearResult
	err := c.call(ctx, "Clear", &tp.TidepoolClearArgs{Req: &tp.ClearRequest{Ns: ns, Scope: scopeOf(scope)}}, &res)
	r := res.GetSuccess()
	if err != nil {
		return 0, err
	}
	return r.Removed, nil
}

// Stats returns the server's statistics (one namespace when ns is set).
func (c *Client) Stats(ctx context.Context, ns string) (*tp.StatsResponse, error) {
	var res tp.TidepoolStatsResult
	err := c.call(ctx, "Stats", &tp.TidepoolStatsArgs{Req: &tp.StatsRequest{Ns: ns}}, &res)
	return res.GetSuccess(), err
}
