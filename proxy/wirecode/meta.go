package wirecode

import "github.com/tidepool-kv/tidepool/cache"

// Both Thrift edges carry a block's description (cache.BlockMeta) as
// optional fields: token ids as i32 (Thrift has no unsigned integers; the
// bits are kept), the parent key, the block size.

// Meta converts a description as an edge received it; nil when none of its
// fields was sent. Not checked here: the proxy checks it as a put's. The
// tokens are copied (the publisher keeps them); parent is not.
func Meta(tokens []int32, parent []byte, blockSize *int32) *cache.BlockMeta {
	if tokens == nil && parent == nil && blockSize == nil {
		return nil
	}
	m := &cache.BlockMeta{Parent: parent}
	if blockSize != nil {
		m.BlockSize = *blockSize
	}
	if len(tokens) > 0 {
		m.Tokens = make([]uint32, len(tokens))
		for i, tok := range tokens {
			m.Tokens[i] = uint32(tok)
		}
	}
	return m
}

// Tokens is token ids as the edges carry them.
func Tokens(tokens []uint32) []int32 {
	out := make([]int32, len(tokens))
	for i, tok := range tokens {
		out[i] = int32(tok)
	}
	return out
}
