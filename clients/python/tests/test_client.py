#!/usr/bin/env python3
"""Tests of the tidepool Python client against a real `tidepool serve`.

Run through scripts/test-python-client.sh, which starts the server and sets:

  TIDEPOOL_SOCKET           the server's Unix socket (required)
  TIDEPOOL_MAX_VALUE_BYTES  its --max-value-size in bytes
  TIDEPOOL_DRAM_CAPACITY    its --dram-capacity in bytes

Each test uses its own namespace and clears it afterwards. The buffer
socket tests (BufferSocketTest, BufferSocketWireTest) run only against a
server whose Hello lists "buffer_socket".
"""

import fcntl
import mmap
import os
import random
import socket
import struct
import subprocess
import sys
import textwrap
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)
sys.path.insert(0, PKG_ROOT)

import tidepool  # noqa: E402
from thrift.transport import TTransport  # noqa: E402

from tidepool import ErrorCode  # noqa: E402

KiB = 1024
MiB = 1024 * KiB
SOCKET = os.environ.get("TIDEPOOL_SOCKET", "")
MAX_VALUE = int(os.environ.get("TIDEPOOL_MAX_VALUE_BYTES", str(2 * MiB)))
CAPACITY = int(os.environ.get("TIDEPOOL_DRAM_CAPACITY", str(64 * MiB)))


def payload(n, seed):
    """Deterministic bytes, cheap to make in pure Python."""
    unit = bytes((seed * 31 + i * 7) & 0xFF for i in range(251))
    return (unit * (n // len(unit) + 1))[:n]


def server_features():
    """What the server's Hello lists (nothing without a server)."""
    if not SOCKET:
        return ()
    c = tidepool.Client(SOCKET)
    try:
        return tuple(c.hello().features or ())
    finally:
        c.close()


BUFFER_SOCKET = tidepool.client.FEATURE_BUFFER_SOCKET in server_features()


def poll(cond, timeout=10.0, what="condition"):
    """Waits for cond() with a deadline (no fixed sleeps as waits)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.02)


@unittest.skipUnless(SOCKET, "TIDEPOOL_SOCKET is not set; run scripts/test-python-client.sh")
class ClientTest(unittest.TestCase):
    framed = True

    def setUp(self):
        self.c = tidepool.Client(SOCKET, framed=self.framed)
        self.addCleanup(self.c.close)
        self.ns = "pyclient/" + uuid.uuid4().hex[:12]
        self.addCleanup(lambda: self.c.clear(self.ns))

    def test_hello_arenas(self):
        h = self.c.hello()
        self.assertEqual(h.layout_version, tidepool.ARENA_LAYOUT_VERSION)
        self.assertTrue(h.arenas)
        for i, a in enumerate(h.arenas):
            self.assertEqual(a.id, i)
            self.assertTrue(os.path.isabs(a.path))
            st = os.stat(a.path)
            self.assertEqual(st.st_mode & 0o777, 0o600, "arena files keep other users out")
            self.assertGreaterEqual(st.st_size, a.size)

    def test_inline_and_lookup(self):
        tokens = list(range(64))
        keys = tidepool.chain_keys(tokens, 16)
        self.assertEqual(self.c.lookup(self.ns, keys), 0)
        codes = self.c.batch_put(self.ns, [(k, payload(1000, i), i) for i, k in enumerate(keys[:2])])
        self.assertEqual(codes, [tidepool.OK] * 2)
        self.assertTrue(self.c.put(self.ns, keys[0], b"other"))  # exists: no-op
        self.assertEqual(self.c.lookup(self.ns, keys), 2)
        self.assertEqual(self.c.get(self.ns, keys[1]), payload(1000, 1))
        self.assertIsNone(self.c.get(self.ns, keys[3]))
        self.assertEqual(self.c.batch_get(self.ns, keys[:3]), [payload(1000, 0), payload(1000, 1), None])
        self.assertEqual([p.present for p in self.c.batch_exists(self.ns, keys)], [True, True, False, False])
        with self.assertRaises(tidepool.Error) as cm:
            self.c.put(self.ns, b"", b"x")
        self.assertEqual(cm.exception.code, ErrorCode.INVALID_ARGUMENT)

    def test_inline_values_of_every_size(self):
        # The framed transport (tidepool/transport.py) sends a message's
        # parts with sendmsg, partial sends included (a 2 MiB frame does not
        # fit the socket buffer), and reads a frame arriving in pieces.
        sizes = [0, 1, 64 * KiB - 1, 64 * KiB, 1 << 20, MAX_VALUE]
        for i, n in enumerate(sizes):
            v = payload(n, 30 + i)
            self.assertFalse(self.c.put(self.ns, b"in-%d" % i, v if i % 2 else bytearray(v)))
            self.assertEqual(self.c.get(self.ns, b"in-%d" % i), v)
        items = [(b"bin-%d" % i, payload(n, 40 + i)) for i, n in enumerate(sizes[:5])]
        self.assertEqual(self.c.batch_put(self.ns, items), [tidepool.OK] * len(items))
        self.assertEqual(self.c.batch_get(self.ns, [k for k, _ in items]), [v for _, v in items])
        self.assertEqual(self.c.hello().server_version, 1)  # the connection is still in step

    def test_get_receives_a_hit_in_place(self):
        # Framed: a hit's value is received straight into the bytes object
        # get returns (no decoder); a miss and an error are decoded as
        # usual, and the connection stays in step.
        if not self.framed:
            self.skipTest("framed transport only")
        self.c._arena_ok = False  # the socket path (test_get_through_the_arenas: the other)
        decoded = []
        recv_get = self.c._c.recv_Get

        def counting():
            decoded.append(1)
            return recv_get()
        self.c._c.recv_Get = counting
        for i, n in enumerate([0, 3, 1 << 20, MAX_VALUE]):
            v = payload(n, 60 + i)
            self.c.put(self.ns, b"hit-%d" % i, v)
            self.assertEqual(self.c.get(self.ns, b"hit-%d" % i), v)
        self.assertEqual(decoded, [], "a hit went through the decoder")
        self.assertIsNone(self.c.get(self.ns, b"absent"))
        with self.assertRaises(tidepool.Error) as cm:
            self.c.get(self.ns, b"")
        self.assertEqual(cm.exception.code, ErrorCode.INVALID_ARGUMENT)
        self.assertEqual(len(decoded), 2)
        self.assertEqual(self.c.get(self.ns, b"hit-2"), payload(1 << 20, 62))

    def test_get_through_the_arenas(self):
        # A client that maps the arenas copies a hit out of them under a
        # lease that rides on its next Acquire: no Get call at all, the
        # same bytes, None on a miss, the same errors; a client that cannot
        # map them gets over the socket.
        sent = []
        send_get = self.c._c.send_Get

        def counting(req):
            sent.append(1)
            return send_get(req)
        self.c._c.send_Get = counting
        for i, n in enumerate([0, 3, 1 << 20, MAX_VALUE]):
            v = payload(n, 70 + i)
            self.c.put(self.ns, b"arena-%d" % i, v)
            self.assertEqual(self.c.get(self.ns, b"arena-%d" % i), v)
        self.assertEqual(sent, [], "a hit went over the socket")
        self.assertTrue(self.c._arena_ok)
        self.assertEqual(len(self.c._pending), 1)  # the last hit's lease, released by the next Acquire
        self.assertIsNone(self.c.get(self.ns, b"absent"))
        self.assertEqual(self.c._pending, [])
        with self.assertRaises(tidepool.Error) as cm:
            self.c.get(self.ns, b"")
        self.assertEqual(cm.exception.code, ErrorCode.INVALID_ARGUMENT)
        self.assertEqual(sent, [])
        self.c.flush_releases()
        # No arenas to map (a sidecar in another container without the
        # arena directory): get goes over the socket.
        c = tidepool.Client(SOCKET, framed=self.framed)
        self.addCleanup(c.close)

        def no_arenas(remap=False):
            raise tidepool.Error(ErrorCode.UNAVAILABLE, "the server offers no shared arenas")
        c._map = no_arenas
        self.assertEqual(c.get(self.ns, b"arena-2"), payload(1 << 20, 72))
        self.assertIs(c._arena_ok, False)
        self.assertIsNone(c.get(self.ns, b"absent"))

    def test_slot_index(self):
        # The sidecar's slot index says where each block lies, as an
        # Acquire would; a block deleted (or evicted) leaves it, and a
        # reader that found it sees its entry changed.
        from tidepool import slots
        if not slots.supported():
            self.skipTest("the slot index is read on x86-64 only")
        idx = self.c.slot_index()
        self.assertIsNotNone(idx, "the sidecar lists no slot_index")
        keys = [b"slot-%d" % i for i in range(20)]
        for i, k in enumerate(keys):
            self.c.put(self.ns, k, payload(100_000 + i, 90 + i))
        found = idx.find(self.ns, keys + [b"absent"])
        self.assertIsNone(found[-1])
        leases, _ = self.c.acquire(self.ns, keys)
        views = self.c.arena_views()
        for i, (f, l) in enumerate(zip(found, leases)):
            self.assertIsNotNone(f, keys[i])
            self.assertEqual((f.arena, f.offset, f.length), (l.slot.arena, l.slot.offset, l.slot.length))
            self.assertEqual(bytes(views[f.arena][f.offset:f.offset + f.length]), payload(100_000 + i, 90 + i))
            self.assertTrue(idx.unchanged(f))
        self.c.release([l.lease_id for l in leases])
        self.assertEqual(idx.prefix(self.ns, keys), len(keys))
        self.assertEqual(idx.find(self.ns + "-other", keys[:1]), [None])
        self.assertTrue(self.c.delete(self.ns, keys[3]))
        self.assertFalse(idx.unchanged(found[3]))
        self.assertEqual(idx.find(self.ns, keys[3:4]), [None])
        self.assertEqual(idx.prefix(self.ns, keys), 3)

    def test_get_tail_checked(self):
        from tidepool.client import _check_get_tail
        _check_get_tail(b"\x0b\x00\x03\x00\x00\x00\x04dram\x00\x00")  # tier, two ends
        _check_get_tail(b"\x00\x00")
        for bad in (b"", b"\x00", b"\x0b\x00\x03\x00\x00\x00\x09dram\x00\x00", b"\x00\x00\x00", b"\x63\x00\x01"):
            with self.assertRaises(TTransport.TTransportException, msg=repr(bad)):
                _check_get_tail(bad)

    def test_lazy_release(self):
        """get_into's lease rides on the next Acquire (or flush_releases,
        or close) instead of a Release call of its own."""
        value = payload(4 * KiB, 21)
        self.assertFalse(self.c.put_from(self.ns, b"lz", value))
        buf = bytearray(4 * KiB)
        self.assertEqual(self.c.get_into(self.ns, b"lz", buf), 4 * KiB)
        self.assertEqual(bytes(buf), value)
        self.assertEqual(len(self.c._pending), 1)
        (id1,) = self.c._pending
        self.assertEqual(self.c.get_into(self.ns, b"lz", buf), 4 * KiB)
        (id2,) = self.c._pending
        # id1 was released by the second Acquire: not held any more.
        self.assertEqual(self.c.release([id1]), [ErrorCode.LEASE_EXPIRED])
        self.c.flush_releases()
        self.assertEqual(self.c._pending, [])
        self.assertEqual(self.c.release([id2]), [ErrorCode.LEASE_EXPIRED])
        # close() sends what is queued.
        c2 = tidepool.Client(SOCKET, framed=self.framed)
        self.assertEqual(c2.get_into(self.ns, b"lz", buf), 4 * KiB)
        (id3,) = c2._pending
        c2.close()
        self.assertEqual(self.c.release([id3]), [ErrorCode.LEASE_EXPIRED])
        # lazy_release=False, or a server without the feature (an older
        # one would ignore the ids): released at once, nothing queued.
        for c in (tidepool.Client(SOCKET, framed=self.framed, lazy_release=False),
                  tidepool.Client(SOCKET, framed=self.framed)):
            try:
                c._map()
                if c._lazy:
                    c._acq_release = False
                self.assertEqual(c.get_into(self.ns, b"lz", buf), 4 * KiB)
                self.assertEqual(c._pending, [])
            finally:
                c.close()
        # A copy that ends within RELEASE_MARGIN_MS of the lease deadline
        # (here: any copy, the margin made longer than the lease) is
        # released at once and its release checked.
        from tidepool import client as client_mod
        saved = client_mod.RELEASE_MARGIN_MS
        client_mod.RELEASE_MARGIN_MS = 10 * 60 * 1000
        try:
            self.assertEqual(self.c.get_into(self.ns, b"lz", buf), 4 * KiB)
            self.assertEqual(self.c._pending, [])
        finally:
            client_mod.RELEASE_MARGIN_MS = saved

    def test_register_buffer_needs_the_feature(self):
        """A sidecar whose Hello does not list buffer_socket (here: made to
        look so): register_buffer raises UNAVAILABLE and opens nothing;
        get_into keeps the arena path."""
        h = self.c.hello()
        h.features = [f for f in (h.features or []) if f != tidepool.client.FEATURE_BUFFER_SOCKET]
        self.c.hello = lambda: h
        with self.assertRaises(tidepool.Error) as cm:
            self.c.register_buffer(4 * KiB)
        self.assertEqual(cm.exception.code, ErrorCode.UNAVAILABLE)
        self.assertIsNone(self.c._bconn)
        with self.assertRaises(tidepool.Error) as cm:
            self.c.register_buffer(0)
        self.assertEqual(cm.exception.code, ErrorCode.INVALID_ARGUMENT)
        self.c.put(self.ns, b"nf", b"value")
        self.assertEqual(self.c.get_into(self.ns, b"nf", bytearray(10)), 5)

    def test_zero_copy_round_trip(self):
        sizes = [0, 1, 4 * KiB, 64 * KiB + 3, MAX_VALUE]
        items = [(b"zc-%d" % i, payload(n, i), i) for i, n in enumerate(sizes)]
        self.assertEqual(self.c.batch_put_from(self.ns, items), [tidepool.OK] * len(items))
        # Same semantics as put: a second put of a key is EXISTS.
        self.assertEqual(self.c.batch_put_from(self.ns, items[:1]), [tidepool.EXISTS])
        self.assertTrue(self.c.put_from(self.ns, items[1][0], items[1][1]))
        # Inline reads see what was written in place.
        for k, v, _ in items:
            self.assertEqual(self.c.get(self.ns, k), v)
        bufs = [bytearray(n + 5) for n in sizes] + [bytearray(10)]
        got = self.c.batch_get_into(self.ns, [k for k, _, _ in items] + [b"missing"], bufs)
        self.assertEqual(got, sizes + [None])
        for (k, v, _), buf, n in zip(items, bufs, sizes):
            self.assertEqual(bytes(buf[:n]), v, k)
        # Verified copies (pure-Python CRC on a small block).
        buf = bytearray(4 * KiB)
        self.assertEqual(self.c.get_into(self.ns, b"zc-2", buf, verify=True), 4 * KiB)
        self.assertFalse(self.c.put_from(self.ns, b"zc-v", payload(3000, 9), verify=True))
        self.assertEqual(self.c.get(self.ns, b"zc-v"), payload(3000, 9))
        self.assertIsNone(self.c.get_into(self.ns, b"nope", buf))
        # A short buffer: TOO_LARGE, and no lease is left behind.
        with self.assertRaises(tidepool.Error) as cm:
            self.c.get_into(self.ns, b"zc-3", bytearray(10))
        self.assertEqual(cm.exception.code, ErrorCode.TOO_LARGE)
        self.assertEqual(self.c.delete(self.ns, b"zc-3"), True)

    def test_put_from_reserves_ahead(self):
        """After the first put, each put_from writes into a slot reserved
        ahead by the commit before it: one round trip (commit), no reserve.
        A stored key through such a slot is EXISTS and unchanged; a slot
        the sidecar no longer knows (lost in a restart; aborted here) makes
        the put fall back to a reserve; close() aborts the slots kept."""
        c = tidepool.Client(SOCKET, framed=self.framed)
        calls = {"Reserve": 0, "Commit": 0}
        for name in calls:
            fn = getattr(c._c, name)
            def counted(req, fn=fn, name=name):
                calls[name] += 1
                return fn(req)
            setattr(c._c, name, counted)
        vals = [payload(64 * KiB, i) for i in range(5)]
        for i, v in enumerate(vals):
            self.assertFalse(c.put_from(self.ns, b"ra-%d" % i, v))
        self.assertEqual(calls, {"Reserve": 1, "Commit": 5})
        self.assertTrue(c.put_from(self.ns, b"ra-0", vals[1]))
        self.assertEqual(calls, {"Reserve": 1, "Commit": 6})
        self.assertEqual(c.batch_put_from(self.ns, [(b"ra-b%d" % i, v) for i, v in enumerate(vals)]),
                         [tidepool.OK] * 5)
        for i, v in enumerate(vals):
            self.assertEqual(c.get(self.ns, b"ra-%d" % i), v)
            self.assertEqual(c.get(self.ns, b"ra-b%d" % i), v)
        # A slot the sidecar no longer knows (as after a restart): the put
        # goes through a reserve instead, once.
        lost = c._spares[(self.ns, 64 * KiB)][-1]
        self.assertEqual(c.abort([lost.token]), [tidepool.OK])
        self.assertFalse(c.put_from(self.ns, b"ra-lost", vals[2]))
        self.assertEqual(c.get(self.ns, b"ra-lost"), vals[2])
        kept = [r.token for lst in c._spares.values() for r in lst]
        self.assertTrue(kept)
        c.close()
        self.assertEqual(self.c.abort(kept), [ErrorCode.LEASE_EXPIRED] * len(kept))
        off = tidepool.Client(SOCKET, framed=self.framed, reserve_ahead=0)
        self.assertFalse(off.put_from(self.ns, b"ra-off", vals[0]))
        self.assertEqual(off._spares, {})
        off.close()

    def keyed_supported(self):
        try:
            tidepool.pkey.key()
            return True
        except tidepool.pkey.Unsupported:
            return False

    def test_keyed_writes(self):
        """Where the machine has protection keys, zero-copy puts (one, a
        batch, write_slot) copy through each arena's keyed mapping, and
        read back right; without them (or with write_mode pwrite) they
        write with pwrite and make no keyed mapping."""
        if not self.keyed_supported():
            self.skipTest("no memory protection keys here")
        c = tidepool.Client(SOCKET, framed=self.framed)
        self.addCleanup(c.close)
        vals = {b"kw-%d" % i: payload(n, i) for i, n in enumerate([1, 4 * KiB - 1, 64 * KiB + 3, MAX_VALUE])}
        for k, v in vals.items():
            self.assertFalse(c.put_from(self.ns, k, v))
        # A batch (slots that follow one another), and buffers of other
        # types: read-only bytes, a bytearray, a memoryview slice.
        batch = [(b"kwb-%d" % i, v) for i, v in enumerate(
            [payload(10 * KiB, 40), bytearray(payload(3000, 41)), memoryview(payload(9000, 42))[1000:8000]])]
        self.assertEqual(c.batch_put_from(self.ns, batch), [tidepool.OK] * 3)
        vals.update((k, bytes(v)) for k, v in batch)
        (r,) = c.reserve(self.ns, [(b"kw-slot", 5000)])
        c.write_slot(r.slot, payload(5000, 43))
        self.assertEqual(c.commit([(r.token, tidepool.crc32c(payload(5000, 43)))]), [tidepool.OK])
        vals[b"kw-slot"] = payload(5000, 43)
        keyed = [a for a in c._arenas if a.keyed is not None]
        self.assertTrue(keyed, "no keyed mapping was made")
        # The stretches written were faulted in with madvise (None: a
        # kernel before 5.14, which faults them page by page).
        for a in keyed:
            if a.keyed.chunks is not None:
                self.assertGreater(sum(a.keyed.chunks), 0)
                self.assertLess(sum(a.keyed.chunks), len(a.keyed.chunks))
        for k, v in vals.items():
            self.assertEqual(self.c.get(self.ns, k), v, k)
        # Not contiguous: refused before anything is reserved or written.
        with self.assertRaises((BufferError, TypeError, ValueError)):
            c.put_from(self.ns, b"kw-strided", memoryview(payload(100, 1))[::2])
        self.assertIsNone(self.c.get(self.ns, b"kw-strided"))
        self.assertTrue(c.prepare_writes())
        self.assertFalse(c.put_from(self.ns, b"kw-after", vals[b"kw-1"]))
        self.assertEqual(self.c.get(self.ns, b"kw-after"), vals[b"kw-1"])

        pw = tidepool.Client(SOCKET, framed=self.framed, write_mode=tidepool.WRITE_PWRITE)
        self.addCleanup(pw.close)
        self.assertFalse(pw.put_from(self.ns, b"pw", vals[b"kw-2"]))
        self.assertEqual(self.c.get(self.ns, b"pw"), vals[b"kw-2"])
        self.assertFalse(pw.prepare_writes())
        self.assertTrue(all(a.keyed is None for a in pw._arenas))
        # A block written from parts, through either mode; a wrong total
        # length is refused before anything is written.
        parts = [b"head", bytearray(payload(7000, 44)), memoryview(payload(3000, 45))[1000:]]
        joined = b"".join(bytes(p) for p in parts)
        for cl, key in ((c, b"parts-keyed"), (pw, b"parts-pwrite")):
            (r,) = cl.reserve(self.ns, [(key, len(joined))])
            with self.assertRaises(tidepool.Error) as cm:
                cl.write_slot(r.slot, parts + [b"x"])
            self.assertEqual(cm.exception.code, ErrorCode.INVALID_ARGUMENT)
            cl.write_slot(r.slot, parts)
            self.assertEqual(cl.commit([(r.token, tidepool.crc32c(joined))]), [tidepool.OK])
            self.assertEqual(self.c.get(self.ns, key), joined)
        with self.assertRaises(ValueError):
            tidepool.Client(SOCKET, framed=self.framed, write_mode="mmap")

    def test_keyed_writes_without_keys(self):
        """A process whose key cannot be allocated (none free, or no PKU)
        writes with pwrite: same bytes, no keyed mapping."""
        script = textwrap.dedent("""
            import sys
            sys.path.insert(0, %r)
            import tidepool
            from tidepool import pkey
            def no_keys():
                raise pkey.Unsupported("pkey_alloc: No space left on device")
            pkey.key = no_keys
            c = tidepool.Client(%r)
            v = bytes(range(256)) * 1000
            assert c.put_from(%r, b"nokeys", v) is False
            assert all(a.keyed is None for a in c._arenas)
            assert c.prepare_writes() is False
            assert c.get(%r, b"nokeys") == v
            c.close()
        """) % (PKG_ROOT, SOCKET, self.ns, self.ns)
        subprocess.run([sys.executable, "-c", script], timeout=60, check=True)
        self.assertEqual(len(self.c.get(self.ns, b"nokeys")), 256000)

    def test_keyed_mapping_faults_outside_writes(self):
        """Any store of the process into a keyed mapping, but the client's
        own copies, faults: after a put, and from one thread while another
        copies. Each case in a process of its own, which dies of
        SIGSEGV; the puts of the same process went in right."""
        if not self.keyed_supported():
            self.skipTest("no memory protection keys here")
        prog = textwrap.dedent("""
            import ctypes, sys, threading
            sys.path.insert(0, %r)
            import tidepool
            c = tidepool.Client(%r)
            ns, case = %r, sys.argv[1]
            v = bytes(range(256)) * 4096
            assert c.put_from(ns, b"fault-" + case.encode(), v) is False
            # The stores aim at a slot of this process's own, reserved and
            # never committed: nothing else is hit should one not fault.
            (r,) = c.reserve(ns, [(b"fault-slot-" + case.encode(), %d)])
            m = c._arenas[r.slot.arena].keyed_map()
            at = m.addr + r.slot.offset
            print("put", flush=True)
            if case == "after":
                ctypes.memset(at, 0, 1)
            elif case == "thread":
                # One thread copies into the slot in a loop; another stores.
                big = bytearray(r.slot.length)
                def writer():
                    while True:
                        tidepool.pkey.write_all([(m, r.slot.offset, big)])
                threading.Thread(target=writer, daemon=True).start()
                for _ in range(1000):
                    ctypes.memset(at + r.slot.length - 1, 0, 1)
            print("survived", flush=True)
        """) % (PKG_ROOT, SOCKET, self.ns, MAX_VALUE)
        for case in ("after", "thread"):
            p = subprocess.run([sys.executable, "-c", prog, case], timeout=60, capture_output=True, text=True)
            self.assertEqual(p.returncode, -11, "%s: rc %d, out %r, err %r" % (case, p.returncode, p.stdout, p.stderr[-500:]))
            self.assertEqual(p.stdout, "put\n", case)
            self.assertEqual(self.c.get(self.ns, b"fault-" + case.encode()), bytes(range(256)) * 4096)

    def test_damaged_arena_bytes_are_refused_when_verifying(self):
        # Hardening item 14 made the zero-copy reads verify by default;
        # issue 17 moved that check out of the read path (the sidecar
        # checks where bytes enter and scrubs resident blocks), so a client
        # that wants every read checked asks with verify=True. Damage a
        # committed block in the shared arena (as a stray write would) and
        # read it back verifying.
        value = payload(4 * KiB, 11)
        self.assertFalse(self.c.put_from(self.ns, b"dmg", value))
        (lease,), _ = self.c.acquire(self.ns, [b"dmg"])
        self.assertEqual(lease.code, tidepool.OK)
        self.assertEqual(self.c.release([lease.lease_id]), [tidepool.OK])
        path = self.c.hello().arenas[lease.slot.arena].path
        fd = os.open(path, os.O_RDWR)
        try:
            old = os.pread(fd, 1, lease.slot.offset + 100)
            os.pwrite(fd, bytes([old[0] ^ 0xFF]), lease.slot.offset + 100)
        finally:
            os.close(fd)
        with self.assertRaises(tidepool.Error) as cm:
            self.c.get_into(self.ns, b"dmg", bytearray(4 * KiB), verify=True)
        self.assertEqual(cm.exception.code, ErrorCode.CHECKSUM_MISMATCH)
        (lease,), _ = self.c.acquire(self.ns, [b"dmg"])
        try:
            with self.assertRaises(tidepool.Error) as cm:
                self.c.slot_view(lease, verify=True)
            self.assertEqual(cm.exception.code, ErrorCode.CHECKSUM_MISMATCH)
            raw = self.c.slot_view(lease.slot)  # the raw primitive: unchecked by design
            try:
                self.assertNotEqual(bytes(raw), value)
            finally:
                raw.release()
        finally:
            self.c.release([lease.lease_id])
        # An intact block still reads, checked, through both paths.
        self.assertFalse(self.c.put_from(self.ns, b"ok", value))
        self.assertEqual(self.c.get_into(self.ns, b"ok", bytearray(4 * KiB), verify=True), 4 * KiB)
        (lease,), _ = self.c.acquire(self.ns, [b"ok"])
        view = self.c.slot_view(lease, verify=True)
        try:
            self.assertEqual(bytes(view), value)
        finally:
            view.release()
            self.c.release([lease.lease_id])

    def test_views_and_writable_slots(self):
        value = payload(100 * KiB + 7, 5)
        (r,) = self.c.reserve(self.ns, [(b"w", len(value))])
        self.assertEqual(r.code, tidepool.OK, r.message)
        with self.c.writable_slot(r.slot) as view:
            self.assertEqual(len(view), len(value))
            view[:] = value
        self.assertEqual(self.c.commit([(r.token, None)]), [tidepool.OK])
        leases, deadline_ms = self.c.acquire(self.ns, [b"w"], lease_ms=5000)
        self.assertGreater(deadline_ms, time.time() * 1000)
        (lease,) = leases
        self.assertEqual(lease.code, tidepool.OK)
        self.assertEqual(lease.tier, "dram")
        view = self.c.slot_view(lease.slot)
        try:
            self.assertEqual(bytes(view), value)
            self.assertTrue(view.readonly)
            with self.assertRaises(TypeError):
                view[0] = 1
        finally:
            view.release()
        self.assertEqual(lease.checksum, tidepool.crc32c(value))
        codes, _ = self.c.renew([lease.lease_id], 5000)
        self.assertEqual(codes, [tidepool.OK])
        self.assertEqual(self.c.release([lease.lease_id]), [tidepool.OK])

    # ---- bad input: each gets a clear error or is cleaned up by deadline ---

    def test_commit_unknown_and_double(self):
        self.assertEqual(self.c.commit([12345]), [ErrorCode.LEASE_EXPIRED])
        (r,) = self.c.reserve(self.ns, [(b"d", 10)])
        self.c.write_slot(r.slot, b"0123456789")
        self.assertEqual(self.c.commit([(r.token, tidepool.crc32c(b"0123456789"))]), [tidepool.OK])
        self.assertEqual(self.c.commit([r.token]), [ErrorCode.LEASE_EXPIRED])
        self.assertEqual(self.c.abort([r.token]), [ErrorCode.LEASE_EXPIRED])

    def test_commit_wrong_checksum(self):
        (r,) = self.c.reserve(self.ns, [(b"crc", 10)])
        self.c.write_slot(r.slot, b"0123456789")
        self.assertEqual(self.c.commit([(r.token, 1)]), [ErrorCode.CHECKSUM_MISMATCH])
        self.assertIsNone(self.c.get(self.ns, b"crc"))

    def test_release_not_held(self):
        self.assertEqual(self.c.release([987654321]), [ErrorCode.LEASE_EXPIRED])
        self.c.put(self.ns, b"r", b"v")
        (lease,), _ = self.c.acquire(self.ns, [b"r"])
        self.assertEqual(self.c.release([lease.lease_id, lease.lease_id]), [tidepool.OK, ErrorCode.LEASE_EXPIRED])
        codes, _ = self.c.renew([lease.lease_id])
        self.assertEqual(codes, [ErrorCode.LEASE_EXPIRED])

    def test_reserve_too_large_and_no_space(self):
        (r,) = self.c.reserve(self.ns, [(b"big", MAX_VALUE + 1)])
        self.assertEqual(r.code, ErrorCode.TOO_LARGE, r.message)
        (r,) = self.c.reserve(self.ns, [(b"neg", -1)])
        self.assertEqual(r.code, ErrorCode.INVALID_ARGUMENT, r.message)
        n = CAPACITY // MAX_VALUE + 2
        rs = self.c.reserve(self.ns, [(b"fill-%d" % i, MAX_VALUE) for i in range(n)])
        codes = [r.code for r in rs]
        self.assertIn(ErrorCode.NO_SPACE, codes, "reservations beyond the tier's free space")
        self.assertNotIn(ErrorCode.INTERNAL, codes)
        ok = [r.token for r in rs if r.code == tidepool.OK]
        self.assertEqual(self.c.abort(ok), [tidepool.OK] * len(ok))
        # Aborted space is usable again.
        self.assertFalse(self.c.put_from(self.ns, b"after", payload(MAX_VALUE, 3)))

    def test_reserve_and_disconnect(self):
        other = tidepool.Client(SOCKET, framed=self.framed)
        (r,) = other.reserve(self.ns, [(b"abandoned", 1000)], ttl_ms=200)
        self.assertEqual(r.code, tidepool.OK)
        other.close()  # disconnects without commit or abort

        # After its deadline the token is unusable and nothing was published.
        poll(lambda: time.time() * 1000 > r.deadline_ms + 20, what="the reservation deadline")
        self.assertEqual(self.c.commit([r.token]), [ErrorCode.LEASE_EXPIRED])
        self.assertIsNone(self.c.get(self.ns, b"abandoned"))
        (r2,) = self.c.reserve(self.ns, [(b"abandoned", 10)])
        self.assertEqual(r2.code, tidepool.OK)
        self.c.abort([r2.token])

    def dram_used(self):
        return {t.name: t.used_bytes for t in self.c.stats().tiers}["dram"]

    def test_dying_client_with_leases(self):
        """A process that maps the arenas, pins a block and dies: the block's
        memory stays pinned only until the lease expires, and other clients'
        blocks are not affected."""
        mine = payload(64 * KiB, 11)
        self.c.put(self.ns, b"mine", mine)
        self.c.put_from(self.ns, b"pinned", payload(MAX_VALUE, 12))
        script = textwrap.dedent("""
            import os, sys
            sys.path.insert(0, %r)
            import tidepool
            c = tidepool.Client(%r)
            (l,), _ = c.acquire(%r, [b"pinned"], lease_ms=3000)
            assert l.code == tidepool.OK, l
            v = c.slot_view(l.slot)
            assert len(v) == %d
            os._exit(3)  # dies holding the lease and the mapping
        """) % (PKG_ROOT, SOCKET, self.ns, MAX_VALUE)
        t0 = time.monotonic()
        rc = subprocess.run([sys.executable, "-c", script], timeout=60).returncode
        self.assertEqual(rc, 3)
        # Deleting a pinned block unlinks it at once, but its memory stays
        # until the last lease ends: here, the dead client's deadline.
        self.assertTrue(self.c.delete(self.ns, b"pinned"))
        self.assertIsNone(self.c.get(self.ns, b"pinned"))
        used = self.dram_used()
        if time.monotonic() - t0 < 2.0:  # the 3 s lease surely still lives
            self.c.release([])  # a zero-copy call: the server sweeps expired leases
            self.assertGreaterEqual(self.dram_used(), used, "memory of a live lease was freed")

        def freed():
            self.c.release([])
            return self.dram_used() <= used - MAX_VALUE

        poll(freed, timeout=30, what="the dead client's lease to expire and free its block")
        self.assertEqual(self.c.get(self.ns, b"mine"), mine, "another client's block changed")


class BufferedClientTest(ClientTest):
    framed = False


SENTINEL = 0xEE


@unittest.skipUnless(SOCKET, "TIDEPOOL_SOCKET is not set; run scripts/test-python-client.sh")
@unittest.skipUnless(BUFFER_SOCKET, "the server does not list buffer_socket")
class BufferSocketTest(unittest.TestCase):
    """register_buffer; get_into and batch_get_into into registered memory
    over the buffer socket (the sidecar writes the block there itself; no
    Acquire); put_from and batch_put_from out of it (the sidecar copies the
    value; no Reserve, no Commit)."""

    def setUp(self):
        self.c = tidepool.Client(SOCKET)
        self.addCleanup(self.c.close)
        self.ns = "pybufsock/" + uuid.uuid4().hex[:12]
        self.addCleanup(lambda: self.c.clear(self.ns))
        self.acquires = 0
        self.arena_puts = 0  # Reserve and Commit calls
        acquire = self.c._c.Acquire

        def counted(req):
            self.acquires += 1
            return acquire(req)
        self.c._c.Acquire = counted
        for name in ("Reserve", "Commit"):
            def counted_put(req, fn=getattr(self.c._c, name)):  # noqa: B008 (bound per name, on purpose)
                self.arena_puts += 1
                return fn(req)
            setattr(self.c._c, name, counted_put)

    def register(self, size):
        b = self.c.register_buffer(size)
        b.view[:] = bytes([SENTINEL]) * size
        return b

    def assertUntouched(self, b, start, end):
        self.assertTrue(b.view[start:end] == bytes([SENTINEL]) * (end - start),
                        "bytes %d..%d of the buffer were written" % (start, end))

    def test_get_into_registered(self):
        b = self.register(4 * MiB)
        self.assertIsInstance(b, tidepool.RegisteredBuffer)
        self.assertNotEqual(b.id, 0)
        self.assertEqual(b.size, 4 * MiB)
        self.assertEqual(len(b.view), 4 * MiB)
        self.assertFalse(b.view.readonly)
        v = payload(64 * KiB + 3, 1)
        self.c.put(self.ns, b"v", v)
        # At offset 0, the whole view.
        self.assertEqual(self.c.get_into(self.ns, b"v", b.view), len(v))
        self.assertTrue(b.view[:len(v)] == v)
        self.assertUntouched(b, len(v), b.size)
        # At a nonzero offset, with room to spare.
        b.view[:] = bytes([SENTINEL]) * b.size
        off = 100003
        self.assertEqual(self.c.get_into(self.ns, b"v", b.view[off:off + len(v) + 10]), len(v))
        self.assertUntouched(b, 0, off)
        self.assertTrue(b.view[off:off + len(v)] == v)
        self.assertUntouched(b, off + len(v), b.size)
        # Exactly at the end; and a block of the largest size.
        self.assertEqual(self.c.get_into(self.ns, b"v", b.view[b.size - len(v):]), len(v))
        self.assertTrue(b.view[b.size - len(v):] == v)
        big = payload(MAX_VALUE, 2)
        self.c.put(self.ns, b"big", big)
        self.assertEqual(self.c.get_into(self.ns, b"big", b.view[MiB:], verify=True), MAX_VALUE)
        self.assertTrue(b.view[MiB:MiB + MAX_VALUE] == big)
        self.assertEqual(self.acquires, 0, "a registered buffer went through Acquire")

    def test_miss_too_large_and_errors(self):
        b = self.register(64 * KiB)
        self.assertIsNone(self.c.get_into(self.ns, b"absent", b.view))
        self.assertUntouched(b, 0, b.size)
        self.c.put(self.ns, b"10k", payload(10 * KiB, 3))
        with self.assertRaises(tidepool.Error) as cm:
            self.c.get_into(self.ns, b"10k", b.view[5:5 + KiB])
        self.assertEqual(cm.exception.code, ErrorCode.TOO_LARGE)
        self.assertUntouched(b, 0, b.size)
        with self.assertRaises(tidepool.Error) as cm:
            self.c.get_into(self.ns, b"", b.view)
        self.assertEqual(cm.exception.code, ErrorCode.INVALID_ARGUMENT)
        # The connection stays in step after per-call errors.
        self.assertEqual(self.c.get_into(self.ns, b"10k", b.view), 10 * KiB)
        self.assertTrue(b.view[:10 * KiB] == payload(10 * KiB, 3))
        self.assertEqual(self.acquires, 0)

    def test_verify(self):
        v = payload(4 * KiB, 4)
        self.c.put(self.ns, b"v", v)
        b = self.register(8 * KiB)
        self.assertEqual(self.c.get_into(self.ns, b"v", b.view[100:], verify=True), len(v))
        self.assertTrue(b.view[100:100 + len(v)] == v)
        # The client's check is of the bytes in the buffer against the
        # answered CRC-32C: made to disagree, it refuses; unverified reads
        # do not check.
        from tidepool import client as client_mod
        real = client_mod.crc32c
        client_mod.crc32c = lambda data: real(data) ^ 1
        try:
            with self.assertRaises(tidepool.Error) as cm:
                self.c.get_into(self.ns, b"v", b.view, verify=True)
            self.assertEqual(cm.exception.code, ErrorCode.CHECKSUM_MISMATCH)
            self.assertEqual(self.c.get_into(self.ns, b"v", b.view), len(v))
        finally:
            client_mod.crc32c = real

    def test_unregistered_buffers_take_the_arena_path(self):
        self.register(64 * KiB)  # the client has a registered buffer
        v = payload(3000, 5)
        self.c.put(self.ns, b"v", v)
        buf = bytearray(4 * KiB)
        self.assertEqual(self.c.get_into(self.ns, b"v", buf), len(v))
        self.assertEqual(bytes(buf[:len(v)]), v)
        self.assertEqual(self.acquires, 1)
        m = mmap.mmap(-1, 4 * KiB)
        self.assertEqual(self.c.get_into(self.ns, b"v", memoryview(m)), len(v))
        self.assertEqual(m[:len(v)], v)
        self.assertEqual(self.acquires, 2)
        # Another client's registered buffer is not this client's.
        other = tidepool.Client(SOCKET)
        self.addCleanup(other.close)
        ob = other.register_buffer(4 * KiB)
        self.assertEqual(self.c.get_into(self.ns, b"v", ob.view), len(v))
        self.assertEqual(self.acquires, 3)
        # A read-only buffer is refused as before.
        with self.assertRaises(TypeError):
            self.c.get_into(self.ns, b"v", bytes(4 * KiB))

    def test_close_buffer(self):
        """close() unregisters and unmaps; again does nothing. view is
        released; a slice kept from before still holds the memory, and
        get_into into it takes the arena path."""
        v = payload(5000, 6)
        self.c.put(self.ns, b"v", v)
        b = self.register(16 * KiB)
        self.assertEqual(self.c.get_into(self.ns, b"v", b.view), len(v))
        keep = b.view[:8 * KiB]
        b.close()
        self.assertTrue(b.closed)
        b.close()
        with self.assertRaises(ValueError):
            b.view[0]
        self.assertEqual(self.c.get_into(self.ns, b"v", keep[10:]), len(v))
        self.assertTrue(keep[10:10 + len(v)] == v)
        self.assertEqual(self.acquires, 1)
        keep.release()
        # The sidecar forgot the id: a GET with it is refused.
        code, _, _, _, _ = self.c._bconn.call(tidepool.bufsock.GET,
                                              tidepool.bufsock.get_body(b.id, 0, 8 * KiB, 0, self.ns, b"v"))
        self.assertEqual(code, ErrorCode.INVALID_ARGUMENT)
        with self.c.register_buffer(8 * KiB) as b2:
            self.assertEqual(self.c.get_into(self.ns, b"v", b2.view), len(v))
            self.assertTrue(b2.view[:len(v)] == v)
        self.assertTrue(b2.closed)
        self.assertEqual(self.c._bufs, [])

    def test_two_buffers(self):
        x, y = self.register(64 * KiB), self.register(64 * KiB)
        self.assertNotEqual(x.id, y.id)
        v1, v2 = payload(1000, 7), payload(2000, 8)
        self.c.put(self.ns, b"1", v1)
        self.c.put(self.ns, b"2", v2)
        self.assertEqual(self.c.get_into(self.ns, b"1", x.view[10:]), 1000)
        self.assertEqual(self.c.get_into(self.ns, b"2", y.view[20:]), 2000)
        self.assertTrue(x.view[10:1010] == v1)
        self.assertTrue(y.view[20:2020] == v2)
        self.assertUntouched(x, 0, 10)
        self.assertUntouched(x, 1010, x.size)
        self.assertUntouched(y, 0, 20)
        self.assertUntouched(y, 2020, y.size)
        x.close()
        self.assertEqual(self.c.get_into(self.ns, b"1", y.view[30 * KiB:]), 1000)
        self.assertTrue(y.view[30 * KiB:30 * KiB + 1000] == v1)
        self.assertEqual(self.acquires, 0)

    def test_client_close_ends_everything(self):
        c = tidepool.Client(SOCKET)
        x, y = c.register_buffer(4 * KiB), c.register_buffer(4 * KiB)
        conn = c._bconn
        self.c.put(self.ns, b"v", b"value")
        self.assertEqual(c.get_into(self.ns, b"v", x.view), 5)
        c.close()
        self.assertFalse(conn.alive)
        self.assertTrue(x.closed and y.closed)
        x.close()
        with self.assertRaises(ValueError):
            y.view[0]

    def test_failed_connection(self):
        """A failed buffer socket connection: the call on it raises
        UNAVAILABLE; get_into into a buffer registered on it raises
        UNAVAILABLE (re-register) without trying; close() still works and
        register_buffer opens a new connection."""
        self.c.put(self.ns, b"v", b"value")
        b = self.register(4 * KiB)
        first = self.c._bconn
        first.sock.shutdown(socket.SHUT_RDWR)  # as when the sidecar goes away
        with self.assertRaises(tidepool.Error) as cm:
            self.c.get_into(self.ns, b"v", b.view)
        self.assertEqual(cm.exception.code, ErrorCode.UNAVAILABLE)
        self.assertFalse(first.alive)
        with self.assertRaises(tidepool.Error) as cm:
            self.c.get_into(self.ns, b"v", b.view)
        self.assertEqual(cm.exception.code, ErrorCode.UNAVAILABLE)
        self.assertIn("re-register", cm.exception.message)
        for call in (lambda: self.c.put_from(self.ns, b"w", b.view[:10]),
                     lambda: self.c.batch_put_from(self.ns, [(b"w", b.view[:10])]),
                     lambda: self.c.batch_get_into(self.ns, [b"v"], [b.view])):
            with self.assertRaises(tidepool.Error) as cm:
                call()
            self.assertEqual(cm.exception.code, ErrorCode.UNAVAILABLE)
        b.close()
        b2 = self.c.register_buffer(4 * KiB)
        self.assertIsNot(self.c._bconn, first)
        self.assertEqual(self.c.get_into(self.ns, b"v", b2.view), 5)
        self.assertEqual(self.acquires, 0)
        self.assertIsNone(self.c.get(self.ns, b"w"))

    def count_crcs(self):
        """Counts the client's CRC-32C computations from here on."""
        from tidepool import client as client_mod
        real, n = client_mod.crc32c, [0]

        def counting(data):
            n[0] += 1
            return real(data)
        client_mod.crc32c = counting
        self.addCleanup(setattr, client_mod, "crc32c", real)
        return n

    def test_put_from_registered(self):
        b = self.register(MAX_VALUE + MiB)
        v = payload(100 * KiB + 3, 20)
        off = 12345
        b.view[off:off + len(v)] = v
        crcs = self.count_crcs()
        self.assertFalse(self.c.put_from(self.ns, b"p", b.view[off:off + len(v)]))
        self.assertEqual(self.c.get(self.ns, b"p"), v)
        self.assertEqual(crcs[0], 0, "a CRC-32C computed for an unverified put")
        # A second put of the key: existed, nothing written.
        b.view[off:off + 10] = b"0123456789"
        self.assertTrue(self.c.put_from(self.ns, b"p", b.view[off:off + len(v)]))
        self.assertEqual(self.c.get(self.ns, b"p"), v)
        # The largest value, at the end of the buffer.
        big = payload(MAX_VALUE, 21)
        b.view[b.size - MAX_VALUE:] = big
        self.assertFalse(self.c.put_from(self.ns, b"big", b.view[b.size - MAX_VALUE:], depth=3))
        self.assertEqual(self.c.get(self.ns, b"big"), big)
        self.assertEqual(self.arena_puts, 0, "a registered buffer went through Reserve or Commit")
        # verify=True sends the CRC-32C, which the sidecar checks.
        self.assertFalse(self.c.put_from(self.ns, b"pv", b.view[off:off + len(v)], verify=True))
        self.assertEqual(crcs[0], 1)
        self.assertEqual(self.c.get(self.ns, b"pv"), bytes(b.view[off:off + len(v)]))
        from tidepool import client as client_mod
        client_mod.crc32c = lambda data: tidepool.crc32c(data) ^ 1
        with self.assertRaises(tidepool.Error) as cm:
            self.c.put_from(self.ns, b"pbad", b.view[off:off + len(v)], verify=True)
        self.assertEqual(cm.exception.code, ErrorCode.CHECKSUM_MISMATCH)
        self.assertIsNone(self.c.get(self.ns, b"pbad"))
        self.assertFalse(self.c.put_from(self.ns, b"pbad", b.view[off:off + len(v)]))  # unverified: stored
        # Errors as put's: an empty key, a value over the limit.
        with self.assertRaises(tidepool.Error) as cm:
            self.c.put_from(self.ns, b"", b.view[:10])
        self.assertEqual(cm.exception.code, ErrorCode.INVALID_ARGUMENT)
        self.assertEqual(self.arena_puts, 0)

    def test_put_from_too_large(self):
        b = self.register(MAX_VALUE + 4 * KiB)
        with self.assertRaises(tidepool.Error) as cm:
            self.c.put_from(self.ns, b"big", b.view[:MAX_VALUE + 1])
        self.assertEqual(cm.exception.code, ErrorCode.TOO_LARGE)
        self.assertIsNone(self.c.get(self.ns, b"big"))
        self.assertEqual(self.arena_puts, 0)

    def test_batch_put_and_get_registered(self):
        n, size = 64, 64 * KiB
        src, dst = self.register(n * size), self.register(n * size + 4 * KiB)
        vals = [payload(size, 30 + i) for i in range(n)]
        for i, v in enumerate(vals):
            src.view[i * size:(i + 1) * size] = v
        keys = [b"bp-%d" % i for i in range(n)]
        crcs = self.count_crcs()
        items = [(k, src.view[i * size:(i + 1) * size], i) for i, k in enumerate(keys)]
        self.assertEqual(self.c.batch_put_from(self.ns, items), [tidepool.OK] * n)
        self.assertEqual(crcs[0], 0, "a CRC-32C computed for an unverified batch")
        self.assertEqual(self.arena_puts, 0, "a registered batch went through Reserve or Commit")
        # Stored keys are EXISTS, as through the arenas; new ones OK.
        more = items[:2] + [(b"bp-new", src.view[:100])]
        self.assertEqual(self.c.batch_put_from(self.ns, more), [tidepool.EXISTS] * 2 + [tidepool.OK])
        self.assertEqual(self.c.batch_put_from(self.ns, items[:1]), self.c.batch_put_from(self.ns, [
            (keys[0], bytes(vals[0]))]), "EXISTS differs between the paths")
        self.arena_puts = 0
        # Into another registered buffer, at offsets of their own.
        bufs = [dst.view[4 * KiB + i * size:4 * KiB + (i + 1) * size] for i in range(n)]
        self.assertEqual(self.c.batch_get_into(self.ns, keys, bufs, verify=True), [size] * n)
        self.assertEqual(self.acquires, 0, "a registered batch went through Acquire")
        for i, v in enumerate(vals):
            self.assertTrue(bufs[i] == v, i)
        self.assertUntouched(dst, 0, 4 * KiB)
        # Into plain bytearrays: the arena path, same answers.
        plain = [bytearray(size) for _ in range(n)]
        self.assertEqual(self.c.batch_get_into(self.ns, keys, plain), [size] * n)
        self.assertEqual(self.acquires, 1)
        self.assertEqual([bytes(p) for p in plain], vals)
        # verify=True on a registered batch checks each buffer: made to
        # disagree, it refuses.
        from tidepool import client as client_mod
        client_mod.crc32c = lambda data: tidepool.crc32c(data) ^ 1
        with self.assertRaises(tidepool.Error) as cm:
            self.c.batch_get_into(self.ns, keys[:2], bufs[:2], verify=True)
        self.assertEqual(cm.exception.code, ErrorCode.CHECKSUM_MISMATCH)
        # verify=True on a batch put sends each CRC-32C: here wrong, so
        # each item is refused and nothing stored.
        bad = [(b"bv-%d" % i, src.view[i * size:(i + 1) * size]) for i in range(3)]
        self.assertEqual(self.c.batch_put_from(self.ns, bad, verify=True), [ErrorCode.CHECKSUM_MISMATCH] * 3)
        self.assertEqual(self.c.batch_get(self.ns, [k for k, _ in bad]), [None] * 3)
        self.assertEqual(self.arena_puts, 0)
        self.assertEqual(self.acquires, 1)

    def test_batch_get_registered_miss_and_too_large(self):
        b = self.register(64 * KiB)
        v1, v2 = payload(1000, 40), payload(10 * KiB, 41)
        self.c.put(self.ns, b"1", v1)
        self.c.put(self.ns, b"2", v2)
        got = self.c.batch_get_into(self.ns, [b"1", b"missing", b"2"],
                                    [b.view[:2000], b.view[2000:4000], b.view[4000:20000]])
        self.assertEqual(got, [1000, None, 10 * KiB])
        self.assertTrue(b.view[:1000] == v1)
        self.assertUntouched(b, 1000, 4000)
        self.assertTrue(b.view[4000:4000 + 10 * KiB] == v2)
        # A buffer too short: TOO_LARGE once the batch is done (the other
        # keys were read; this one wrote nothing), as through the arenas.
        b.view[:] = bytes([SENTINEL]) * b.size
        with self.assertRaises(tidepool.Error) as cm:
            self.c.batch_get_into(self.ns, [b"2", b"1"], [b.view[:KiB], b.view[KiB:3 * KiB]])
        self.assertEqual(cm.exception.code, ErrorCode.TOO_LARGE)
        self.assertUntouched(b, 0, KiB)
        self.assertTrue(b.view[KiB:KiB + 1000] == v1)
        with self.assertRaises(tidepool.Error) as cm:
            self.c.batch_get_into(self.ns, [b"2", b"1"], [bytearray(KiB), bytearray(2 * KiB)])
        self.assertEqual(cm.exception.code, ErrorCode.TOO_LARGE)
        self.assertEqual(self.acquires, 1)
        # Other per-key errors raise too (an empty key).
        with self.assertRaises(tidepool.Error) as cm:
            self.c.batch_get_into(self.ns, [b"1", b""], [b.view[:2000], b.view[2000:4000]])
        self.assertEqual(cm.exception.code, ErrorCode.INVALID_ARGUMENT)
        self.assertEqual(self.acquires, 1)

    def test_batch_put_registered_too_large(self):
        b = self.register(MAX_VALUE + 4 * KiB)
        b.view[:100] = payload(100, 42)
        codes = self.c.batch_put_from(self.ns, [(b"ok", b.view[:100]), (b"big", b.view[:MAX_VALUE + 1])])
        self.assertEqual(codes, [tidepool.OK, ErrorCode.TOO_LARGE])
        self.assertEqual(self.c.batch_get(self.ns, [b"ok", b"big"]), [payload(100, 42), None])
        self.assertEqual(self.arena_puts, 0)

    def test_batch_over_max_batch(self):
        """A batch over max_batch is refused whole, BATCH_TOO_LARGE raised,
        on either path; the buffer socket connection stays usable."""
        n = self.c.hello().limits.max_batch + 1
        b = self.register(n)
        keys = [b"mb-%d" % i for i in range(n)]
        for items in ([(k, b.view[i:i + 1]) for i, k in enumerate(keys)], [(k, b"x") for k in keys]):
            with self.assertRaises(tidepool.Error) as cm:
                self.c.batch_put_from(self.ns, items)
            self.assertEqual(cm.exception.code, ErrorCode.BATCH_TOO_LARGE)
        self.assertEqual(self.arena_puts, 1)  # the plain batch's Reserve
        for bufs in ([b.view[i:i + 1] for i in range(n)], [bytearray(1) for _ in range(n)]):
            with self.assertRaises(tidepool.Error) as cm:
                self.c.batch_get_into(self.ns, keys, bufs)
            self.assertEqual(cm.exception.code, ErrorCode.BATCH_TOO_LARGE)
        self.assertEqual(self.acquires, 1)
        self.assertIsNone(self.c.get(self.ns, keys[0]))
        self.assertEqual(self.c.batch_put_from(self.ns, [(keys[0], b.view[:1])]), [tidepool.OK])
        self.assertEqual(self.arena_puts, 1)

    def test_mixed_buffers_take_the_arena_path(self):
        x, y = self.register(64 * KiB), self.register(64 * KiB)
        x.view[:1000] = payload(1000, 50)
        y.view[:1000] = payload(1000, 51)
        # Two registered buffers: Reserve and Commit.
        self.assertEqual(self.c.batch_put_from(self.ns, [(b"x", x.view[:1000]), (b"y", y.view[:1000])]),
                         [tidepool.OK] * 2)
        self.assertGreater(self.arena_puts, 0)
        puts = self.arena_puts
        # One registered, one not; and one of them empty.
        self.assertEqual(self.c.batch_put_from(self.ns, [(b"z", x.view[:10]), (b"w", b"plain")]), [tidepool.OK] * 2)
        self.assertEqual(self.c.batch_put_from(self.ns, [(b"e", x.view[:0]), (b"f", x.view[:10])]), [tidepool.OK] * 2)
        self.assertGreater(self.arena_puts, puts)
        self.assertEqual(self.c.batch_get(self.ns, [b"x", b"y", b"z", b"w", b"e", b"f"]),
                         [payload(1000, 50), payload(1000, 51), payload(10, 50), b"plain", b"", payload(10, 50)])
        x.view[:] = bytes([SENTINEL]) * x.size
        y.view[:] = bytes([SENTINEL]) * y.size
        plain = bytearray(1000)
        self.assertEqual(self.c.batch_get_into(self.ns, [b"x", b"y"], [y.view[:1000], x.view[:1000]]), [1000] * 2)
        self.assertEqual(self.acquires, 1)
        self.assertEqual(self.c.batch_get_into(self.ns, [b"x", b"y"], [x.view[:1000], plain]), [1000] * 2)
        self.assertEqual(self.acquires, 2)
        self.assertTrue(y.view[:1000] == payload(1000, 50) and x.view[:1000] == payload(1000, 50))
        self.assertEqual(bytes(plain), payload(1000, 51))
        # An empty batch asks nothing.
        self.assertEqual(self.c.batch_get_into(self.ns, [], []), [])
        self.assertEqual(self.c.batch_put_from(self.ns, []), [])


# The buffer socket's frames (bufsock.py, spelled out again here).
REQ = struct.Struct(">BBHI")
ANS = struct.Struct(">HHIQ")
ITEM = struct.Struct(">HIQ")
OP_REGISTER, OP_GET, OP_UNREGISTER, OP_PUT, OP_BATCH_GET, OP_BATCH_PUT = 1, 2, 3, 4, 5, 6
ALL_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


@unittest.skipUnless(SOCKET, "TIDEPOOL_SOCKET is not set; run scripts/test-python-client.sh")
@unittest.skipUnless(BUFFER_SOCKET, "the server does not list buffer_socket")
class BufferSocketWireTest(unittest.TestCase):
    """The buffer socket's protocol spoken by hand: what the server refuses."""

    def setUp(self):
        self.c = tidepool.Client(SOCKET)
        self.addCleanup(self.c.close)
        self.ns = "pybufwire/" + uuid.uuid4().hex[:12]
        self.addCleanup(lambda: self.c.clear(self.ns))

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(s.close)
        s.settimeout(10)
        s.connect(SOCKET + ".buf")
        return s

    def memfd(self, size, flags=os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING, seals=ALL_SEALS):
        fd = os.memfd_create("tp-wire-test", flags)
        self.addCleanup(os.close, fd)
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)  # the server refuses a file with holes
        if seals:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        return fd

    def call(self, s, op, body, fds=()):
        """(code, message, checksum, value)."""
        msg = REQ.pack(op, 1, 0, len(body)) + body
        sent = socket.send_fds(s, [msg], list(fds)) if fds else 0
        s.sendall(msg[sent:])
        code, mlen, crc, value = ANS.unpack(self.recv(s, ANS.size))
        return code, self.recv(s, mlen).decode(), crc, value

    def recv(self, s, n):
        out = b""
        while len(out) < n:
            chunk = s.recv(n - len(out))
            self.assertTrue(chunk, "the server closed the connection")
            out += chunk
        return out

    def get_body(self, buffer_id, offset, length, key):
        ns = self.ns.encode()
        return struct.pack(">QQQBH", buffer_id, offset, length, 0, len(ns)) + ns + struct.pack(">H", len(key)) + key

    def put_body(self, buffer_id, offset, length, key, flags=0, checksum=0):
        ns = self.ns.encode()
        return struct.pack(">QQQiBiIH", buffer_id, offset, length, 0, flags, 0, checksum, len(ns)) + ns \
            + struct.pack(">H", len(key)) + key

    def batch_get_body(self, buffer_id, items, count=None):
        """items: (offset, length, key); count: the count sent, if not
        len(items)."""
        ns = self.ns.encode()
        body = struct.pack(">QBH", buffer_id, 0, len(ns)) + ns + struct.pack(">H", len(items) if count is None else count)
        for offset, length, key in items:
            body += struct.pack(">QQH", offset, length, len(key)) + key
        return body

    def batch_put_body(self, buffer_id, items):
        """items: (offset, length, checksum or None, key)."""
        ns = self.ns.encode()
        body = struct.pack(">QBiH", buffer_id, 0, 0, len(ns)) + ns + struct.pack(">H", len(items))
        for offset, length, checksum, key in items:
            body += struct.pack(">QQiBIH", offset, length, 0, checksum is not None, checksum or 0, len(key)) + key
        return body

    def items(self, s, n):
        """The n items (code, checksum, value) after a batch answer."""
        return list(ITEM.iter_unpack(self.recv(s, n * ITEM.size)))

    def assertClosed(self, s):
        self.assertEqual(s.recv(1), b"", "the server kept the connection")

    def registered(self, s, size):
        """A buffer of size bytes registered on s: (id, mapping)."""
        fd = self.memfd(size)
        code, message, _, bid = self.call(s, OP_REGISTER, struct.pack(">Q", size), [fd])
        self.assertEqual(code, ErrorCode.OK, message)
        m = mmap.mmap(fd, size)
        self.addCleanup(m.close)
        return bid, m

    def test_register_get_unregister(self):
        v = payload(1000, 9)
        self.c.put(self.ns, b"v", v)
        s = self.connect()
        fd = self.memfd(64 * KiB)
        code, message, _, bid = self.call(s, OP_REGISTER, struct.pack(">Q", 64 * KiB), [fd])
        self.assertEqual(code, ErrorCode.OK, message)
        self.assertNotEqual(bid, 0)
        m = mmap.mmap(fd, 64 * KiB)
        self.addCleanup(m.close)
        code, message, crc, n = self.call(s, OP_GET, self.get_body(bid, 4 * KiB, 2000, b"v"))
        self.assertEqual((code, n, crc), (ErrorCode.OK, 1000, tidepool.crc32c(v)), message)
        self.assertEqual(m[4 * KiB:4 * KiB + 1000], v)
        # A range outside the buffer: refused, the connection kept.
        code, _, _, _ = self.call(s, OP_GET, self.get_body(bid, 63 * KiB, 2 * KiB, b"v"))
        self.assertEqual(code, ErrorCode.INVALID_ARGUMENT)
        code, message, _, value = self.call(s, OP_UNREGISTER, struct.pack(">Q", bid))
        self.assertEqual((code, value), (ErrorCode.OK, 0), message)
        code, _, _, _ = self.call(s, OP_GET, self.get_body(bid, 0, 2000, b"v"))
        self.assertEqual(code, ErrorCode.INVALID_ARGUMENT)

    def test_register_unsealed(self):
        for name, flags, seals in [("not sealable", os.MFD_CLOEXEC, 0),
                                   ("sealed against growing only", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING,
                                    fcntl.F_SEAL_GROW)]:
            with self.subTest(name):
                fd = self.memfd(64 * KiB, flags, seals)
                code, message, _, _ = self.call(self.connect(), OP_REGISTER, struct.pack(">Q", 64 * KiB), [fd])
                self.assertEqual(code, ErrorCode.INVALID_ARGUMENT, message)

    def test_register_without_fd(self):
        code, message, _, _ = self.call(self.connect(), OP_REGISTER, struct.pack(">Q", 64 * KiB))
        self.assertEqual(code, ErrorCode.INVALID_ARGUMENT, message)

    def test_get_unknown_id(self):
        s = self.connect()
        code, message, _, _ = self.call(s, OP_GET, self.get_body(random.getrandbits(64) | 1, 0, 4 * KiB, b"k"))
        self.assertEqual(code, ErrorCode.INVALID_ARGUMENT, message)
        # A per-call error: the connection is kept.
        code, message, _, _ = self.call(s, OP_REGISTER, struct.pack(">Q", 4 * KiB), [self.memfd(4 * KiB)])
        self.assertEqual(code, ErrorCode.OK, message)

    def test_put_checksum(self):
        """PUT with a checksum: a wrong one is CHECKSUM_MISMATCH and stores
        nothing (the connection kept); the right one stores; again: existed."""
        s = self.connect()
        bid, m = self.registered(s, 64 * KiB)
        v = payload(5000, 10)
        m[100:100 + len(v)] = v
        crc = tidepool.crc32c(v)
        code, message, _, value = self.call(s, OP_PUT, self.put_body(bid, 100, len(v), b"k", 2, crc ^ 1))
        self.assertEqual((code, value), (ErrorCode.CHECKSUM_MISMATCH, 0), message)
        self.assertIsNone(self.c.get(self.ns, b"k"))
        code, message, _, value = self.call(s, OP_PUT, self.put_body(bid, 100, len(v), b"k", 2, crc))
        self.assertEqual((code, value), (ErrorCode.OK, 0), message)
        self.assertEqual(self.c.get(self.ns, b"k"), v)
        code, message, _, value = self.call(s, OP_PUT, self.put_body(bid, 100, len(v), b"k", 2, crc))
        self.assertEqual((code, value), (ErrorCode.OK, 1), message)
        # A checksum without flag bit 1 is not looked at.
        code, message, _, value = self.call(s, OP_PUT, self.put_body(bid, 100, len(v), b"k2", 0, crc ^ 1))
        self.assertEqual((code, value), (ErrorCode.OK, 0), message)
        self.assertEqual(self.c.get(self.ns, b"k2"), v)
        # A range outside the buffer: refused, the connection kept.
        code, _, _, _ = self.call(s, OP_PUT, self.put_body(bid, 63 * KiB, 2 * KiB, b"k3"))
        self.assertEqual(code, ErrorCode.INVALID_ARGUMENT)
        self.assertIsNone(self.c.get(self.ns, b"k3"))
        code, message, _, _ = self.call(s, OP_UNREGISTER, struct.pack(">Q", bid))
        self.assertEqual(code, ErrorCode.OK, message)

    def test_put_bad_flags(self):
        """Flags other than bits 0 and 1: malformed; the connection closes."""
        s = self.connect()
        bid, m = self.registered(s, 4 * KiB)
        code, message, _, _ = self.call(s, OP_PUT, self.put_body(bid, 0, 10, b"k", 1 << 2))
        self.assertEqual(code, ErrorCode.INVALID_ARGUMENT, message)
        self.assertClosed(s)
        self.assertIsNone(self.c.get(self.ns, b"k"))

    def test_batch_get_count_past_items(self):
        """A count larger than the items present: malformed; closed."""
        self.c.put(self.ns, b"v", b"value")
        s = self.connect()
        bid, _ = self.registered(s, 4 * KiB)
        code, message, _, value = self.call(s, OP_BATCH_GET, self.batch_get_body(bid, [(0, 100, b"v")], count=3))
        self.assertEqual((code, value), (ErrorCode.INVALID_ARGUMENT, 0), message)
        self.assertClosed(s)

    def test_batch_get_unknown_id(self):
        """An unknown buffer id: an INVALID_ARGUMENT per item, the head OK,
        the connection kept."""
        self.c.put(self.ns, b"v", b"value")
        s = self.connect()
        items = [(0, 100, b"v"), (100, 100, b"missing")]
        code, message, _, n = self.call(s, OP_BATCH_GET, self.batch_get_body(random.getrandbits(64) | 1, items))
        self.assertEqual((code, n), (ErrorCode.OK, 2), message)
        self.assertEqual(self.items(s, n), [(ErrorCode.INVALID_ARGUMENT, 0, 0)] * 2)
        bid, m = self.registered(s, 4 * KiB)
        code, message, _, n = self.call(s, OP_BATCH_GET, self.batch_get_body(bid, items))
        self.assertEqual((code, n), (ErrorCode.OK, 2), message)
        self.assertEqual(self.items(s, n),
                         [(ErrorCode.OK, tidepool.crc32c(b"value"), 5), (ErrorCode.NOT_FOUND, 0, 0)])
        self.assertEqual(m[:5], b"value")

    def test_batch_put(self):
        """BATCH_PUT's items: a wrong checksum, a right one, none, a stored
        key (value 1), a range outside the buffer."""
        self.c.put(self.ns, b"old", b"old value")
        s = self.connect()
        bid, m = self.registered(s, 4 * KiB)
        v = payload(3000, 11)
        m[:len(v)] = v
        crc = tidepool.crc32c(v)
        code, message, _, n = self.call(s, OP_BATCH_PUT, self.batch_put_body(bid, [
            (0, 3000, crc ^ 1, b"bad"), (0, 3000, crc, b"good"), (0, 1000, None, b"plain"), (0, 10, None, b"old"),
            (4000, 1000, None, b"outside")]))
        self.assertEqual((code, n), (ErrorCode.OK, 5), message)
        self.assertEqual([(c, val) for c, _, val in self.items(s, n)],
                         [(ErrorCode.CHECKSUM_MISMATCH, 0), (ErrorCode.OK, 0), (ErrorCode.OK, 0), (ErrorCode.OK, 1),
                          (ErrorCode.INVALID_ARGUMENT, 0)])
        self.assertEqual(self.c.batch_get(self.ns, [b"bad", b"good", b"plain", b"old", b"outside"]),
                         [None, v, v[:1000], b"old value", None])


if __name__ == "__main__":
    unittest.main()
