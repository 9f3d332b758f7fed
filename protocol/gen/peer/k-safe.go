// Code added by scripts/gen-idl.sh (safe_skip). DO NOT EDIT.

package peer

import "github.com/cloudwego/gopkg/protocol/thrift"

// maxContainerLen bounds the length of any list, set or map the
// decoders accept (bound_lists): far above any batch the servers
// allow (max_batch is at most this), low enough that a list of
// empty structs costs at most 64 MiB.
const maxContainerLen = 1 << 20

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
