package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/tidepool-kv/tidepool/internal/wire"
)

// MetaVersion is the first byte of encoded node metadata: the layout below.
// A node refuses peers whose metadata it cannot decode.
const MetaVersion uint8 = 1

// MetaMaxSize is the largest encoded metadata memberlist carries.
const MetaMaxSize = 512

// ProtocolVersion is the tidepool peer protocol this build speaks (peer API
// and transfer layer together). Peers announcing another one are refused.
const ProtocolVersion uint16 = 1

// MaxTiers bounds Meta.Tiers.
const MaxTiers = 8

// Metadata errors.
var (
	ErrMetaVersion  = errors.New("cluster: unknown metadata version")
	ErrMetaTooLarge = errors.New("cluster: metadata too large")
	ErrMetaCorrupt  = errors.New("cluster: corrupt metadata")
)

// Tier names a storage tier in Meta.
type Tier uint8

// Tiers.
const (
	TierGPU  Tier = 1
	TierDRAM Tier = 2
	TierSSD  Tier = 3
)

// String names a tier.
func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "gpu"
	case TierDRAM:
		return "dram"
	case TierSSD:
		return "ssd"
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

// TierUsage is one tier's capacity and usage in bytes.
type TierUsage struct {
	Tier     Tier
	Capacity uint64
	Used     uint64
}

// Meta is what a node tells the cluster about itself. It travels in
// memberlist's node metadata, so its encoding (Encode) stays under
// MetaMaxSize bytes.
type Meta struct {
	// NodeID is the node's stable identity (usually the memberlist name).
	NodeID string
	// PeerAddr is the host:port of the node's peer API (Thrift over TCP).
	PeerAddr string
	// TransferAddr is the host:port of the node's rdma/tcp transport.
	TransferAddr string
	// Zone is a failure domain (Kubernetes topology zone), may be empty.
	Zone string
	// Protocol is the node's peer protocol version (ProtocolVersion).
	Protocol uint16
	// Leaving is set by a node that is leaving gracefully, before it leaves.
	Leaving bool
	// RDMA is the node's RDMA endpoint, nil without an RDMA NIC.
	RDMA *RDMAEndpoint
	// Tiers lists capacity and usage per tier (at most MaxTiers).
	Tiers []TierUsage
}

// RDMAEndpoint addresses a node's RDMA port.
type RDMAEndpoint struct {
	GID  [16]byte
	LID  uint16
	Port uint8
}

// Layout of version 1 (integers big-endian):
//
//	u8  version (1)
//	u8  flags: bit 0 leaving, bit 1 RDMA present; other bits zero
//	u16 protocol
//	str node id        (str = u8 length + bytes)
//	str peer addr
//	str transfer addr
//	str zone
//	[RDMA present] 16 B GID, u16 LID, u8 port
//	u8  tier count (<= MaxTiers), then per tier: u8 tier, u64 capacity, u64 used
//
// Nothing may follow. The encoding is canonical: Decode accepts exactly
// what Encode produces.
const (
	flagLeaving = 1 << 0
	flagRDMA    = 1 << 1
	flagsKnown  = flagLeaving | flagRDMA
)

// Encode returns the version-1 encoding of m.
func (m Meta) Encode() ([]byte, error) {
	var errs []error
	for _, f := range []struct{ name, s string }{
		{"node id", m.NodeID}, {"peer addr", m.PeerAddr}, {"transfer addr", m.TransferAddr}, {"zone", m.Zone},
	} {
		if len(f.s) > 255 {
			errs = append(errs, fmt.Errorf("%w: %s is %d bytes (max 255)", ErrMetaTooLarge, f.name, len(f.s)))
		}
	}
	if len(m.Tiers) > MaxTiers {
		errs = append(errs, fmt.Errorf("%w: %d tiers (max %d)", ErrMetaTooLarge, len(m.Tiers), MaxTiers))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	b := make([]byte, 0, 64+len(m.NodeID)+len(m.PeerAddr)+len(m.TransferAddr)+len(m.Zone)+17*len(m.Tiers))
	var flags byte
	if m.Leaving {
		flags |= flagLeaving
	}
	if m.RDMA != nil {
		flags |= flagRDMA
	}
	b = append(b, MetaVersion, flags)
	b = binary.BigEndian.AppendUint16(b, m.Protocol)
	for _, s := range []string{m.NodeID, m.PeerAddr, m.TransferAddr, m.Zone} {
		b = append(b, byte(len(s)))
		b = append(b, s...)
	}
	if m.RDMA != nil {
		b = append(b, m.RDMA.GID[:]...)
		b = binary.BigEndian.AppendUint16(b, m.RDMA.LID)
		b = append(b, m.RDMA.Port)
	}
	b = append(b, byte(len(m.Tiers)))
	for _, t := range m.Tiers {
		b = append(b, byte(t.Tier))
		b = binary.BigEndian.AppendUint64(b, t.Capacity)
		b = binary.BigEndian.AppendUint64(b, t.Used)
	}
	if len(b) > MetaMaxSize {
		return nil, fmt.Errorf("%w: %d bytes (max %d)", ErrMetaTooLarge, len(b), MetaMaxSize)
	}
	return b, nil
}

// DecodeMeta is the only metadata decoder.
func DecodeMeta(b []byte) (Meta, error) {
	if len(b) == 0 {
		return Meta{}, fmt.Errorf("%w: empty", ErrMetaCorrupt)
	}
	if b[0] != MetaVersion {
		return Meta{}, fmt.Errorf("%w: %d (this build reads %d)", ErrMetaVersion, b[0], MetaVersion)
	}
	if len(b) > MetaMaxSize {
		return Meta{}, fmt.Errorf("%w: %d bytes", ErrMetaTooLarge, len(b))
	}
	d := wire.Reader{B: b[1:]}
	str := func() string { return string(d.Take(int(d.U8()))) }
	flags := d.U8()
	if flags&^flagsKnown != 0 {
		return Meta{}, fmt.Errorf("%w: unknown flags %#x", ErrMetaCorrupt, flags)
	}
	m := Meta{Leaving: flags&flagLeaving != 0, Protocol: d.U16()}
	m.NodeID, m.PeerAddr, m.TransferAddr, m.Zone = str(), str(), str(), str()
	if flags&flagRDMA != 0 {
		r := &RDMAEndpoint{}
		copy(r.GID[:], d.Take(16))
		r.LID = d.U16()
		r.Port = d.U8()
		m.RDMA = r
	}
	n := int(d.U8())
	if n > MaxTiers {
		return Meta{}, fmt.Errorf("%w: %d tiers", ErrMetaCorrupt, n)
	}
	if n > 0 && !d.Bad {
		m.Tiers = make([]TierUsage, 0, n)
		for i := 0; i < n; i++ {
			m.Tiers = append(m.Tiers, TierUsage{Tier: Tier(d.U8()), Capacity: d.U64(), Used: d.U64()})
		}
	}
	if d.Bad {
		return Meta{}, fmt.Errorf("%w: truncated", ErrMetaCorrupt)
	}
	if len(d.B) != 0 {
		return Meta{}, fmt.Errorf("%w: %d trailing bytes", ErrMetaCorrupt, len(d.B))
	}
	return m, nil
}
