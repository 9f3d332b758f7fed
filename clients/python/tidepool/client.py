"""The engine-side client of a tidepool sidecar (see README.md).

One Client holds one connection; it is not thread-safe (Thrift transports are
not): give each thread or process its own Client. The arena mappings made
for the zero-copy calls belong to the Client and go away with close(), as
do the buffers registered with register_buffer (and the buffer socket
connection they were registered on).
"""

import collections
import contextlib
import ctypes
import errno
import logging
import mmap
import os
import socket
import time

from struct import unpack

from thrift.protocol import TBinaryProtocol
from thrift.Thrift import TType
from thrift.transport import TSocket, TTransport

from . import bufsock as _bufsock
from . import pkey as _pkey
from . import slots as _slots
from .checksum import FAST as CRC_FAST
from .checksum import crc32c, from_i32, to_i32
from .gen import Tidepool
from .transport import FramedSocketTransport
from .gen import ttypes as T

ARENA_LAYOUT_VERSION = 1
CLIENT_VERSION = 1

# HelloResponse.features: Acquire honours release_lease_ids.
FEATURE_ACQUIRE_RELEASE = "acquire_release"
FEATURE_GPU = "gpu"
# HelloResponse.features: Reserve takes unbound items, and Commit reserves
# the next slot of an item that asks (CommitItem.next_size).
FEATURE_COMMIT_NEXT = "commit_next"
# HelloResponse.features: the sidecar serves the buffer socket (the engine
# socket's path plus ".buf"; see bufsock.py), for register_buffer.
FEATURE_BUFFER_SOCKET = "buffer_socket"
# A slot reserved ahead with less time than this left is not used.
SPARE_MARGIN_MS = 5000
# A finished read's leases ride on the next Acquire only when its copy ended
# at least this long before the lease deadline (as the Go client's GetInto);
# otherwise they are released at once and an expired one fails the read.
RELEASE_MARGIN_MS = 100
# Client(write_mode=...): how slots are written (put_from, batch_put_from,
# write_slot). WRITE_KEYED, the default: a memmove into a mapping only the
# copying thread can touch (pkey.py), where the machine has protection keys,
# else pwrite. WRITE_PWRITE: always pwrite on the arena file.
WRITE_KEYED = "keyed"
WRITE_PWRITE = "pwrite"



class _QuietConnectFailures(logging.Filter):
    """thrift's TSocket logs an ERROR for every failed connect before it
    raises; the raised error says the same, and a caller that retries (an
    engine started before its sidecar) would log one per try."""

    def filter(self, record):
        return not str(record.msg).startswith("Could not connect to")


logging.getLogger("thrift.transport.TSocket").addFilter(_QuietConnectFailures())

ErrorCode = T.ErrorCode
Scope = T.Scope

OK = ErrorCode.OK
NOT_FOUND = ErrorCode.NOT_FOUND
EXISTS = ErrorCode.EXISTS


def code_name(code):
    return ErrorCode._VALUES_TO_NAMES.get(code, str(code))


class Error(Exception):
    """An error answered by the server (or found by the client), with its
    ErrorCode."""

    def __init__(self, code, message=""):
        super().__init__("tidepool: %s: %s" % (code_name(code), message))
        self.code = code
        self.message = message


Slot = collections.namedtuple("Slot", "arena offset length")
Reservation = collections.namedtuple("Reservation", "code message slot token deadline_ms")
Lease = collections.namedtuple("Lease", "code slot lease_id checksum tier")
Presence = collections.namedtuple("Presence", "present tier node_id")


def _slot(s):
    return Slot(s.arena, s.offset, s.length) if s is not None else Slot(0, 0, 0)


def _codes(results):
    return [r.code for r in results]


# The most buffers one pwritev is given (Linux's IOV_MAX is 1024).
_MAX_IOV = 512


def _pwritev_all(fd, bufs, off):
    """Writes bufs (byte memoryviews) back to back at off, all of them."""
    bufs = [b for b in bufs if len(b)]
    i = 0
    while i < len(bufs):
        done = os.pwritev(fd, bufs[i:i + _MAX_IOV], off)
        if done <= 0:
            raise OSError(errno.EIO, "pwritev wrote nothing")
        off += done
        while i < len(bufs) and done >= len(bufs[i]):
            done -= len(bufs[i])
            i += 1
        if done:
            bufs[i] = bufs[i][done:]


# The send buffer asked for the connection (SO_SNDBUF; Linux doubles it and
# caps the request at net.core.wmem_max). On a Unix socket the sender's
# buffer bounds what is queued for the reader: with the default (208 KiB) a
# 1 MiB Put is five partial sends, each waiting for the sidecar to drain
# the queue; with a buffer above the request size it is one. The sidecar
# does the same for its replies (proxy/engineapi/sockbuf.go).
SEND_BUFFER = 4 << 20


def _grow_send_buffer(tsock):
    """Best effort: a refusal (or a cap) only costs speed."""
    h = getattr(tsock, "handle", None)
    if h is None:
        return
    try:
        h.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
    except OSError:
        pass


# populate_reads: the unit it fills page tables in, and madvise's advice
# (Linux >= 5.14; Python 3.11's mmap module does not name it).
_POPULATE_CHUNK = 2 << 20
_MADV_POPULATE_READ = 22


class _Arena:
    """One arena file: mapped read-only, a descriptor to write slots, and a
    keyed mapping for writes (pkey.KeyedMap, made at the first keyed write)."""

    def __init__(self, path, size):
        self.path = path
        self.size = size
        self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            st = os.fstat(self.fd)
            if st.st_size < size:
                raise Error(ErrorCode.UNAVAILABLE, "arena %s is %d bytes, Hello says %d" % (path, st.st_size, size))
            self.ino = st.st_ino
            self.map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        except BaseException:
            os.close(self.fd)
            raise
        self.view = memoryview(self.map)
        self.keyed = None
        self.populated = set()  # 2 MiB regions populate_reads filled; None: not supported

    def keyed_map(self):
        if self.keyed is None:
            self.keyed = _pkey.KeyedMap(self.fd, self.size)
        return self.keyed

    def stale(self):
        try:
            return os.stat(self.path).st_ino != self.ino
        except OSError:
            return True

    def close(self):
        self.view.release()
        self.map.close()
        if self.keyed is not None:
            self.keyed.close()
        os.close(self.fd)


class RegisteredBuffer:
    """Memory of this process registered with the sidecar over the buffer
    socket (Client.register_buffer): get_into (and batch_get_into) a buffer
    that lies inside `view` has the sidecar write the block there itself,
    with no copy by this client and none through the arenas for a block
    fetched from another node; put_from (and batch_put_from) a buffer inside
    it has the sidecar copy the value out of it into its slot, with no
    reserve, write and commit by this client.

    view: a writable memoryview of size bytes (a MAP_SHARED mapping of a
    sealed memfd, page-aligned); id: the sidecar's id for it. close()
    unregisters it and unmaps it (also as a context manager; a second
    close does nothing). After close, view is released; a slice of it kept
    from before still reads and writes the memory (the mapping goes with
    the last such view) and the calls on it take the unregistered paths
    (acquire and copy; reserve, write and commit). Client.close() ends
    every registration at once."""

    def __init__(self, client, conn, buffer_id, size, m):
        self.id = buffer_id
        self.size = size
        self._client = client
        self._conn = conn
        self._map = m
        self.view = memoryview(m)
        # The mapping's address: get_into finds a buffer inside it by its own.
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(m))

    @property
    def closed(self):
        return self._map is None

    def close(self):
        """UNREGISTER (unless the connection is gone: then so is the
        registration), then unmap."""
        if self._map is None:
            return
        try:
            if self._conn.alive:
                self._client._unregister(self)
        except Error:
            if self._conn.alive:
                raise  # refused by the sidecar; a failed connection ended the registration itself
        finally:
            self._client._bufs.remove(self)
            self._unmap()

    def _unmap(self):
        m, self._map = self._map, None
        try:
            self.view.release()
            m.close()
        except BufferError:
            pass  # a view of it is still held: the mapping goes with the last one

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "RegisteredBuffer(id=%#x, size=%d%s)" % (self.id, self.size, ", closed" if self.closed else "")


# The head of a Get reply that found its block, in the binary protocol (what
# the sidecar sends): message header (strict version, REPLY; name "Get";
# seqid), the result's field 0 (struct), GetResponse's found (field 1, bool,
# true), then value's header (field 2, binary) and length; the value follows.
_GET_HEAD = 29
_GET_MSG = b"\x80\x01\x00\x02" + b"\x00\x00\x00\x03Get"


def _get_value_len(p):
    """The value's length when p is the head of a hit, else None."""
    if p[:11] != _GET_MSG or p[15:22] != b"\x0c\x00\x00\x02\x00\x01\x01" or p[22:25] != b"\x0b\x00\x02":
        return None
    return unpack("!i", p[25:29])[0]


def _check_get_tail(rest):
    """The rest of a hit's reply after its value: GetResponse's other fields
    and end, then the result's end; nothing may follow."""
    prot = TBinaryProtocol.TBinaryProtocol(TTransport.TMemoryBuffer(rest))
    try:
        for _ in range(2):  # GetResponse, then the result struct
            while True:
                _, ftype, _ = prot.readFieldBegin()
                if ftype == TType.STOP:
                    break
                prot.skip(ftype)
        extra = prot.trans.read(1)
    except Exception as e:  # EOF inside a field, a bad type
        raise TTransport.TTransportException(TTransport.TTransportException.UNKNOWN,
                                             "malformed Get reply: %s" % e) from None
    if extra:
        raise TTransport.TTransportException(TTransport.TTransportException.UNKNOWN,
                                             "malformed Get reply: bytes after its end")


_NO_ARENAS = object()  # _get_from_arena: not through the arenas this time


class Client:
    """A connection to the sidecar's Unix socket (binary protocol; framed
    transport by default, buffered with framed=False)."""

    def __init__(self, socket_path, framed=True, timeout=30.0, client_name="tidepool-py", lazy_release=True,
                 reserve_ahead=64, write_mode=WRITE_KEYED):
        sock = TSocket.TSocket(unix_socket=socket_path)
        sock.setTimeout(int(timeout * 1000))
        if framed:
            self._transport = FramedSocketTransport(sock)
        else:
            self._transport = TTransport.TBufferedTransport(sock)
        try:
            proto = TBinaryProtocol.TBinaryProtocolAccelerated(self._transport)
        except Exception:  # pragma: no cover - no fastbinary
            proto = TBinaryProtocol.TBinaryProtocol(self._transport)
        self._c = Tidepool.Client(proto)
        # Calls that carry block bytes encode them in pure Python: thrift's C
        # encoder (fastbinary) copies a binary field one byte at a time, about
        # 5 ms per MiB, while TBinaryProtocol writes it in one piece (~30 us).
        # Everything else, and every response, keeps the C codec, which is
        # faster for many small fields (a 256-key Lookup: ~11 us vs ~75 us).
        self._cw = Tidepool.Client(proto, TBinaryProtocol.TBinaryProtocol(self._transport))
        self._name = client_name
        self._arenas = None
        self._slots = None  # tidepool.slots.SlotIndex, or False: the sidecar has none
        self._hello = None  # the HelloResponse the arenas were mapped from
        # Lazy release (batch_get_into, get_into): the leases of a finished
        # copy are queued and ride on the next Acquire (release_lease_ids)
        # when the server lists FEATURE_ACQUIRE_RELEASE, instead of a
        # Release round trip of their own.
        self._lazy = lazy_release
        self._acq_release = False  # learnt from Hello in _map
        self._max_batch = 256  # learnt from Hello in _map
        self._pending = []  # lease ids queued for release
        # Whether this connection maps the arenas (get through them): None
        # until the first get finds out, then True or False.
        self._arena_ok = None
        # Slots reserved ahead (put_from, batch_put_from): each commit asks
        # for the slot of the next put of its namespace and size, so that a
        # put takes one round trip (commit) instead of two (reserve, commit)
        # when the server lists FEATURE_COMMIT_NEXT. At most reserve_ahead
        # are kept (0: none); close() aborts them.
        self._reserve_ahead = max(int(reserve_ahead), 0)
        self._commit_next = False  # learnt from Hello in _map
        self._spares = {}  # (ns, size) -> [Reservation]
        self._nspares = 0
        # How put_from, batch_put_from and write_slot write slots: through
        # a keyed mapping (pkey.py) where this machine has protection keys,
        # else (and with WRITE_PWRITE) with pwrite on the arena file.
        if write_mode not in (WRITE_KEYED, WRITE_PWRITE):
            raise ValueError("write_mode must be %r or %r, got %r" % (WRITE_KEYED, WRITE_PWRITE, write_mode))
        self._keyed = write_mode == WRITE_KEYED
        # The buffer socket (register_buffer): its path is the engine
        # socket's plus bufsock.SUFFIX, connected at the first registration
        # (and again after the connection failed), with the same timeout.
        self._socket_path = socket_path
        self._timeout = timeout
        self._bconn = None
        self._bufs = []  # RegisteredBuffers not closed, on any connection
        self._transport.open()
        _grow_send_buffer(sock)

    def close(self):
        """Releases the queued leases, ends the registered buffers (closes
        the buffer socket connection, which ends them on the sidecar, and
        unmaps them), unmaps the arenas and closes the connection. Views
        returned by slot_view must have been released first."""
        try:
            self.flush_releases()
        except Exception:  # the leases lapse at their deadlines anyway
            pass
        try:
            self._abort_spares()
        except Exception:  # reclaimed at their deadlines anyway
            pass
        if self._bconn is not None:
            self._bconn.close()
        for b in self._bufs:
            b._unmap()
        self._bufs = []
        self._unmap()
        self._transport.close()

    def flush_releases(self):
        """Sends the leases queued by lazy release now (one Release call).
        A client that goes idle after a read holds those blocks pinned until
        its next zero-copy read, this call, close(), or the leases' deadline
        (the server's lease_timeout, 5 s by default), whichever comes first."""
        if self._pending:
            ids, self._pending = self._pending, []
            self.release(ids)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, fn, req):
        try:
            return fn(req)
        except T.TidepoolError as e:
            raise Error(e.code, e.message) from None

    # ---- inline calls ------------------------------------------------------
    # (BlockMeta and _meta_fields are at the end of this module.)

    def hello(self):
        """HelloResponse: server version, limits, tiers, arenas."""
        return self._call(self._c.Hello, T.HelloRequest(client_version=CLIENT_VERSION, client_name=self._name))

    def put(self, ns, key, value, depth=0, meta=None):
        """Stores one block; returns True when the key existed (a no-op).
        meta (a BlockMeta: token ids, parent key, block size) describes the
        block for KV events (docs/events.md). The value goes over the
        socket (through the arenas, as put_from, one caller was slower:
        docs/PERFORMANCE.md section 29)."""
        return self._call(self._cw.Put, T.PutRequest(ns=ns, key=key, value=bytes(value), depth=depth,
                                                     **_meta_fields(meta))).existed

    def batch_put(self, ns, items):
        """items: (key, value), (key, value, depth) or (key, value, depth,
        meta). Returns one ErrorCode per item (OK, EXISTS, ...)."""
        req = T.BatchPutRequest(ns=ns, items=[
            T.PutItem(key=it[0], value=bytes(it[1]), depth=it[2] if len(it) > 2 else 0,
                      **_meta_fields(it[3] if len(it) > 3 else None)) for it in items])
        return _codes(self._call(self._cw.BatchPut, req).results)

    def _mapped(self):
        """Whether this connection maps the sidecar's arenas, found out
        (by mapping them) at the first get."""
        if self._arena_ok is None:
            try:
                self._map()
                self._arena_ok = True
            except Error:
                self._arena_ok = False
        return self._arena_ok

    def get(self, ns, key, scope=Scope.DEFAULT):
        """The block's bytes, or None on a miss.

        Where this client maps the sidecar's arenas and the server takes
        releases with Acquire (FEATURE_ACQUIRE_RELEASE), with lazy release
        on (the default), the bytes are copied out of the shared arena under
        a lease (one round trip and one copy, against two copies through
        the socket); the lease rides on the next Acquire as get_into's do
        (see flush_releases). Otherwise, or when the arenas cannot be
        mapped, they come over the socket."""
        if self._lazy and self._mapped() and self._acq_release:
            value = self._get_from_arena(ns, key, scope)
            if value is not _NO_ARENAS:
                return value
        return self._get_over_socket(ns, key, scope)

    def _get_over_socket(self, ns, key, scope):
        if not isinstance(self._transport, FramedSocketTransport):
            r = self._call(self._c.Get, T.GetRequest(ns=ns, key=key, scope=scope))
            return r.value if r.found else None
        # A hit's value is received straight into the bytes object returned
        # (the thrift decoder would copy it out of the frame once more);
        # any other answer is decoded as usual.
        self._c.send_Get(T.GetRequest(ns=ns, key=key, scope=scope))
        value, rest = self._transport.read_reply_value(_GET_HEAD, _get_value_len)
        if value is None:
            try:
                r = self._c.recv_Get()
            except T.TidepoolError as e:
                raise Error(e.code, e.message) from None
            return r.value if r.found else None
        _check_get_tail(rest)
        return value

    def _get_from_arena(self, ns, key, scope):
        """get through the arenas: the bytes, None on a miss, or
        _NO_ARENAS when the slot lies outside the arenas this client
        mapped (the sidecar changed them: get goes over the socket this
        time)."""
        pending, self._pending = self._pending or None, []
        r = self._call(self._c.Acquire, T.AcquireRequest(ns=ns, keys=[key], scope=scope, release_lease_ids=pending))
        if len(r.results) != 1:
            raise Error(ErrorCode.INTERNAL, "acquire answered %d items for 1" % len(r.results))
        (l,) = r.results
        if l.code == NOT_FOUND:
            return None
        if l.code != OK:
            raise Error(l.code, "get")
        try:
            a = self._arena(l.slot)
        except Error:
            self._pending.append(l.lease_id)
            self._remap_if_stale()
            return _NO_ARENAS
        s = l.slot
        try:
            value = bytes(a.view[s.offset:s.offset + s.length])
        except BaseException:
            self._pending.append(l.lease_id)
            raise
        if time.time() * 1000 + RELEASE_MARGIN_MS < r.deadline_unix_ms and len(self._pending) < self._max_batch:
            # Copied well before the deadline: the bytes were pinned
            # throughout, so the release needs no answer.
            self._pending.append(l.lease_id)
            return value
        if self.release([l.lease_id]) != [OK]:
            # The lease expired during the copy: the bytes may be another
            # block's. Once more over the socket.
            return self._get_over_socket(ns, key, scope)
        return value

    def batch_get(self, ns, keys, scope=Scope.DEFAULT):
        """One bytes or None (miss) per key; other per-item errors raise."""
        out = []
        for r in self._call(self._c.BatchGet, T.BatchGetRequest(ns=ns, keys=list(keys), scope=scope)).results:
            if r.code == OK:
                out.append(r.value)
            elif r.code == NOT_FOUND:
                out.append(None)
            else:
                raise Error(r.code, "batch get item")
        return out

    def exists(self, ns, key, scope=Scope.DEFAULT):
        r = self._call(self._c.Exists, T.ExistsRequest(ns=ns, key=key, scope=scope))
        return Presence(r.present, r.tier, r.node_id)

    def batch_exists(self, ns, keys, scope=Scope.DEFAULT):
        rs = self._call(self._c.BatchExists, T.BatchExistsRequest(ns=ns, keys=list(keys), scope=scope)).results
        return [Presence(r.present, r.tier, r.node_id) for r in rs]

    def lookup(self, ns, keys, scope=Scope.DEFAULT):
        """How many leading keys of a chain are present (the longest cached
        prefix, in blocks)."""
        return self._call(self._c.Lookup, T.LookupRequest(ns=ns, keys=list(keys), scope=scope)).matched

    def prefetch(self, ns, keys, scope=Scope.DEFAULT):
        return self._call(self._c.Prefetch, T.PrefetchRequest(ns=ns, keys=list(keys), scope=scope)).queued

    def delete(self, ns, key, scope=Scope.DEFAULT):
        """Delete one block. DEFAULT on a clustered node (CLUSTER): every
        live member deletes it; LOCAL: this sidecar only."""
        return self._call(self._c.Delete, T.DeleteRequest(ns=ns, key=key, scope=scope)).deleted

    def clear(self, ns, scope=Scope.DEFAULT):
        """Remove a namespace. DEFAULT on a clustered node (CLUSTER): every
        live member clears it; LOCAL: this sidecar only."""
        return self._call(self._c.Clear, T.ClearRequest(ns=ns, scope=scope)).removed

    def stats(self, ns=""):
        return self._call(self._c.Stats, T.StatsRequest(ns=ns))

    # ---- zero-copy primitives ----------------------------------------------

    def reserve(self, ns, items, ttl_ms=0, durable=False):
        """items: (key, size) or (key, size, depth). One Reservation per
        item; code OK means: write `size` bytes at `slot`, then commit
        `token` before `deadline_ms`. durable: the committed blocks are
        written through to the SSD tier before the commit is answered and
        survive a restart of the sidecar; they are still evicted like any
        block when the cache needs room."""
        req = T.ReserveRequest(ns=ns, ttl_ms=ttl_ms, durable=durable, items=[
            T.ReserveItem(key=it[0], size=it[1], depth=it[2] if len(it) > 2 else 0) for it in items])
        return [Reservation(r.code, r.message, _slot(r.slot), r.token, r.deadline_unix_ms)
                for r in self._call(self._c.Reserve, req).results]

    def commit(self, items):
        """items: token, (token, crc32c or None) or (token, crc32c or None,
        meta: a BlockMeta for KV events). One ErrorCode per item: OK, EXISTS
        (stored meanwhile; slot freed), LEASE_EXPIRED (unknown, used or
        expired token), CHECKSUM_MISMATCH."""
        req = T.CommitRequest(items=[])
        for it in items:
            token, crc, meta = (it, None, None) if isinstance(it, int) else (tuple(it) + (None,))[:3]
            req.items.append(T.CommitItem(token=token, has_checksum=crc is not None,
                                          checksum=to_i32(crc) if crc is not None else 0,
                                          **_meta_fields(meta)))
        return _codes(self._call(self._c.Commit, req).results)

    def abort(self, tokens):
        return _codes(self._call(self._c.Abort, T.AbortRequest(tokens=list(tokens))).results)

    def acquire(self, ns, keys, lease_ms=0, scope=Scope.DEFAULT, release=None):
        """Pins blocks; returns ([Lease], deadline_ms). Every OK lease MUST
        be released (or left to expire: then its bytes must not be read).

        release: lease ids to release first, in the same call (a server
        whose Hello lists FEATURE_ACQUIRE_RELEASE; an older one ignores
        them and they stay pinned until their deadline). No outcome is
        answered per id: release them this way only after checking the
        copies against their deadline."""
        r = self._call(self._c.Acquire, T.AcquireRequest(ns=ns, keys=list(keys), lease_ms=lease_ms, scope=scope,
                                                         release_lease_ids=list(release) if release else None))
        return [Lease(x.code, _slot(x.slot), x.lease_id, from_i32(x.checksum), x.tier) for x in r.results], \
            r.deadline_unix_ms

    def release(self, lease_ids):
        """One ErrorCode per id: OK, or LEASE_EXPIRED (not held, or released
        after its deadline: bytes read through it may be wrong)."""
        return _codes(self._call(self._c.Release, T.ReleaseRequest(lease_ids=list(lease_ids))).results)

    def renew(self, lease_ids, lease_ms=0):
        """Returns (codes, earliest new deadline_ms)."""
        r = self._call(self._c.Renew, T.RenewRequest(lease_ids=list(lease_ids), lease_ms=lease_ms))
        return _codes(r.results), r.deadline_unix_ms

    # ---- GPU end (servers whose Hello lists FEATURE_GPU; docs/gpu.md) --------
    # A registration belongs to this client's connection: it ends at
    # gpu_unregister, when the connection closes, or when the sidecar stops.

    def gpu_register(self, buffers, segments, num_blocks, header=b""):
        """Hands the sidecar KV-cache buffers as CUDA IPC memory handles.

        buffers: [(device, device_uuid or b"", ipc_handle (64 bytes), offset,
        size)]; segments: [(buffer, offset, stride, length)]: block slot s's
        piece of segment j is length bytes at offset + s*stride of its
        buffer; a block's value is header + its segments. Returns
        (registration_id, block_bytes)."""
        req = T.GpuRegisterRequest(
            buffers=[T.GpuBuffer(device=d, device_uuid=bytes(u or b""), ipc_handle=bytes(h), offset=o, size=n)
                     for d, u, h, o, n in buffers],
            segments=[T.GpuSegment(buffer=b, offset=o, stride=st, length=n) for b, o, st, n in segments],
            num_blocks=num_blocks, header=bytes(header))
        r = self._call(self._c.GpuRegister, req)
        return r.registration_id, r.block_bytes

    def gpu_unregister(self, registration_id):
        self._call(self._c.GpuUnregister, T.GpuUnregisterRequest(registration_id=registration_id))

    def gpu_save(self, registration_id, ns, blocks, durable=False):
        """blocks: [(slot, key, depth)]. One ErrorCode per block: OK, EXISTS,
        INTERNAL (the copy failed; nothing stored) or the item's error."""
        req = T.GpuCopyRequest(registration_id=registration_id, ns=ns, durable=durable,
                               blocks=[T.GpuBlock(slot=s, key=k, depth=d) for s, k, d in blocks])
        return _codes(self._call(self._c.GpuSave, req).results)

    def gpu_load(self, registration_id, ns, blocks, scope=Scope.DEFAULT):
        """blocks: [(slot, key)]. One ErrorCode per block: OK, NOT_FOUND,
        INTERNAL (the copy failed: the slot's bytes are undefined) or the
        item's error."""
        req = T.GpuCopyRequest(registration_id=registration_id, ns=ns, scope=scope,
                               blocks=[T.GpuBlock(slot=s, key=k) for s, k in blocks])
        return _codes(self._call(self._c.GpuLoad, req).results)

    # ---- arenas ------------------------------------------------------------

    def _map(self, remap=False):
        if self._arenas is not None and not remap:
            return self._arenas
        h = self.hello()
        if not h.arenas:
            raise Error(ErrorCode.UNAVAILABLE, "the server offers no shared arenas")
        if h.layout_version != ARENA_LAYOUT_VERSION:
            raise Error(ErrorCode.UNAVAILABLE, "arena layout version %d, this client knows %d"
                        % (h.layout_version, ARENA_LAYOUT_VERSION))
        self._hello = h
        self._acq_release = FEATURE_ACQUIRE_RELEASE in (h.features or ())
        self._commit_next = FEATURE_COMMIT_NEXT in (h.features or ())
        if remap:
            self._abort_spares()  # reserved in the arenas being replaced
        if h.limits is not None and h.limits.max_batch > 0:
            self._max_batch = h.limits.max_batch
        arenas = []
        try:
            for i, a in enumerate(h.arenas):
                if a.id != i:
                    raise Error(ErrorCode.UNAVAILABLE, "malformed arena list")
                arenas.append(_Arena(a.path, a.size))
        except OSError as e:
            for a in arenas:
                a.close()
            raise Error(ErrorCode.UNAVAILABLE,
                        "cannot map %s (is the arena directory shared with this container?)" % e) from None
        self._unmap()
        self._arenas = arenas
        return arenas

    def server_info(self):
        """The HelloResponse this client mapped its arenas from (limits,
        tiers, features), asking for it first if it has not yet."""
        self._map()
        return self._hello

    def arena_views(self):
        """Read-only memoryviews of the shared arenas, by arena id, for
        readers that copy many leased blocks at once (tidepool.vllm views
        them as tensors). A slot's bytes are valid while its lease is held;
        the views go with close()."""
        return [a.view for a in self._map()]

    def slot_index(self):
        """The sidecar's slot index (tidepool.slots.SlotIndex): where each
        block of its DRAM tier lies, to copy it out of arena_views() without
        a call and check after the copy that it did not change. None when
        the sidecar keeps none, or this machine cannot read it safely
        (docs/zerocopy.md, "Reads without a call"). Goes with the arenas."""
        arenas = self._map()
        if self._slots is None:
            self._slots = _slots.open_index([a.path for a in arenas], self._hello.features) or False
        elif self._slots is not False and self._slots.stale() and self._remap_if_stale():
            return self.slot_index()
        return self._slots or None

    def populate_reads(self, arena, offsets, length):
        """Optional: fills this process's page tables for the arena pages
        under [off, off + length) for each off in offsets, 2 MiB at a time
        and each 2 MiB once per client (MADV_POPULATE_READ, Linux >= 5.14),
        so that a copy out of those slots takes no page fault per 4 KiB.
        Best effort: an older kernel leaves them to fault as they are read."""
        a = self._map()[arena]
        if a.populated is None:
            return
        end = a.size
        for off in offsets:
            first, last = off // _POPULATE_CHUNK, (min(off + length, end) - 1) // _POPULATE_CHUNK
            for r in range(first, last + 1):
                if r in a.populated:
                    continue
                a.populated.add(r)
                start = r * _POPULATE_CHUNK
                try:
                    a.map.madvise(_MADV_POPULATE_READ, start, min(_POPULATE_CHUNK, end - start))
                except (OSError, ValueError):
                    a.populated = None  # not on this kernel: stop trying
                    return

    def _unmap(self):
        if self._arenas:
            for a in self._arenas:
                a.close()
        self._arenas = None
        if self._slots:
            self._slots.close()
        self._slots = None

    def _remap_if_stale(self):
        if self._arenas and any(a.stale() for a in self._arenas):
            self._map(remap=True)
            return True
        return False

    def _arena(self, slot):
        arenas = self._map()
        if not 0 <= slot.arena < len(arenas) or slot.offset < 0 or slot.length < 0 \
                or slot.offset + slot.length > arenas[slot.arena].size:
            raise Error(ErrorCode.INTERNAL, "slot %r outside the arenas" % (slot,))
        return arenas[slot.arena]

    def slot_view(self, slot, verify=None):
        """Read-only memoryview of a leased block, without a copy. Valid
        while the lease is held; release() the view before close().

        Given the Lease (from acquire) and verify=True, the view is checked
        against the block's CRC-32C before it is returned and a mismatch
        raises Error(CHECKSUM_MISMATCH). By default (verify None or False)
        it is not: the sidecar checked the bytes where they entered (put,
        commit, a peer transfer, an SSD read), the arenas are mapped
        read-only here, and its scrubber re-checks resident blocks; a
        sidecar with verify_reads (or this namespace in
        verify_reads_namespaces) refuses a damaged block in acquire itself
        (docs/security.md, "Integrity"). Given a bare Slot there is no
        checksum to check: the bytes are returned unchecked."""
        lease = slot if isinstance(slot, Lease) else None
        if lease is not None:
            slot = lease.slot
        a = self._arena(slot)
        view = a.view[slot.offset:slot.offset + slot.length]
        if lease is not None and verify:
            if crc32c(view) != lease.checksum:
                view.release()
                raise Error(ErrorCode.CHECKSUM_MISMATCH, "leased block %d fails its CRC-32C" % lease.lease_id)
        return view

    def write_slot(self, slot, data):
        """Writes data (exactly slot.length bytes) into a reserved slot:
        through the arena's keyed mapping (see write_mode), else with pwrite
        on the arena file. data is a C-contiguous buffer, or a list of them
        written one after the other (a block assembled from parts, with no
        copy to join them)."""
        self.write_slots([(slot, data)])

    def write_slots(self, items):
        """write_slot for many slots in one go: items are (slot, data), data
        as write_slot takes it. Every size is checked before any byte is
        written; the writes then go through one keyed access window (or
        pwritev runs), as batch_put_from's."""
        writes = []
        for slot, data in items:
            a = self._arena(slot)
            parts = [memoryview(d).cast("B") for d in (data if isinstance(data, (list, tuple)) else [data])]
            n = sum(len(p) for p in parts)
            if n != slot.length:
                raise Error(ErrorCode.INVALID_ARGUMENT, "slot of %d bytes, %d to write" % (slot.length, n))
            off = slot.offset
            for p in parts:
                writes.append((a, off, p))
                off += len(p)
        self._write_slots(writes)

    def prepare_writes(self):
        """Optional, once at start (an engine's, say): maps the arenas and,
        with keyed writes, fills the page tables of their keyed mappings now
        (MADV_POPULATE_WRITE, Linux >= 5.14) rather than 2 MiB at a time at
        this process's first write there, which slows its first pass over
        the arenas. The pages are the sidecar's, already in memory; this
        costs this process's page tables (2 MiB per GiB of arena) and about
        a quarter of a second per GiB. Returns True when every keyed mapping
        was populated, False with pwrite writes or an older kernel."""
        arenas = self._map()
        if not self._keyed:
            return False
        done = True
        for a in arenas:
            try:
                m = a.keyed_map()
            except (_pkey.Unsupported, OSError):
                self._keyed = False
                return False
            done = m.populate() and done
        return done

    def _write_slots(self, writes):
        """writes: (arena, offset, bytes). Through the arenas' keyed mappings
        in one access window when keyed writes are on and work here (from a
        first failure on, not for this client); else with pwrite, slots that
        follow one another in an arena in one pwritev."""
        if self._keyed:
            try:
                maps = [(a.keyed_map(), off, b) for a, off, b in writes]
            except (_pkey.Unsupported, OSError):
                self._keyed = False
            else:
                _pkey.write_all(maps)
                return
        run_fd, run_off, run_end, run = None, 0, 0, []
        for a, off, b in writes:
            if a.fd == run_fd and off == run_end:
                run.append(b)
                run_end += len(b)
                continue
            if run:
                _pwritev_all(run_fd, run, run_off)
            run_fd, run_off, run_end, run = a.fd, off, off + len(b), [b]
        if run:
            _pwritev_all(run_fd, run, run_off)

    @contextlib.contextmanager
    def writable_slot(self, slot):
        """Context manager yielding a writable memoryview of a reserved slot
        (a MAP_SHARED mapping of just its pages), for writing in place, for
        example torch.frombuffer(view, dtype=torch.uint8).copy_(gpu_tensor).
        Commit after the block."""
        a = self._arena(slot)
        start = slot.offset - slot.offset % mmap.ALLOCATIONGRANULARITY
        length = slot.offset + slot.length - start
        if slot.length == 0:
            yield memoryview(bytearray())
            return
        m = mmap.mmap(a.fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
        try:
            # Fault the slot's pages in writable in one call (Linux >= 5.14)
            # rather than one write fault per 4 KiB page: a 1 MiB slot's
            # reserve + write + commit took 0.80-0.89 ms instead of 1.09-1.22.
            m.madvise(_pkey.MADV_POPULATE_WRITE)
        except (OSError, AttributeError):  # an older kernel: faults as the writer goes
            pass
        mv = memoryview(m)
        try:
            view = mv[slot.offset - start:]
            try:
                yield view
            finally:
                view.release()
        finally:
            mv.release()
            m.close()

    # ---- registered buffers (the buffer socket) ---------------------------

    def register_buffer(self, size):
        """Registers size bytes of new shared memory with the sidecar and
        returns them as a RegisteredBuffer; get_into into (a slice of) its
        view then has the sidecar write the block there itself.

        The memory is a memfd sealed against shrinking and growing, mapped
        here and by the sidecar, its pages allocated at once (the sidecar
        refuses a file with holes; OSError when memory is short). The
        registration lives on this client's buffer socket connection (one,
        opened here at the first call): close() on the buffer or on the
        client ends it. If that connection fails (the sidecar restarted, a
        timeout), the call on it raises Error(UNAVAILABLE) and all its
        registrations are gone: get_into into such a buffer raises
        Error(UNAVAILABLE) without asking the sidecar; close it and
        register again (the next register_buffer opens a new connection).
        Error(UNAVAILABLE) too when the sidecar does not offer the buffer
        socket (FEATURE_BUFFER_SOCKET)."""
        size = int(size)
        if size <= 0:
            raise Error(ErrorCode.INVALID_ARGUMENT, "a buffer of %d bytes" % size)
        conn = self._buffer_conn()
        fd = _bufsock.sealed_memfd(size)
        # The descriptor is closed once the sidecar has answered: this
        # process's mapping keeps the memfd, the sidecar maps its own copy.
        try:
            m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            try:
                code, message, _, buffer_id, _ = self._bcall(conn, _bufsock.REGISTER,
                                                             _bufsock.register_body(size), [fd])
                if code != OK:
                    raise Error(code, message)
            except BaseException:
                m.close()
                raise
        finally:
            os.close(fd)
        b = RegisteredBuffer(self, conn, buffer_id, size, m)
        self._bufs.append(b)
        return b

    def _buffer_conn(self):
        if self._bconn is not None and self._bconn.alive:
            return self._bconn
        if FEATURE_BUFFER_SOCKET not in (self.hello().features or ()):
            raise Error(ErrorCode.UNAVAILABLE, "the server offers no buffer socket")
        path = self._socket_path + _bufsock.SUFFIX
        try:
            self._bconn = _bufsock.Conn(path, self._timeout)
        except OSError as e:
            raise Error(ErrorCode.UNAVAILABLE, "cannot connect to the buffer socket %s: %s" % (path, e)) from None
        return self._bconn

    def _bcall(self, conn, op, body, fds=()):
        try:
            return conn.call(op, body, fds)
        except _bufsock.Closed as e:
            raise Error(ErrorCode.UNAVAILABLE, "buffer socket failed (%s); its buffers must be registered again"
                        % e) from None

    def _unregister(self, b):
        code, message, _, _, _ = self._bcall(b._conn, _bufsock.UNREGISTER, _bufsock.unregister_body(b.id))
        if code != OK:
            raise Error(code, message)

    def _registered(self, buf):
        """(RegisteredBuffer, offset, byte view of buf) when buf (not empty,
        writable) lies entirely inside one of this client's registered
        buffers, else None."""
        try:
            mv = memoryview(buf).cast("B")
        except TypeError:  # not a buffer, not contiguous: the old path says so
            return None
        if mv.readonly or not len(mv):
            return None
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mv))
        for b in self._bufs:
            if b._base <= addr and addr + len(mv) <= b._base + b.size:
                return b, addr - b._base, mv
        return None

    def _registered_in_one(self, bufs):
        """(RegisteredBuffer, [(offset, byte view)] per buffer) when bufs is
        not empty and every buffer of it lies inside the same registered
        buffer of this client (as _registered says), else None: a batch
        goes over the buffer socket as one call on one buffer id, or not
        at all."""
        if not self._bufs or not bufs:
            return None
        b, spans = None, []
        for buf in bufs:
            found = self._registered(buf)
            if found is None or (b is not None and found[0] is not b):
                return None
            b = found[0]
            spans.append(found[1:])
        return b, spans

    def _live(self, b):
        """b's connection; Error(UNAVAILABLE) without asking anything when
        it failed, for with it went the registration."""
        if not b._conn.alive:
            raise Error(ErrorCode.UNAVAILABLE, "buffer %#x was registered on a buffer socket connection that failed; "
                        "close it and re-register" % b.id)
        return b._conn

    def _get_registered(self, ns, key, b, offset, buf, verify, scope):
        conn = self._live(b)
        try:
            body = _bufsock.get_body(b.id, offset, len(buf), scope, ns, key)
        except ValueError as e:
            raise Error(ErrorCode.INVALID_ARGUMENT, str(e)) from None
        code, message, checksum, n, _ = self._bcall(conn, _bufsock.GET, body)
        if code == NOT_FOUND:
            return None
        if code != OK:
            raise Error(code, message)
        if n > len(buf):
            raise Error(ErrorCode.INTERNAL, "the sidecar answered %d bytes for a buffer of %d" % (n, len(buf)))
        if verify and crc32c(buf[:n]) != checksum:
            raise Error(ErrorCode.CHECKSUM_MISMATCH, "block written into buffer %#x" % b.id)
        return n

    def _put_registered(self, ns, key, b, offset, buf, depth, verify):
        conn = self._live(b)
        try:
            body = _bufsock.put_body(b.id, offset, len(buf), depth, ns, key, crc32c(buf) if verify else None)
        except ValueError as e:
            raise Error(ErrorCode.INVALID_ARGUMENT, str(e)) from None
        code, message, _, existed, _ = self._bcall(conn, _bufsock.PUT, body)
        if code != OK:
            raise Error(code, message)
        return bool(existed)

    def _batch_registered(self, b, op, body, n):
        """The n items (code, checksum, value) answered to a BATCH_GET or
        BATCH_PUT on b. A refusal of the whole batch (BATCH_TOO_LARGE over
        max_batch, ...) raises, as Acquire and Reserve do on the engine
        socket."""
        code, message, _, _, items = self._bcall(self._live(b), op, body)
        if code != OK:
            raise Error(code, message)
        if len(items) != n:
            raise Error(ErrorCode.INTERNAL, "the sidecar answered %d items for %d" % (len(items), n))
        return items

    def _batch_get_registered(self, b, body, spans, verify):
        out, err = [None] * len(spans), None
        for i, ((code, checksum, n), (_, dst)) in enumerate(
                zip(self._batch_registered(b, _bufsock.BATCH_GET, body, len(spans)), spans)):
            if code == NOT_FOUND:
                continue
            if code != OK:
                err = err or Error(code, "key %d of the batch" % i)
                continue
            if n > len(dst):
                raise Error(ErrorCode.INTERNAL, "the sidecar answered %d bytes for a buffer of %d" % (n, len(dst)))
            if verify and crc32c(dst[:n]) != checksum:
                err = err or Error(ErrorCode.CHECKSUM_MISMATCH, "block %d written into buffer %#x" % (i, b.id))
                continue
            out[i] = n
        if err is not None:
            raise err
        return out

    # ---- zero-copy helpers (same semantics as put/get) ---------------------

    def _take_spare(self, ns, size):
        lst = self._spares.get((ns, size))
        now = time.time() * 1000
        while lst:
            r = lst.pop()
            self._nspares -= 1
            if r.deadline_unix_ms - now > SPARE_MARGIN_MS:
                return r
            # too close to its deadline: dropped (the server reclaims it)
        return None

    def _keep_spares(self, ns, sizes, nexts):
        """Keeps the unbound reservations a commit answered; aborts those
        over reserve_ahead."""
        extra = []
        for size, r in zip(sizes, nexts or ()):
            if r is None or r.code != OK or not r.token:
                continue
            if self._nspares >= self._reserve_ahead:
                extra.append(r.token)
                continue
            self._spares.setdefault((ns, size), []).append(r)
            self._nspares += 1
        if extra:
            self.abort(extra)

    def _abort_spares(self):
        tokens = [r.token for lst in self._spares.values() for r in lst]
        self._spares, self._nspares = {}, 0
        if tokens:
            self.abort(tokens)

    def batch_put_from(self, ns, items, verify=None, ttl_ms=0):
        """items: (key, buffer) or (key, buffer, depth). Reserve all, write
        each slot in place, commit all: two round trips per batch, no block
        bytes on the socket; one (the commit) for items that find a slot
        reserved ahead of their namespace and size (see reserve_ahead).
        Returns one ErrorCode per item (OK, EXISTS, or the item's error).
        verify (default: when a fast CRC-32C is installed) sends the
        client's checksum for the server to check; else the server computes
        it from the arena. Slots are written through the arenas' keyed
        mappings (write_mode); without protection keys, slots that follow
        one another in an arena (as a batch's usually do) are written with
        one pwritev.

        When every buffer lies inside one RegisteredBuffer of this client
        (not empty, writable: slices of its view), the sidecar copies the
        values out of it itself over the buffer socket (BATCH_PUT): one
        round trip, nothing written by this client; ttl_ms (how long a slot
        stays reserved) does not apply, the sidecar holding each slot only
        while it copies. It checksums each value as it copies, from this
        process's own memory: nothing crosses a wire or an arena on the
        way, so by default no CRC-32C is computed here; verify=True still
        sends each item's for the sidecar to check (CHECKSUM_MISMATCH for
        that item, nothing stored). A batch over max_batch raises
        Error(BATCH_TOO_LARGE) as through the arenas. Buffers in different
        registered buffers, or some not registered, or a batch longer than
        the buffer socket's request limit (1 MiB of keys) take the path
        above."""
        items = list(items)
        found = self._registered_in_one([it[1] for it in items])
        if found is not None:
            b, spans = found
            try:
                body = _bufsock.batch_put_body(b.id, ns, [
                    (off, len(buf), it[2] if len(it) > 2 else 0, crc32c(buf) if verify else None, it[0])
                    for it, (off, buf) in zip(items, spans)])
            except ValueError:
                pass  # too long for the buffer socket: through the arenas
            else:
                # An existing key is answered OK with value 1: EXISTS here,
                # as Reserve and Commit say it.
                return [EXISTS if code == OK and existed else code
                        for code, _, existed in self._batch_registered(b, _bufsock.BATCH_PUT, body, len(items))]
        return self._batch_put_from(ns, items, verify, ttl_ms, True)

    def _batch_put_from(self, ns, items, verify, ttl_ms, use_spares):
        if verify is None:
            verify = CRC_FAST
        bufs = [memoryview(it[1]).cast("B") for it in items]
        arenas = self._map()
        ahead = self._commit_next and self._reserve_ahead > 0 and ttl_ms == 0
        spares = [self._take_spare(ns, len(b)) if ahead and use_spares else None for b in bufs]
        need = [i for i, sp in enumerate(spares) if sp is None]
        rs = list(spares)
        if need:
            req = T.ReserveRequest(ns=ns, ttl_ms=ttl_ms, durable=False, items=[
                T.ReserveItem(key=items[i][0], size=len(bufs[i]), depth=items[i][2] if len(items[i]) > 2 else 0)
                for i in need])
            for i, r in zip(need, self._call(self._c.Reserve, req).results):
                rs[i] = r
        codes = [r.code for r in rs]
        commits, where, writes = [], [], []
        try:
            for i, (r, b) in enumerate(zip(rs, bufs)):
                if r.code != OK:
                    continue
                s, n = r.slot, len(b)
                if s is None or not 0 <= s.arena < len(arenas) or s.offset < 0 or s.length != n \
                        or s.offset + n > arenas[s.arena].size:
                    raise Error(ErrorCode.INTERNAL, "slot %r for %d bytes outside the arenas" % (_slot(s), n))
                writes.append((arenas[s.arena], s.offset, b))
                c = T.CommitItem(token=r.token, has_checksum=bool(verify),
                                 checksum=to_i32(crc32c(b)) if verify else 0, next_size=n if ahead else 0)
                if spares[i] is not None:
                    c.key, c.depth = items[i][0], items[i][2] if len(items[i]) > 2 else 0
                commits.append(c)
                where.append(i)
            self._write_slots(writes)
        except BaseException:
            self.abort([r.token for r in rs if r.code == OK])
            raise
        if not commits:
            return codes
        resp = self._call(self._c.Commit, T.CommitRequest(items=commits))
        lost = []
        for i, r in zip(where, resp.results):
            codes[i] = r.code
            if r.code == ErrorCode.LEASE_EXPIRED and spares[i] is not None:
                lost.append(i)  # the slot reserved ahead was gone
        if ahead:
            self._keep_spares(ns, [len(bufs[i]) for i in where], resp.next)
        if lost:
            # The sidecar restarted, or the slots outlived their deadline:
            # put those again through a reserve, once.
            self._abort_spares()
            for i, code in zip(lost, self._batch_put_from(ns, [items[i] for i in lost], verify, ttl_ms, False)):
                codes[i] = code
        return codes

    def put_from(self, ns, key, buf, depth=0, verify=None):
        """Zero-copy put; returns True when the key existed (as put).

        When buf lies entirely inside a RegisteredBuffer of this client, the
        sidecar copies the value out of it itself over the buffer socket
        (PUT): one round trip, no reserve, write or commit by this client,
        and by default no CRC-32C computed here (verify=True sends it for
        the sidecar to check: see batch_put_from). A buffer whose buffer
        socket connection failed raises Error(UNAVAILABLE) (re-register;
        see register_buffer). Any other buffer: batch_put_from of one item
        through the arenas."""
        if self._bufs:
            found = self._registered(buf)
            if found is not None:
                return self._put_registered(ns, key, *found, depth, verify)
        (code,) = self.batch_put_from(ns, [(key, buf, depth)], verify=verify)
        if code == EXISTS:
            return True
        if code != OK:
            raise Error(code, "put_from")
        return False

    def batch_get_into(self, ns, keys, buffers, verify=None, scope=Scope.DEFAULT):
        """Copies each block into its buffer (any writable buffer) straight
        from the shared arena: acquire all, copy, release all, two round
        trips per batch. Returns, per key, the block's size or None on a
        miss. A buffer too short raises Error(TOO_LARGE) after every lease
        is released. With verify=True each copy is checked against the
        block's CRC-32C (with no C CRC-32C module installed the check runs
        in pure Python, slowly): a mismatch raises Error(CHECKSUM_MISMATCH)
        after every lease is released. By default (verify None or False) it
        is not, as slot_view says; a sidecar with verify_reads checks in
        acquire for every client.

        When every buffer lies inside one RegisteredBuffer of this client,
        the sidecar writes the blocks there itself over the buffer socket
        (BATCH_GET): one round trip, no lease, no copy by this client. The
        answers are the same: a miss is None, a buffer too short raises
        Error(TOO_LARGE) (as does any other error of a key: the first, once
        every key was read), verify=True checks each buffer against its
        block's CRC-32C after the write. Buffers in different registered
        buffers, or some not registered, or a batch longer than the buffer
        socket's request limit take the arena path."""
        if verify is None:
            verify = False
        keys = list(keys)
        if len(buffers) != len(keys):
            raise ValueError("one buffer per key")
        found = self._registered_in_one(buffers)
        if found is not None:
            b, spans = found
            try:
                body = _bufsock.batch_get_body(b.id, scope, ns,
                                               [(off, len(buf), k) for k, (off, buf) in zip(keys, spans)])
            except ValueError:
                pass  # too long for the buffer socket: through the arenas
            else:
                return self._batch_get_registered(b, body, spans, verify)
        arenas = self._map()
        # Queued leases ride along (never more than max_batch: see below).
        pending, self._pending = self._pending or None, []
        r = self._call(self._c.Acquire, T.AcquireRequest(ns=ns, keys=keys, scope=scope, release_lease_ids=pending))
        leases = r.results
        out, err = [None] * len(keys), None
        held = [l.lease_id for l in leases if l.code == OK]
        done = False
        try:
            for i, (l, buf) in enumerate(zip(leases, buffers)):
                code = l.code
                if code == NOT_FOUND:
                    continue
                if code != OK:
                    err = err or Error(code, "acquire of key %d" % i)
                    continue
                s = l.slot
                dst = memoryview(buf).cast("B")
                n = s.length
                if n > len(dst):
                    err = err or Error(ErrorCode.TOO_LARGE, "block %d is %d bytes, buffer %d" % (i, n, len(dst)))
                    continue
                if not 0 <= s.arena < len(arenas) or s.offset < 0 or n < 0 \
                        or s.offset + n > arenas[s.arena].size:
                    raise Error(ErrorCode.INTERNAL, "slot %r outside the arenas" % (_slot(s),))
                dst[:n] = arenas[s.arena].view[s.offset:s.offset + n]
                if verify and crc32c(dst[:n]) != from_i32(l.checksum):
                    err = err or Error(ErrorCode.CHECKSUM_MISMATCH, "block %d" % i)
                    continue
                out[i] = n
            done = True
        finally:
            rel = []
            if held:
                if (done and self._lazy and self._acq_release and err is None
                        and time.time() * 1000 + RELEASE_MARGIN_MS < r.deadline_unix_ms
                        and len(self._pending) + len(held) <= self._max_batch):
                    # Copied well before the deadline: the bytes were pinned
                    # throughout, so the release needs no answer.
                    self._pending.extend(held)
                else:
                    rel = self.release(held)
        if any(c != OK for c in rel):
            raise Error(ErrorCode.LEASE_EXPIRED, "a lease expired during the copy; retry")
        if err is not None:
            if err.code == ErrorCode.CHECKSUM_MISMATCH and self._remap_if_stale():
                return self.batch_get_into(ns, keys, buffers, verify, scope)
            raise err
        return out

    def get_into(self, ns, key, buf, verify=None, scope=Scope.DEFAULT):
        """Zero-copy get into buf; returns the size, or None on a miss
        (nothing written). A block longer than buf raises Error(TOO_LARGE);
        verify as batch_get_into.

        When buf lies entirely inside a RegisteredBuffer of this client (a
        slice of its view, or the view itself), the sidecar writes the block
        there itself over the buffer socket: one round trip, no lease, no
        copy by this client. verify=True then checks buf against the
        block's CRC-32C after the write. A buffer whose buffer socket
        connection failed raises Error(UNAVAILABLE) (re-register; see
        register_buffer). Any other buffer: acquire, copy out of the arena,
        release (batch_get_into of one key)."""
        if self._bufs:
            found = self._registered(buf)
            if found is not None:
                return self._get_registered(ns, key, *found, verify, scope)
        return self.batch_get_into(ns, [key], [buf], verify=verify, scope=scope)[0]


class BlockMeta(collections.namedtuple("BlockMeta", "token_ids parent_key block_size")):
    """What a router needs to index a block (docs/events.md): the block's
    token ids (exactly block_size of them, or empty), the key of the block
    before it in its chain (None for the first) and the engine's block size
    in tokens. Passed with put, batch_put and commit."""


def _meta_fields(meta):
    if meta is None:
        return {}
    return {"token_ids": [int(t) for t in meta.token_ids] if meta.token_ids else None,
            "parent_key": bytes(meta.parent_key) if meta.parent_key else None,
            "block_size": int(meta.block_size) if meta.block_size else None}
