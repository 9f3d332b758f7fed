package cluster

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func fullMeta() Meta {
	return Meta{
		NodeID: "tidepool-7f9c-0", PeerAddr: "10.1.2.3:7951", TransferAddr: "10.1.2.3:7950",
		Zone: "us-east-1a", Protocol: ProtocolVersion, Leaving: true,
		RDMA:  &RDMAEndpoint{GID: [16]byte{0xfe, 0x80, 15: 1}, LID: 7, Port: 1},
		Tiers: []TierUsage{{TierGPU, 80 << 30, 1 << 30}, {TierDRAM, 256 << 30, 3}, {TierSSD, 4 << 40, 0}},
	}
}

func TestMetaRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		m    Meta
	}{
		{"empty", Meta{}},
		{"minimal", Meta{NodeID: "a", Protocol: ProtocolVersion}},
		{"full", fullMeta()},
		{"max tiers", Meta{NodeID: "x", Tiers: make([]TierUsage, MaxTiers)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := tt.m.Encode()
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			if b[0] != MetaVersion {
				t.Fatalf("first byte %d, want version %d", b[0], MetaVersion)
			}
			if len(b) >= MetaMaxSize {
				t.Fatalf("%d bytes, want < %d", len(b), MetaMaxSize)
			}
			got, err := DecodeMeta(b)
			if err != nil {
				t.Fatalf("DecodeMeta: %v", err)
			}
			if !reflect.DeepEqual(got, tt.m) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", got, tt.m)
			}
		})
	}
}

func TestMetaTypicalSize(t *testing.T) {
	b, err := fullMeta().Encode()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 160 {
		t.Fatalf("typical metadata is %d bytes; keep it small", len(b))
	}
}

func TestMetaEncodeRejects(t *testing.T) {
	long := strings.Repeat("x", 256)
	tests := []struct {
		name string
		m    Meta
		want []string
	}{
		{"long fields", Meta{NodeID: long, Zone: long}, []string{"node id", "zone"}},
		{"too many tiers", Meta{Tiers: make([]TierUsage, MaxTiers+1)}, []string{"tiers"}},
		{"over 512 bytes", Meta{NodeID: strings.Repeat("a", 255), PeerAddr: strings.Repeat("b", 255), TransferAddr: "c"}, []string{"bytes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.m.Encode()
			if !errors.Is(err, ErrMetaTooLarge) {
				t.Fatalf("Encode: %v, want ErrMetaTooLarge", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestDecodeMetaRejects(t *testing.T) {
	good, _ := fullMeta().Encode()
	mod := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrMetaCorrupt},
		{"other version", mod(func(b []byte) []byte { b[0] = 2; return b }), ErrMetaVersion},
		{"version zero", []byte{0}, ErrMetaVersion},
		{"unknown flag", mod(func(b []byte) []byte { b[1] |= 0x80; return b }), ErrMetaCorrupt},
		{"truncated", good[:len(good)-1], ErrMetaCorrupt},
		{"only version", []byte{MetaVersion}, ErrMetaCorrupt},
		{"trailing byte", append(bytes.Clone(good), 0), ErrMetaCorrupt},
		{"string past end", []byte{MetaVersion, 0, 0, 1, 200, 'a'}, ErrMetaCorrupt},
		{"too many tiers", []byte{MetaVersion, 0, 0, 1, 0, 0, 0, 0, MaxTiers + 1}, ErrMetaCorrupt},
		{"oversize", append([]byte{MetaVersion}, make([]byte, MetaMaxSize)...), ErrMetaTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := DecodeMeta(tt.in); !errors.Is(err, tt.want) {
				t.Fatalf("DecodeMeta: %v, want %v", err, tt.want)
			}
		})
	}
}

// FuzzDecodeMeta checks that the decoder never panics, that whatever it
// accepts re-encodes to the same bytes (one canonical encoding), and that
// accepted metadata respects the size bounds.
func FuzzDecodeMeta(f *testing.F) {
	for _, m := range []Meta{{}, fullMeta(), {NodeID: "n", Tiers: []TierUsage{{TierDRAM, 1, 2}}}} {
		b, err := m.Encode()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{MetaVersion, 3, 0, 1, 255})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMeta(b)
		if err != nil {
			return
		}
		if len(m.Tiers) > MaxTiers {
			t.Fatalf("accepted %d tiers", len(m.Tiers))
		}
		out, err := m.Encode()
		if err != nil {
			t.Fatalf("re-encode of accepted metadata failed: %v", err)
		}
		if !bytes.Equal(out, b) {
			t.Fatalf("not canonical:\n in %x\nout %x", b, out)
		}
	})
}
