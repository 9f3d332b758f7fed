package ssd

import (
	"encoding/binary"
	"errors"

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
const (
	recVersion  = 1
	recLen      = 38
	recVersion2 = 2
	recLen2     = 50
	flagLowPri  = 1 << 0
	flagDurable = 1 << 1
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
}

func (m *meta) encode() []byte {
	n, ver := recLen, byte(recVersion)
	if m.seg != 0 {
		n, ver = recLen2, recVersion2
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
	binary.LittleEndian.PutUint32(b[n-4:], cache.Checksum(b[:n-4]))
	return b
}

func decodeMeta(b []byte) (meta, error) {
	switch {
	case len(b) == recLen && b[0] == recVersion:
	case len(b) == recLen2 && b[0] == recVersion2:
	default:
		return meta{}, errBadRecord
	}
	n := len(b)
	if binary.LittleEndian.Uint32(b[n-4:]) != cache.Checksum(b[:n-4]) {
		return meta{}, errBadRecord
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
	if n == recLen2 {
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

// footprint is what one block counts against the capacity budget: the
// value, the key stored twice (data and meta families), the metadata record
// and a fixed allowance for RocksDB's per-entry overhead (blob record
// header, blob reference, SST index share).
func footprint(keyLen int, size int64) int64 {
	return size + int64(2*keyLen) + recLen + entryOverhead
}

const entryOverhead = 64
