"""A framed Thrift transport over the sidecar's Unix socket that copies each
frame as few times as it can.

thrift's TFramedTransport reads a frame with TSocket.readAll, which joins
the pieces that recv returns with bytes += (every piece copies all the frame
so far: about three copies of a 1 MiB Get answer, received in pieces of the
socket buffer's size), and wraps the result in a BytesIO; it writes a frame
as header + payload, one more copy of a 1 MiB Put. Here a frame is received
with recv_into straight into the BytesIO the protocol decodes from (or,
when it arrives in one piece, as the one bytes object recv returns, which
the BytesIO shares), and sent with one sendmsg of the header and the
payload in place: a large bytes object written whole (a block's value, as
the pure-Python protocol writes it) is sent from where it is, not copied.
"""

import socket
from io import BytesIO
from struct import pack, unpack

from thrift.transport import TTransport
from thrift.transport.TTransport import TTransportException

# thrift's default (TTransport.DEFAULT_MAX_FRAME_SIZE, not in every version).
MAX_FRAME_SIZE = 16384000

# A write of a bytes object at least this long is kept as it is (bytes are
# immutable) and sent from there; shorter writes, and mutable buffers, are
# copied into the frame's buffer.
KEEP_WRITE = 64 << 10


class FramedSocketTransport(TTransport.TTransportBase, TTransport.CReadableTransport):
    """Framed transport over a thrift TSocket (what TFramedTransport(sock)
    does, with fewer copies). Usable by the accelerated protocol."""

    def __init__(self, sock, max_frame_size=MAX_FRAME_SIZE):
        self._trans = sock
        self._rbuf = BytesIO(b"")
        self._wbuf = BytesIO()
        self._wparts = []  # the frame so far: BytesIO buffers and kept bytes
        self._max_frame_size = max_frame_size
        self._waitall = 0  # recv flag for a frame's body: MSG_WAITALL once the socket blocks

    def isOpen(self):
        return self._trans.isOpen()

    def open(self):
        self._trans.open()
        self._waitall = socket.MSG_WAITALL if _kernel_timeouts(self._trans.handle) else 0

    def close(self):
        return self._trans.close()

    def _handle(self):
        h = self._trans.handle
        if h is None:
            raise TTransportException(TTransportException.NOT_OPEN, "transport not open")
        return h

    def _recv_into(self, view):
        h, got, n = self._handle(), 0, len(view)
        while got < n:
            try:
                k = h.recv_into(view[got:], n - got)
            except (socket.timeout, TimeoutError, BlockingIOError) as e:
                raise TTransportException(TTransportException.TIMED_OUT, "read timeout", inner=e) from e
            except OSError as e:
                raise TTransportException(TTransportException.UNKNOWN, "unexpected exception", inner=e) from e
            if k == 0:
                raise TTransportException(TTransportException.END_OF_FILE, "TSocket read 0 bytes")
            got += k

    def read(self, sz):
        ret = self._rbuf.read(sz)
        if len(ret) != 0:
            return ret
        self.readFrame()
        return self._rbuf.read(sz)

    def _frame_size(self):
        hdr = bytearray(4)
        self._recv_into(memoryview(hdr))
        (sz,) = unpack("!i", hdr)
        # Checked before anything is allocated for it.
        if sz < 0:
            raise TTransportException(TTransportException.NEGATIVE_SIZE, "Read a negative frame size (%d)" % sz)
        if sz > self._max_frame_size:
            raise TTransportException(TTransportException.SIZE_LIMIT,
                                      "Frame size (%d) larger than the maximum (%d)" % (sz, self._max_frame_size))
        return sz

    def _recv_bytes(self, n):
        """n bytes of the stream as one bytes object: straight from recv
        when they arrive in one piece (MSG_WAITALL on a blocking socket),
        else joined."""
        try:
            first = self._handle().recv(n, self._waitall) if n else b""
        except (socket.timeout, TimeoutError, BlockingIOError) as e:
            raise TTransportException(TTransportException.TIMED_OUT, "read timeout", inner=e) from e
        except OSError as e:
            raise TTransportException(TTransportException.UNKNOWN, "unexpected exception", inner=e) from e
        if len(first) == n:
            return first
        if not first:
            raise TTransportException(TTransportException.END_OF_FILE, "TSocket read 0 bytes")
        buf = bytearray(n)
        buf[:len(first)] = first
        self._recv_into(memoryview(buf)[len(first):])
        return bytes(buf)

    def read_reply_value(self, head, parse):
        """Reads the next frame for a reply that carries one large binary
        value, receiving the value straight into its own bytes object (no
        frame buffer, no decoder copy). head: how many leading bytes of the
        frame say where the value is; parse(prefix) returns the value's
        length when the prefix has the expected layout, else None. Returns
        (value, rest) with rest the frame's bytes after the value; or (None,
        None) with the whole frame left for the protocol to decode (another
        layout: an error, a miss, a short reply)."""
        sz = self._frame_size()
        prefix = self._recv_bytes(min(sz, head))
        n = parse(prefix) if len(prefix) == head else None
        if n is None or n < 0 or n > sz - head:
            self._rbuf = BytesIO(prefix + self._recv_bytes(sz - len(prefix)))
            return None, None
        value = self._recv_bytes(n)
        return value, self._recv_bytes(sz - head - n)

    def readFrame(self):
        sz = self._frame_size()
        if sz == 0:
            self._rbuf = BytesIO(b"")
            return
        try:
            # All of it, in one bytes object, when the socket blocks (open);
            # what has arrived so far otherwise, or when the timeout expires.
            first = self._handle().recv(sz, self._waitall)
        except (socket.timeout, TimeoutError, BlockingIOError) as e:
            raise TTransportException(TTransportException.TIMED_OUT, "read timeout", inner=e) from e
        except OSError as e:
            raise TTransportException(TTransportException.UNKNOWN, "unexpected exception", inner=e) from e
        if not first:
            raise TTransportException(TTransportException.END_OF_FILE, "TSocket read 0 bytes")
        if len(first) == sz:
            # The whole frame in one piece (the usual case): the BytesIO
            # shares the bytes object, nothing is copied or zeroed.
            self._rbuf = BytesIO(first)
            return
        buf = BytesIO()
        buf.write(first)
        buf.seek(sz - 1)
        buf.write(b"\0")
        buf.seek(0)
        view = buf.getbuffer()
        try:
            self._recv_into(view[len(first):])
        finally:
            view.release()
        self._rbuf = buf

    def write(self, buf):
        if type(buf) is bytes and len(buf) >= KEEP_WRITE:
            if self._wbuf.tell():
                self._wparts.append(self._wbuf)
                self._wbuf = BytesIO()
            self._wparts.append(buf)
        else:
            self._wbuf.write(buf)

    def flush(self):
        wparts, self._wparts = self._wparts, []
        wbuf, self._wbuf = self._wbuf, BytesIO()
        if wbuf.tell():
            wparts.append(wbuf)
        views = [p.getbuffer() if isinstance(p, BytesIO) else memoryview(p) for p in wparts]
        try:
            parts = [memoryview(pack("!i", sum(len(v) for v in views)))] + views
            h = self._handle()
            while parts:
                try:
                    sent = h.sendmsg(parts)
                except (socket.timeout, TimeoutError, BlockingIOError) as e:
                    raise TTransportException(TTransportException.TIMED_OUT, "write timeout", inner=e) from e
                except OSError as e:
                    raise TTransportException(TTransportException.UNKNOWN, "unexpected exception", inner=e) from e
                while parts and sent >= len(parts[0]):
                    sent -= len(parts[0])
                    parts.pop(0)
                if parts and sent:
                    parts[0] = parts[0][sent:]
        finally:
            for v in views:
                v.release()

    # The CReadableTransport interface (the accelerated protocol reads the
    # frame's BytesIO directly).
    @property
    def cstringio_buf(self):
        return self._rbuf

    def cstringio_refill(self, prefix, reqlen):
        # The accelerated protocol asks for a refill only once the frame is
        # used up; a message never spans frames in practice, but join them
        # as TFramedTransport does if one does.
        while len(prefix) < reqlen:
            self.readFrame()
            prefix += self._rbuf.getvalue()
        self._rbuf = BytesIO(prefix)
        return self._rbuf


def _kernel_timeouts(h):
    """Moves the socket's timeout into the kernel (SO_RCVTIMEO, SO_SNDTIMEO)
    and makes it blocking, so that recv(MSG_WAITALL) waits for a whole frame
    (on a socket with a Python timeout, which is non-blocking underneath, it
    returns what has arrived). A call that times out then fails with
    BlockingIOError, or returns what it got. Returns False, changing nothing,
    where the options cannot be set."""
    if h is None:
        return False
    t = h.gettimeout()
    if t is None:
        return True  # blocking already, no timeout
    if t <= 0:
        return False  # non-blocking on purpose; a kernel timeout of 0 would mean none
    sec = int(t)
    tv = pack("ll", sec, int((t - sec) * 1e6))
    try:
        h.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        h.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    except (OSError, AttributeError):
        return False
    h.settimeout(None)
    return True
