package peerapi

// Named reads: a remote fetch in one exchange on the transfer port
// (rdma.Fetcher). The asking node sends its credentials and the block's
// name; the owner checks the credentials as every peer call does, pins
// the block, sends its length, checksum and depth and then its bytes, and
// unpins it once they are sent. Without it a fetch is an Acquire call (to
// learn where the block lies), then a one-sided read, then a lease
// release: one round trip more.
//
// A node says that it serves named reads in its Acquire answers
// (AcquireResponse.fetch); the client uses them with a node only after
// such an answer, so a cluster that mixes versions keeps the Acquire path
// between old and new nodes.
//
// Request (rdma.MaxFetchRequest bytes at most; integers big-endian,
// str16 = u16 length + bytes):
//
//	u8    version (1, or 2: flags follow the key)
//	u16   peer protocol version (cluster.ProtocolVersion)
//	str16 cluster label
//	str16 token
//	str16 namespace
//	str16 key
//	u8    flags (version 2 only): bit 0 describe (send the block's
//	      description); other bits zero
//
// Answer metadata:
//
//	u8    version (1)
//	u16   code (tidepool.ErrorCode; 0 OK)
//	u8    flags: bit 0 refused (the credentials do not match: as
//	      PeerError.refused); bit 1 described (the description follows
//	      the message; only in answers to a request with describe set);
//	      other bits zero
//	u32   checksum (CRC-32C of the block; OK only)
//	i32   depth (OK only)
//	str16 message (not OK only; at most maxMetaMsg bytes)
//	      (described only:)
//	i32   block size
//	u16   token count n, then n × u32 token ids
//	str16 parent key
//
// An OK answer carries the block's bytes (their count is the block's
// length); any other carries none. Nothing may follow either encoding.
//
// Versions: a node that predates descriptions refuses a version 2
// request and an answer with bit 1 set, so a node sends version 2 only
// to a node whose Acquire answer set fetch_describe, and only when it
// wants descriptions (proxy.FetchOptions.Describe: its KV events are on); a
// node answers with a description only a request that asked for one.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/internal/wire"
	"github.com/tidepool-kv/tidepool/protocol/gen/peer"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/wirecode"
	"github.com/tidepool-kv/tidepool/rdma"
)

const (
	fetchVersion  = 1
	fetchDescribe = 2 // request version with flags
	maxMetaMsg    = 512
	metaRefused   = 1 << 0
	metaDescribed = 1 << 1
	reqDescribe   = 1 << 0
)

// fetchRequest is a decoded named-read request.
type fetchRequest struct {
	protocol     uint16
	label, token string
	ns           string
	key          []byte
	describe     bool // send the block's description
}

// encodeFetchRequest encodes a request; describe makes it version 2,
// which only nodes that said so (fetch_describe) understand.
func encodeFetchRequest(a *peer.Auth, ns string, key []byte, describe bool) ([]byte, error) {
	b := make([]byte, 0, 12+len(a.ClusterLabel)+len(a.Token)+len(ns)+len(key))
	v := byte(fetchVersion)
	if describe {
		v = fetchDescribe
	}
	b = append(b, v)
	b = binary.BigEndian.AppendUint16(b, uint16(a.ProtocolVersion))
	for _, s := range [][]byte{[]byte(a.ClusterLabel), []byte(a.Token), []byte(ns), key} {
		if len(s) > 0xffff {
			return nil, fmt.Errorf("%w: a field of %d bytes", rdma.ErrTooLarge, len(s))
		}
		b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	if describe {
		b = append(b, reqDescribe)
	}
	if len(b) > rdma.MaxFetchRequest {
		return nil, fmt.Errorf("%w: named-read request of %d bytes (max %d)", rdma.ErrTooLarge, len(b), rdma.MaxFetchRequest)
	}
	return b, nil
}

// errFetchRequest: a request this build cannot decode.
var errFetchRequest = errors.New("peerapi: malformed named-read request")

func decodeFetchRequest(b []byte) (fetchRequest, error) {
	d := wire.Reader{B: b}
	v := d.U8()
	if v != fetchVersion && v != fetchDescribe {
		return fetchRequest{}, fmt.Errorf("%w: version %d", errFetchRequest, v)
	}
	r := fetchRequest{protocol: d.U16()}
	r.label, r.token, r.ns = string(d.Str16()), string(d.Str16()), string(d.Str16())
	r.key = bytes.Clone(d.Str16()) // req is the transport's buffer, reused for the next request
	if v == fetchDescribe {
		flags := d.U8()
		if flags&^reqDescribe != 0 {
			return fetchRequest{}, fmt.Errorf("%w: flags %#x", errFetchRequest, flags)
		}
		r.describe = flags&reqDescribe != 0
	}
	if !d.Done() {
		return fetchRequest{}, fmt.Errorf("%w: %d bytes", errFetchRequest, len(b))
	}
	return r, nil
}

// fetchMeta is a decoded answer's metadata.
type fetchMeta struct {
	code     tp.ErrorCode
	refused  bool
	checksum uint32
	depth    int32
	msg      string
	desc     *cache.BlockMeta // described (flag bit 1); nil: none
}

// encodeFetchMeta encodes an answer's metadata. A description that does
// not fit in rdma.MaxFetchMeta (or in its u16 counts) is left out: the
// block is then answered undescribed.
func encodeFetchMeta(m fetchMeta) []byte {
	if d := m.desc; d != nil && (len(d.Tokens) > 0xffff || len(d.Parent) > 0xffff) {
		m.desc = nil
	}
	b := make([]byte, 0, 14+len(m.msg))
	b = append(b, fetchVersion)
	b = binary.BigEndian.AppendUint16(b, uint16(m.code))
	var flags byte
	if m.refused {
		flags |= metaRefused
	}
	if m.desc != nil {
		flags |= metaDescribed
	}
	b = append(b, flags)
	b = binary.BigEndian.AppendUint32(b, m.checksum)
	b = binary.BigEndian.AppendUint32(b, uint32(m.depth))
	msg := m.msg
	if len(msg) > maxMetaMsg {
		msg = msg[:maxMetaMsg]
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(msg)))
	b = append(b, msg...)
	if d := m.desc; d != nil {
		b = binary.BigEndian.AppendUint32(b, uint32(d.BlockSize))
		b = binary.BigEndian.AppendUint16(b, uint16(len(d.Tokens)))
		for _, tok := range d.Tokens {
			b = binary.BigEndian.AppendUint32(b, tok)
		}
		b = binary.BigEndian.AppendUint16(b, uint16(len(d.Parent)))
		b = append(b, d.Parent...)
		if len(b) > rdma.MaxFetchMeta {
			m.desc = nil
			return encodeFetchMeta(m)
		}
	}
	return b
}

func decodeFetchMeta(b []byte) (fetchMeta, error) {
	d := wire.Reader{B: b}
	if v := d.U8(); v != fetchVersion {
		return fetchMeta{}, fmt.Errorf("%w: named-read answer version %d", ErrProtocol, v)
	}
	m := fetchMeta{code: tp.ErrorCode(d.U16())}
	flags := d.U8()
	m.refused = flags&metaRefused != 0
	m.checksum, m.depth = d.U32(), int32(d.U32())
	msg := d.Str16()
	if flags&metaDescribed != 0 {
		desc := &cache.BlockMeta{BlockSize: int32(d.U32())}
		n := int(d.U16())
		if raw := d.Take(4 * n); raw != nil && n > 0 { // present before anything is allocated
			desc.Tokens = make([]uint32, n)
			for i := range desc.Tokens {
				desc.Tokens[i] = binary.BigEndian.Uint32(raw[4*i:])
			}
		}
		if parent := d.Str16(); len(parent) > 0 {
			desc.Parent = bytes.Clone(parent)
		}
		m.desc = desc
	}
	if !d.Done() || len(msg) > maxMetaMsg || flags&^(metaRefused|metaDescribed) != 0 {
		return fetchMeta{}, fmt.Errorf("%w: named-read answer of %d bytes", ErrProtocol, len(b))
	}
	m.msg = string(msg)
	if !utf8.ValidString(m.msg) {
		m.msg = fmt.Sprintf("%q", m.msg)
	}
	return m, nil
}

// ---- owner side ----

// fetch answers a named read: credentials first, then the block pinned
// (as Acquire does) until the transport has sent it.
func (h *handler) fetchBlock(ctx context.Context, req []byte) rdma.FetchAnswer {
	fail := func(err error) rdma.FetchAnswer {
		return rdma.FetchAnswer{Meta: encodeFetchMeta(fetchMeta{code: wirecode.Code(err), msg: err.Error()})}
	}
	r, err := decodeFetchRequest(req)
	if err == nil && h.undescribed.Load() && len(req) > 0 && req[0] != fetchVersion {
		err = fmt.Errorf("%w: version %d", errFetchRequest, req[0])
	}
	if err != nil {
		h.count(func(s *ServerStats) { s.Refused++ })
		return fail(fmt.Errorf("%w: %w", proxy.ErrInvalidArgument, err))
	}
	if e := h.check(&peer.Auth{ClusterLabel: r.label, ProtocolVersion: int32(r.protocol), Token: r.token}); e != nil {
		return rdma.FetchAnswer{Meta: encodeFetchMeta(fetchMeta{code: e.Code, refused: e.GetRefused(), msg: e.Message})}
	}
	res, err := h.p.Acquire(ctx, r.ns, [][]byte{r.key}, h.cfg.MaxLease, proxy.ScopeLocal)
	if err != nil {
		return fail(err)
	}
	a := res[0]
	if a.Err != nil {
		return fail(a.Err)
	}
	var once sync.Once
	unpin := func() {
		once.Do(func() {
			if _, err := h.p.Release(context.Background(), []int64{a.LeaseID}); err != nil {
				h.lg.Debug("named read: unpin", zap.Error(err))
			}
		})
	}
	if a.Slot.Arena < 0 || a.Slot.Arena >= len(h.cfg.Regions) || a.Slot.Offset < 0 || a.Slot.Length < 0 {
		unpin()
		return fail(fmt.Errorf("%w: arena %d is not registered for transfers", cache.ErrUnavailable, a.Slot.Arena))
	}
	h.count(func(s *ServerStats) { s.Fetched++ })
	m := fetchMeta{code: tp.ErrorCode_OK, checksum: a.Info.Checksum, depth: a.Info.Depth}
	if r.describe {
		m.desc = h.p.Description(r.ns, r.key)
	}
	return rdma.FetchAnswer{
		Meta:   encodeFetchMeta(m),
		Region: h.cfg.Regions[a.Slot.Arena].ID, Offset: uint64(a.Slot.Offset), Len: uint64(a.Slot.Length),
		Sum: a.Info.Checksum, Done: unpin,
	}
}

// ---- asking side ----

// Fetch implements proxy.Peers: a named read where node said it serves
// them (in an Acquire answer), else proxy.ErrNoFetch without sending
// anything.
func (c *Client) Fetch(ctx context.Context, node, ns string, key []byte, opts proxy.FetchOptions, land func(proxy.RemoteBlock) (cache.Reservation, error)) error {
	return c.fetch(ctx, node, ns, key, opts, landing{slot: func(b proxy.RemoteBlock) (rdma.RegionID, uint64, error) {
		slot, err := land(b)
		if err != nil {
			return 0, 0, err
		}
		arena, off, sz := slot.Location()
		if arena < 0 || arena >= len(c.cfg.Regions) || sz != b.Length {
			return 0, 0, fmt.Errorf("%w: local arena %d is not registered", cache.ErrUnavailable, arena)
		}
		return c.cfg.Regions[arena].ID, uint64(off), nil
	}})
}

// FetchTo implements proxy.Peers: Fetch, with the bytes landing in memory
// that land returns (exactly the block's Length bytes, valid until FetchTo
// returns), never registered with the transport. proxy.ErrNoFetch, with
// nothing sent, where a named read cannot land in plain memory (node does
// not serve them, or an RDMA connection to it).
func (c *Client) FetchTo(ctx context.Context, node, ns string, key []byte, opts proxy.FetchOptions, land func(proxy.RemoteBlock) ([]byte, error)) error {
	return c.fetch(ctx, node, ns, key, opts, landing{mem: land})
}

// landing says where a named read's bytes go: a reserved slot's region
// (slot) or plain memory (mem); exactly one is set.
type landing struct {
	slot func(proxy.RemoteBlock) (rdma.RegionID, uint64, error)
	mem  func(proxy.RemoteBlock) ([]byte, error)
}

// fetch is Fetch and FetchTo.
func (c *Client) fetch(ctx context.Context, node, ns string, key []byte, opts proxy.FetchOptions, l landing) error {
	c.mu.Lock()
	describes, ok := c.fetchable[node]
	c.mu.Unlock()
	if !ok {
		return proxy.ErrNoFetch
	}
	describe := describes && l.slot != nil && opts.Describe
	_, addr, ok := c.cfg.Resolve(node)
	if !ok || addr == "" {
		return fmt.Errorf("%w: %q", ErrUnknownNode, node)
	}
	req, err := encodeFetchRequest(c.auth, ns, key, describe)
	if err != nil {
		return fmt.Errorf("%w: %w", proxy.ErrInvalidArgument, err)
	}
	x, err := c.xfer(ctx, addr)
	if err != nil {
		return fmt.Errorf("peerapi: connect transfer %s: %w: %w", addr, cache.ErrUnavailable, err)
	}
	p, f := x.p, x.f
	if f == nil {
		return proxy.ErrNoFetch // no ClientConfig.Fetch (fetchable is then never set)
	}
	var (
		landed   bool
		landErr  error
		answered atomic.Bool
	)
	if d := opts.AnswerTimeout; d > 0 {
		// node must answer (the metadata) within d, as an Acquire must; the
		// bytes then move within ctx.
		actx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		t := time.AfterFunc(d, func() {
			if !answered.Load() {
				cancel(fmt.Errorf("%w: %s did not answer a named read within %v", context.DeadlineExceeded, node, d))
			}
		})
		defer t.Stop()
		ctx = actx
	}
	// block checks an answer that carries n bytes and describes them; land
	// errors are the proxy's own (landErr).
	block := func(meta []byte, n uint64, sum uint32) (proxy.RemoteBlock, error) {
		answered.Store(true)
		m, err := decodeFetchMeta(meta)
		if err != nil {
			return proxy.RemoteBlock{}, err
		}
		if m.code != tp.ErrorCode_OK || m.checksum != sum {
			return proxy.RemoteBlock{}, fmt.Errorf("%w: named-read answer: bytes with code %s, checksum %08x against %08x", ErrProtocol, m.code, m.checksum, sum)
		}
		landed = true
		return proxy.RemoteBlock{Length: int64(n), Checksum: m.checksum, Depth: m.depth, Meta: m.desc}, nil
	}
	var raw []byte
	if l.mem != nil {
		raw, err = f.FetchMem(ctx, req, func(meta []byte, n uint64, sum uint32) ([]byte, error) {
			b, err := block(meta, n, sum)
			if err != nil {
				return nil, err
			}
			dst, err := l.mem(b)
			landErr = err
			return dst, err
		})
	} else {
		raw, err = f.Fetch(ctx, req, func(meta []byte, n uint64, sum uint32) (rdma.RegionID, uint64, error) {
			b, err := block(meta, n, sum)
			if err != nil {
				return 0, 0, err
			}
			id, off, err := l.slot(b)
			landErr = err
			return id, off, err
		})
	}
	if landErr != nil {
		return landErr // the proxy's own refusal (the block is stored here now, no space, ...)
	}
	if err != nil {
		switch {
		case errors.Is(err, rdma.ErrChecksum):
			return fmt.Errorf("peerapi: fetch from %s: %w: %w", addr, cache.ErrChecksum, err)
		case errors.Is(err, rdma.ErrUnsupported) && !landed:
			// Not here (an RDMA connection to node: its one-sided read is
			// the better path) or not there (node stopped serving them):
			// nothing moved, so this block goes by Acquire.
			c.noFetch(node)
			return proxy.ErrNoFetch
		case errors.Is(err, ErrProtocol):
			c.noFetch(node) // back to Acquire until node says it serves them again
		}
		if errors.Is(err, rdma.ErrPeerLost) || errors.Is(err, rdma.ErrClosed) || errors.Is(err, rdma.ErrProtocol) {
			c.noFetch(node)
			c.dropXfer(addr, p)
		}
		return fmt.Errorf("peerapi: fetch from %s: %w: %w", addr, cache.ErrUnavailable, err)
	}
	m, err := decodeFetchMeta(raw)
	if err != nil {
		c.noFetch(node)
		return err
	}
	if m.refused {
		return fmt.Errorf("%w (peer %s)", ErrRefused, node)
	}
	if m.code == tp.ErrorCode_INVALID_ARGUMENT && describe {
		// node refused a version 2 request: it restarted on a version
		// that predates descriptions. Acquire until it says otherwise.
		c.noFetch(node)
		return proxy.ErrNoFetch
	}
	if m.code != tp.ErrorCode_OK {
		return codeErr(node, m.code, m.msg)
	}
	if !landed {
		// An empty block: no bytes came, so its place has not been asked
		// for yet.
		if m.checksum != 0 {
			return fmt.Errorf("%w: empty block with checksum %08x", ErrProtocol, m.checksum)
		}
		b := proxy.RemoteBlock{Checksum: m.checksum, Depth: m.depth, Meta: m.desc}
		if l.mem != nil {
			_, err = l.mem(b)
		} else {
			_, _, err = l.slot(b)
		}
		return err
	}
	return nil
}

// noFetch stops named reads to node until an Acquire answer says it serves
// them again (a node that restarted on an older version, say).
func (c *Client) noFetch(node string) {
	c.mu.Lock()
	delete(c.fetchable, node)
	c.mu.Unlock()
}

// canFetch notes that node serves named reads, and whether it describes
// blocks in them.
func (c *Client) canFetch(node string, describes bool) {
	c.mu.Lock()
	if !c.closed {
		c.fetchable[node] = describes
	}
	c.mu.Unlock()
}
