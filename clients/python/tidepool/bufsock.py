"""The buffer socket's wire protocol, client side (Client.register_buffer,
get_into, put_from, batch_put_from and batch_get_into use it; the server
is proxy/engineapi/bufsock.go).

A third Unix socket beside the engine socket, at its path plus SUFFIX: a
client registers shared memory of its own (a sealed memfd) once; a GET then
has the sidecar write the block straight into it, a PUT has it copy the
value out of it (checksumming as it copies), and the batches do either for
many keys in one call. Registrations belong to the connection that made
them and end when it closes. One call at a time (request, then answer);
all integers big-endian.

Request: u8 op, u8 version, u16 zero, u32 body length, then the body.
Answer: u16 code, u16 message length, u32 checksum (GET OK only), u64 value,
then the message (UTF-8); for a batch whose code is OK, value is the item
count and that many items follow the message: u16 code, u32 checksum
(BATCH_GET OK items), u64 value (BATCH_GET: the size; BATCH_PUT: 1 when the
key existed).
"""

import fcntl
import os
import socket
import struct

from .transport import _kernel_timeouts

SUFFIX = ".buf"

REGISTER = 1
GET = 2
UNREGISTER = 3
PUT = 4
BATCH_GET = 5
BATCH_PUT = 6
VERSION = 1
# The longest body the server reads; a longer one closes the connection.
MAX_BODY = 1 << 20
# PUT flags (BATCH_PUT's flags take DURABLE only; each item says whether it
# carries a checksum). Any other bit is malformed: the server closes the
# connection.
DURABLE = 1 << 0
CHECKSUM = 1 << 1
# A string's and a batch's count field are u16.
_MAX_U16 = 0xFFFF
# The longest message the server writes in an answer; a longer one means
# the stream is out of step (the Go client refuses it too).
MAX_MESSAGE = 1024

_REQ = struct.Struct(">BBHI")
_ANS = struct.Struct(">HHIQ")
_ITEM = struct.Struct(">HIQ")
_GET = struct.Struct(">QQQB")
_PUT = struct.Struct(">QQQiBiI")
_BATCH_GET = struct.Struct(">QB")
_BATCH_GET_ITEM = struct.Struct(">QQ")
_BATCH_PUT = struct.Struct(">QBi")
_BATCH_PUT_ITEM = struct.Struct(">QQiBI")

# Linux's values, for a Python whose fcntl lacks the names.
F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
F_SEAL_SEAL = getattr(fcntl, "F_SEAL_SEAL", 1)
F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 2)
F_SEAL_GROW = getattr(fcntl, "F_SEAL_GROW", 4)


class Closed(Exception):
    """The connection failed (closed, reset, timed out, cut mid-answer):
    it is closed, and every registration made on it is gone."""


def sealed_memfd(size, name="tidepool-buf"):
    """A memfd of size bytes, all allocated, that can neither shrink nor
    grow, nor have its seals changed. The sidecar maps it and writes into
    it: a file that shrank under that mapping, or a hole the kernel could
    not fill (memory short), would fault the sidecar, which refuses a file
    without F_SEAL_SHRINK or with holes. So the pages are allocated here,
    at once (OSError ENOSPC/ENOMEM when they cannot be), and stay this
    process's memory until the buffer is closed."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
        fcntl.fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def register_body(size):
    return struct.pack(">Q", size)


def unregister_body(buffer_id):
    return struct.pack(">Q", buffer_id)


def _str16(what, s):
    """s (str: UTF-8; else bytes) with its u16 length before it, as parts
    to join. ValueError when it is longer than a u16 says."""
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    if len(b) > _MAX_U16:
        raise ValueError("%s of %d bytes: the buffer socket takes at most %d" % (what, len(b), _MAX_U16))
    return [struct.pack(">H", len(b)), b]


def _body(parts):
    """The body joined from parts. ValueError when it exceeds MAX_BODY (the
    server would close the connection)."""
    body = b"".join(parts)
    if len(body) > MAX_BODY:
        raise ValueError("a request of %d bytes: the buffer socket takes at most %d" % (len(body), MAX_BODY))
    return body


def _count(n):
    if n > _MAX_U16:
        raise ValueError("%d items: the buffer socket takes at most %d per call" % (n, _MAX_U16))
    return [struct.pack(">H", n)]


def get_body(buffer_id, offset, length, scope, ns, key):
    """ns: str (UTF-8 on the wire), key: bytes. ValueError when ns or key
    does not fit its u16 length."""
    return _body([_GET.pack(buffer_id, offset, length, scope)] + _str16("namespace", ns) + _str16("key", key))


def put_body(buffer_id, offset, length, depth, ns, key, checksum=None, durable=False, sync_replicas=0):
    """The value is buffer[offset:offset+length]. checksum: its CRC-32C for
    the sidecar to check as it copies (flag CHECKSUM), or None. ValueError
    as get_body."""
    flags = (DURABLE if durable else 0) | (CHECKSUM if checksum is not None else 0)
    head = _PUT.pack(buffer_id, offset, length, depth, flags, sync_replicas, checksum or 0)
    return _body([head] + _str16("namespace", ns) + _str16("key", key))


def batch_get_body(buffer_id, scope, ns, items):
    """items: (offset, length, key), each block read into
    buffer[offset:offset+length]. ValueError when the body would exceed
    MAX_BODY (or a count or length its u16)."""
    parts = [_BATCH_GET.pack(buffer_id, scope)] + _str16("namespace", ns) + _count(len(items))
    for offset, length, key in items:
        parts.append(_BATCH_GET_ITEM.pack(offset, length))
        parts += _str16("key", key)
    return _body(parts)


def batch_put_body(buffer_id, ns, items, durable=False, sync_replicas=0):
    """items: (offset, length, depth, checksum or None, key), each value
    buffer[offset:offset+length]. ValueError as batch_get_body."""
    parts = [_BATCH_PUT.pack(buffer_id, DURABLE if durable else 0, sync_replicas)] + _str16("namespace", ns) \
        + _count(len(items))
    for offset, length, depth, checksum, key in items:
        parts.append(_BATCH_PUT_ITEM.pack(offset, length, depth, checksum is not None, checksum or 0))
        parts += _str16("key", key)
    return _body(parts)


class Conn:
    """One connection to the buffer socket. Not thread-safe (one call at a
    time is the protocol anyway)."""

    def __init__(self, path, timeout):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.settimeout(timeout)
            self.sock.connect(path)
            # A blocking socket with the timeout in the kernel: a Python
            # timeout makes the socket non-blocking underneath, and every
            # recv a poll and a recv (about 30 us more per call here).
            self._waitall = socket.MSG_WAITALL if _kernel_timeouts(self.sock) else 0
        except BaseException:
            self.sock.close()
            raise

    @property
    def alive(self):
        return self.sock is not None

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def call(self, op, body, fds=()):
        """Sends one request (fds ride with its first byte) and returns the
        answer: (code, message, checksum, value, items). items: for a
        BATCH_GET or BATCH_PUT answered OK, the value items that followed
        the message, each (code, checksum, value); else None. Any failure
        of the connection closes it and raises Closed: a request half sent
        or an answer half read leaves the stream out of step, and so does
        an item count no request can have asked for (it would not be read
        to its end)."""
        if self.sock is None:
            raise Closed("the connection was closed earlier")
        msg = _REQ.pack(op, VERSION, 0, len(body)) + body
        try:
            sent = socket.send_fds(self.sock, [msg], list(fds)) if fds else 0
            self.sock.sendall(memoryview(msg)[sent:])
            code, mlen, checksum, value = _ANS.unpack(self._recv(_ANS.size))
            if mlen > MAX_MESSAGE:
                raise Closed("an answer with a message of %d bytes" % mlen)
            message = self._recv(mlen).decode("utf-8", "replace")
            items = None
            if op in (BATCH_GET, BATCH_PUT) and code == 0:  # OK
                if value > _MAX_U16:
                    raise Closed("an answer of %d items" % value)
                items = list(_ITEM.iter_unpack(self._recv(value * _ITEM.size)))
        except (OSError, Closed) as e:
            self.close()
            raise Closed("%s: %s" % (self.path, e)) from None
        return code, message, checksum, value, items

    def _recv(self, n):
        if n == 0:
            return b""
        b = self.sock.recv(n, self._waitall)  # usually all of it at once
        if len(b) == n:
            return b
        if not b:
            raise Closed("closed by the server")
        buf = bytearray(n)
        view = memoryview(buf)
        view[:len(b)] = b
        got = len(b)
        while got < n:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise Closed("closed by the server")
            got += k
        return bytes(buf)
