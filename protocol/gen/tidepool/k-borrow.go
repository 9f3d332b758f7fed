// Code added by scripts/gen-idl.sh (borrow_values). DO NOT EDIT.

package tidepool

import (
	"bytes"
	"encoding/binary"

	"github.com/cloudwego/gopkg/protocol/thrift"
)

// borrowBinary reads a binary field as thrift.Binary.ReadBinary does,
// but returns a slice of b instead of a copy (its capacity ends with
// the field, so an append cannot write over the bytes after it).
func borrowBinary(b []byte) (v []byte, l int, err error) {
	if len(b) < 4 {
		return nil, 0, thrift.NewProtocolException(thrift.INVALID_DATA, "binary length past the end of the message")
	}
	sz := int32(binary.BigEndian.Uint32(b))
	if sz < 0 {
		return nil, 0, thrift.NewProtocolException(thrift.NEGATIVE_SIZE, "negative binary length")
	}
	l = 4 + int(sz)
	if len(b) < l {
		return nil, 0, thrift.NewProtocolException(thrift.INVALID_DATA, "binary value past the end of the message")
	}
	return b[4:l:l], l, nil
}

// OwnValues replaces the borrowed put value with a copy of its own.
func (p *TidepoolPutArgs) OwnValues() {
	if p.Req != nil {
		p.Req.Value = bytes.Clone(p.Req.Value)
	}
}

// OwnValues replaces the borrowed put values with copies of their own.
func (p *TidepoolBatchPutArgs) OwnValues() {
	if p.Req == nil {
		return
	}
	for _, it := range p.Req.Items {
		if it != nil {
			it.Value = bytes.Clone(it.Value)
		}
	}
}
