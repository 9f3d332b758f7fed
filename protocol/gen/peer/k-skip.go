// Code added by scripts/gen-idl.sh (safe_skip). DO NOT EDIT.

package peer

import "github.com/cloudwego/gopkg/protocol/thrift"

// skipUnknown skips a field of type t like thrift.Binary.Skip, which
// panics on a type byte of 0x80 or more; that is refused instead.
func skipUnknown(b []byte, t thrift.TType) (n int, err error) {
	defer func() {
		if recover() != nil {
			n, err = 0, thrift.NewProtocolException(thrift.INVALID_DATA, "invalid field type")
		}
	}()
	return thrift.Binary.Skip(b, t)
}
