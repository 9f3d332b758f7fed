"""The buffer socket's wire protocol, client side (Client.register_buffer
and get_into use it; the server is proxy/engineapi/bufsock.go).

A third Unix socket beside the engine socket, at its path plus SUFFIX: a
client registers shared memory of its own (a sealed memfd) once, and a GET
has the sidecar write the block straight into it. Registrations belong to
the connection that made them and end when it closes. One call at a time
(request, then answer); all integers big-endian.

Request: u8 op, u8 version, u16 zero, u32 body length, then the body.
Answer: u16 code, u16 message length, u32 checksum (GET OK only), u64 value,
then the message (UTF-8).
"""

import fcntl
import os
import socket
import struct

SUFFIX = ".buf"

REGISTER = 1
GET = 2
UNREGISTER = 3
VERSION = 1
# The longest body the server reads; a longer one closes the connection.
MAX_BODY = 65536

_REQ = struct.Struct(">BBHI")
_ANS = struct.Struct(">HHIQ")
_GET = struct.Struct(">QQQB")

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


def get_body(buffer_id, offset, length, scope, ns, key):
    """ns: str (UTF-8 on the wire), key: bytes. ValueError when the body
    would exceed MAX_BODY."""
    nsb = ns.encode("utf-8") if isinstance(ns, str) else bytes(ns)
    key = bytes(key)
    # Within MAX_BODY, each length also fits its u16.
    if _GET.size + 2 + len(nsb) + 2 + len(key) > MAX_BODY:
        raise ValueError("namespace (%d bytes) and key (%d bytes) too long for the buffer socket"
                         % (len(nsb), len(key)))
    return b"".join([_GET.pack(buffer_id, offset, length, scope),
                     struct.pack(">H", len(nsb)), nsb, struct.pack(">H", len(key)), key])


class Conn:
    """One connection to the buffer socket. Not thread-safe (one call at a
    time is the protocol anyway)."""

    def __init__(self, path, timeout):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.settimeout(timeout)
            self.sock.connect(path)
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
        answer: (code, message, checksum, value). Any failure of the
        connection closes it and raises Closed: a request half sent or an
        answer half read leaves the stream out of step."""
        if self.sock is None:
            raise Closed("the connection was closed earlier")
        msg = _REQ.pack(op, VERSION, 0, len(body)) + body
        try:
            sent = socket.send_fds(self.sock, [msg], list(fds)) if fds else 0
            self.sock.sendall(memoryview(msg)[sent:])
            code, mlen, checksum, value = _ANS.unpack(self._recv(_ANS.size))
            message = self._recv(mlen).decode("utf-8", "replace")
        except (OSError, Closed) as e:
            self.close()
            raise Closed("%s: %s" % (self.path, e)) from None
        return code, message, checksum, value

    def _recv(self, n):
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise Closed("closed by the server")
            got += k
        return bytes(buf)
