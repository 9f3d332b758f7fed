package cluster

import (
	"bytes"
	"encoding/hex"
	"reflect"
	"testing"
)

// TestMetaGolden: node metadata as gossip carries it, its bytes made from
// the version-1 layout with Python's struct: decoded to its fields and
// encoded back byte for byte, so that a change that breaks older members
// fails here.
func TestMetaGolden(t *testing.T) {
	t.Parallel()
	const golden = "01030002066e6f64652d610d31302e302e302e313a373934370d31302e302e302e313a37393438067a6f6e652d31000102030405060708090a0b0c0d0e0f1234010201000000100000000000000000400000000200000100000000000000000000000000"
	want := Meta{NodeID: "node-a", PeerAddr: "10.0.0.1:7947", TransferAddr: "10.0.0.1:7948", Zone: "zone-1",
		Protocol: 2, Leaving: true,
		RDMA:  &RDMAEndpoint{GID: [16]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, LID: 0x1234, Port: 1},
		Tiers: []TierUsage{{Tier: 1, Capacity: 64 << 30, Used: 1 << 30}, {Tier: 2, Capacity: 1 << 40}}}
	b, err := hex.DecodeString(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeMeta(b); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded %+v, %v; want %+v", got, err, want)
	}
	if enc, err := want.Encode(); err != nil || !bytes.Equal(enc, b) {
		t.Fatalf("encoded %x, %v; want %x", enc, err, b)
	}
}
