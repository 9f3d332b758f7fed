package engineapi_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/cache/evict"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/engineapi"
)

// TestCloseRightAfterStart: Close returns, and the socket is released,
// whether it comes before Start, right after it (before Kitex's Run has
// built its server: Kitex's Stop is then a no-op, and Run used to serve
// forever, so Close hung), or once the server runs.
func TestCloseRightAfterStart(t *testing.T) {
	t.Parallel() // its own store and socket
	dcfg := dram.DefaultConfig()
	dcfg.Dir = t.TempDir()
	dcfg.Capacity, dcfg.ArenaSize = 8<<20, 8<<20
	dcfg.Policy = evict.NewLRU
	tier, err := dram.New(dcfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tier.Close()
	pcfg := proxy.DefaultConfig()
	pcfg.NodeID = "test-node"
	p, err := proxy.New(pcfg, proxy.Deps{Store: tier, ZeroCopy: tier, Scan: tier}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "tp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	socket := filepath.Join(dir, "tp.sock")
	for i := range 30 {
		ln, err := engineapi.Listen(socket, 0o600, -1)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		srv, err := engineapi.NewServer(engineapi.DefaultConfig(), p, ln, nil)
		if err != nil {
			t.Fatal(err)
		}
		switch i % 3 {
		case 1: // Close right after Start
			if err := srv.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
		case 2: // Close once it runs
			if err := srv.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			<-srv.Ready()
		}
		closed := make(chan error, 1)
		go func() { closed <- srv.Close() }()
		select {
		case <-closed:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: Close did not return", i)
		}
		select {
		case <-srv.Done():
		default:
			t.Fatalf("round %d: Done not closed after Close", i)
		}
	}
}
