package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/client"
)

// putClaim is a Put call on the put socket (Thrift binary, unframed) with
// every field before the value, whose length says claim: the bytes of the
// value are for the caller to send.
func putClaim(ns, key string, claim uint32) []byte {
	b := binary.BigEndian.AppendUint32(nil, 0x80010001) // strict, CALL
	b = binary.BigEndian.AppendUint32(b, 3)
	b = append(b, "Put"...)
	b = binary.BigEndian.AppendUint32(b, 1) // seq
	b = append(b, 12, 0, 1)                 // args field 1: the request
	str := func(id byte, s string) {
		b = append(b, 11, 0, id)
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	str(1, ns)
	str(2, key)
	b = append(b, 8, 0, 4, 0, 0, 0, 0) // depth
	b = append(b, 2, 0, 5, 0)          // durable false
	b = append(b, 8, 0, 6, 0, 0, 0, 0) // sync_replicas
	b = append(b, 11, 0, 3)            // the value
	return binary.BigEndian.AppendUint32(b, claim)
}

// TestServePutClaimsEvictNothing: 8 connections to the put socket of a
// real serve with a 128 MiB DRAM tier each claim a 16 MiB value and send
// 1 KiB of it; none of the 200 blocks put before is evicted (the claims
// take room only as bytes arrive). A claim over max_value_size is
// answered TOO_LARGE at once, before any of its bytes.
func TestServePutClaimsEvictNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	d := startDaemon(t, "--dram-capacity", "128MiB", "--max-value-size", "16MiB", "--max-request-size", "17MiB", "--ssd-capacity", "0")
	ctx := context.Background()
	c, err := client.New(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const blocks = 200
	keys := make([][]byte, blocks)
	val := make([]byte, 600<<10)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "blk-%03d", i)
		val[0] = byte(i)
		if _, err := c.Put(ctx, "ns", keys[i], val, 0); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	present := func() int {
		ps, err := c.BatchExists(ctx, "ns", keys)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, p := range ps {
			if p.Present {
				n++
			}
		}
		return n
	}
	if n := present(); n != blocks {
		t.Fatalf("%d of %d blocks present before the claims", n, blocks)
	}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range 8 {
		pc, err := net.Dial("unix", d.socket+".put")
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, pc)
		if _, err := pc.Write(append(putClaim("ns", fmt.Sprintf("claim-%d", i), 16<<20), make([]byte, 1<<10)...)); err != nil {
			t.Fatal(err)
		}
	}
	// Nothing to wait for but the server reading the claims: give it the
	// time, then look (an absence cannot be polled for).
	time.Sleep(500 * time.Millisecond)
	if n := present(); n != blocks {
		t.Fatalf("%d of %d blocks present after 8 claims of 16 MiB with 1 KiB sent each", n, blocks)
	}

	// A claim over max_value_size, none of its bytes sent: answered now.
	pc, err := net.Dial("unix", d.socket+".put")
	if err != nil {
		t.Fatal(err)
	}
	conns = append(conns, pc)
	if _, err := pc.Write(putClaim("ns", "huge", 32<<20)); err != nil {
		t.Fatal(err)
	}
	_ = pc.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, 4096)
	n, err := pc.Read(got)
	if err != nil || !bytes.Contains(got[:n], []byte("value is 33554432 bytes")) {
		t.Fatalf("a claim over max_value_size: %q, %v; want TOO_LARGE before its bytes", got[:n], err)
	}
}
