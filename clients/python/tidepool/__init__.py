"""tidepool: the engine-side client of a tidepool KV-cache sidecar.

Needs only the standard library and Debian's python3-thrift. See README.md
(in clients/python) for the calls and for how a vLLM or SGLang connector
uses them.

    import tidepool
    c = tidepool.Client("/run/tidepool/tidepool.sock")
    keys = tidepool.chain_keys(token_ids, block_tokens=16)
    hit_blocks = c.lookup("llama3-70b/tp8/bf16", keys)
"""

from .client import (  # noqa: F401
    ARENA_LAYOUT_VERSION,
    BlockMeta,
    EXISTS,
    NOT_FOUND,
    OK,
    Client,
    Error,
    ErrorCode,
    Lease,
    Presence,
    RegisteredBuffer,
    Reservation,
    Scope,
    Slot,
    WRITE_KEYED,
    WRITE_PWRITE,
    code_name,
)
from . import pkey  # noqa: F401
from .checksum import FAST as CRC32C_FAST  # noqa: F401
from .checksum import crc32c  # noqa: F401
from .keys import KEY_SIZE, block_key, chain_keys  # noqa: F401

__all__ = [
    "ARENA_LAYOUT_VERSION", "BlockMeta", "CRC32C_FAST", "Client", "EXISTS", "Error", "ErrorCode", "KEY_SIZE",
    "Lease", "NOT_FOUND", "OK", "Presence", "RegisteredBuffer", "Reservation", "Scope", "Slot", "block_key",
    "chain_keys", "code_name", "crc32c",
]
