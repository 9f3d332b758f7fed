package client

import (
	"context"

	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
)

// AppendGet is Get that appends the block's bytes to dst and returns the
// extended slice, as strconv.AppendInt does: a caller that passes a
// buffer with room for the block (dst[:0] of a buffer it reuses) reads
// blocks through the socket without an allocation per call. The bytes
// go from the socket straight into dst (rawget.go: Get and AppendGet
// call on connections of their own, not through Kitex). On a miss or an
// error dst comes back unchanged.
// The scope is as Get's.
func (c *Client) AppendGet(ctx context.Context, dst []byte, ns string, key []byte, scope ...Scope) (value []byte, found bool, err error) {
	res, err := c.rawGet(ctx, dst, &tp.GetRequest{Ns: ns, Key: key, Scope: scopeOf(scope)})
	if err != nil {
		return dst, false, err
	}
	if res.err != nil {
		return dst, false, &Error{Code: res.err.Code, Message: res.err.Message}
	}
	if !res.found {
		return dst, false, nil
	}
	return res.dst, true, nil
}

// appendGet is the result of an AppendGet: the reply's value appended to
// dst (the shape of tp.TidepoolGetResult: field 0 the GetResponse, field
// 1 the declared exception; rawget.go reads it from the socket).
type appendGet struct {
	dst   []byte
	base  int // len(dst) before the call: a repeated field replaces, not appends
	found bool
	err   *tp.TidepoolError
	// maxValue bounds the value (Config.MaxResponseBytes).
	maxValue int
}
