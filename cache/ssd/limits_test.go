package ssd

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
)

// TestDefaultLimitsAreTheProxys checks that the tier's default limits are
// cache.Limits' defaults, the ones the proxy enforces: a namespace of 256
// bytes, which the proxy accepts, was refused by this tier's default of 255.
func TestDefaultLimitsAreTheProxys(t *testing.T) {
	d, l := DefaultConfig(), cache.DefaultLimits()
	if d.MaxKeySize != l.MaxKeyBytes || d.MaxValueSize != l.MaxValueBytes || d.MaxNamespaceSize != l.MaxNamespaceBytes {
		t.Fatalf("ssd defaults key %d value %d namespace %d; cache.DefaultLimits %+v",
			d.MaxKeySize, d.MaxValueSize, d.MaxNamespaceSize, l)
	}
	tr := newTier(t, testConfig(t.TempDir()))
	ctx := context.Background()
	for _, tc := range []struct {
		nsLen int
		err   error
	}{
		{l.MaxNamespaceBytes, nil},
		{l.MaxNamespaceBytes + 1, cache.ErrInvalidKey},
	} {
		ns := strings.Repeat("n", tc.nsLen)
		if _, err := tr.Put(ctx, ns, []byte("k"), []byte("v"), cache.PutOptions{}); !errors.Is(err, tc.err) {
			t.Fatalf("put in a namespace of %d bytes: %v, want %v", tc.nsLen, err, tc.err)
		}
	}
}
