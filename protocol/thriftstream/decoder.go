// Package thriftstream reads Thrift binary-protocol messages from a stream
// as they arrive, for the two places that take a value straight off a Unix
// socket instead of through Kitex's buffers: the Go client's AppendGet
// reads a Get reply's value into the caller's buffer, and the sidecar's put
// socket reads a Put's value into its arena slot.
//
// A Decoder never allocates for what a length field claims, only for bytes
// that arrived; it bounds nesting and what it keeps of a value captured
// whole, and checks a message header strictly (version 1 of the strict
// binary protocol, a method name of at most 64 bytes).
package thriftstream

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/cloudwego/gopkg/protocol/thrift"
)

const (
	// MaxSkipDepth bounds the nesting of a value the decoder skips.
	MaxSkipDepth = 64
	// MaxCaptureBytes bounds a value kept whole for a generated decoder
	// (an error struct, an application exception).
	MaxCaptureBytes = 1 << 20
	// MaxMethodBytes bounds a message's method name.
	MaxMethodBytes = 64

	msgVersionMask = 0xffff0000
	msgVersion1    = 0x80010000
)

// IOError marks an error of reading the stream, as against bytes that
// arrived but do not parse (a protocol exception).
type IOError struct{ Err error }

func (e IOError) Error() string { return e.Err.Error() }
func (e IOError) Unwrap() error { return e.Err }

// Decoder reads one message at a time from R.
type Decoder struct {
	R *bufio.Reader
	// What names the messages read in errors ("reply", "request").
	What    string
	scratch [8]byte
	// tee, when not nil, receives every byte read (CaptureStruct).
	tee *[]byte
}

// Errorf returns a protocol exception (INVALID_DATA) about the message.
func (d *Decoder) Errorf(format string, args ...any) error {
	return thrift.NewProtocolException(thrift.INVALID_DATA, d.What+": "+fmt.Sprintf(format, args...))
}

// read returns the next n (≤ 8) bytes, valid until the next read.
func (d *Decoder) read(n int) ([]byte, error) {
	b := d.scratch[:n]
	if _, err := io.ReadFull(d.R, b); err != nil {
		return nil, IOError{eof(err)}
	}
	return b, d.keep(b)
}

// Byte reads one byte.
func (d *Decoder) Byte() (byte, error) {
	b, err := d.read(1)
	if err != nil {
		return 0, err
	}
	return b[0], nil
}

// I16 reads a big-endian 16-bit integer.
func (d *Decoder) I16() (int16, error) {
	b, err := d.read(2)
	if err != nil {
		return 0, err
	}
	return int16(binary.BigEndian.Uint16(b)), nil
}

// I32 reads a big-endian 32-bit integer.
func (d *Decoder) I32() (int32, error) {
	b, err := d.read(4)
	if err != nil {
		return 0, err
	}
	return int32(binary.BigEndian.Uint32(b)), nil
}

// keep appends b to the capture, if one is on.
func (d *Decoder) keep(b []byte) error {
	if d.tee == nil {
		return nil
	}
	if len(*d.tee)+len(b) > MaxCaptureBytes {
		return d.Errorf("a field decoded whole is over %d bytes", MaxCaptureBytes)
	}
	*d.tee = append(*d.tee, b...)
	return nil
}

// Discard skips the next n bytes (into the capture, if one is on).
func (d *Decoder) Discard(n int) error {
	if d.tee != nil {
		if len(*d.tee)+n > MaxCaptureBytes {
			return d.Errorf("a field decoded whole is over %d bytes", MaxCaptureBytes)
		}
		var err error
		*d.tee, err = d.AppendN(*d.tee, n)
		return err
	}
	if k, err := d.R.Discard(n); err != nil || k < n {
		return IOError{eof(err)}
	}
	return nil
}

// ReadFull reads exactly len(dst) bytes into dst; a read of at least the
// reader's buffer size goes from the stream straight into dst.
func (d *Decoder) ReadFull(dst []byte) error {
	if _, err := io.ReadFull(d.R, dst); err != nil {
		return IOError{eof(err)}
	}
	return d.keep(dst)
}

// eof turns the end of the stream inside a message into ErrUnexpectedEOF.
func eof(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// MessageBegin reads a message header: its type, method name and
// sequence number.
func (d *Decoder) MessageBegin() (typ thrift.TMessageType, method string, seq int32, err error) {
	v, err := d.I32()
	if err != nil {
		return 0, "", 0, err
	}
	if uint32(v)&msgVersionMask != msgVersion1 {
		return 0, "", 0, d.Errorf("message header %#x: not the strict binary protocol", uint32(v))
	}
	typ = thrift.TMessageType(v & 0xffff)
	n, err := d.I32()
	if err != nil {
		return 0, "", 0, err
	}
	if n < 0 || n > MaxMethodBytes {
		return 0, "", 0, d.Errorf("method name of %d bytes", n)
	}
	name := make([]byte, 0, n)
	if name, err = d.AppendN(name, int(n)); err != nil {
		return 0, "", 0, err
	}
	if seq, err = d.I32(); err != nil {
		return 0, "", 0, err
	}
	return typ, string(name), seq, nil
}

// ReadStruct reads the fields of a struct up to its stop byte, calling
// field for each with its type and id; field reads (or skips) its value.
func (d *Decoder) ReadStruct(field func(d *Decoder, t thrift.TType, id int16) error) error {
	for {
		t, err := d.Byte()
		if err != nil {
			return err
		}
		if thrift.TType(t) == thrift.STOP {
			return nil
		}
		id, err := d.I16()
		if err != nil {
			return err
		}
		if err := field(d, thrift.TType(t), id); err != nil {
			return err
		}
	}
}

// Length reads a string's length and checks it against limit (what the
// caller will hold); what the string is, for the error.
func (d *Decoder) Length(what string, limit int64) (int, error) {
	n, err := d.I32()
	if err != nil {
		return 0, err
	}
	if n < 0 || int64(n) > limit {
		return 0, d.Errorf("%s of %d bytes (limit %d)", what, n, limit)
	}
	return int(n), nil
}

// AppendN appends the next n bytes of the stream to dst. Room is made as
// bytes arrive (at most what has arrived again, from 64 KiB), not for
// what n claims. A read of at least the reader's buffer size goes from
// the stream straight into dst.
func (d *Decoder) AppendN(dst []byte, n int) ([]byte, error) {
	end := len(dst) + n
	for len(dst) < end {
		if len(dst) == cap(dst) {
			grow := min(end-len(dst), max(len(dst), 64<<10))
			dst = append(dst, make([]byte, grow)...)[:len(dst)]
		}
		k, err := d.R.Read(dst[len(dst):min(cap(dst), end)])
		dst = dst[:len(dst)+k]
		if err != nil && len(dst) < end {
			return dst, IOError{eof(err)}
		}
	}
	return dst, nil
}

// CaptureStruct reads a struct whole and returns its encoding (its fields
// and stop byte), for a generated decoder. Its fields are skipped as the
// generated decoder skips them: each from depth 0.
func (d *Decoder) CaptureStruct() ([]byte, error) {
	var buf []byte
	d.tee = &buf
	defer func() { d.tee = nil }()
	if err := d.skipStruct(-1); err != nil {
		return nil, err
	}
	return buf, nil
}

// Skip reads past a value of type t, nested depth deep.
func (d *Decoder) Skip(t thrift.TType, depth int) error {
	if depth >= MaxSkipDepth {
		return d.Errorf("nested too deep")
	}
	switch t {
	case thrift.BOOL, thrift.BYTE:
		return d.Discard(1)
	case thrift.I16:
		return d.Discard(2)
	case thrift.I32:
		return d.Discard(4)
	case thrift.I64, thrift.DOUBLE:
		return d.Discard(8)
	case thrift.STRING:
		n, err := d.I32()
		if err != nil {
			return err
		}
		if n < 0 {
			return d.Errorf("string of %d bytes", n)
		}
		return d.Discard(int(n))
	case thrift.STRUCT:
		return d.skipStruct(depth)
	case thrift.MAP:
		// An element type of 0x80 and above is refused even in an empty
		// container, as the generated decoder refuses it; another unknown
		// type fails when an element of it is read.
		kt, err := d.Byte()
		if err != nil {
			return err
		}
		vt, err := d.Byte()
		if err != nil {
			return err
		}
		n, err := d.I32()
		if err != nil {
			return err
		}
		if n < 0 || kt >= 0x80 || vt >= 0x80 {
			return d.Errorf("map<%d,%d> of %d entries", kt, vt, n)
		}
		// Every value takes at least one byte of the stream, so a count
		// that claims more than arrives ends in a read error, not a loop
		// without input.
		for range n {
			if err := d.Skip(thrift.TType(kt), depth+1); err != nil {
				return err
			}
			if err := d.Skip(thrift.TType(vt), depth+1); err != nil {
				return err
			}
		}
		return nil
	case thrift.SET, thrift.LIST:
		et, err := d.Byte()
		if err != nil {
			return err
		}
		n, err := d.I32()
		if err != nil {
			return err
		}
		if n < 0 || et >= 0x80 {
			return d.Errorf("list<%d> of %d elements", et, n)
		}
		for range n {
			if err := d.Skip(thrift.TType(et), depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	return d.Errorf("unknown data type %d", t)
}

func (d *Decoder) skipStruct(depth int) error {
	return d.ReadStruct(func(d *Decoder, t thrift.TType, _ int16) error { return d.Skip(t, depth+1) })
}
