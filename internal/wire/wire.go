// Package wire reads the big-endian fields of the hand-written binary
// messages (the peer API's named reads, the engine API's buffer socket,
// the verbs transport's control messages, node metadata).
package wire

import "encoding/binary"

// Reader reads fields from B. Past its end it sets Bad and returns zeros
// (nil for bytes), so that a message is decoded field by field and
// checked once at the end (Done).
type Reader struct {
	B   []byte
	Bad bool
}

// Take returns the next n bytes (sharing B's memory).
func (d *Reader) Take(n int) []byte {
	if d.Bad || n < 0 || n > len(d.B) {
		d.Bad = true
		return nil
	}
	v := d.B[:n:n]
	d.B = d.B[n:]
	return v
}

// U8 reads one byte.
func (d *Reader) U8() uint8 {
	if v := d.Take(1); v != nil {
		return v[0]
	}
	return 0
}

// U16 reads a big-endian uint16.
func (d *Reader) U16() uint16 {
	if v := d.Take(2); v != nil {
		return binary.BigEndian.Uint16(v)
	}
	return 0
}

// U32 reads a big-endian uint32.
func (d *Reader) U32() uint32 {
	if v := d.Take(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

// U64 reads a big-endian uint64.
func (d *Reader) U64() uint64 {
	if v := d.Take(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// Str16 reads a u16 length and that many bytes.
func (d *Reader) Str16() []byte {
	n := d.U16()
	if d.Bad {
		return nil
	}
	return d.Take(int(n))
}

// Done reports whether every field was there and nothing follows them.
func (d *Reader) Done() bool { return !d.Bad && len(d.B) == 0 }
