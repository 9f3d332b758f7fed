// Package protocol holds what every tidepool client and server must agree on
// byte for byte: the canonical chained block-key hash, the protocol version,
// and (in gen/) the code generated from idl/.
package protocol

import (
	"crypto/sha256"
	"encoding/binary"
)

// Version is the engine API version a server reports in Hello.
const Version = 1

// KeySize is the length of a canonical block key in bytes.
const KeySize = sha256.Size

// keyDomain separates tidepool block keys from any other SHA-256 use.
const keyDomain = "tidepool/block/v1"

// BlockKey returns the canonical key of one block, chained on its parent's
// key:
//
//	key = SHA-256( "tidepool/block/v1"
//	             ‖ parent          (32 bytes; 32 zero bytes for the first block)
//	             ‖ uint32le(len(tokens)) ‖ uint32le(token) for each token
//	             ‖ uint32le(len(extra))  ‖ extra )
//
// Equal keys therefore mean equal prefixes: a block's key commits to every
// token before it. extra carries whatever else changes the KV bytes of the
// block (a LoRA id, multimodal hashes, a cache salt); nil and empty are the
// same. parent must be nil (first block) or a key returned by BlockKey.
// Python clients compute the same bytes with hashlib.sha256 (see
// clients/python and protocol/testdata/keys.txt for test vectors).
func BlockKey(parent []byte, tokens []uint32, extra []byte) [KeySize]byte {
	h := sha256.New()
	h.Write([]byte(keyDomain))
	var zero [KeySize]byte
	if len(parent) == 0 {
		h.Write(zero[:])
	} else {
		h.Write(parent)
	}
	var buf [4096]byte
	b := binary.LittleEndian.AppendUint32(buf[:0], uint32(len(tokens)))
	for _, t := range tokens {
		if len(b)+4 > len(buf) {
			h.Write(b)
			b = buf[:0]
		}
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(extra)))
	h.Write(b)
	h.Write(extra)
	var out [KeySize]byte
	h.Sum(out[:0])
	return out
}

// ChainKeys splits tokens into blocks of blockTokens tokens and returns the
// chained key of every full block, in order. A trailing partial block gets
// no key: it is not cacheable until it is full. extra is applied to every
// block. blockTokens must be positive.
func ChainKeys(tokens []uint32, blockTokens int, extra []byte) [][KeySize]byte {
	if blockTokens <= 0 {
		return nil
	}
	n := len(tokens) / blockTokens
	keys := make([][KeySize]byte, n)
	var parent []byte
	for i := 0; i < n; i++ {
		keys[i] = BlockKey(parent, tokens[i*blockTokens:(i+1)*blockTokens], extra)
		parent = keys[i][:]
	}
	return keys
}
