//go:build verbs

package verbs

import (
	crand "crypto/rand"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/tidepool-kv/tidepool/internal/wire"
	"github.com/tidepool-kv/tidepool/rdma"
)

// Control messages: [type u8][len u16 BE][payload]. Requests go from the
// initiator to the owner; every request has one answer, msgOK (with a
// payload for msgHello, msgConnect and msgResolve) or msgErr (code u8,
// text). Payloads (integers big-endian; golden vectors in
// control_test.go, TestControlGolden):
//
//	msgHello    "TPVB", version u8           -> devices u8 (not 0)
//	msgConnect  connData, device u8          -> connData
//	msgDestroy  qpn u32                      -> (none)
//	msgCheck    id u64, key u32, addr u64, len u64, sum u32 -> (none)
//	msgStats    writes, reads, bytesIn, bytesOut: u64 each -> (none)
//	msgPing     (none)                       -> (none)
//	msgResolve  id u64, key u32, base u64    -> addr u64, len u64, n u8 (not 0), n x rkey u32 (one per device)
//	connData    gid [16], qpn u32, psn u32, mtu u8, lid u16
//
// Every payload is encoded by an append function and decoded by one
// function with internal/wire's reader, which refuses a payload with a
// field missing or a byte left over.
const (
	msgHello   = 1
	msgConnect = 2
	msgDestroy = 3
	msgCheck   = 4
	msgStats   = 5
	msgPing    = 6
	msgOK      = 7
	msgErr     = 8
	msgResolve = 9

	maxMsg       = 256
	ctlVersion   = 1
	connDataLen  = 16 + 4 + 4 + 1 + 2
	errUnknown   = 1
	errRange     = 2
	errChecksum  = 3
	errRefused   = 4
	errInternal  = 5
	helloPayload = "TPVB"
)

var codeErrs = map[byte]error{
	errUnknown: rdma.ErrUnknownRegion, errRange: rdma.ErrOutOfRange, errChecksum: rdma.ErrChecksum,
	errRefused: rdma.ErrProtocol, errInternal: rdma.ErrProtocol,
}

func writeMsg(w io.Writer, typ byte, payload []byte) error {
	if len(payload) > maxMsg {
		return fmt.Errorf("%w: control message of %d bytes", rdma.ErrProtocol, len(payload))
	}
	b := make([]byte, 0, 3+len(payload))
	b = append(b, typ)
	b = binary.BigEndian.AppendUint16(b, uint16(len(payload)))
	_, err := w.Write(append(b, payload...))
	return err
}

func readMsg(r io.Reader) (byte, []byte, error) {
	var h [3]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	d := wire.Reader{B: h[:]}
	typ, n := d.U8(), int(d.U16())
	if n > maxMsg {
		return 0, nil, fmt.Errorf("%w: control message of %d bytes", rdma.ErrProtocol, n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, err
	}
	return typ, p, nil
}

// decodeAll decodes a what payload p with read, refusing it when a field
// is missing or a byte is left over.
func decodeAll[T any](what string, p []byte, read func(d *wire.Reader) T) (T, error) {
	d := wire.Reader{B: p}
	m := read(&d)
	if !d.Done() {
		var zero T
		return zero, fmt.Errorf("%w: %s of %d bytes", rdma.ErrProtocol, what, len(p))
	}
	return m, nil
}

func encodeHello() []byte { return append([]byte(helloPayload), ctlVersion) }

func decodeHello(p []byte) error {
	d := wire.Reader{B: p}
	if string(d.Take(len(helloPayload))) != helloPayload || d.U8() != ctlVersion || !d.Done() {
		return fmt.Errorf("%w: bad hello", rdma.ErrProtocol)
	}
	return nil
}

// encodeHelloAnswer: the number of devices the owner serves on, in one
// byte (a machine has a handful of RDMA devices, never 256).
func encodeHelloAnswer(devs int) []byte { return []byte{byte(devs)} }

// decodeHelloAnswer returns the number of devices the owner serves on.
func decodeHelloAnswer(p []byte) (int, error) {
	d := wire.Reader{B: p}
	n := d.U8()
	if !d.Done() || n == 0 {
		return 0, fmt.Errorf("%w: hello answer of %d bytes", rdma.ErrProtocol, len(p))
	}
	return int(n), nil
}

func (d connData) encode() []byte { return d.append(make([]byte, 0, connDataLen+1)) }

func (d connData) append(b []byte) []byte {
	b = append(b, d.GID[:]...)
	b = binary.BigEndian.AppendUint32(b, d.QPN)
	b = binary.BigEndian.AppendUint32(b, d.PSN)
	b = append(b, d.MTU)
	return binary.BigEndian.AppendUint16(b, d.LID)
}

// read reads connection data from a peer; decodeConnData checks it.
func (d *connData) read(r *wire.Reader) {
	copy(d.GID[:], r.Take(len(d.GID)))
	d.QPN, d.PSN, d.MTU, d.LID = r.U32(), r.U32(), r.U8(), r.U16()
}

// decodeConnData parses and validates connection data from a peer.
func decodeConnData(b []byte) (connData, error) {
	var d connData
	r := wire.Reader{B: b}
	d.read(&r)
	if !r.Done() {
		return d, fmt.Errorf("%w: connection data of %d bytes, want %d", rdma.ErrProtocol, len(b), connDataLen)
	}
	return d, d.check()
}

func (d connData) check() error {
	switch {
	case d.QPN == 0 || d.QPN > 0xffffff:
		return fmt.Errorf("%w: QPN %#x out of range", rdma.ErrProtocol, d.QPN)
	case d.PSN > 0xffffff:
		return fmt.Errorf("%w: PSN %#x out of range", rdma.ErrProtocol, d.PSN)
	case d.MTU < 1 || d.MTU > 5:
		return fmt.Errorf("%w: MTU enum %d out of range", rdma.ErrProtocol, d.MTU)
	}
	return nil
}

// connectReq asks the owner for a responder QP on its device dev.
type connectReq struct {
	conn connData
	dev  uint8
}

func (m connectReq) encode() []byte {
	return append(m.conn.append(make([]byte, 0, connDataLen+1)), m.dev)
}

func decodeConnect(p []byte) (connectReq, error) {
	m, err := decodeAll("connect", p, func(d *wire.Reader) (m connectReq) {
		m.conn.read(d)
		m.dev = d.U8()
		return m
	})
	if err != nil {
		return m, err
	}
	return m, m.conn.check()
}

// encodeDestroy and decodeDestroy: the owner's QP to destroy.
func encodeDestroy(qpn uint32) []byte { return binary.BigEndian.AppendUint32(nil, qpn) }

func decodeDestroy(p []byte) (uint32, error) {
	return decodeAll("destroy", p, (*wire.Reader).U32)
}

// checkReq asks the owner to verify the CRC-32C of a range it received,
// named the remote way (id, key, base+offset).
type checkReq struct {
	id   rdma.RegionID
	key  uint32
	addr uint64
	n    uint64
	sum  uint32
}

// appendRegion appends a region's remote name: id u64, key u32, an
// address u64 (check: where the range starts; resolve: the region's base).
func appendRegion(b []byte, id rdma.RegionID, key uint32, addr uint64) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(id))
	b = binary.BigEndian.AppendUint32(b, key)
	return binary.BigEndian.AppendUint64(b, addr)
}

func (m checkReq) encode() []byte {
	b := appendRegion(make([]byte, 0, 32), m.id, m.key, m.addr)
	b = binary.BigEndian.AppendUint64(b, m.n)
	return binary.BigEndian.AppendUint32(b, m.sum)
}

func decodeCheck(p []byte) (checkReq, error) {
	return decodeAll("check", p, func(d *wire.Reader) checkReq {
		return checkReq{id: rdma.RegionID(d.U64()), key: d.U32(), addr: d.U64(), n: d.U64(), sum: d.U32()}
	})
}

// statsReq: what an initiator's handle moved since its last report.
type statsReq struct{ writes, reads, in, out uint64 }

func (m statsReq) encode() []byte {
	b := make([]byte, 0, 32)
	for _, v := range [...]uint64{m.writes, m.reads, m.in, m.out} {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	return b
}

func decodeStats(p []byte) (statsReq, error) {
	return decodeAll("stats", p, func(d *wire.Reader) statsReq {
		return statsReq{writes: d.U64(), reads: d.U64(), in: d.U64(), out: d.U64()}
	})
}

// resolveReq names a remote region; its answer is resolveAnswer.
type resolveReq struct {
	id   rdma.RegionID
	key  uint32
	base uint64
}

func (m resolveReq) encode() []byte { return appendRegion(make([]byte, 0, 20), m.id, m.key, m.base) }

func decodeResolve(p []byte) (resolveReq, error) {
	return decodeAll("resolve", p, func(d *wire.Reader) resolveReq {
		return resolveReq{id: rdma.RegionID(d.U64()), key: d.U32(), base: d.U64()}
	})
}

// resolveAnswer: a region's address, length and rkeys, one per owner
// device (1 to 255 of them).
type resolveAnswer struct {
	addr, size uint64
	rkeys      []uint32
}

func (m resolveAnswer) encode() []byte {
	b := make([]byte, 0, 17+4*len(m.rkeys))
	b = binary.BigEndian.AppendUint64(b, m.addr)
	b = binary.BigEndian.AppendUint64(b, m.size)
	b = append(b, byte(len(m.rkeys)))
	for _, k := range m.rkeys {
		b = binary.BigEndian.AppendUint32(b, k)
	}
	return b
}

func decodeResolveAnswer(p []byte) (resolveAnswer, error) {
	d := wire.Reader{B: p}
	m := resolveAnswer{addr: d.U64(), size: d.U64()}
	n := int(d.U8())
	raw := d.Take(4 * n) // present before anything is allocated
	if !d.Done() || n == 0 {
		return resolveAnswer{}, fmt.Errorf("%w: resolve answer of %d bytes", rdma.ErrProtocol, len(p))
	}
	m.rkeys = make([]uint32, n)
	for i := range m.rkeys {
		m.rkeys[i] = binary.BigEndian.Uint32(raw[4*i:])
	}
	return m, nil
}

// encodeErr encodes an error answer: its code and as much of its text as
// fits in a message.
func encodeErr(code byte, msg string) []byte {
	if len(msg) > maxMsg-1 {
		msg = msg[:maxMsg-1]
	}
	return append([]byte{code}, msg...)
}

// decodeErr returns the error an error answer carries: its code's
// (rdma.ErrProtocol for a code this build does not know) with its text.
func decodeErr(p []byte) error {
	d := wire.Reader{B: p}
	code := d.U8()
	if d.Bad {
		return fmt.Errorf("%w: empty error", rdma.ErrProtocol)
	}
	e, ok := codeErrs[code]
	if !ok {
		e = rdma.ErrProtocol
	}
	return fmt.Errorf("remote: %w: %s", e, d.B)
}

func randPSN() uint32 {
	var b [4]byte
	_, _ = crand.Read(b[:])
	return binary.BigEndian.Uint32(b[:]) & 0xffffff
}
