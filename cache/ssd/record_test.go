package ssd

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"reflect"
	"testing"

	"github.com/tidepool-kv/tidepool/cache"
)

// The decoders of this file read what is on disk; rebuild runs them on
// every record at start, so damaged bytes must give an error, never a
// panic or an allocation sized by the input.

func TestDecodeKey(t *testing.T) {
	long := bytes.Repeat([]byte{'n'}, 300) // a two-byte length prefix
	for _, tc := range []struct {
		name    string
		in      []byte
		ns, key string
		err     error
	}{
		{"empty namespace", encodeKey("", []byte("k")), "", "k", nil},
		{"namespace and key", encodeKey("llama/bf16", []byte("block-0")), "llama/bf16", "block-0", nil},
		{"long namespace", encodeKey(string(long), []byte{0}), string(long), "\x00", nil},
		{"key with a zero byte", encodeKey("ns", []byte{0, 1, 0}), "ns", "\x00\x01\x00", nil},
		{"nothing", nil, "", "", errBadKey},
		{"length only", []byte{0}, "", "", errBadKey},
		{"no key after the namespace", encodeKey("ns", nil), "", "", errBadKey},
		{"namespace longer than the record", []byte{5, 'a', 'b'}, "", "", errBadKey},
		{"length past the end by one", []byte{3, 'a', 'b'}, "", "", errBadKey},
		{"truncated varint", []byte{0x80}, "", "", errBadKey},
		{"varint overflows 64 bits", append(bytes.Repeat([]byte{0xff}, 10), 1, 'k'), "", "", errBadKey},
		{"huge length", binary.AppendUvarint(nil, 1<<62), "", "", errBadKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns, key, err := decodeKey(tc.in)
			if !errors.Is(err, tc.err) {
				t.Fatalf("decodeKey(%x) error = %v, want %v", tc.in, err, tc.err)
			}
			if err != nil {
				return
			}
			if ns != tc.ns || string(key) != tc.key {
				t.Fatalf("decodeKey(%x) = %q, %q; want %q, %q", tc.in, ns, key, tc.ns, tc.key)
			}
		})
	}
}

// record returns the encoded metadata record of m after edit changed its
// bytes; fix recomputes the record's own checksum afterwards.
func record(m meta, fix bool, edit func(b []byte)) []byte {
	b := m.encode()
	edit(b)
	if fix {
		binary.LittleEndian.PutUint32(b[34:], cache.Checksum(b[:34]))
	}
	return b
}

// record2 is a version 2 record of m (a version 1 one extended to its
// length when m has no segment) edited by edit, its CRC fixed after.
func record2(m meta, edit func([]byte) []byte) []byte {
	b := m.encode()
	if len(b) == recLen {
		b = append(b, make([]byte, recLen2-recLen)...)
		b[0] = recVersion2
		binary.LittleEndian.PutUint32(b[34:], 1)
	}
	b = edit(b)
	binary.LittleEndian.PutUint32(b[len(b)-4:], cache.Checksum(b[:len(b)-4]))
	return b
}

func TestDecodeMeta(t *testing.T) {
	m := meta{size: 4 << 20, sum: 0xdeadbeef, depth: 7, lowPri: true, access: 1_700_000_000_000_000_000, created: 1_600_000_000_000_000_000}
	m2 := m
	m2.seg, m2.off = 7, 96<<20
	keep := func([]byte) {}
	for _, tc := range []struct {
		name string
		in   []byte
		want meta
		err  error
	}{
		{"round trip", m.encode(), m, nil},
		{"zero record", (&meta{}).encode(), meta{}, nil},
		{"negative depth", (&meta{depth: -1, size: 1}).encode(), meta{depth: -1, size: 1}, nil},
		{"unknown flag bits are ignored", record(m, true, func(b []byte) { b[1] |= 0xfc }), m, nil},
		{"durable", (&meta{size: 1, durable: true}).encode(), meta{size: 1, durable: true}, nil},
		{"durable flag bit", record(m, true, func(b []byte) { b[1] |= flagDurable }), func() meta { d := m; d.durable = true; return d }(), nil},
		{"nothing", nil, meta{}, errBadRecord},
		{"short", m.encode()[:recLen-1], meta{}, errBadRecord},
		{"long", append(m.encode(), 0), meta{}, errBadRecord},
		{"other version", record(m, true, func(b []byte) { b[0] = recVersion + 1 }), meta{}, errBadRecord},
		{"bit flip in the size", record(m, false, func(b []byte) { b[5] ^= 1 }), meta{}, errBadRecord},
		{"bit flip in the checksum", record(m, false, func(b []byte) { b[36] ^= 0x80 }), meta{}, errBadRecord},
		{"negative size with a valid checksum", record(m, true, func(b []byte) { b[9] = 0x80 }), meta{}, errBadRecord},
		{"unchanged", record(m, false, keep), m, nil},
		{"value log round trip", m2.encode(), m2, nil},
		{"value log record cut to version 1's length", record2(m2, func(b []byte) []byte { return b[:recLen] }), meta{}, errBadRecord},
		{"version 1 record of version 2's length", record2(m, func(b []byte) []byte { b[0] = recVersion; return b }), meta{}, errBadRecord},
		{"value log segment 0", record2(m2, func(b []byte) []byte { binary.LittleEndian.PutUint32(b[34:], 0); return b }), meta{}, errBadRecord},
		{"value log offset not aligned", record2(m2, func(b []byte) []byte { b[38] = 1; return b }), meta{}, errBadRecord},
		{"value log offset negative", record2(m2, func(b []byte) []byte { b[45] = 0x80; return b }), meta{}, errBadRecord},
		{"bit flip in the value log offset", func() []byte { b := m2.encode(); b[40] ^= 1; return b }(), meta{}, errBadRecord},
	} {
		checkDecodeMeta(t, tc.name, tc.in, tc.want, tc.err)
	}
}

func checkDecodeMeta(t *testing.T, name string, in []byte, want meta, wantErr error) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		got, err := decodeMeta(in)
		if !errors.Is(err, wantErr) {
			t.Fatalf("decodeMeta error = %v, want %v", err, wantErr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decodeMeta = %+v, want %+v", got, want)
		}
	})
}

// TestDecodeMetaDescription: records with a block description (versions 3
// and 4) round-trip, and every count in one is checked against the bytes
// present: a record that claims more tokens or a longer parent than it
// holds, or tokens that are not one block, is refused, never allocated.
func TestDecodeMetaDescription(t *testing.T) {
	desc := &cache.BlockMeta{Tokens: []uint32{1100, 1101, 1102, 0xffffffff}, Parent: []byte("parent-key"), BlockSize: 4}
	m := meta{size: 4 << 20, sum: 0xdeadbeef, depth: 7, access: 5, created: 4, desc: desc}
	m2 := m
	m2.seg, m2.off = 7, 96<<20
	noTokens := m
	noTokens.desc = &cache.BlockMeta{BlockSize: 16}
	// edit changes a version 3 record's description (it starts at 34)
	// and fixes the record's CRC.
	edit := func(m meta, f func(b []byte) []byte) []byte {
		b := f(m.encode())
		binary.LittleEndian.PutUint32(b[len(b)-4:], cache.Checksum(b[:len(b)-4]))
		return b
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want meta
		err  error
	}{
		{"version 3 round trip", m.encode(), m, nil},
		{"version 4 (value log) round trip", m2.encode(), m2, nil},
		{"block size without tokens", noTokens.encode(), noTokens, nil},
		{"version 3 tag", func() []byte { b := m.encode(); return b[:1] }(), meta{}, errBadRecord},
		{"token count beyond the record", edit(m, func(b []byte) []byte { binary.LittleEndian.PutUint16(b[38:], 0xffff); return b }), meta{}, errBadRecord},
		{"parent length beyond the record", edit(m, func(b []byte) []byte { binary.LittleEndian.PutUint16(b[40:], 0xffff); return b }), meta{}, errBadRecord},
		{"tokens are not one block", edit(m, func(b []byte) []byte { binary.LittleEndian.PutUint32(b[34:], 5); return b }), meta{}, errBadRecord},
		{"negative block size", edit(noTokens, func(b []byte) []byte { binary.LittleEndian.PutUint32(b[34:], 0xffffffff); return b }), meta{}, errBadRecord},
		{"block size over the cap", edit(noTokens, func(b []byte) []byte { binary.LittleEndian.PutUint32(b[34:], maxDescTokens+1); return b }), meta{}, errBadRecord},
		{"a byte too many", edit(m, func(b []byte) []byte { return append(b, 0) }), meta{}, errBadRecord},
		{"a byte too few", edit(m, func(b []byte) []byte { return append(b[:len(b)-5], 0, 0, 0, 0) }), meta{}, errBadRecord},
		{"description cut off", edit(m, func(b []byte) []byte { return append(b[:37], 0, 0, 0, 0) }), meta{}, errBadRecord},
		{"bit flip in a token id", func() []byte { b := m.encode(); b[43] ^= 1; return b }(), meta{}, errBadRecord},
		{"bit flip in the parent", func() []byte { b := m.encode(); b[len(b)-6] ^= 1; return b }(), meta{}, errBadRecord},
	} {
		checkDecodeMeta(t, tc.name, tc.in, tc.want, tc.err)
	}
	if got := len(m.encode()); got != recLen+descHead+4*4+len("parent-key") {
		t.Errorf("version 3 record is %d bytes", got)
	}
	// keepDesc copies, and drops what the format cannot hold or says
	// nothing.
	k := keepDesc(desc)
	if !reflect.DeepEqual(k, desc) || &k.Tokens[0] == &desc.Tokens[0] {
		t.Errorf("keepDesc = %+v: want an equal copy", k)
	}
	for _, d := range []*cache.BlockMeta{nil, {}, {BlockSize: -1}, {BlockSize: 2, Tokens: []uint32{1}},
		{BlockSize: maxDescTokens + 1}, {Parent: make([]byte, maxDescParent+1)}} {
		if k := keepDesc(d); k != nil {
			t.Errorf("keepDesc(%+v) = %+v, want nil", d, k)
		}
	}
}

func FuzzDecodeKey(f *testing.F) {
	f.Add(encodeKey("llama/bf16", []byte("block-0")))
	f.Add(encodeKey("", []byte{0}))
	f.Add([]byte{0x80})
	f.Add([]byte{5, 'a', 'b'})
	f.Fuzz(func(t *testing.T, in []byte) {
		ns, key, err := decodeKey(in)
		if err != nil {
			if !errors.Is(err, errBadKey) {
				t.Fatalf("error %v does not wrap errBadKey", err)
			}
			return
		}
		if len(key) == 0 || len(ns)+len(key) > len(in) {
			t.Fatalf("decodeKey(%x) = %q, %q: empty key or more bytes than given", in, ns, key)
		}
		if !bytes.HasSuffix(in, key) {
			t.Fatalf("decodeKey(%x) key %x is not the record's tail", in, key)
		}
		// What decodes re-encodes to a record that decodes the same
		// (the canonical form: the varint may have been overlong).
		ns2, key2, err := decodeKey(encodeKey(ns, key))
		if err != nil || ns2 != ns || !bytes.Equal(key2, key) {
			t.Fatalf("re-encoded %q, %q decodes to %q, %q, %v", ns, key, ns2, key2, err)
		}
	})
}

func FuzzDecodeMeta(f *testing.F) {
	f.Add((&meta{size: 4 << 20, sum: 1, depth: 3, lowPri: true, access: 5, created: 4}).encode())
	f.Add((&meta{}).encode())
	f.Add(make([]byte, recLen))
	f.Add([]byte{recVersion})
	f.Add((&meta{size: 1 << 20, sum: 2, seg: 3, off: 8 << 20}).encode())
	f.Add((&meta{size: 1 << 20, desc: &cache.BlockMeta{Tokens: []uint32{1, 2}, Parent: []byte("p"), BlockSize: 2}}).encode())
	f.Add((&meta{size: 1 << 20, seg: 3, off: 8 << 20, desc: &cache.BlockMeta{BlockSize: 16}}).encode())
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := decodeMeta(in)
		if err != nil {
			if !errors.Is(err, errBadRecord) || !reflect.DeepEqual(m, meta{}) {
				t.Fatalf("decodeMeta(%x) = %+v, %v: want the zero meta and errBadRecord", in, m, err)
			}
			return
		}
		if m.size < 0 {
			t.Fatalf("decodeMeta(%x) accepted a negative size %d", in, m.size)
		}
		// An accepted record is the encoding of what it decodes to, but
		// for flag bits this version does not know.
		again := m.encode()
		want := bytes.Clone(in)
		want[1] &= flagLowPri | flagDurable
		binary.LittleEndian.PutUint32(want[len(want)-4:], cache.Checksum(want[:len(want)-4]))
		if !bytes.Equal(again, want) {
			t.Fatalf("decodeMeta(%x) = %+v re-encodes to %x", in, m, again)
		}
	})
}

// TestRecordGolden: records as written to disk, bytes made from the
// format's description above with Python's struct and an independent
// CRC-32C (clients/python/tidepool/checksum.py). They decode to their
// fields and are written back byte for byte: a change that breaks the
// records already on disk fails here.
func TestRecordGolden(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, hex string
		m         meta
	}{
		{"version 1", "01010000400000000000efbeadde0700000000002a36fe9c97170000a0d88557341639221a4d",
			meta{size: 4 << 20, sum: 0xdeadbeef, depth: 7, lowPri: true, access: 1_700_000_000_000_000_000, created: 1_600_000_000_000_000_000}},
		{"version 4: value log and description",
			"040200100000000000000403020103000000050000000000000006000000000000000700000000000006000000000400000004000200010000000200000003000000ffffffff7030126da01d",
			meta{size: 4096, sum: 0x01020304, depth: 3, durable: true, access: 5, created: 6, seg: 7, off: 96 << 20,
				desc: &cache.BlockMeta{BlockSize: 4, Tokens: []uint32{1, 2, 3, 0xffffffff}, Parent: []byte("p0")}}},
	} {
		b, err := hex.DecodeString(tc.hex)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeMeta(b)
		if err != nil || !reflect.DeepEqual(got, tc.m) {
			t.Errorf("%s: decoded %+v, %v; want %+v", tc.name, got, err, tc.m)
		}
		if enc := tc.m.encode(); !bytes.Equal(enc, b) {
			t.Errorf("%s: encoded %x, want %x", tc.name, enc, b)
		}
	}
}
