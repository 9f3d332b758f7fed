package peerapi

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/protocol/gen/peer"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/rdma/inproc"
)

// TestCodeRoundTrip: every domain error a peer answers with comes back as
// the same sentinel on the caller's side.
func TestCodeRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int32
	}{
		{cache.ErrNotFound, 1},
		{cache.ErrExists, 2},
		{cache.ErrTooLarge, 3},
		{proxy.ErrInvalidArgument, 4},
		{cache.ErrNoSpace, 5},
		{cache.ErrLeaseExpired, 6},
		{cache.ErrChecksum, 7},
		{cache.ErrUnavailable, 8},
		{errors.New("boom"), 9},
		{proxy.ErrUnknownNamespace, 10},
		{proxy.ErrBatchTooLarge, 11},
	} {
		t.Run(tc.err.Error(), func(t *testing.T) {
			if got := toCode(tc.err); got != tc.code {
				t.Fatalf("toCode = %d, want %d", got, tc.code)
			}
			back := codeErr("n", tc.code, "msg")
			want := tc.err
			if tc.code == 9 {
				want = ErrRemote
			}
			if !errors.Is(back, want) {
				t.Fatalf("codeErr(%d) = %v, want %v", tc.code, back, want)
			}
			if e := callErr("n", &peer.PeerError{Code: tc.code, Message: "m"}); !errors.Is(e, want) {
				t.Fatalf("callErr = %v", e)
			}
		})
	}
	if codeErr("n", 0, "") != nil {
		t.Fatal("OK is an error")
	}
	if !errors.Is(codeErr("n", 99, ""), ErrRemote) {
		t.Fatal("an unknown code is not ErrRemote")
	}
	if e := callErr("n", &peer.PeerError{Code: codeUnavailable, Message: refusedMessage}); !errors.Is(e, ErrRefused) {
		t.Fatalf("refusal: %v", e)
	}
	if e := callErr("n", errors.New("dial tcp: refused")); !errors.Is(e, cache.ErrUnavailable) {
		t.Fatalf("transport error: %v", e)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := (ServerConfig{}).Validate(); err == nil {
		t.Fatal("empty server config accepted")
	}
	if err := (ClientConfig{}).Validate(); err == nil {
		t.Fatal("empty client config accepted")
	}
	bad := ClientConfig{Timeout: -1, Parallel: -1}
	err := bad.Validate()
	for _, want := range []string{"Resolve", "Store", "Transport", "Regions", "Timeout", "Parallel"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("client Validate() = %v, want a problem with %s", err, want)
		}
	}
}

// TestServerCloseUnstarted: Close without Start returns, twice.
func TestServerCloseUnstarted(t *testing.T) {
	tier, err := dram.New(dram.Config{Dir: t.TempDir(), Capacity: 1 << 20, LazyFault: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tier.Close()
	p, err := proxy.New(proxy.DefaultConfig(), proxy.Deps{Store: tier, ZeroCopy: tier, Scan: tier}, nil)
	if err != nil {
		t.Fatal(err)
	}
	icfg := inproc.DefaultConfig()
	icfg.Network = inproc.NewNetwork()
	tr, err := inproc.New(icfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	regions, err := RegisterArenas(tr, TierArenaMems(tier))
	if err != nil || len(regions) != 1 {
		t.Fatal(regions, err)
	}
	defer DeregisterArenas(tr, regions)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(ServerConfig{Transport: tr, Regions: regions}, p, ln, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	<-s.Done()
}
