package main

import (
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/proxy"
)

// TestLimitsFromConfig checks that serve's defaults are the library's
// (written once, in cache and proxy) and that one cache.Limits carries the
// settings to the proxy and the tiers.
func TestLimitsFromConfig(t *testing.T) {
	d := DefaultConfig()
	if got, want := d.limits(), cache.DefaultLimits(); got != want {
		t.Fatalf("default limits %+v, want cache.DefaultLimits %+v", got, want)
	}
	if d.MaxNamespaces != proxy.DefaultConfig().MaxNamespaces {
		t.Fatalf("max_namespaces default %d, proxy's %d", d.MaxNamespaces, proxy.DefaultConfig().MaxNamespaces)
	}
	d.MaxKeySize, d.MaxValueSize, d.MaxBatch = 64, 1<<20, 16
	want := cache.Limits{MaxKeyBytes: 64, MaxValueBytes: 1 << 20, MaxNamespaceBytes: cache.DefaultMaxNamespaceBytes, MaxBatch: 16}
	if got := d.limits(); got != want {
		t.Fatalf("limits %+v, want %+v", got, want)
	}
}
