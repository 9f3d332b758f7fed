package peerapi

import (
	"net"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/internal/peerauth"
)

// TestClientConnIsActive: a pooled connection reports itself inactive once
// the peer closed it (so the pool drops it instead of failing a call on
// it), plain or encrypted.
func TestClientConnIsActive(t *testing.T) {
	key, err := peerauth.NewKey([]byte("conn-test-cluster-secret"), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []*peerauth.Key{nil, key, key.Encrypting()} {
		raw, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln := peerauth.NewListener(raw, peerauth.ListenerConfig{Key: k, Purpose: peerauth.PurposePeerAPI}, nil)
		accepted := make(chan net.Conn, 1)
		go func() {
			c, err := ln.Accept()
			if err == nil {
				accepted <- c
			}
		}()
		nc, err := authDialer{key: k}.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		cc := nc.(*clientConn)
		srv := <-accepted
		if !cc.IsActive() {
			t.Fatalf("encrypting %v: open connection reported inactive", k != nil && k.Encrypts())
		}
		srv.Close()
		deadline := time.Now().Add(5 * time.Second)
		for cc.IsActive() {
			if time.Now().After(deadline) {
				t.Fatal("connection closed by the peer still reported active")
			}
			time.Sleep(5 * time.Millisecond)
		}
		cc.Close()
		if cc.IsActive() {
			t.Fatal("closed connection reported active")
		}
		ln.Close()
	}
}
