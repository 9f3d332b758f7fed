package engineapi

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy/wirecode"
)

// TestToThrift: every row of the one code table (proxy/wirecode, where
// TestCodeTable covers the rows themselves) reaches the engine as its code,
// with the error's message.
func TestToThrift(t *testing.T) {
	for _, row := range wirecode.Rows() {
		wrapped := fmt.Errorf("context: %w", row.Err)
		var te *tp.TidepoolError
		if !errors.As(toThrift(wrapped), &te) || te.Code != row.Code || te.Message != wrapped.Error() {
			t.Errorf("toThrift(%v) = %v, want %v", wrapped, te, row.Code)
		}
		if r := itemResult(wrapped); r.Code != row.Code || r.Message != wrapped.Error() {
			t.Errorf("itemResult(%v) = %v", wrapped, r)
		}
	}
	if toThrift(nil) != nil || itemResult(nil).Code != tp.ErrorCode_OK {
		t.Fatal("nil must be no error and OK")
	}
	if codeOf(nil) != "OK" || codeOf(toThrift(cache.ErrNoSpace)) != "NO_SPACE" || codeOf(errors.New("x")) != "TRANSPORT" {
		t.Fatal("codeOf")
	}
}
