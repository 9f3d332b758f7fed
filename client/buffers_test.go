package client_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/tidepool-kv/tidepool/client"
	"github.com/tidepool-kv/tidepool/proxy/engineapi"
)

// startBufferSidecar is startSidecar with the buffer socket served.
func startBufferSidecar(t testing.TB) *client.Client {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "tpbuf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ecfg := engineapi.DefaultConfig()
	if ecfg.BufferListener, err = engineapi.Listen(filepath.Join(dir, "tp.sock")+engineapi.BufferSocketSuffix, 0o600, -1); err != nil {
		t.Fatal(err)
	}
	runSidecarWith(t, dir, 64<<20, ecfg)
	c, err := client.New(filepath.Join(dir, "tp.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestRegisteredBuffer: Put from and Get into a registered buffer, against
// a sidecar in this process; the blocks are those the engine socket sees.
func TestRegisteredBuffer(t *testing.T) {
	c := startBufferSidecar(t)
	ctx := context.Background()
	b, err := c.RegisterBuffer(ctx, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	mem := b.Bytes()
	value := randBlock(7)
	copy(mem[100:], value)
	if existed, err := b.Put(ctx, "ns", []byte("k"), 100, len(value), 3); err != nil || existed {
		t.Fatalf("Put: existed %v, %v", existed, err)
	}
	got, found, err := c.Get(ctx, "ns", []byte("k"))
	if err != nil || !found || !bytes.Equal(got, value) {
		t.Fatalf("Get through the engine socket: %d bytes, found %v, %v", len(got), found, err)
	}
	if existed, err := b.Put(ctx, "ns", []byte("k"), 0, len(value), 3); err != nil || !existed {
		t.Fatalf("second Put: existed %v, %v", existed, err)
	}

	clear(mem)
	n, found, err := b.Get(ctx, "ns", []byte("k"), 1<<20, 2<<20, client.ScopeDefault)
	if err != nil || !found || n != len(value) || !bytes.Equal(mem[1<<20:1<<20+n], value) {
		t.Fatalf("Get: %d bytes, found %v, %v", n, found, err)
	}
	if !bytes.Equal(mem[:1<<20], make([]byte, 1<<20)) || !bytes.Equal(mem[1<<20+n:], make([]byte, len(mem)-1<<20-n)) {
		t.Fatal("Get wrote outside the block's range")
	}
	if _, found, err := b.Get(ctx, "ns", []byte("absent"), 0, 1<<20, client.ScopeDefault); err != nil || found {
		t.Fatalf("miss: found %v, %v", found, err)
	}
	if _, _, err := b.Get(ctx, "ns", []byte("k"), 0, 10, client.ScopeDefault); client.CodeOf(err) != client.CodeTooLarge {
		t.Fatalf("too large: %v", err)
	}
	for _, r := range [][2]int{{-1, 10}, {0, -1}, {4 << 20, 1}, {1, 4 << 20}} {
		if _, _, err := b.Get(ctx, "ns", []byte("k"), r[0], r[1], client.ScopeDefault); client.CodeOf(err) != client.CodeInvalidArgument {
			t.Fatalf("Get(%d, %d): %v, want INVALID_ARGUMENT", r[0], r[1], err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, _, err := b.Get(ctx, "ns", []byte("k"), 0, 10, client.ScopeDefault); client.CodeOf(err) != client.CodeUnavailable {
		t.Fatalf("Get after Close: %v, want UNAVAILABLE", err)
	}
}

// TestRegisterBufferWithoutSocket: a sidecar that does not serve the
// buffer socket answers UNAVAILABLE.
func TestRegisterBufferWithoutSocket(t *testing.T) {
	c := startSidecar(t, 16<<20)
	if _, err := c.RegisterBuffer(context.Background(), 1<<20); client.CodeOf(err) != client.CodeUnavailable {
		t.Fatalf("RegisterBuffer: %v, want UNAVAILABLE", err)
	}
}
