package kvevents

import (
	"encoding/binary"
	"math"
)

// The msgpack encoding of vLLM's KVEventBatch as the pinned vLLM writes it
// (vllm/distributed/kv_events.py, msgspec): the batch is an array
// [ts, events, data_parallel_rank] (EventBatch is array_like), and each
// event a map tagged under "type" with its fields in declaration order,
// fields equal to their default left out (KVCacheEvent is omit_defaults,
// tag=True). Integers and strings take msgpack's smallest form, as
// msgspec writes them, so that the bytes equal msgspec's for the same
// batch (tests/python/test_kv_events.py compares them).

type enc struct{ b []byte }

func (e *enc) arrayHeader(n int) {
	switch {
	case n < 16:
		e.b = append(e.b, 0x90|byte(n))
	case n <= math.MaxUint16:
		e.b = append(e.b, 0xdc)
		e.b = binary.BigEndian.AppendUint16(e.b, uint16(n))
	default:
		e.b = append(e.b, 0xdd)
		e.b = binary.BigEndian.AppendUint32(e.b, uint32(n))
	}
}

func (e *enc) mapHeader(n int) {
	// Events have at most 8 fields: always a fixmap.
	e.b = append(e.b, 0x80|byte(n))
}

func (e *enc) str(s string) {
	n := len(s)
	switch {
	case n < 32:
		e.b = append(e.b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		e.b = append(e.b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		e.b = append(e.b, 0xda)
		e.b = binary.BigEndian.AppendUint16(e.b, uint16(n))
	default:
		e.b = append(e.b, 0xdb)
		e.b = binary.BigEndian.AppendUint32(e.b, uint32(n))
	}
	e.b = append(e.b, s...)
}

func (e *enc) bin(p []byte) {
	n := len(p)
	switch {
	case n <= math.MaxUint8:
		e.b = append(e.b, 0xc4, byte(n))
	case n <= math.MaxUint16:
		e.b = append(e.b, 0xc5)
		e.b = binary.BigEndian.AppendUint16(e.b, uint16(n))
	default:
		e.b = append(e.b, 0xc6)
		e.b = binary.BigEndian.AppendUint32(e.b, uint32(n))
	}
	e.b = append(e.b, p...)
}

func (e *enc) uint(v uint64) {
	switch {
	case v < 128:
		e.b = append(e.b, byte(v))
	case v <= math.MaxUint8:
		e.b = append(e.b, 0xcc, byte(v))
	case v <= math.MaxUint16:
		e.b = append(e.b, 0xcd)
		e.b = binary.BigEndian.AppendUint16(e.b, uint16(v))
	case v <= math.MaxUint32:
		e.b = append(e.b, 0xce)
		e.b = binary.BigEndian.AppendUint32(e.b, uint32(v))
	default:
		e.b = append(e.b, 0xcf)
		e.b = binary.BigEndian.AppendUint64(e.b, v)
	}
}

func (e *enc) float(f float64) {
	e.b = append(e.b, 0xcb)
	e.b = binary.BigEndian.AppendUint64(e.b, math.Float64bits(f))
}

func (e *enc) nil() { e.b = append(e.b, 0xc0) }

// hash writes a block key in the configured form: the key's bytes, or (as
// vLLM does by default, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1) the
// unsigned integer of its last 8 bytes, big-endian.
func (e *enc) hash(key []byte, asInt bool) {
	if !asInt {
		e.bin(key)
		return
	}
	e.uint(HashInt(key))
}

// HashInt is a block key as vLLM's integer block hash: its last 8 bytes
// (all of a shorter key) as a big-endian unsigned integer.
func HashInt(key []byte) uint64 {
	if len(key) > 8 {
		key = key[len(key)-8:]
	}
	var v uint64
	for _, c := range key {
		v = v<<8 | uint64(c)
	}
	return v
}

// event is one change to publish.
type event struct {
	kind   kind
	ns     string
	key    string
	medium string
	meta   *meta // BlockStored: the block's description, nil when unknown
}

type kind uint8

const (
	stored kind = iota
	removed
	cleared
)

// meta is a block's description as the publisher keeps it (copied from
// the put; never changed once made).
type meta struct {
	tokens    []uint32
	parent    []byte
	blockSize int32
}

// appendEvent encodes ev as vLLM's BlockStored, BlockRemoved or
// AllBlocksCleared.
func (e *enc) event(ev *event, asInt bool) {
	switch ev.kind {
	case stored:
		e.mapHeader(8)
		e.str("type")
		e.str("BlockStored")
		e.str("block_hashes")
		e.arrayHeader(1)
		e.hash([]byte(ev.key), asInt)
		e.str("parent_block_hash")
		m := ev.meta
		if m != nil && len(m.parent) > 0 {
			e.hash(m.parent, asInt)
		} else {
			e.nil()
		}
		e.str("token_ids")
		if m == nil {
			e.arrayHeader(0)
		} else {
			e.arrayHeader(len(m.tokens))
			for _, t := range m.tokens {
				e.uint(uint64(t))
			}
		}
		e.str("block_size")
		if m == nil {
			e.uint(0)
		} else {
			e.uint(uint64(m.blockSize))
		}
		e.str("lora_id")
		e.nil()
		e.str("medium")
		e.str(ev.medium)
		e.str("lora_name")
		e.nil()
	case removed:
		e.mapHeader(3)
		e.str("type")
		e.str("BlockRemoved")
		e.str("block_hashes")
		e.arrayHeader(1)
		e.hash([]byte(ev.key), asInt)
		e.str("medium")
		e.str(ev.medium)
	case cleared:
		e.mapHeader(1)
		e.str("type")
		e.str("AllBlocksCleared")
	}
}

// encodeBatch encodes a KVEventBatch of evs: [ts, [events...], 0] (the
// data-parallel rank is 0, as vLLM's publisher sets it for rank 0).
func encodeBatch(dst []byte, ts float64, evs []*event, asInt bool) []byte {
	e := enc{b: dst}
	e.arrayHeader(3)
	e.float(ts)
	e.arrayHeader(len(evs))
	for _, ev := range evs {
		e.event(ev, asInt)
	}
	e.uint(0)
	return e.b
}
