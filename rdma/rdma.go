// Package rdma is the transfer layer: it moves bulk bytes between the
// registered memory of two nodes with one-sided writes (push) and reads
// (pull), the way RDMA verbs RC queue pairs do.
//
// The model, shared by every implementation:
//
//   - A node registers memory regions with its Transport. A region is a
//     []byte that stays valid, and is accessed by the transport, until
//     Deregister returns. Register returns a RegionDesc: the address a
//     remote peer needs (id, length, key; the remote virtual address for
//     verbs). Descriptors travel to peers out of band (the peer API).
//   - A node connects to a peer's endpoint (Transport.Addr on the peer) and
//     gets a Peer handle. Peer.Write copies Op.Len bytes from a local region
//     into the peer's region; Peer.Read copies the peer's bytes into a local
//     region. Neither needs any code on the remote side beyond its
//     Transport running: they are one-sided.
//   - Calls are synchronous: they return when the transfer completed or
//     failed, or when ctx is done. Many goroutines may call at once; each
//     implementation keeps a pool of connections (queue pairs) per peer.
//     A verbs implementation posts work requests and waits for their
//     completion-queue entries behind the same calls, so callers do not
//     change when it arrives.
//
// Guarantees:
//
//   - When Write or Read returns, whatever the result, the transport no longer
//     touches the local range of that call.
//   - A Read that returns nil filled the local range with exactly the remote
//     bytes (verified by checksum on TCP). A Read that fails leaves the local
//     range unspecified.
//   - A Write that returns nil was applied to the remote range. A Write that
//     fails leaves the remote range unspecified: partly applied, or applied
//     later (chunks already on the wire still land, as a posted RDMA write
//     does). Publish remote bytes only after a successful Write, and do not
//     reuse a range a failed Write targeted until the region is deregistered
//     (Deregister waits for in-flight applies; a new registration gets a new
//     key, so stale writes are refused). Bytes that fail their checksum are
//     never applied. A pull (Read) has no such tail: prefer it when the
//     receiver of the bytes may give up.
//   - Errors are classified by the sentinels below (errors.Is); a context
//     expiry is reported with the context's error in the chain.
package rdma

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Implementations wrap them with %w and context.
var (
	// ErrUnknownRegion: no registered region with that id (or the key does
	// not match: the region was deregistered and the descriptor is stale).
	ErrUnknownRegion = errors.New("rdma: unknown region")
	// ErrOutOfRange: offset+length falls outside the region.
	ErrOutOfRange = errors.New("rdma: offset out of range")
	// ErrChecksum: the bytes received do not match their checksum.
	ErrChecksum = errors.New("rdma: checksum mismatch")
	// ErrTooLarge: a transfer longer than the transport accepts.
	ErrTooLarge = errors.New("rdma: transfer too large")
	// ErrClosed: the local transport or peer handle is closed.
	ErrClosed = errors.New("rdma: closed")
	// ErrPeerLost: the connection to the peer broke during the transfer or
	// the peer is shutting down.
	ErrPeerLost = errors.New("rdma: peer connection lost")
	// ErrProtocol: the peer sent something this side does not understand
	// (another frame version, a malformed frame).
	ErrProtocol = errors.New("rdma: protocol error")
	// ErrUnreachable: Connect could not reach the peer.
	ErrUnreachable = errors.New("rdma: peer unreachable")
)

// RegionID names a registered region on the transport that owns it. Ids are
// never reused by a transport.
type RegionID uint64

// RegionDesc is what a peer needs to address a registered region: the owner
// hands it to peers through the peer API.
type RegionDesc struct {
	ID  RegionID
	Len uint64
	// Key authorises access: an rkey for verbs, a random token for tcp and
	// inproc. A descriptor whose key does not match is ErrUnknownRegion.
	Key uint32
	// Addr is the remote virtual address for verbs. tcp and inproc draw it
	// at random (a secret base, like a virtual address): the remote bytes
	// at RemoteOff are named Addr+RemoteOff on the wire, so a peer must
	// hold the whole descriptor to address them.
	Addr uint64
}

// Op is one one-sided transfer: Len bytes between [LocalOff, LocalOff+Len)
// of a local region and [RemoteOff, RemoteOff+Len) of a remote region.
type Op struct {
	Local     RegionID
	LocalOff  uint64
	Remote    RegionDesc
	RemoteOff uint64
	Len       uint64
	// Sum, when SumKnown, is the CRC-32C the initiator expects of the Len
	// bytes (a block's stored checksum). The transfer is then checked once,
	// end to end, where the bytes land — Read checks the local bytes,
	// Write has the owner check the remote ones — and fails with
	// ErrChecksum on a mismatch, instead of each chunk being checksummed
	// by the sender and again by the receiver. Without it the transport
	// checksums what it moves on its own (tcp: per chunk).
	Sum      uint32
	SumKnown bool
}

// String renders an op for error messages.
func (o Op) String() string {
	return fmt.Sprintf("local %d@%d remote %d@%d len %d", o.Local, o.LocalOff, o.Remote.ID, o.RemoteOff, o.Len)
}

// Transport owns registered memory, serves one-sided transfers into and out
// of it, and connects to peers. Implementations are safe for concurrent use.
type Transport interface {
	// Addr is the endpoint peers pass to Connect ("host:port" for tcp).
	Addr() string
	// Register makes buf addressable by peers until Deregister. The caller
	// must keep buf alive and must not shrink it; the transport reads and
	// writes it concurrently with the caller (coordinating who writes where
	// is the caller's business).
	Register(buf []byte) (RegionDesc, error)
	// Deregister removes a region. It waits for in-flight accesses to that
	// region to finish; when it returns the transport no longer touches buf.
	Deregister(id RegionID) error
	// Connect returns a handle to the peer at addr. Each call returns a new
	// handle with its own connections; share a handle between goroutines.
	Connect(ctx context.Context, addr string) (Peer, error)
	// Stats returns a snapshot of the counters.
	Stats() Stats
	// Close stops serving, breaks in-flight transfers and closes every
	// Peer handle. Safe to call more than once.
	Close() error
}

// Peer is a connection handle to one remote transport.
type Peer interface {
	// Addr is the remote endpoint.
	Addr() string
	// Write pushes op.Len bytes from the local region into the remote one.
	Write(ctx context.Context, op Op) error
	// Read pulls op.Len bytes from the remote region into the local one.
	Read(ctx context.Context, op Op) error
	// Stats returns the counters of this peer address (shared by every
	// handle to it from the same transport).
	Stats() PeerStats
	// Close releases the handle's connections; in-flight calls fail with
	// ErrClosed. Safe to call more than once.
	Close() error
}

// PeerStats counts transfers initiated through one Peer handle.
type PeerStats struct {
	Addr      string
	Writes    uint64 // successful writes
	Reads     uint64 // successful reads
	Failures  uint64 // failed writes and reads
	BytesOut  uint64 // payload bytes pushed by successful writes
	BytesIn   uint64 // payload bytes pulled by successful reads
	Latency   time.Duration
	Conns     int // open connections now
	DialFails uint64
}

// MeanLatency is Latency divided by the number of successful transfers.
func (s PeerStats) MeanLatency() time.Duration {
	if n := s.Writes + s.Reads; n > 0 {
		return s.Latency / time.Duration(n)
	}
	return 0
}

// ServeStats counts transfers served for remote initiators.
type ServeStats struct {
	Writes   uint64 // writes applied
	Reads    uint64 // reads answered
	Errors   uint64 // requests refused or broken
	BytesIn  uint64 // payload bytes applied to local regions
	BytesOut uint64 // payload bytes sent from local regions
	Conns    int    // open inbound connections now
}

// Stats is a snapshot of a Transport's counters.
type Stats struct {
	Regions     int    // registered regions now
	RegionBytes uint64 // bytes registered now
	Peers       []PeerStats
	Serve       ServeStats
}

// CheckRange reports ErrOutOfRange unless [off, off+n) lies inside a region
// of size size, without overflow.
func CheckRange(size, off, n uint64) error {
	if off > size || n > size-off {
		return fmt.Errorf("%w: [%d, %d+%d) of %d bytes", ErrOutOfRange, off, off, n, size)
	}
	return nil
}

// ---- named reads: an optional two-sided operation ----

// ErrUnsupported: the transport or peer cannot do what was asked (a named
// read over verbs, or to a peer that does not serve them). Use the
// one-sided path instead.
var ErrUnsupported = errors.New("rdma: not supported")

// Fetcher is implemented by a Peer that can make a named read: one
// exchange in which the remote side resolves a request (which block, who
// asks) to bytes in its own registered memory, pins them, and sends them
// with their CRC-32C. It saves the round trip that a one-sided Read needs
// first to learn where the bytes lie. It is two-sided: the remote
// transport must run a FetchHandler (FetchServer).
type Fetcher interface {
	// Fetch sends req (at most MaxFetchRequest bytes) to the peer's fetch
	// handler and returns the metadata it answered. When the answer
	// carries bytes, land is called first, with that metadata, the byte
	// count and their CRC-32C, and says where they go: a local region and
	// offset. The bytes are checked against the CRC-32C as they land
	// (ErrChecksum). When land returns an error, nothing lands and Fetch
	// returns that error (wrapped). Errors: ErrUnsupported when the peer
	// does not serve named reads (or this handle cannot make them), and
	// the sentinels of Read.
	Fetch(ctx context.Context, req []byte, land Lander) (meta []byte, err error)
}

// Lander places the bytes of a named read (Fetcher.Fetch): given the
// answer's metadata, byte count and CRC-32C, it returns the local region
// and offset they go into, or an error to drop them.
type Lander func(meta []byte, n uint64, sum uint32) (local RegionID, off uint64, err error)

// MemFetcher is implemented by a Peer that can land a named read in memory
// that is not registered with the transport: a buffer an engine shared
// with this process, which no peer may ever address, so it is never put
// in the region table.
type MemFetcher interface {
	// FetchMem is Fetch with the bytes landing where land says: memory
	// the caller keeps valid and unused by anyone else until FetchMem
	// returns (no read into it is in flight after that, whatever the
	// outcome). land returns exactly n bytes, or an error to drop them.
	FetchMem(ctx context.Context, req []byte, land MemLander) (meta []byte, err error)
}

// MemLander places the bytes of a named read (MemFetcher.FetchMem): given
// the answer's metadata, byte count and CRC-32C, it returns the n bytes of
// memory they go into, or an error to drop them.
type MemLander func(meta []byte, n uint64, sum uint32) (dst []byte, err error)

// Bounds of a named read, checked on both sides before anything is
// allocated for them.
const (
	MaxFetchRequest = 4 << 10 // request bytes
	MaxFetchMeta    = 4 << 10 // metadata bytes in an answer
)

// FetchHandler answers a named read on the serving side. req is valid only
// during the call. It returns what to send back.
type FetchHandler func(ctx context.Context, req []byte) FetchAnswer

// FetchAnswer is a FetchHandler's answer: Meta (at most MaxFetchMeta
// bytes) goes back first; then, when Len > 0, the Len bytes at Offset of
// the local region Region, whose CRC-32C is Sum (the handler knows it: a
// block's stored checksum; the transport does not compute it). The
// handler keeps those bytes in place until Done is called, once, when they
// were sent or the send failed. Done may be nil.
type FetchAnswer struct {
	Meta   []byte
	Region RegionID
	Offset uint64
	Len    uint64
	Sum    uint32
	Done   func()
}

// FetchServer is implemented by a Transport that serves named reads (tcp).
type FetchServer interface {
	// HandleFetch sets the handler of named reads; nil stops serving
	// them (requests are then refused with ErrUnsupported).
	HandleFetch(h FetchHandler)
}

// FetchPeer is a connection that makes named reads as well as one-sided
// transfers.
type FetchPeer interface {
	Peer
	Fetcher
	MemFetcher
}

// FetchConnector is implemented by a Transport whose connections make
// named reads (tcp, auto): ConnectFetch is Connect with the named reads in
// the type it returns, so that its users take them as a dependency
// instead of discovering them on a Peer by a type assertion. A connection
// may still answer a named read with ErrUnsupported (auto's over RDMA).
type FetchConnector interface {
	ConnectFetch(ctx context.Context, addr string) (FetchPeer, error)
}
