package engineapi

import (
	"errors"

	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy/wirecode"
)

// Domain errors become codes in one place, the table of proxy/wirecode,
// shared with the peer API.

// toThrift converts a domain error to the API's exception.
func toThrift(err error) error {
	if err == nil {
		return nil
	}
	return &tp.TidepoolError{Code: wirecode.Code(err), Message: err.Error()}
}

// itemResult converts a per-item error to its result entry.
func itemResult(err error) *tp.ItemStatus {
	r := &tp.ItemStatus{Code: wirecode.Code(err)}
	if err != nil {
		r.Message = err.Error()
	}
	return r
}

// codeOf names the protocol code an error returned by a handler carries.
func codeOf(err error) string {
	if err == nil {
		return "OK"
	}
	var te *tp.TidepoolError
	if errors.As(err, &te) {
		return te.Code.String()
	}
	return "TRANSPORT"
}
