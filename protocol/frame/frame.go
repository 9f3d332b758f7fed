// Package frame is the data-plane frame header of the TCP transfer layer
// (rdma/tcp): a fixed 48-byte, versioned, self-checked header that precedes
// every request, response and payload chunk on a transfer connection.
//
// Layout (all integers big-endian):
//
//	off len field
//	  0   4 magic      "TPXF" (0x54505846)
//	  4   1 version    Version (1)
//	  5   1 op         Op
//	  6   1 flags      FlagLast, ...
//	  7   1 status     Status (responses; 0 in requests)
//	  8   8 request id chosen by the initiator, echoed in responses
//	 16   8 region id  target region on the owner of the memory
//	 24   4 region key token returned by Register; guards against stale ids
//	 28   8 offset     byte offset inside the region
//	 36   4 length     payload bytes that follow this header (for OpRead:
//	                   bytes requested; no payload follows)
//	 40   4 crc        CRC-32C (Castagnoli) of the payload that follows
//	 44   4 hdr crc    CRC-32C of bytes 0..43
//
// Decode is the only decoder; it checks magic, version, op, header checksum
// and the length bound, so a reader never trusts a length it has not
// validated.
package frame

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/tidepool-kv/tidepool/internal/crc32c"
)

// HeaderSize is the encoded size of a Header in bytes.
const HeaderSize = 48

// Magic opens every frame: "TPXF".
const Magic uint32 = 0x54505846

// Version is the frame format version this package writes and accepts.
const Version uint8 = 1

// MaxLength bounds Header.Length: a single frame never carries more than
// this many payload bytes (and a read request never asks for more in one
// frame). 64 MiB.
const MaxLength = 64 << 20

// Op says what a frame is.
type Op uint8

// Ops. Requests are sent by the initiator, responses by the memory owner.
const (
	OpHello    Op = 1 // handshake request: Length 0
	OpHelloAck Op = 2 // handshake response
	OpWrite    Op = 3 // payload chunk to apply at Region/Offset; FlagLast on the final chunk
	OpWriteAck Op = 4 // response to the final write chunk: Status
	OpRead     Op = 5 // request Length bytes at Region/Offset
	OpReadData Op = 6 // response chunk carrying read bytes; FlagLast on the final chunk
	OpError    Op = 7 // response: Status says why, payload is a short UTF-8 message
	// OpFetch is a named read (two-sided): the payload (bounded by the
	// transport, rdma.MaxFetchRequest) names what to read, in a format
	// the owner's fetch handler understands; Region, Key and Offset are 0.
	// The owner answers with one OpFetchMeta, or OpError.
	OpFetch Op = 8
	// OpFetchMeta answers an OpFetch: the payload (bounded by the
	// transport, rdma.MaxFetchMeta) is the handler's metadata, Offset is
	// the number of data bytes that follow as OpReadData chunks (summed:
	// their Offset counts from 0 within the data, FlagLast on the final
	// one) and Key is the CRC-32C of all the data, which the initiator
	// checks as it lands.
	OpFetchMeta Op = 9
	opSentinel  Op = 10 // first unknown op
)

// String names an op for logs.
func (o Op) String() string {
	switch o {
	case OpHello:
		return "hello"
	case OpHelloAck:
		return "hello-ack"
	case OpWrite:
		return "write"
	case OpWriteAck:
		return "write-ack"
	case OpRead:
		return "read"
	case OpReadData:
		return "read-data"
	case OpError:
		return "error"
	case OpFetch:
		return "fetch"
	case OpFetchMeta:
		return "fetch-meta"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Flags.
const (
	// FlagLast marks the final chunk of a write or of read data.
	FlagLast uint8 = 1 << 0
	// FlagSummed marks a transfer checked end to end against a CRC-32C
	// that the initiator holds (a block's stored checksum) instead of
	// chunk by chunk: on an OpRead request it asks the owner to send the
	// data chunks without their CRC (OpReadData chunks then carry the flag
	// and CRC 0, and the initiator checks the whole read); on OpWrite
	// chunks the CRC field is 0 except on the last chunk, where it is the
	// expected CRC-32C of the whole write, which the owner checks. Peers
	// that predate the flag refuse it (ErrFlags): the transfer fails, it
	// never passes unchecked.
	FlagSummed uint8 = 1 << 1
	flagMask         = FlagLast | FlagSummed
)

// Status is the result carried by a response frame.
type Status uint8

// Statuses.
const (
	StatusOK            Status = 0
	StatusUnknownRegion Status = 1 // no such region id, or the key does not match
	StatusOutOfRange    Status = 2 // offset+length beyond the region
	StatusChecksum      Status = 3 // payload CRC mismatch
	StatusTooLarge      Status = 4 // length above the receiver's limit
	StatusBadRequest    Status = 5 // malformed or unexpected frame
	StatusShutdown      Status = 6 // receiver is closing
	StatusInternal      Status = 7
	StatusUnsupported   Status = 8 // the receiver does not serve that request (a named read)
	statusSentinel      Status = 9
)

// String names a status for logs and error messages.
func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusUnknownRegion:
		return "unknown region"
	case StatusOutOfRange:
		return "out of range"
	case StatusChecksum:
		return "checksum mismatch"
	case StatusTooLarge:
		return "too large"
	case StatusBadRequest:
		return "bad request"
	case StatusShutdown:
		return "shutting down"
	case StatusInternal:
		return "internal error"
	case StatusUnsupported:
		return "unsupported"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Errors returned by Decode and ReadHeader.
var (
	ErrMagic     = errors.New("frame: bad magic")
	ErrVersion   = errors.New("frame: unsupported version")
	ErrOp        = errors.New("frame: unknown op")
	ErrFlags     = errors.New("frame: unknown flags")
	ErrStatus    = errors.New("frame: unknown status")
	ErrHeaderCRC = errors.New("frame: header checksum mismatch")
	ErrLength    = errors.New("frame: length above limit")
	ErrShort     = errors.New("frame: short header")
)

// Header is one decoded frame header.
type Header struct {
	Op        Op
	Flags     uint8
	Status    Status
	RequestID uint64
	Region    uint64
	Key       uint32
	Offset    uint64
	Length    uint32
	CRC       uint32
}

// Last reports whether FlagLast is set.
func (h Header) Last() bool { return h.Flags&FlagLast != 0 }

// Checksum returns the CRC-32C of b (the payload checksum of a frame; the
// same function as the store's cache.Checksum).
func Checksum(b []byte) uint32 { return crc32c.Checksum(b) }

// UpdateChecksum extends crc with b: the CRC-32C of a transfer taken
// chunk by chunk (FlagSummed).
func UpdateChecksum(crc uint32, b []byte) uint32 { return crc32c.Update(crc, b) }

// Summed reports whether FlagSummed is set.
func (h Header) Summed() bool { return h.Flags&FlagSummed != 0 }

// Encode writes h into dst, which must hold HeaderSize bytes, and returns
// dst[:HeaderSize]. Encode does not validate h; Decode does on the other end.
func Encode(dst []byte, h Header) []byte {
	b := dst[:HeaderSize]
	binary.BigEndian.PutUint32(b[0:], Magic)
	b[4] = Version
	b[5] = byte(h.Op)
	b[6] = h.Flags
	b[7] = byte(h.Status)
	binary.BigEndian.PutUint64(b[8:], h.RequestID)
	binary.BigEndian.PutUint64(b[16:], h.Region)
	binary.BigEndian.PutUint32(b[24:], h.Key)
	binary.BigEndian.PutUint64(b[28:], h.Offset)
	binary.BigEndian.PutUint32(b[36:], h.Length)
	binary.BigEndian.PutUint32(b[40:], h.CRC)
	binary.BigEndian.PutUint32(b[44:], crc32c.Checksum(b[:44]))
	return b
}

// Decode parses the first HeaderSize bytes of b. It is the only header
// decoder: it rejects a bad magic, another version, an unknown op, flag or
// status, a header checksum mismatch and a length above MaxLength.
func Decode(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, ErrShort
	}
	if m := binary.BigEndian.Uint32(b[0:]); m != Magic {
		return Header{}, fmt.Errorf("%w: %#x", ErrMagic, m)
	}
	if b[4] != Version {
		return Header{}, fmt.Errorf("%w: %d (want %d)", ErrVersion, b[4], Version)
	}
	if got, want := binary.BigEndian.Uint32(b[44:]), crc32c.Checksum(b[:44]); got != want {
		return Header{}, ErrHeaderCRC
	}
	h := Header{
		Op:        Op(b[5]),
		Flags:     b[6],
		Status:    Status(b[7]),
		RequestID: binary.BigEndian.Uint64(b[8:]),
		Region:    binary.BigEndian.Uint64(b[16:]),
		Key:       binary.BigEndian.Uint32(b[24:]),
		Offset:    binary.BigEndian.Uint64(b[28:]),
		Length:    binary.BigEndian.Uint32(b[36:]),
		CRC:       binary.BigEndian.Uint32(b[40:]),
	}
	if h.Op == 0 || h.Op >= opSentinel {
		return Header{}, fmt.Errorf("%w: %d", ErrOp, uint8(h.Op))
	}
	if h.Flags&^flagMask != 0 {
		return Header{}, fmt.Errorf("%w: %#x", ErrFlags, h.Flags)
	}
	if h.Status >= statusSentinel {
		return Header{}, fmt.Errorf("%w: %d", ErrStatus, uint8(h.Status))
	}
	if h.Length > MaxLength {
		return Header{}, fmt.Errorf("%w: %d > %d", ErrLength, h.Length, MaxLength)
	}
	return h, nil
}

// ReadHeader reads exactly HeaderSize bytes from r into buf and decodes
// them. A stream that ends before the first byte returns io.EOF; one that
// ends inside the header returns io.ErrUnexpectedEOF.
func ReadHeader(r io.Reader, buf *[HeaderSize]byte) (Header, error) {
	if _, err := io.ReadFull(r, buf[:]); err != nil {
		return Header{}, err
	}
	return Decode(buf[:])
}
