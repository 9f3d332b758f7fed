package peerapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"reflect"
	"testing"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache"
	"github.com/tidepool-kv/tidepool/cluster"
	"github.com/tidepool-kv/tidepool/protocol/gen/peer"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	"github.com/tidepool-kv/tidepool/rdma"
)

func TestFetchRequestCodec(t *testing.T) {
	a := &peer.Auth{ClusterLabel: "lab", ProtocolVersion: int32(cluster.ProtocolVersion), Token: "secret"}
	for _, describe := range []bool{false, true} {
		b, err := encodeFetchRequest(a, "ns", []byte{0, 1, 2}, describe)
		if err != nil {
			t.Fatal(err)
		}
		if want := byte(1 + btoi(describe)); b[0] != want {
			t.Fatalf("describe %v: version %d, want %d (version 1: what nodes that predate descriptions read)", describe, b[0], want)
		}
		r, err := decodeFetchRequest(b)
		if err != nil || r.label != "lab" || r.token != "secret" || r.ns != "ns" || !bytes.Equal(r.key, []byte{0, 1, 2}) ||
			r.protocol != cluster.ProtocolVersion || r.describe != describe {
			t.Fatalf("round trip: %+v %v", r, err)
		}
		// Every truncation, a trailing byte and another version are refused.
		for i := range b {
			if _, err := decodeFetchRequest(b[:i]); !errors.Is(err, errFetchRequest) {
				t.Fatalf("truncated to %d bytes: %v", i, err)
			}
		}
		if _, err := decodeFetchRequest(append(bytes.Clone(b), 0)); !errors.Is(err, errFetchRequest) {
			t.Fatalf("trailing byte: %v", err)
		}
		v3 := bytes.Clone(b)
		v3[0] = 3
		if _, err := decodeFetchRequest(v3); !errors.Is(err, errFetchRequest) {
			t.Fatalf("version 3: %v", err)
		}
		if describe {
			flags := bytes.Clone(b)
			flags[len(flags)-1] |= 0x80 // an unknown flag
			if _, err := decodeFetchRequest(flags); !errors.Is(err, errFetchRequest) {
				t.Fatalf("unknown request flag: %v", err)
			}
		}
	}
	// A request over the transport's bound is refused before it is sent.
	if _, err := encodeFetchRequest(a, "ns", make([]byte, rdma.MaxFetchRequest), false); !errors.Is(err, rdma.ErrTooLarge) {
		t.Fatalf("oversized request: %v", err)
	}
}

func TestFetchMetaCodec(t *testing.T) {
	for _, m := range []fetchMeta{
		{code: tp.ErrorCode_OK, checksum: 0xdeadbeef, depth: -3},
		{code: tp.ErrorCode_NOT_FOUND, msg: "not here"},
		{code: tp.ErrorCode_UNAVAILABLE, refused: true, msg: "refused"},
		{code: tp.ErrorCode_OK, checksum: 7, depth: 2, desc: &cache.BlockMeta{Tokens: []uint32{1, 2, 1 << 31, 4}, Parent: []byte("p"), BlockSize: 4}},
		{code: tp.ErrorCode_OK, checksum: 7, depth: 2, desc: &cache.BlockMeta{BlockSize: 16}},
	} {
		b := encodeFetchMeta(m)
		got, err := decodeFetchMeta(b)
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Fatalf("round trip of %+v: %+v %v", m, got, err)
		}
		for i := range b {
			if _, err := decodeFetchMeta(b[:i]); !errors.Is(err, ErrProtocol) {
				t.Fatalf("truncated to %d bytes: %v", i, err)
			}
		}
		if _, err := decodeFetchMeta(append(bytes.Clone(b), 0)); !errors.Is(err, ErrProtocol) {
			t.Fatalf("trailing byte: %v", err)
		}
		bad := bytes.Clone(b)
		bad[3] |= 0x80 // an unknown flag
		if _, err := decodeFetchMeta(bad); !errors.Is(err, ErrProtocol) {
			t.Fatalf("unknown flag: %v", err)
		}
	}
	long := encodeFetchMeta(fetchMeta{code: tp.ErrorCode_INTERNAL, msg: string(make([]byte, 2*maxMetaMsg))})
	if m, err := decodeFetchMeta(long); err != nil || len(m.msg) != maxMetaMsg {
		t.Fatalf("long message: %d bytes, %v", len(m.msg), err)
	}
	// A description that does not fit the transport's bound on metadata is
	// left out: the block is answered undescribed.
	huge := encodeFetchMeta(fetchMeta{code: tp.ErrorCode_OK, desc: &cache.BlockMeta{Tokens: make([]uint32, 2048), BlockSize: 2048}})
	if m, err := decodeFetchMeta(huge); err != nil || m.desc != nil || len(huge) > rdma.MaxFetchMeta {
		t.Fatalf("oversized description: %d bytes, %+v %v", len(huge), m, err)
	}
	// A token count the answer does not hold is refused, not allocated.
	claim := encodeFetchMeta(fetchMeta{code: tp.ErrorCode_OK, desc: &cache.BlockMeta{Tokens: []uint32{1}, BlockSize: 1}})
	claim[len(claim)-8], claim[len(claim)-7] = 0xff, 0xff // u16 count, then 1 token, an empty parent
	if _, err := decodeFetchMeta(claim); !errors.Is(err, ErrProtocol) {
		t.Fatalf("token count past the answer: %v", err)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestFetchHandlerChecksCredentialsFirst: a named read with a wrong token,
// label or protocol, or one that does not decode, is refused before the
// store is looked at (the handler has no proxy here: reaching it would
// panic).
func TestFetchHandlerChecksCredentialsFirst(t *testing.T) {
	h := &handler{cfg: ServerConfig{Credentials: Credentials{Label: "lab", Token: "secret"}},
		tokenSum: sha256.Sum256([]byte("secret")), lg: zap.NewNop()}
	good := peer.Auth{ClusterLabel: "lab", ProtocolVersion: int32(cluster.ProtocolVersion), Token: "secret"}
	for _, tc := range []struct {
		name string
		mod  func(*peer.Auth)
	}{
		{"token", func(a *peer.Auth) { a.Token = "guess" }},
		{"label", func(a *peer.Auth) { a.ClusterLabel = "other" }},
		{"protocol", func(a *peer.Auth) { a.ProtocolVersion++ }},
	} {
		a := good
		tc.mod(&a)
		req, err := encodeFetchRequest(&a, "ns", []byte("k"), false)
		if err != nil {
			t.Fatal(err)
		}
		ans := h.fetchBlock(context.Background(), req)
		m, err := decodeFetchMeta(ans.Meta)
		if err != nil || !m.refused || m.code == tp.ErrorCode_OK || ans.Len != 0 || ans.Done != nil {
			t.Fatalf("wrong %s: %+v %v, answer of %d bytes", tc.name, m, err, ans.Len)
		}
	}
	ans := h.fetchBlock(context.Background(), []byte{1, 2, 3})
	if m, err := decodeFetchMeta(ans.Meta); err != nil || m.code != tp.ErrorCode_INVALID_ARGUMENT || ans.Len != 0 {
		t.Fatalf("undecodable request: %+v %v", m, err)
	}
	if st := h.stats; st.Refused != 4 {
		t.Fatalf("%d refusals counted, want 4", st.Refused)
	}
}
