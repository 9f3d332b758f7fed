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
//	1   1   flags (bit 0: low priority)
//	2   8   size of the value in bytes
//	10  4   CRC-32C of the value (cache.Checksum)
//	14  4   depth in the prefix chain (int32)
//	18  8   last access, Unix ns (persisted on put and on clean close)
//	26  8   creation time, Unix ns
//	34  4   CRC-32C of bytes 0..34
const (
	recVersion = 1
	recLen     = 38
	flagLowPri = 1 << 0
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
	access  int64
	created int64
}

func (m *meta) encode() []byte {
	b := make([]byte, recLen)
	b[0] = recVersion
	if m.lowPri {
		b[1] |= flagLowPri
	}
	binary.LittleEndian.PutUint64(b[2:], uint64(m.size))
	binary.LittleEndian.PutUint32(b[10:], m.sum)
	binary.LittleEndian.PutUint32(b[14:], uint32(m.depth))
	binary.LittleEndian.PutUint64(b[18:], uint64(m.access))
	binary.LittleEndian.PutUint64(b[26:], uint64(m.created))
	binary.LittleEndian.PutUint32(b[34:], cache.Checksum(b[:34]))
	return b
}

func decodeMeta(b []byte) (meta, error) {
	if len(b) != recLen || b[0] != recVersion {
		return meta{}, errBadRecord
	}
	if binary.LittleEndian.Uint32(b[34:]) != cache.Checksum(b[:34]) {
		return meta{}, errBadRecord
	}
	m := meta{
		lowPri:  b[1]&flagLowPri != 0,
		size:    int64(binary.LittleEndian.Uint64(b[2:])),
		sum:     binary.LittleEndian.Uint32(b[10:]),
		depth:   int32(binary.LittleEndian.Uint32(b[14:])),
		access:  int64(binary.LittleEndian.Uint64(b[18:])),
		created: int64(binary.LittleEndian.Uint64(b[26:])),
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
