package client_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/tidepool-kv/tidepool/client"
)

// BenchmarkSmallGetOp: what one op costs when its bytes cost nothing: a
// get of a 64-byte block from one caller, on the buffer socket (its
// hand-written encoding, Buffer.Get into a registered buffer) against
// the engine socket (the IDL's Get call: Kitex's codec both ways with
// Get, the reply read by hand into the caller's buffer with AppendGet),
// one sidecar, side by side in one run. The figure beside "Buffer
// socket" in docs/architecture.md ("Hand-written wire formats"):
//
//	go test ./client/ -run '^$' -bench BenchmarkSmallGetOp -count 5
func BenchmarkSmallGetOp(b *testing.B) {
	ctx := context.Background()
	c := startBufferSidecar(b)
	const keys, size = 16, 64
	val := make([]byte, size)
	for k := range keys {
		val[0] = byte(k)
		if _, err := c.Put(ctx, "op", []byte{byte(k)}, val, 0); err != nil {
			b.Fatal(err)
		}
	}
	buf, err := c.RegisterBuffer(ctx, 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	defer buf.Close()
	dst := make([]byte, 0, size)
	check := func(n int, found bool, err error) {
		if err == nil && (!found || n != size) {
			err = fmt.Errorf("get: %d bytes, found %v", n, found)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	b.Run("buffer-socket", func(b *testing.B) {
		i := 0
		for b.Loop() {
			check(buf.Get(ctx, "op", []byte{byte(i % keys)}, 0, size, client.ScopeDefault))
			i++
		}
	})
	b.Run("engine-socket-AppendGet", func(b *testing.B) {
		i := 0
		for b.Loop() {
			v, found, err := c.AppendGet(ctx, dst[:0], "op", []byte{byte(i % keys)})
			check(len(v), found, err)
			i++
		}
	})
	b.Run("engine-socket-Get", func(b *testing.B) {
		i := 0
		for b.Loop() {
			v, found, err := c.Get(ctx, "op", []byte{byte(i % keys)})
			check(len(v), found, err)
			i++
		}
	})
}
