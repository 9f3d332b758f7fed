"""CRC-32C (Castagnoli), the checksum every tidepool block carries.

Uses the ``crc32c`` or ``google_crc32c`` module when one is installed (C
speed, several GB/s; ``pip install tidepool-kv`` brings ``crc32c``);
otherwise a table-driven pure-Python fallback (a few MB/s: fine for tests
and small blocks, slow for MiB blocks). ``FAST`` says which one is in use.
Zero-copy reads (batch_get_into, get_into, slot_view of a Lease) are not
checked by default (the sidecar checks where bytes enter, and with
verify_reads also at acquire); verify=True checks them with whichever
implementation is present, so without a C module such a check runs at a
few MB/s. Importing this module without one warns once (RuntimeWarning),
so that nobody believes reads are checked cheaply when they are not. Puts
send their checksum only when FAST; otherwise the server computes it from
the arena at Commit.
"""

import warnings

FAST = False
_extend = None  # (data, crc) -> the crc continued over data, where a C module offers it
try:  # pragma: no cover - depends on the host
    import crc32c as _mod

    def _extend(data, crc):
        return _mod.crc32c(data, crc)

    def crc32c(data):
        return _mod.crc32c(data) & 0xFFFFFFFF

    FAST = True
except ImportError:
    try:  # pragma: no cover
        import google_crc32c as _gmod

        def crc32c(data):
            return _gmod.value(bytes(data)) & 0xFFFFFFFF

        FAST = True
    except ImportError:
        _TABLE = []
        for _i in range(256):
            _c = _i
            for _ in range(8):
                _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
            _TABLE.append(_c)

        def crc32c(data):
            """CRC-32C of a bytes-like object (pure Python)."""
            c = 0xFFFFFFFF
            t = _TABLE
            for b in memoryview(data).cast("B"):
                c = t[(c ^ b) & 0xFF] ^ (c >> 8)
            return c ^ 0xFFFFFFFF


def crc32c_parts(parts):
    """CRC-32C of the parts' bytes one after the other, without joining
    them (the C modules continue a CRC across calls)."""
    if _extend is not None:
        c = 0
        for p in parts:
            c = _extend(p, c)
        return c & 0xFFFFFFFF
    return crc32c(b"".join(bytes(memoryview(p).cast("B")) for p in parts))


def to_i32(u):
    """The IDL carries checksums as i32: the same 32 bits, signed."""
    return u - (1 << 32) if u >= 1 << 31 else u


def from_i32(i):
    return i & 0xFFFFFFFF


if not FAST:
    warnings.warn(
        "tidepool: no C CRC-32C module (pip install crc32c): zero-copy reads "
        "(get_into, batch_get_into, slot_view) are unchecked unless verify=True, "
        "and verify=True falls back to pure Python (a few MB/s)",
        RuntimeWarning,
        stacklevel=2,
    )
