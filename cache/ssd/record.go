package ssd

import (
	"encoding/binary"
	"errors"
	"slices"

	"github.com/tidepool-kv/tidepool/cache"
)

// On-disk formats. Both column families use the same key:
//
//	uvarint(len(ns)) ‖ ns ‖ key
//
// so that all blocks of one namespace are contiguous and the encoding is
// unambiguous. The metadata record (meta family) is fixed size:
//
//	off len field
//	0   1   version (recVersion)
//	1   1   flags (bit 0: low priority, bit 1: written by a durable put)
//	2   8   size of the value in bytes
//	10  4   CRC-32C of the value (cache.Checksum)
//	14  4   depth in the prefix chain (int32)
//	18  8   last access, Unix ns (persisted on put and on clean close)
//	26  8   creation time, Unix ns
//	34  4   CRC-32C of bytes 0..34
//
// A block whose bytes are in the value log (vlog.go) has a version 2
// record instead, with where they are before the record's CRC:
//
//	34  4   value log segment id (> 0)
//	38  8   offset in the segment (a multiple of dioAlign)
//	46  4   CRC-32C of bytes 0..46
//
// A block put with a description (cache.BlockMeta: what the KV-event
// publisher tells routers) has a version 3 record (version 1's fields) or
// a version 4 record (version 2's), with the description between those
// fields (ending at F = 34 or 46) and the CRC:
//
//	F+0     4   block size in tokens (int32, 0..maxDescTokens)
//	F+4     2   number of token ids n (0 or the block size)
//	F+6     2   length of the parent key p
//	F+8     4n  token ids (uint32 each)
//	F+8+4n  p   parent key
//	then    4   CRC-32C of every byte before it
//
// The record's length must be exactly that: a count is never trusted
// beyond the bytes present.
const (
	recVersion  = 1
	recLen      = 38
	recVersion2 = 2
	recLen2     = 50
	recVersion3 = 3 // version 1 + description
	recVersion4 = 4 // version 2 + description
	flagLowPri  = 1 << 0
	flagDurable = 1 << 1
	// descHead is the description's fixed part; maxDescTokens bounds its
	// block size and token count (proxy.MaxBlockTokens is lower), and
	// maxDescParent its parent key (the engine API's keys are shorter).
	descHead      = 8
	maxDescTokens = 1 << 15
	maxDescParent = 1<<16 - 1
)

var (
	errBadKey    = errors.New("ssd: malformed stored key")
	errBadRecord = errors.New("ssd: malformed metadata record")
)

// encodeKey returns the stored key of (ns, key).
func encodeKey(ns string, key []byte) []byte {
	b := make([]byte, 0, binary.MaxVarintLen64+len(ns)+len(key))
	b = binary.AppendUvarint(b, uint64(len(ns)))
	b = append(b, ns...)
	return append(b, key...)
}

// decodeKey splits a stored key into namespace and key. The returned key
// aliases k.
func decodeKey(k []byte) (ns string, key []byte, err error) {
	n, w := binary.Uvarint(k)
	if w <= 0 || n > uint64(len(k)-w) {
		return "", nil, errBadKey
	}
	ns = string(k[w : w+int(n)])
	key = k[w+int(n):]
	if len(key) == 0 {
		return "", nil, errBadKey
	}
	return ns, key, nil
}

// meta is the decoded metadata record of one block.
type meta struct {
	size    int64
	sum     uint32
	depth   int32
	lowPri  bool
	durable bool // written by a durable put (counted when evicted)
	access  int64
	created int64
	seg     uint32 // value log segment; 0: the bytes are in RocksDB
	off     int64  // offset in seg
	desc    *cache.BlockMeta
}

// descLen is the bytes d takes in a record (0: none, or one that cannot
// be stored; see keepDesc).
func descLen(d *cache.BlockMeta) int {
	if d == nil {
		return 0
	}
	return descHead + 4*len(d.Tokens) + len(d.Parent)
}

// keepDesc returns a copy of d for an entry (the caller's slices may be
// reused), or nil for none, an empty one, or one the record format cannot
// hold.
func keepDesc(d *cache.BlockMeta) *cache.BlockMeta {
	if d == nil || (d.BlockSize == 0 && len(d.Tokens) == 0 && len(d.Parent) == 0) || d.BlockSize < 0 || d.BlockSize > maxDescTokens ||
		(len(d.Tokens) != 0 && len(d.Tokens) != int(d.BlockSize)) || len(d.Parent) > maxDescParent {
		return nil
	}
	return d.Clone()
}

func (m *meta) encode() []byte {
	base, ver := recLen-4, byte(recVersion)
	if m.seg != 0 {
		base, ver = recLen2-4, recVersion2
	}
	n := base + 4
	if m.desc != nil {
		ver += 2
		n += descLen(m.desc)
	}
	b := make([]byte, n)
	b[0] = ver
	if m.lowPri {
		b[1] |= flagLowPri
	}
	if m.durable {
		b[1] |= flagDurable
	}
	binary.LittleEndian.PutUint64(b[2:], uint64(m.size))
	binary.LittleEndian.PutUint32(b[10:], m.sum)
	binary.LittleEndian.PutUint32(b[14:], uint32(m.depth))
	binary.LittleEndian.PutUint64(b[18:], uint64(m.access))
	binary.LittleEndian.PutUint64(b[26:], uint64(m.created))
	if m.seg != 0 {
		binary.LittleEndian.PutUint32(b[34:], m.seg)
		binary.LittleEndian.PutUint64(b[38:], uint64(m.off))
	}
	if d := m.desc; d != nil {
		p := b[base:]
		binary.LittleEndian.PutUint32(p, uint32(d.BlockSize))
		binary.LittleEndian.PutUint16(p[4:], uint16(len(d.Tokens)))
		binary.LittleEndian.PutUint16(p[6:], uint16(len(d.Parent)))
		p = p[descHead:]
		for i, tok := range d.Tokens {
			binary.LittleEndian.PutUint32(p[4*i:], tok)
		}
		copy(p[4*len(d.Tokens):], d.Parent)
	}
	binary.LittleEndian.PutUint32(b[n-4:], cache.Checksum(b[:n-4]))
	return b
}

func decodeMeta(b []byte) (meta, error) {
	n := len(b)
	var base int // where the fixed fields end
	switch {
	case n == recLen && b[0] == recVersion:
	case n == recLen2 && b[0] == recVersion2:
	case n >= recLen+descHead && b[0] == recVersion3:
		base = recLen - 4
	case n >= recLen2+descHead && b[0] == recVersion4:
		base = recLen2 - 4
	default:
		return meta{}, errBadRecord
	}
	if binary.LittleEndian.Uint32(b[n-4:]) != cache.Checksum(b[:n-4]) {
		return meta{}, errBadRecord
	}
	var desc *cache.BlockMeta
	if base > 0 {
		d, err := decodeDesc(b[base : n-4])
		if err != nil {
			return meta{}, err
		}
		desc = d
	}
	m := meta{
		lowPri:  b[1]&flagLowPri != 0,
		durable: b[1]&flagDurable != 0,
		size:    int64(binary.LittleEndian.Uint64(b[2:])),
		sum:     binary.LittleEndian.Uint32(b[10:]),
		depth:   int32(binary.LittleEndian.Uint32(b[14:])),
		access:  int64(binary.LittleEndian.Uint64(b[18:])),
		created: int64(binary.LittleEndian.Uint64(b[26:])),
	}
	m.desc = desc
	if b[0] == recVersion2 || b[0] == recVersion4 {
		m.seg = binary.LittleEndian.Uint32(b[34:])
		m.off = int64(binary.LittleEndian.Uint64(b[38:]))
		if m.seg == 0 || m.off < 0 || m.off%dioAlign != 0 {
			return meta{}, errBadRecord
		}
	}
	if m.size < 0 {
		return meta{}, errBadRecord
	}
	return m, nil
}

// decodeDesc decodes a record's description (the bytes between its fixed
// fields and its CRC), which must fill p exactly.
func decodeDesc(p []byte) (*cache.BlockMeta, error) {
	if len(p) < descHead {
		return nil, errBadRecord
	}
	bs := int32(binary.LittleEndian.Uint32(p))
	nt := int(binary.LittleEndian.Uint16(p[4:]))
	np := int(binary.LittleEndian.Uint16(p[6:]))
	if bs < 0 || bs > maxDescTokens || (nt != 0 && nt != int(bs)) || len(p) != descHead+4*nt+np {
		return nil, errBadRecord
	}
	p = p[descHead:]
	d := &cache.BlockMeta{BlockSize: bs}
	if nt > 0 {
		d.Tokens = make([]uint32, nt)
		for i := range d.Tokens {
			d.Tokens[i] = binary.LittleEndian.Uint32(p[4*i:])
		}
	}
	if np > 0 {
		d.Parent = slices.Clone(p[4*nt:])
	}
	return d, nil
}

// footprint is what one block counts against the capacity budget: the
// value, the key stored twice (data and meta families), the metadata record
// (with desc, its description) and a fixed allowance for RocksDB's
// per-entry overhead (blob record header, blob reference, SST index
// share).
func footprint(keyLen int, size int64, desc *cache.BlockMeta) int64 {
	return size + int64(2*keyLen) + recLen + int64(descLen(desc)) + entryOverhead
}

const entryOverhead = 64
