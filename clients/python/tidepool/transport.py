"""The framed transport of the client: Thrift's TFramedTransport without its
copies.

thrift's TFramedTransport buffers every write in a BytesIO, copies it out
with getvalue() and once more to put the frame's length in front
(``pack("!i", n) + data``): three copies of a 1 MiB value before the kernel's
own. On the read side TTransportBase.readAll grows the frame with
``bytes += chunk``, a copy of everything so far for every chunk the socket
hands over. This transport keeps the parts of a message as written (the
value's own bytes object, never copied) and sends them with one sendmsg
(scatter-gather), and reads a frame into one buffer. The wire format is the
same framed transport: a 4-byte big-endian length, then the message.

It implements CReadableTransport, so thrift's C decoder (fastbinary) reads
responses from it as from TFramedTransport.
"""

import socket
import struct
from io import BytesIO

from thrift.transport import TTransport
from thrift.transport.TTransport import TTransportException

# Writes shorter than this are gathered into one buffer (field headers,
# small messages); longer ones are sent from the caller's object. Only
# immutable objects are kept uncopied: a bytearray or memoryview the caller
# may change after write() returns is copied like a small write.
_GATHER = 64 << 10

# The most iovecs passed to one sendmsg (Linux's IOV_MAX is 1024).
_MAX_IOV = 512

DEFAULT_MAX_FRAME_SIZE = 256 << 20


class FramedTransport(TTransport.TTransportBase, TTransport.CReadableTransport):
    """Framed transport over a TSocket (opened and closed through it)."""

    def __init__(self, sock, max_frame_size=DEFAULT_MAX_FRAME_SIZE):
        self._sock = sock
        self._max = max_frame_size
        self._rbuf = BytesIO(b"")
        self._parts = []  # bytes objects and bytearrays, in order
        self._small = None  # the bytearray gathering small writes, or None
        self._wlen = 0

    def isOpen(self):
        return self._sock.isOpen()

    def open(self):
        return self._sock.open()

    def close(self):
        return self._sock.close()

    # ---- writing -----------------------------------------------------------

    def write(self, buf):
        n = len(buf)
        if n >= _GATHER and isinstance(buf, bytes):
            self._parts.append(buf)
            self._small = None
        else:
            if self._small is None:
                self._small = bytearray()
                self._parts.append(self._small)
            self._small += buf
        self._wlen += n

    def flush(self):
        parts = [struct.pack("!i", self._wlen)] + self._parts
        # Reset before sending: a failed send leaves no half message behind.
        self._parts, self._small, self._wlen = [], None, 0
        h = self._handle()
        try:
            views = [memoryview(p) for p in parts if len(p)]
            while views:
                sent = h.sendmsg(views[:_MAX_IOV])
                while sent:
                    if sent >= len(views[0]):
                        sent -= len(views[0])
                        views.pop(0)
                    else:
                        views[0] = views[0][sent:]
                        sent = 0
        except (socket.timeout, TimeoutError) as e:
            raise TTransportException(TTransportException.TIMED_OUT, "write timeout", inner=e) from None
        except OSError as e:
            raise TTransportException(TTransportException.UNKNOWN, "write failed: %s" % e, inner=e) from None

    # ---- reading -----------------------------------------------------------

    def _handle(self):
        h = self._sock.handle
        if h is None:
            raise TTransportException(TTransportException.NOT_OPEN, "transport not open")
        return h

    def _recv_exactly(self, n):
        """n bytes from the socket as one bytes object: as the kernel hands
        them over when they come in one piece (the usual case), else joined
        once."""
        h = self._handle()
        chunks, have = [], 0
        try:
            while have < n:
                c = h.recv(n - have)
                if not c:
                    raise TTransportException(TTransportException.END_OF_FILE, "TSocket read 0 bytes")
                chunks.append(c)
                have += len(c)
        except (socket.timeout, TimeoutError) as e:
            raise TTransportException(TTransportException.TIMED_OUT, "read timeout", inner=e) from None
        except OSError as e:
            raise TTransportException(TTransportException.UNKNOWN, "read failed: %s" % e, inner=e) from None
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _read_frame(self):
        (sz,) = struct.unpack("!i", self._recv_exactly(4))
        if sz < 0:
            raise TTransportException(TTransportException.NEGATIVE_SIZE, "negative frame size %d" % sz)
        if sz > self._max:
            raise TTransportException(TTransportException.SIZE_LIMIT,
                                      "frame size %d larger than the maximum %d" % (sz, self._max))
        self._rbuf = BytesIO(self._recv_exactly(sz) if sz else b"")

    def read(self, sz):
        ret = self._rbuf.read(sz)
        if ret:
            return ret
        self._read_frame()
        return self._rbuf.read(sz)

    # CReadableTransport: the C decoder reads the frame's BytesIO in place.
    @property
    def cstringio_buf(self):
        return self._rbuf

    def cstringio_refill(self, prefix, reqlen):
        while len(prefix) < reqlen:
            self._read_frame()
            prefix += self._rbuf.getvalue()
        self._rbuf = BytesIO(prefix)
        return self._rbuf
