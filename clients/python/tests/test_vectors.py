#!/usr/bin/env python3
"""Offline tests against the wire vectors the Go server and the Go client
are tested with: the buffer socket's protocol (tidepool.bufsock) against
protocol/testdata/bufsock.txt (every request encoded byte for byte, every
answer read as its fields say, every answer that must be refused refused),
the put socket's calls and replies (protocol/testdata/putsock.txt) read by
Apache Thrift's decoder with the generated bindings, and the Get replies
that Client.get reads by hand (protocol/testdata/getreply.txt)."""

import os
import socket
import struct
import sys
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

from thrift.protocol import TBinaryProtocol  # noqa: E402
from thrift.Thrift import TMessageType  # noqa: E402
from thrift.transport import TSocket, TTransport  # noqa: E402

import tidepool  # noqa: E402
from tidepool import ErrorCode  # noqa: E402
from tidepool import bufsock  # noqa: E402
from tidepool.transport import FramedSocketTransport  # noqa: E402
from tidepool.gen import Tidepool  # noqa: E402


def load(name):
    """The vectors of protocol/testdata/name: (kind, name, op or None,
    frame, fields, items)."""
    out = []
    with open(os.path.join(ROOT, "protocol", "testdata", name)) as f:
        for line in f:
            w = line.split()
            if not w or w[0].startswith("#"):
                continue
            kind, vname, rest = w[0], w[1], w[2:]
            op = None
            if len(rest[0]) <= 3:  # an op (a frame is longer)
                op, rest = int(rest[0]), rest[1:]
            fields, items = {}, []
            for kv in rest[1:]:
                k, v = kv.split("=", 1)
                if k == "item":
                    items.append(v.split(","))
                else:
                    fields[k] = v
            out.append((kind, vname, op, bytes.fromhex(rest[0]), fields, items))
    return out


def hexfield(s):
    return b"" if s == "-" else bytes.fromhex(s)


def checksum(s):
    return None if s == "-" else int(s)


def encode(op, f, items):
    """The body tidepool.bufsock writes for a request with these fields."""
    ns = hexfield(f["ns"]).decode("utf-8") if "ns" in f else None
    if op == bufsock.REGISTER:
        return bufsock.register_body(int(f["size"]))
    if op == bufsock.UNREGISTER:
        return bufsock.unregister_body(int(f["id"]))
    if op == bufsock.GET:
        return bufsock.get_body(int(f["id"]), int(f["off"]), int(f["len"]), int(f["scope"]), ns, hexfield(f["key"]))
    flags = int(f.get("flags", "0"))
    durable = bool(flags & bufsock.DURABLE)
    if op == bufsock.PUT:
        sum_ = checksum(f["sum"])
        if bool(flags & bufsock.CHECKSUM) != (sum_ is not None):
            raise AssertionError("flags and sum disagree")
        return bufsock.put_body(int(f["id"]), int(f["off"]), int(f["len"]), int(f["depth"]), ns, hexfield(f["key"]),
                                sum_, durable, int(f["sync"]))
    if op == bufsock.BATCH_GET:
        return bufsock.batch_get_body(int(f["id"]), int(f["scope"]), ns,
                                      [(int(o), int(n), hexfield(k)) for o, n, k in items])
    if op == bufsock.BATCH_PUT:
        return bufsock.batch_put_body(int(f["id"]), ns,
                                      [(int(o), int(n), int(d), checksum(s), hexfield(k)) for o, n, d, s, k in items],
                                      durable, int(f["sync"]))
    raise AssertionError("op %d" % op)


def pair():
    """A bufsock.Conn on one end of a socket pair, and the other end."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.settimeout(10)
    b.settimeout(10)
    c = bufsock.Conn.__new__(bufsock.Conn)
    c.path, c.sock, c._waitall = "socketpair", a, 0
    return c, b


def recv_exactly(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def against_peer(peer, read, answer, hang_up, call):
    """call() while a thread plays the sidecar on peer: reads the request
    (read(peer) returns it), writes answer and, with hang_up, closes its
    end. Returns (call's result or the exception it raised, the request);
    peer is closed after."""
    got = []

    def serve():
        got.append(read(peer))
        peer.sendall(answer)
        if hang_up:
            peer.shutdown(socket.SHUT_RDWR)
    th = threading.Thread(target=serve)
    th.start()
    try:
        try:
            res = call()
        except Exception as e:  # the caller checks what it expects
            res = e
    finally:
        th.join()
        peer.close()
    return res, got[0]


class BufferSocketVectorsTest(unittest.TestCase):
    vectors = load("bufsock.txt")

    def call(self, op, body, answer, hang_up):
        """Conn.call(op, body) against a peer that reads the request,
        writes answer and (hang_up) closes: (result or exception, request
        as the peer read it, the connection)."""
        c, peer = pair()
        try:
            res, sent = against_peer(peer, lambda p: recv_exactly(p, 8 + len(body)), answer, hang_up,
                                     lambda: c.call(op, body))
        finally:
            c.close()
        return res, sent, c

    def test_requests(self):
        n = 0
        for kind, name, _, frame, f, items in self.vectors:
            if kind != "req":
                continue
            n += 1
            op = int(f["op"])
            body = encode(op, f, items)
            self.assertEqual(body.hex(), frame[8:].hex(), name)
            # Conn.call puts the head before it.
            _, sent, _ = self.call(op, body, bytes(16), False)
            self.assertEqual(sent.hex(), frame.hex(), name)
        self.assertGreater(n, 8)

    def test_answers(self):
        n = 0
        for kind, name, op, frame, f, items in self.vectors:
            if kind != "ans":
                continue
            n += 1
            res, _, c = self.call(op, b"\x00" * 8, frame, False)
            self.assertNotIsInstance(res, Exception, name)
            code, message, sum_, value, got_items = res
            self.assertEqual(code, getattr(ErrorCode, f["code"]), name)
            self.assertEqual(message.encode("utf-8"), hexfield(f["msg"]), name)
            self.assertEqual((sum_, value), (int(f["sum"]), int(f["value"])), name)
            if op in (bufsock.BATCH_GET, bufsock.BATCH_PUT) and code == ErrorCode.OK:
                self.assertEqual(got_items, [tuple(int(x) for x in it) for it in items], name)
            else:
                self.assertIsNone(got_items, name)
        self.assertGreater(n, 8)

    def test_refused_answers(self):
        n = 0
        for kind, name, op, frame, _, _ in self.vectors:
            if kind != "badans":
                continue
            n += 1
            res, _, c = self.call(op, b"\x00" * 8, frame, True)
            self.assertIsInstance(res, bufsock.Closed, name)
            self.assertFalse(c.alive, name)
        self.assertGreater(n, 3)

    def test_malformed_requests_not_written(self):
        # What the server refuses as malformed, the client cannot be asked
        # to write: a count or string over a u16, a body over MAX_BODY.
        with self.assertRaises(ValueError):
            bufsock.get_body(7, 0, 1, 0, "ns", b"k" * 0x10000)
        with self.assertRaises(ValueError):
            bufsock.batch_get_body(7, 0, "ns", [(0, 1, b"k")] * 0x10000)
        with self.assertRaises(ValueError):
            bufsock.batch_get_body(7, 0, "ns", [(0, 1, b"k" * 60000)] * 20)


def thrift_message(frame, cls):
    """(name, type, seq, the decoded struct, bytes left over)."""
    buf = TTransport.TMemoryBuffer(frame)
    p = TBinaryProtocol.TBinaryProtocol(buf)
    name, typ, seq = p.readMessageBegin()
    v = cls()
    v.read(p)
    p.readMessageEnd()
    return name, typ, seq, v, buf.read(len(frame))


class PutSocketVectorsTest(unittest.TestCase):
    """Whatever order its fields come in (the Go client's value-last, or id
    order), a Put call of putsock.txt is the IDL's Put call to Apache
    Thrift's own decoder, and each reply its Put result."""
    vectors = load("putsock.txt")

    def test_calls(self):
        n = 0
        for kind, name, _, frame, f, _ in self.vectors:
            if kind != "req":
                continue
            n += 1
            mname, typ, seq, args, rest = thrift_message(frame, Tidepool.Put_args)
            self.assertEqual((mname, typ, seq, rest), ("Put", TMessageType.CALL, 1, b""), name)
            r = args.req
            self.assertEqual((r.ns.encode(), r.key, r.value), (hexfield(f["ns"]), hexfield(f["key"]), hexfield(f["value"])),
                             name)
            self.assertEqual((r.depth, int(r.durable), r.sync_replicas), (int(f["depth"]), int(f["durable"]), int(f["sync"])),
                             name)
        self.assertGreater(n, 2)

    def test_replies(self):
        n = 0
        for kind, name, _, frame, f, _ in self.vectors:
            if kind != "ans":
                continue
            n += 1
            mname, typ, seq, res, rest = thrift_message(frame, Tidepool.Put_result)
            self.assertEqual((mname, typ, seq, rest), ("Put", TMessageType.REPLY, 1, b""), name)
            if "code" in f:
                self.assertEqual((res.err.code, res.err.message.encode()), (getattr(ErrorCode, f["code"]), hexfield(f["msg"])),
                                 name)
                self.assertIsNone(res.success, name)
            else:
                self.assertEqual(res.success.existed, f["existed"] == "1", name)
        self.assertGreater(n, 2)


class GetReplyVectorsTest(unittest.TestCase):
    """Client.get on the framed transport reads each reply of getreply.txt
    as its fields say: a plain hit through its own head and tail readers,
    anything else through the generated decoder; a reply cut short is an
    error."""
    vectors = load("getreply.txt")

    def get(self, frame, hang_up):
        """Client.get against a peer that reads the request and answers
        frame (framed; cut short when hang_up): its result or exception."""
        a, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        a.settimeout(10)
        peer.settimeout(10)
        sock = TSocket.TSocket()
        sock.handle = a
        c = tidepool.Client.__new__(tidepool.Client)
        c._transport = FramedSocketTransport(sock)
        c._c = Tidepool.Client(TBinaryProtocol.TBinaryProtocol(c._transport))
        c._lazy, c._arena_ok = False, False  # the socket path: get's reply decoding

        def read(p):
            return recv_exactly(p, struct.unpack(">I", recv_exactly(p, 4))[0])
        size = len(frame) if not hang_up else 1 << 20
        try:
            return against_peer(peer, read, struct.pack(">I", size) + frame, hang_up, lambda: c.get("ns", b"k"))[0]
        finally:
            a.close()

    def test_replies(self):
        n = 0
        for kind, name, _, frame, f, _ in self.vectors:
            if kind == "badans":
                n += 1
                got = self.get(frame, True)
                self.assertIsInstance(got, Exception, name)
                self.assertNotIsInstance(got, tidepool.Error, name)
                continue
            n += 1
            got = self.get(frame, False)
            if "code" in f:
                self.assertIsInstance(got, tidepool.Error, name)
                self.assertEqual((got.code, str(got.message).encode()), (getattr(ErrorCode, f["code"]), hexfield(f["msg"])), name)
            elif f["found"] == "1":
                self.assertEqual(got, hexfield(f["value"]), name)
            else:
                self.assertIsNone(got, name)
        self.assertGreater(n, 6)


if __name__ == "__main__":
    unittest.main()
