package tcp

import (
	"testing"

	"github.com/tidepool-kv/tidepool/rdma"
	"github.com/tidepool-kv/tidepool/rdma/rdmatest"
)

func newLocal(t testing.TB, mod func(*Config)) *Transport {
	t.Helper()
	cfg := DefaultLocalConfig()
	if mod != nil {
		mod(&cfg)
	}
	tr, err := New(cfg, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

func TestConformance(t *testing.T) {
	rdmatest.Run(t, func(t *testing.T) (rdma.Transport, rdma.Transport) {
		return newLocal(t, nil), newLocal(t, nil)
	})
}

func TestConformanceSmallChunks(t *testing.T) {
	rdmatest.Run(t, func(t *testing.T) (rdma.Transport, rdma.Transport) {
		small := func(c *Config) { c.ChunkSize = 64 << 10; c.MaxConnsPerPeer = 4 }
		return newLocal(t, small), newLocal(t, small)
	})
}
