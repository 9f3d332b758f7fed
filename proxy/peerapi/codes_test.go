package peerapi_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/peerapi"
	"github.com/tidepool-kv/tidepool/proxy/wirecode"
	"github.com/tidepool-kv/tidepool/rdma/inproc"
)

// errStore is a store that fails on purpose: a Put of key "row-i" or a
// Clear of namespace "row-i" returns row i of the code table, wrapped as a
// tier wraps.
type errStore struct{ rows []wirecode.Row }

func (s errStore) rowErr(name string) error {
	var i int
	if _, err := fmt.Sscanf(name, "row-%d", &i); err != nil || i < 0 || i >= len(s.rows) {
		return nil
	}
	return fmt.Errorf("errstore %s: %w", name, s.rows[i].Err)
}

func (s errStore) Put(_ context.Context, _ string, key, _ []byte, _ cache.PutOptions) (bool, error) {
	return false, s.rowErr(string(key))
}
func (errStore) Get(context.Context, string, []byte, []byte) ([]byte, cache.Info, error) {
	return nil, cache.Info{}, cache.ErrNotFound
}
func (errStore) Stat(context.Context, string, []byte) (cache.Info, bool)       { return cache.Info{}, false }
func (errStore) Present(_ context.Context, _ string, _ [][]byte, p []bool) int { clear(p); return 0 }
func (errStore) Delete(context.Context, string, []byte) (bool, error)          { return false, nil }
func (s errStore) Clear(_ context.Context, ns string) (int64, error) {
	return 0, s.rowErr(ns)
}
func (errStore) Stats() cache.Stats { return cache.Stats{} }

// TestErrorsRoundTripThroughPeer: every row of the code table, raised by a
// real peer's store, reaches the caller over the peer API as the same code
// and its sentinel — as a request-level PeerError (Clear) and as a per-item
// code (Push).
func TestErrorsRoundTripThroughPeer(t *testing.T) {
	ctx := context.Background()
	rows := wirecode.Rows()
	p, err := proxy.New(proxy.DefaultConfig(), proxy.Deps{Store: errStore{rows: rows}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tier, err := dram.New(dram.Config{Dir: t.TempDir(), Capacity: 1 << 20, LazyFault: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tier.Close()
	icfg := inproc.DefaultConfig()
	icfg.Network = inproc.NewNetwork()
	tr, err := inproc.New(icfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	regions, dereg, err := peerapi.RegisterTestArenas(tr, tier)
	if err != nil {
		t.Fatal(err)
	}
	defer dereg()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cred := peerapi.Credentials{NodeID: "srv", Label: "codes"}
	srv, err := peerapi.NewServer(peerapi.ServerConfig{Credentials: cred, Transport: tr, Regions: regions}, p, ln, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	<-srv.Ready()
	addr := ln.Addr().String()
	cli, err := peerapi.NewClient(peerapi.ClientConfig{
		Credentials: cred, Transport: tr, Regions: regions,
		Resolve: func(string) (string, string, bool) { return addr, tr.Addr(), true },
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	items := make([]proxy.PutItem, len(rows))
	for i := range rows {
		items[i] = proxy.PutItem{Key: []byte(fmt.Sprint("row-", i)), Value: []byte("v")}
	}
	pushed, err := cli.Push(ctx, "srv", "codes", items)
	if err != nil || len(pushed) != len(rows) {
		t.Fatalf("push: %v (%d answers)", err, len(pushed))
	}
	for i, row := range rows {
		want := wirecode.Err(row.Code)
		t.Run(strings.ReplaceAll(row.Err.Error(), " ", "_"), func(t *testing.T) {
			_, err := cli.Clear(ctx, "srv", fmt.Sprint("row-", i))
			if !errors.Is(err, want) || wirecode.Code(err) != row.Code {
				t.Errorf("Clear: %v (code %v), want %v (%v)", err, wirecode.Code(err), want, row.Code)
			}
			got := pushed[i]
			if errors.Is(row.Err, cache.ErrExists) {
				// Push counts a block the owner already holds as stored.
				if got != nil {
					t.Errorf("Push of an existing block: %v", got)
				}
				return
			}
			if !errors.Is(got, want) || wirecode.Code(got) != row.Code {
				t.Errorf("Push: %v (code %v), want %v (%v)", got, wirecode.Code(got), want, row.Code)
			}
		})
	}
}
