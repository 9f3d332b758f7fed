//go:build verbs

package verbs

import (
	crand "crypto/rand"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/tidepool-kv/tidepool/rdma"
)

// Control messages: [type u8][len u16 BE][payload]. Requests go from the
// initiator to the owner; every request has one answer, msgOK (with a
// payload for msgConnect) or msgErr (code u8, text).
const (
	msgHello   = 1 // "TPVB" + version u8
	msgConnect = 2 // connData
	msgDestroy = 3 // qpn u32
	msgCheck   = 4 // id u64, key u32, addr u64, len u64, sum u32
	msgStats   = 5 // writes, reads, bytesIn, bytesOut: u64 each
	msgPing    = 6
	msgOK      = 7
	msgErr     = 8
	msgResolve = 9 // id u64, key u32, base u64 -> addr u64, len u64, n u8, n x rkey u32 (one per device)

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
	b := make([]byte, 3+len(payload))
	b[0] = typ
	binary.BigEndian.PutUint16(b[1:], uint16(len(payload)))
	copy(b[3:], payload)
	_, err := w.Write(b)
	return err
}

func readMsg(r io.Reader) (byte, []byte, error) {
	var h [3]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint16(h[1:]))
	if n > maxMsg {
		return 0, nil, fmt.Errorf("%w: control message of %d bytes", rdma.ErrProtocol, n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, err
	}
	return h[0], p, nil
}

func (d connData) encode() []byte {
	b := make([]byte, connDataLen)
	copy(b, d.GID[:])
	binary.BigEndian.PutUint32(b[16:], d.QPN)
	binary.BigEndian.PutUint32(b[20:], d.PSN)
	b[24] = d.MTU
	binary.BigEndian.PutUint16(b[25:], d.LID)
	return b
}

// decodeConnData parses and validates connection data from a peer.
func decodeConnData(b []byte) (connData, error) {
	var d connData
	if len(b) != connDataLen {
		return d, fmt.Errorf("%w: connection data of %d bytes, want %d", rdma.ErrProtocol, len(b), connDataLen)
	}
	copy(d.GID[:], b)
	d.QPN = binary.BigEndian.Uint32(b[16:])
	d.PSN = binary.BigEndian.Uint32(b[20:])
	d.MTU = b[24]
	d.LID = binary.BigEndian.Uint16(b[25:])
	switch {
	case d.QPN == 0 || d.QPN > 0xffffff:
		return d, fmt.Errorf("%w: QPN %#x out of range", rdma.ErrProtocol, d.QPN)
	case d.PSN > 0xffffff:
		return d, fmt.Errorf("%w: PSN %#x out of range", rdma.ErrProtocol, d.PSN)
	case d.MTU < 1 || d.MTU > 5:
		return d, fmt.Errorf("%w: MTU enum %d out of range", rdma.ErrProtocol, d.MTU)
	}
	return d, nil
}

func randPSN() uint32 {
	var b [4]byte
	_, _ = crand.Read(b[:])
	return binary.BigEndian.Uint32(b[:]) & 0xffffff
}

func msgText(p []byte) string {
	if len(p) < 1 {
		return ""
	}
	return string(p[1:])
}
