"""The sidecar's slot index, read without a call (docs/zerocopy.md, "Reads
without a call").

A sidecar whose Hello lists "slot_index" keeps, in the file slots.idx
beside its arenas, a table of where each block of its DRAM tier lies. A
reader finds a block's entry, copies the bytes out of the arena it maps,
and then checks that the entry is unchanged: the sidecar clears a block's
entry before the block's memory can hold anything else, so an unchanged
entry means the bytes read were the block's. Nothing is pinned: a block
can be evicted during the copy, and the check then says so (read it again
through Acquire, or recompute it).

Layout (cache/dram/slots.go): a 64-byte header (magic "TPSLOTS1", version
u32 1, entry size u32 32, entries u64, window u32, arena size u64 at byte
32), then entries of four u64: seq (odd while the sidecar rewrites the
entry), tag (the first 8 bytes of SHA-256(namespace || 0 || key),
little-endian; 1 if those are 0; 0 for an empty entry), global offset
(arena index x arena size + offset) and length. A block's entry is one of
the `window` entries from tag mod entries on.

Each u64 is read with one aligned 8-byte load, in the order the protocol
needs (seq, then the entry, then seq again): x86-64 does not reorder loads
with older loads. Other architectures would need acquire loads that Python
cannot issue, so the index is not used there (open returns None).
"""

import hashlib
import mmap
import os
import platform
from typing import NamedTuple, Optional

MAGIC = b"TPSLOTS1"
VERSION = 1
FILE = "slots.idx"
_HEADER_WORDS = 8  # 64 bytes


class Slot(NamedTuple):
    """Where a block lies, and the entry's seq when it was found."""
    entry: int
    seq: int
    arena: int
    offset: int
    length: int


def supported():
    """The load ordering the protocol relies on (x86-64's)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def _ns_hash(ns):
    """SHA-256 state after the namespace and its zero byte (copied per key)."""
    return hashlib.sha256((ns.encode() if isinstance(ns, str) else bytes(ns)) + b"\0")


def _tag(h0, key):
    h = h0.copy()
    h.update(key)
    return int.from_bytes(h.digest()[:8], "little") or 1


class SlotIndex:
    """A read-only mapping of one sidecar's slot index."""

    def __init__(self, path):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            self.ino = st.st_ino
            self._map = mmap.mmap(fd, st.st_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        try:
            head = self._map[:40]
            if head[:8] != MAGIC or int.from_bytes(head[8:12], "little") != VERSION \
                    or int.from_bytes(head[12:16], "little") != 32:
                raise ValueError("%s: not a slot index of version %d" % (path, VERSION))
            self.entries = int.from_bytes(head[16:24], "little")
            self.window = int.from_bytes(head[24:28], "little")
            self.arena_size = int.from_bytes(head[32:40], "little")
            if self.entries <= 0 or self.entries & (self.entries - 1) or self.window <= 0 \
                    or self.arena_size <= 0 or st.st_size != 64 + 32 * self.entries:
                raise ValueError("%s: malformed slot index header" % path)
        except BaseException:
            self._map.close()
            raise
        self.path = path
        self._q = memoryview(self._map).cast("Q")  # native order: little-endian on x86-64

    def find(self, ns, keys):
        """One Slot or None per key: where each block lay when looked at."""
        q, mask, window, out = self._q, self.entries - 1, self.window, []
        h0 = _ns_hash(ns)
        for key in keys:
            t = _tag(h0, key)
            got = None
            for j in range(window):
                i = _HEADER_WORDS + 4 * ((t + j) & mask)
                if q[i + 1] != t:
                    continue
                s1 = q[i]
                if s1 & 1 or q[i + 1] != t:
                    continue
                off, length = q[i + 2], q[i + 3]
                if q[i] != s1:
                    continue
                got = Slot((t + j) & mask, s1, off // self.arena_size, off % self.arena_size, length)
                break
            out.append(got)
        return out

    def prefix(self, ns, keys):
        """How many of keys, from the first, the index lists: a hint (an
        entry is not read whole), for a reader that then finds them."""
        q, mask, window = self._q, self.entries - 1, self.window
        h0 = _ns_hash(ns)
        n = 0
        for key in keys:
            t = _tag(h0, key)
            for j in range(window):
                if q[_HEADER_WORDS + 1 + 4 * ((t + j) & mask)] == t:
                    break
            else:
                return n
            n += 1
        return n

    def unchanged(self, slot):
        """Whether slot's entry is as it was when found: the bytes read
        from it since are the block's."""
        return self._q[_HEADER_WORDS + 4 * slot.entry] == slot.seq

    def stale(self):
        """The file was replaced (the sidecar restarted) or removed."""
        try:
            return os.stat(self.path).st_ino != self.ino
        except OSError:
            return True

    def close(self):
        self._q.release()
        self._map.close()


def open_index(arena_paths, features) -> Optional[SlotIndex]:
    """The slot index beside arena 0, if the sidecar lists "slot_index",
    this machine orders loads as the protocol needs, and the file maps; else
    None (read through Acquire)."""
    if "slot_index" not in (features or ()) or not arena_paths or not supported():
        return None
    try:
        return SlotIndex(os.path.join(os.path.dirname(arena_paths[0]), FILE))
    except (OSError, ValueError):
        return None
