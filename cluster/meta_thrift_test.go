package cluster

import (
	"errors"
	"reflect"
	"testing"

	"github.com/cloudwego/gopkg/protocol/thrift"
)

// Node metadata as the Thrift struct it could be, to measure the
// hand-written layout against (docs/architecture.md, "Hand-written wire
// formats"):
//
//	struct RDMAEndpoint { 1: binary gid, 2: i16 lid, 3: byte port }
//	struct TierUsage { 1: byte tier, 2: i64 capacity, 3: i64 used }
//	struct NodeMeta {
//	    1: string node_id, 2: string peer_addr, 3: string transfer_addr,
//	    4: string zone, 5: i16 protocol, 6: bool leaving,
//	    7: optional RDMAEndpoint rdma, 8: list<TierUsage> tiers }
//
// coded with the calls Kitex's generated fastcodec makes (thrift.Binary,
// the only Thrift protocol of the modules in go.mod: BLength, then the
// fields written into a buffer of that size; read field by field,
// unknown fields skipped), straight from and into Meta, with no struct
// to convert: the cheapest Thrift coding of these fields.

// sizeMetaThrift is the BLength of m's Thrift encoding.
func sizeMetaThrift(m Meta) int {
	p := thrift.Binary
	n := 4*p.FieldBeginLength() + p.StringLength(m.NodeID) + p.StringLength(m.PeerAddr) +
		p.StringLength(m.TransferAddr) + p.StringLength(m.Zone)
	n += p.FieldBeginLength() + p.I16Length() + p.FieldBeginLength() + p.BoolLength()
	if r := m.RDMA; r != nil {
		n += p.FieldBeginLength() + p.FieldBeginLength() + p.BinaryLength(r.GID[:]) +
			p.FieldBeginLength() + p.I16Length() + p.FieldBeginLength() + p.ByteLength() + p.FieldStopLength()
	}
	n += p.FieldBeginLength() + p.ListBeginLength()
	n += len(m.Tiers) * (3*p.FieldBeginLength() + p.ByteLength() + 2*p.I64Length() + p.FieldStopLength())
	return n + p.FieldStopLength()
}

func encodeMetaThrift(m Meta) []byte {
	p := thrift.Binary
	b := make([]byte, sizeMetaThrift(m))
	o := 0
	for i, s := range []string{m.NodeID, m.PeerAddr, m.TransferAddr, m.Zone} {
		o += p.WriteFieldBegin(b[o:], thrift.STRING, int16(i+1))
		o += p.WriteString(b[o:], s)
	}
	o += p.WriteFieldBegin(b[o:], thrift.I16, 5)
	o += p.WriteI16(b[o:], int16(m.Protocol))
	o += p.WriteFieldBegin(b[o:], thrift.BOOL, 6)
	o += p.WriteBool(b[o:], m.Leaving)
	if r := m.RDMA; r != nil {
		o += p.WriteFieldBegin(b[o:], thrift.STRUCT, 7)
		o += p.WriteFieldBegin(b[o:], thrift.STRING, 1)
		o += p.WriteBinary(b[o:], r.GID[:])
		o += p.WriteFieldBegin(b[o:], thrift.I16, 2)
		o += p.WriteI16(b[o:], int16(r.LID))
		o += p.WriteFieldBegin(b[o:], thrift.BYTE, 3)
		o += p.WriteByte(b[o:], int8(r.Port))
		o += p.WriteFieldStop(b[o:])
	}
	o += p.WriteFieldBegin(b[o:], thrift.LIST, 8)
	o += p.WriteListBegin(b[o:], thrift.STRUCT, len(m.Tiers))
	for _, t := range m.Tiers {
		o += p.WriteFieldBegin(b[o:], thrift.BYTE, 1)
		o += p.WriteByte(b[o:], int8(t.Tier))
		o += p.WriteFieldBegin(b[o:], thrift.I64, 2)
		o += p.WriteI64(b[o:], int64(t.Capacity))
		o += p.WriteFieldBegin(b[o:], thrift.I64, 3)
		o += p.WriteI64(b[o:], int64(t.Used))
		o += p.WriteFieldStop(b[o:])
	}
	p.WriteFieldStop(b[o:])
	return b
}

var errMetaThrift = errors.New("meta thrift: field of the wrong type")

// metaThriftTypes are NodeMeta's field types by id.
var metaThriftTypes = [...]thrift.TType{1: thrift.STRING, 2: thrift.STRING, 3: thrift.STRING, 4: thrift.STRING,
	5: thrift.I16, 6: thrift.BOOL, 7: thrift.STRUCT, 8: thrift.LIST}

// decodeMetaThrift reads field by field as generated code does: a loop
// over field headers, a switch on the id, unknown fields skipped.
func decodeMetaThrift(b []byte) (Meta, error) {
	p := thrift.Binary
	var m Meta
	o := 0
	for {
		typ, id, l, err := p.ReadFieldBegin(b[o:])
		o += l
		if err != nil {
			return Meta{}, err
		}
		if typ == thrift.STOP {
			return m, nil
		}
		if id < 1 || int(id) >= len(metaThriftTypes) {
			l, err = p.Skip(b[o:], typ)
		} else if metaThriftTypes[id] != typ {
			err = errMetaThrift
		} else {
			switch id {
			case 1:
				m.NodeID, l, err = p.ReadString(b[o:])
			case 2:
				m.PeerAddr, l, err = p.ReadString(b[o:])
			case 3:
				m.TransferAddr, l, err = p.ReadString(b[o:])
			case 4:
				m.Zone, l, err = p.ReadString(b[o:])
			case 5:
				var v int16
				v, l, err = p.ReadI16(b[o:])
				m.Protocol = uint16(v)
			case 6:
				m.Leaving, l, err = p.ReadBool(b[o:])
			case 7:
				m.RDMA = &RDMAEndpoint{}
				l, err = readRDMAThrift(b[o:], m.RDMA)
			case 8:
				m.Tiers, l, err = readTiersThrift(b[o:])
			}
		}
		o += l
		if err != nil {
			return Meta{}, err
		}
	}
}

func readRDMAThrift(b []byte, r *RDMAEndpoint) (int, error) {
	p := thrift.Binary
	o := 0
	for {
		typ, id, l, err := p.ReadFieldBegin(b[o:])
		o += l
		if err != nil || typ == thrift.STOP {
			return o, err
		}
		switch {
		case id == 1 && typ == thrift.STRING:
			var v []byte
			v, l, err = p.ReadBinary(b[o:])
			if err == nil && len(v) != len(r.GID) {
				err = errMetaThrift
			}
			copy(r.GID[:], v)
		case id == 2 && typ == thrift.I16:
			var v int16
			v, l, err = p.ReadI16(b[o:])
			r.LID = uint16(v)
		case id == 3 && typ == thrift.BYTE:
			var v int8
			v, l, err = p.ReadByte(b[o:])
			r.Port = uint8(v)
		default:
			l, err = p.Skip(b[o:], typ)
		}
		o += l
		if err != nil {
			return o, err
		}
	}
}

func readTiersThrift(b []byte) ([]TierUsage, int, error) {
	p := thrift.Binary
	et, n, o, err := p.ReadListBegin(b)
	if err != nil {
		return nil, o, err
	}
	if et != thrift.STRUCT || n > MaxTiers {
		return nil, o, errMetaThrift
	}
	var tiers []TierUsage
	if n > 0 {
		tiers = make([]TierUsage, n)
	}
	for i := range tiers {
		t := &tiers[i]
		for {
			typ, id, l, err := p.ReadFieldBegin(b[o:])
			o += l
			if err != nil {
				return nil, o, err
			}
			if typ == thrift.STOP {
				break
			}
			switch {
			case id == 1 && typ == thrift.BYTE:
				var v int8
				v, l, err = p.ReadByte(b[o:])
				t.Tier = Tier(v)
			case id == 2 && typ == thrift.I64:
				var v int64
				v, l, err = p.ReadI64(b[o:])
				t.Capacity = uint64(v)
			case id == 3 && typ == thrift.I64:
				var v int64
				v, l, err = p.ReadI64(b[o:])
				t.Used = uint64(v)
			default:
				l, err = p.Skip(b[o:], typ)
			}
			o += l
			if err != nil {
				return nil, o, err
			}
		}
	}
	return tiers, o, nil
}

// sizeMetaCompact is the length of m in Thrift's compact protocol (which
// no module in go.mod speaks), counted from its specification: field
// headers of one byte (ids ascending by at most 15), bools in their field
// header, lengths and integers as varints (integers zigzagged).
func sizeMetaCompact(m Meta) int {
	uv := func(v uint64) int {
		n := 1
		for ; v >= 0x80; v >>= 7 {
			n++
		}
		return n
	}
	zz := func(v int64) int { return uv(uint64((v << 1) ^ (v >> 63))) }
	str := func(n int) int { return 1 + uv(uint64(n)) + n } // header, length, bytes
	n := str(len(m.NodeID)) + str(len(m.PeerAddr)) + str(len(m.TransferAddr)) + str(len(m.Zone))
	n += 1 + zz(int64(int16(m.Protocol))) + 1 // protocol; leaving in its header
	if r := m.RDMA; r != nil {
		n += 1 + str(len(r.GID)) + 1 + zz(int64(int16(r.LID))) + 1 + 1 + 1
	}
	n += 1 + 1 // tiers: header, list header (size < 15)
	for _, t := range m.Tiers {
		n += 1 + 1 + 1 + zz(int64(t.Capacity)) + 1 + zz(int64(t.Used)) + 1
	}
	return n + 1
}

// sidecarMeta is a realistic sidecar's metadata: a pod name, pod IP
// addresses, a cloud zone, an RDMA port and three tiers.
func sidecarMeta() Meta {
	return Meta{NodeID: "tidepool-7f9c8d6b5-x2kqz", PeerAddr: "10.244.13.27:7947", TransferAddr: "10.244.13.27:7948",
		Zone: "us-east-1a", Protocol: ProtocolVersion,
		RDMA: &RDMAEndpoint{GID: [16]byte{0xfe, 0x80, 10: 0x02, 0x42, 0xac, 0xff, 0xfe, 0x11}, LID: 0, Port: 1},
		Tiers: []TierUsage{{Tier: TierGPU, Capacity: 8 << 30, Used: 5 << 30},
			{Tier: TierDRAM, Capacity: 64 << 30, Used: 41 << 30}, {Tier: TierSSD, Capacity: 1 << 40, Used: 617 << 30}}}
}

// TestMetaAgainstThrift: the Thrift coding above reads back what it
// wrote (so the benchmark compares working code), and the hand-written
// layout is the smaller, signature included, for a realistic sidecar and
// for the largest metadata Encode accepts: the byte count beside the entry
// in docs/architecture.md.
func TestMetaAgainstThrift(t *testing.T) {
	t.Parallel()
	long := sidecarMeta()
	long.NodeID = string(make([]byte, 100))
	long.PeerAddr, long.TransferAddr = "[fd00:1234:5678:9abc:def0:1234:5678:9abc]:7947", "[fd00:1234:5678:9abc:def0:1234:5678:9abc]:7948"
	for name, m := range map[string]Meta{"sidecar": sidecarMeta(), "long names": long} {
		ours, err := m.Encode()
		if err != nil {
			t.Fatal(err)
		}
		th := encodeMetaThrift(m)
		got, err := decodeMetaThrift(th)
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Fatalf("%s: thrift read back %+v, %v", name, got, err)
		}
		c := sizeMetaCompact(m)
		t.Logf("%s: ours %d B, Thrift binary %d B, Thrift compact %d B (+%d B signature each; bound %d)",
			name, len(ours), len(th), c, metaSigLen, MetaMaxSize)
		if len(ours) > len(th) || len(ours) > c {
			t.Fatalf("%s: ours %d B, Thrift binary %d B, compact %d B: the reason written in docs/architecture.md no longer holds",
				name, len(ours), len(th), c)
		}
	}
}

// BenchmarkMetaCodec: encode + decode of a realistic sidecar's metadata,
// the hand-written layout against Thrift's binary protocol (coded as
// Kitex codes a struct), side by side in one run.
func BenchmarkMetaCodec(b *testing.B) {
	m := sidecarMeta()
	b.Run("ours", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			enc, err := m.Encode()
			if err != nil {
				b.Fatal(err)
			}
			if _, err := DecodeMeta(enc); err != nil {
				b.Fatal(err)
			}
		}
		enc, _ := m.Encode()
		b.ReportMetric(float64(len(enc)+metaSigLen), "signed-B")
	})
	b.Run("thrift-binary", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeMetaThrift(encodeMetaThrift(m)); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(encodeMetaThrift(m))+metaSigLen), "signed-B")
	})
}
