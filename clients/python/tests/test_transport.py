#!/usr/bin/env python3
"""Offline tests of tidepool.transport.FramedSocketTransport over a socket
pair, and of the client's pwritev helper (run by
scripts/test-python-client.sh)."""

import os
import socket
import struct
import sys
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from thrift.transport.TTransport import TTransportException  # noqa: E402

from tidepool.transport import FramedSocketTransport  # noqa: E402


class _Sock:
    """The part of thrift's TSocket the transport uses."""

    def __init__(self, handle):
        self.handle = handle

    def isOpen(self):
        return self.handle is not None

    def open(self):
        pass

    def close(self):
        self.handle.close()


def pair(kernel=False, timeout=10):
    """A transport over one end of a socket pair, and the other end. kernel:
    opened, so that its timeout is the kernel's and frames are received with
    MSG_WAITALL (what Client does); else Python's timeout, frames in
    pieces."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.settimeout(timeout)
    b.settimeout(10)
    t = FramedSocketTransport(_Sock(a))
    if kernel:
        t.open()
        assert a.gettimeout() is None, "the kernel timeouts were not set"
    return t, b


def send_in_pieces(sock, data, piece):
    for i in range(0, len(data), piece):
        sock.sendall(data[i:i + piece])


class FramedSocketTransportTest(unittest.TestCase):
    KERNEL = False  # KernelTimeoutTest runs every test with kernel timeouts

    def pair(self, timeout=10):
        return pair(self.KERNEL, timeout)

    def test_frames_arriving_in_pieces(self):
        t, peer = self.pair()
        frames = [b"", b"x", os.urandom(100000), os.urandom(3 << 20)]
        wire = b"".join(struct.pack("!i", len(f)) + f for f in frames)
        sender = threading.Thread(target=send_in_pieces, args=(peer, wire, 7777))
        sender.start()
        for f in frames:
            t.readFrame()
            self.assertEqual(t.cstringio_buf.getvalue(), f)
        sender.join()
        t.cstringio_buf.read()  # the last frame, used up
        # read() continues with the next frame once one is used up.
        peer.sendall(struct.pack("!i", 3) + b"abc" + struct.pack("!i", 2) + b"de")
        self.assertEqual(t.read(2), b"ab")
        self.assertEqual(t.read(5), b"c")
        self.assertEqual(t.read(5), b"de")

    def test_write_is_one_frame(self):
        t, peer = self.pair()
        payload = os.urandom(2 << 20)
        t.write(payload[:10])
        t.write(payload[10:])
        got = bytearray()
        reader = threading.Thread(target=lambda: got.extend(recv_exactly(peer, 4 + len(payload))))
        reader.start()
        t.flush()
        reader.join()
        self.assertEqual(struct.unpack("!i", got[:4])[0], len(payload))
        self.assertEqual(bytes(got[4:]), payload)
        t.flush()  # an empty frame, as TFramedTransport sends
        self.assertEqual(recv_exactly(peer, 4), struct.pack("!i", 0))

    def test_write_keeps_large_bytes_and_copies_the_rest(self):
        # Large bytes objects are sent from where they are; short writes
        # and mutable buffers are copied when written, so changing a
        # bytearray after write() does not change the frame.
        t, peer = self.pair()
        big = os.urandom(256 << 10)
        mutable = bytearray(os.urandom(100 << 10))
        pieces = [b"hdr", big, b"mid", bytes(mutable), big[:10]]
        t.write(b"hdr")
        t.write(big)
        t.write(b"mid")
        t.write(mutable)
        mutable[:] = bytes(len(mutable))
        t.write(big[:10])
        want = b"".join(pieces)
        got = bytearray()
        reader = threading.Thread(target=lambda: got.extend(recv_exactly(peer, 4 + len(want))))
        reader.start()
        t.flush()
        reader.join()
        self.assertEqual(bytes(got), struct.pack("!i", len(want)) + want)
        # Nothing of that frame is left for the next one.
        t.write(b"next")
        t.flush()
        self.assertEqual(recv_exactly(peer, 8), struct.pack("!i", 4) + b"next")

    def test_frame_in_one_piece(self):
        t, peer = self.pair()
        frame = os.urandom(100000)
        peer.sendall(struct.pack("!i", len(frame)) + frame + struct.pack("!i", 1) + b"z")
        t.readFrame()
        self.assertEqual(t.cstringio_buf.getvalue(), frame)
        self.assertEqual(t.read(len(frame) + 5), frame)
        self.assertEqual(t.read(5), b"z")

    def test_bad_frame_sizes_refused_before_reading(self):
        for size, kind in ((-1, TTransportException.NEGATIVE_SIZE), (1 << 30, TTransportException.SIZE_LIMIT)):
            t, peer = self.pair()
            peer.sendall(struct.pack("!i", size))
            with self.assertRaises(TTransportException) as cm:
                t.readFrame()
            self.assertEqual(cm.exception.type, kind)

    def test_peer_stalling_mid_frame_times_out(self):
        import time
        t, peer = self.pair(timeout=0.3)
        peer.sendall(struct.pack("!i", 1 << 20) + b"abc")  # then nothing
        start = time.monotonic()
        with self.assertRaises(TTransportException) as cm:
            t.readFrame()
        self.assertEqual(cm.exception.type, TTransportException.TIMED_OUT)
        # One timeout, or two with MSG_WAITALL (its wait, then the rest's).
        self.assertLess(time.monotonic() - start, 2.0)
        # A write to a peer that reads nothing times out too.
        big = os.urandom(8 << 20)
        with self.assertRaises(TTransportException) as cm:
            t.write(big)
            t.flush()
        self.assertEqual(cm.exception.type, TTransportException.TIMED_OUT)

    def test_peer_closing_mid_frame(self):
        t, peer = self.pair()
        peer.sendall(struct.pack("!i", 10) + b"abc")
        peer.close()
        with self.assertRaises(TTransportException) as cm:
            t.readFrame()
        self.assertEqual(cm.exception.type, TTransportException.END_OF_FILE)


class KernelTimeoutTest(FramedSocketTransportTest):
    """The same, on a transport opened as Client opens it: kernel timeouts,
    a blocking socket, each frame received with one recv(MSG_WAITALL)."""
    KERNEL = True

    def test_frame_lands_in_one_recv(self):
        t, peer = self.pair()
        frame = os.urandom(3 << 20)  # far more than the socket buffer holds
        sender = threading.Thread(target=send_in_pieces, args=(peer, struct.pack("!i", len(frame)) + frame, 65536))
        sender.start()
        t.readFrame()
        sender.join()
        buf = t.cstringio_buf
        self.assertEqual(buf.getvalue(), frame)


class PwritevTest(unittest.TestCase):
    """client._pwritev_all: batch_put_from's write of slots that follow one
    another, more buffers than one pwritev takes, empty ones among them."""

    def test_many_buffers(self):
        import tempfile

        from tidepool.client import _MAX_IOV, _pwritev_all
        bufs = [memoryview(os.urandom(i % 7 * 100)) for i in range(_MAX_IOV * 2 + 5)]
        with tempfile.TemporaryFile() as f:
            f.write(b"x" * 10)
            f.flush()
            _pwritev_all(f.fileno(), list(bufs), 10)
            f.seek(0)
            self.assertEqual(f.read(), b"x" * 10 + b"".join(bytes(b) for b in bufs))


def recv_exactly(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf.extend(chunk)
    return bytes(buf)


if __name__ == "__main__":
    unittest.main()
