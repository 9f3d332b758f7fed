"""Canonical chained block keys (protocol/keys.go, byte for byte).

    key = SHA-256( b"tidepool/block/v1"
                 || parent            (32 bytes; 32 zero bytes for the first block)
                 || uint32le(len(tokens)) || uint32le(token) for each token
                 || uint32le(len(extra))  || extra )

Equal keys mean equal prefixes: a block's key commits to every token before
it. ``extra`` carries whatever else changes the KV bytes of a block (a LoRA
id, multimodal hashes, a cache salt); None and b"" are the same.
"""

import hashlib
import struct

KEY_SIZE = 32
_DOMAIN = b"tidepool/block/v1"
_ZERO = bytes(KEY_SIZE)


def block_key(parent, tokens, extra=b""):
    """Key of one block of ``tokens`` chained on ``parent`` (None or b"" for
    the first block, else a key returned by block_key)."""
    if parent and len(parent) != KEY_SIZE:
        raise ValueError("parent key must be %d bytes, got %d" % (KEY_SIZE, len(parent)))
    extra = extra or b""
    h = hashlib.sha256(_DOMAIN)
    h.update(parent or _ZERO)
    tokens = list(tokens)
    h.update(struct.pack("<I", len(tokens)))
    if tokens:
        h.update(struct.pack("<%dI" % len(tokens), *tokens))
    h.update(struct.pack("<I", len(extra)))
    h.update(extra)
    return h.digest()


def chain_keys(tokens, block_tokens, extra=b""):
    """Keys of every full block of ``block_tokens`` tokens, in order; a
    trailing partial block gets none (it is not cacheable until full)."""
    if block_tokens <= 0:
        raise ValueError("block_tokens must be positive")
    tokens = list(tokens)
    keys, parent = [], None
    for i in range(len(tokens) // block_tokens):
        parent = block_key(parent, tokens[i * block_tokens:(i + 1) * block_tokens], extra)
        keys.append(parent)
    return keys
