package peerapi

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cache/dram"
	"github.com/tidepool-kv/tidepool/protocol/gen/peer"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/proxy"
	"github.com/tidepool-kv/tidepool/proxy/wirecode"
	"github.com/tidepool-kv/tidepool/rdma/inproc"
)

// TestCodeRoundTrip: every row of the code table a peer answers with comes
// back as its code's sentinel on the caller's side (the row's own error for
// the first row of each code); a refusal is read from the refused flag, not
// from the message.
func TestCodeRoundTrip(t *testing.T) {
	for _, row := range wirecode.Rows() {
		t.Run(row.Err.Error(), func(t *testing.T) {
			pe := peerErr(fmt.Errorf("ctx: %w", row.Err))
			if pe.Code != row.Code {
				t.Fatalf("peerErr code = %v, want %v", pe.Code, row.Code)
			}
			want := wirecode.Err(row.Code)
			back := codeErr("n", pe.Code, "msg")
			if !errors.Is(back, want) || wirecode.Code(back) != row.Code {
				t.Fatalf("codeErr(%v) = %v, want %v", pe.Code, back, want)
			}
			if e := callErr("n", pe); !errors.Is(e, want) || wirecode.Code(e) != row.Code {
				t.Fatalf("callErr = %v", e)
			}
		})
	}
	if codeErr("n", tp.ErrorCode_OK, "") != nil {
		t.Fatal("OK is an error")
	}
	if codeErr("n", tp.ErrorCode_NOT_FOUND, "") != cache.ErrNotFound {
		t.Fatal("a NOT_FOUND without message is not the bare sentinel")
	}
	if !errors.Is(codeErr("n", tp.ErrorCode(99), ""), wirecode.ErrInternal) {
		t.Fatal("an unknown code is not ErrInternal")
	}
	if e := callErr("n", refusal()); !errors.Is(e, ErrRefused) || !errors.Is(e, cache.ErrUnavailable) {
		t.Fatalf("refusal: %v", e)
	}
	// A peer that predates the refused flag: its refusal is plain
	// unavailability (same outcome for the caller's breaker).
	old := &peer.PeerError{Code: tp.ErrorCode_UNAVAILABLE, Message: refusedMessage}
	if e := callErr("n", old); errors.Is(e, ErrRefused) || !errors.Is(e, cache.ErrUnavailable) {
		t.Fatalf("old refusal: %v", e)
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
	// (Store, ReserveTTL and Parallel moved to the proxy, which lands
	// fetched blocks itself: proxy.RouteConfig's ReserveTTL, FetchParallel.)
	bad := ClientConfig{Timeout: -1}
	err := bad.Validate()
	for _, want := range []string{"Resolve", "Transport", "Regions", "Timeout"} {
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
	regions, dereg, err := RegisterTestArenas(tr, tier)
	if err != nil || len(regions) != 1 {
		t.Fatal(regions, err)
	}
	defer dereg()
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
