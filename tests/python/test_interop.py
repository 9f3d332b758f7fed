#!/usr/bin/env python3
"""Interop test: a plain Apache Thrift Python client against `tidepool serve`.

Run through scripts/test-python.sh, which starts the server, generates the
bindings with `thrift --gen py` from idl/tidepool.thrift and sets:

  TIDEPOOL_SOCKET           path of the server's Unix socket (required)
  TIDEPOOL_MAX_VALUE_BYTES  the server's --max-value-size in bytes (2 MiB)

Every test runs twice, over TBufferedTransport and over TFramedTransport,
always with TBinaryProtocol (strict), each on its own connection. Every test
uses its own namespaces, so tests do not depend on each other.
"""

import hashlib
import mmap
import os
import sys
import time
import unittest
import uuid

from thrift.Thrift import TApplicationException
from thrift.protocol import TBinaryProtocol
from thrift.transport import TSocket, TTransport

from tidepool import Tidepool
from tidepool.ttypes import (
    AbortRequest,
    AcquireRequest,
    BatchExistsRequest,
    BatchGetRequest,
    BatchPutRequest,
    ClearRequest,
    CommitItem,
    CommitRequest,
    DeleteRequest,
    ErrorCode,
    ExistsRequest,
    GetRequest,
    HelloRequest,
    LookupRequest,
    Member,
    MembersRequest,
    PrefetchRequest,
    PutItem,
    PutRequest,
    ReleaseRequest,
    RenewRequest,
    ReserveItem,
    ReserveRequest,
    Scope,
    StatsRequest,
    TidepoolError,
)

KiB = 1024
MiB = 1024 * KiB

SOCKET = os.environ.get("TIDEPOOL_SOCKET", "")
MAX_VALUE_BYTES = int(os.environ.get("TIDEPOOL_MAX_VALUE_BYTES", str(2 * MiB)))
MAX_KEY_BYTES = 128  # DESIGN.md §3: a block key is at most 128 bytes.
CLIENT_VERSION = 1
SOCKET_TIMEOUT_MS = 30000


def code_name(code):
    return ErrorCode._VALUES_TO_NAMES.get(code, str(code))


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data):
    """CRC-32C (Castagnoli), the checksum every tidepool block carries."""
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC32C[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def as_i32(u):
    """The IDL carries checksums as i32: the same 32 bits, signed."""
    return u - (1 << 32) if u >= 1 << 31 else u


def field_name(struct, field_id):
    """Python attribute of a struct field, looked up by its Thrift id."""
    return {spec[0]: spec[2] for spec in struct.thrift_spec if spec}[field_id]


def payload(n, seed):
    """n deterministic, non-repeating bytes that differ per seed."""
    return hashlib.shake_256(b"tidepool-%d" % seed).digest(n)


class InteropCases:
    """The test cases; mixed into one TestCase class per transport."""

    transport_class = None  # TTransport.TBufferedTransport or TFramedTransport

    def setUp(self):
        sock = TSocket.TSocket(unix_socket=SOCKET)
        sock.setTimeout(SOCKET_TIMEOUT_MS)
        self.transport = self.transport_class(sock)
        self.transport.open()
        self.addCleanup(self.transport.close)
        proto = TBinaryProtocol.TBinaryProtocol(self.transport)
        self.client = Tidepool.Client(proto)

    # ---- helpers ----------------------------------------------------------

    def new_ns(self):
        """A namespace no other test (or earlier run) uses, cleared afterwards
        so the server's namespace count stays low (max_namespaces)."""
        ns = "py-" + uuid.uuid4().hex[:16]

        def clear():
            try:
                self.client.Clear(ClearRequest(ns=ns))
            except Exception:  # hygiene only; test_clear checks Clear
                pass

        self.addCleanup(clear)
        return ns

    def hello(self):
        return self.client.Hello(
            HelloRequest(client_version=CLIENT_VERSION, client_name="python-interop")
        )

    def put(self, ns, key, value, depth=0):
        return self.client.Put(PutRequest(ns=ns, key=key, value=value, depth=depth))

    def get(self, ns, key):
        return self.client.Get(GetRequest(ns=ns, key=key))

    def lookup(self, ns, keys):
        return self.client.Lookup(LookupRequest(ns=ns, keys=keys)).matched

    def assertFound(self, ns, key, value):
        resp = self.get(ns, key)
        self.assertTrue(resp.found, "Get(%s, %r): found=False" % (ns, key[:16]))
        self.assertEqual(len(resp.value or b""), len(value))
        self.assertTrue(resp.value == value, "Get(%s, %r): value differs" % (ns, key[:16]))
        return resp

    def assertMissing(self, ns, key):
        resp = self.get(ns, key)
        self.assertFalse(resp.found, "Get(%s, %r): found=True" % (ns, key[:16]))
        self.assertIn(resp.value, (None, b""))

    def assertTidepoolError(self, code, fn, *args):
        """fn(*args) raises TidepoolError(code) and the connection still works."""
        with self.assertRaises(TidepoolError) as cm:
            fn(*args)
        err = cm.exception
        self.assertEqual(
            err.code,
            code,
            "want %s, got %s (%r)" % (code_name(code), code_name(err.code), err.message),
        )
        self.assertTrue(err.message, "TidepoolError without a message")
        # The error reply must leave the stream in sync for the next call.
        self.assertGreater(self.hello().server_version, 0)

    # ---- Hello ------------------------------------------------------------

    def test_hello(self):
        resp = self.hello()
        self.assertGreater(resp.server_version, 0)
        self.assertIsNotNone(resp.limits, "Hello: no limits")
        self.assertEqual(resp.limits.max_key_bytes, MAX_KEY_BYTES)
        self.assertEqual(resp.limits.max_value_bytes, MAX_VALUE_BYTES)
        self.assertGreater(resp.limits.max_batch, 0)
        self.assertGreater(resp.limits.max_namespace_bytes, 0)
        self.assertTrue(resp.tiers, "Hello: no tiers")
        for tier in resp.tiers:
            self.assertTrue(tier.name)
            self.assertGreaterEqual(tier.capacity_bytes, 0)

    # ---- Put / Get --------------------------------------------------------

    def test_put_get_roundtrip(self):
        ns = self.new_ns()
        cases = [
            ("1B", b"k-1", 1),
            ("4KiB", b"k-4k", 4 * KiB),
            ("1MiB", b"k-1m", 1 * MiB),
            ("binary-key", bytes(range(256))[:MAX_KEY_BYTES], 4 * KiB),
            ("max-key", b"m" * MAX_KEY_BYTES, 64),
            ("max-value", b"k-max", MAX_VALUE_BYTES),
        ]
        for i, (name, key, size) in enumerate(cases):
            with self.subTest(name):
                value = payload(size, i)
                resp = self.put(ns, key, value)
                self.assertFalse(resp.existed)
                got = self.assertFound(ns, key, value)
                self.assertTrue(got.tier, "Get: empty tier")

    def test_put_existing_key(self):
        ns = self.new_ns()
        first, second = payload(100, 1), payload(100, 2)
        self.assertFalse(self.put(ns, b"dup", first).existed)
        self.assertTrue(self.put(ns, b"dup", second).existed)
        # The second put was a no-op: the first value stays.
        self.assertFound(ns, b"dup", first)

    def test_get_missing(self):
        ns = self.new_ns()
        self.assertMissing(ns, b"never-put")
        self.put(ns, b"present", b"x")
        self.assertMissing(ns, b"still-never-put")

    def test_namespaces_are_separate(self):
        a, b = self.new_ns(), self.new_ns()
        self.put(a, b"shared-key", b"in-a")
        self.assertMissing(b, b"shared-key")
        self.put(b, b"shared-key", b"in-b")
        self.assertFound(a, b"shared-key", b"in-a")
        self.assertFound(b, b"shared-key", b"in-b")

    # ---- BatchPut / BatchGet ----------------------------------------------

    def test_batch_put_get(self):
        ns = self.new_ns()
        values = {b"b-%d" % i: payload(1000 * (i + 1), i) for i in range(3)}
        items = [PutItem(key=k, value=v, depth=i) for i, (k, v) in enumerate(values.items())]
        resp = self.client.BatchPut(BatchPutRequest(ns=ns, items=items))
        self.assertEqual(len(resp.results), len(items))
        for i, r in enumerate(resp.results):
            self.assertEqual(r.code, ErrorCode.OK, "item %d: %s %r" % (i, code_name(r.code), r.message))

        keys = [b"b-0", b"missing", b"b-1", b"b-2"]
        resp = self.client.BatchGet(BatchGetRequest(ns=ns, keys=keys))
        self.assertEqual(len(resp.results), len(keys))
        for key, r in zip(keys, resp.results):
            if key in values:
                self.assertEqual(r.code, ErrorCode.OK, "%r: %s" % (key, code_name(r.code)))
                self.assertTrue(r.value == values[key], "%r: value differs" % key)
                self.assertTrue(r.tier)
            else:
                self.assertEqual(r.code, ErrorCode.NOT_FOUND, "%r: %s" % (key, code_name(r.code)))
                self.assertIn(r.value, (None, b""))

        # Items put singly are visible to BatchGet and vice versa.
        self.assertFound(ns, b"b-1", values[b"b-1"])

    def test_batch_put_existing_item(self):
        ns = self.new_ns()
        self.put(ns, b"old", b"original")
        items = [PutItem(key=b"old", value=b"replacement"), PutItem(key=b"new", value=b"fresh")]
        resp = self.client.BatchPut(BatchPutRequest(ns=ns, items=items))
        self.assertEqual(len(resp.results), 2)
        # An existing key is reported per item as EXISTS and is not overwritten.
        self.assertEqual(resp.results[0].code, ErrorCode.EXISTS, code_name(resp.results[0].code))
        self.assertEqual(resp.results[1].code, ErrorCode.OK, code_name(resp.results[1].code))
        self.assertFound(ns, b"old", b"original")
        self.assertFound(ns, b"new", b"fresh")

    # ---- Exists / BatchExists ---------------------------------------------

    def test_exists(self):
        ns = self.new_ns()
        self.put(ns, b"here", payload(10, 3))
        resp = self.client.Exists(ExistsRequest(ns=ns, key=b"here"))
        self.assertTrue(resp.present)
        self.assertTrue(resp.tier, "Exists: empty tier for a present key")
        resp = self.client.Exists(ExistsRequest(ns=ns, key=b"gone"))
        self.assertFalse(resp.present)

        keys = [b"gone", b"here", b"also-gone"]
        resp = self.client.BatchExists(BatchExistsRequest(ns=ns, keys=keys))
        self.assertEqual([r.present for r in resp.results], [False, True, False])

    # ---- Lookup -----------------------------------------------------------

    def test_lookup_prefix(self):
        ns = self.new_ns()
        chain = [b"chain-%d" % i for i in range(5)]
        for depth, key in enumerate(chain[:3]):
            self.put(ns, key, payload(256, depth), depth=depth)
        self.assertEqual(self.lookup(ns, chain), 3, "first 3 of 5 present")

        # Only the leading run counts: a gap stops the match.
        self.put(ns, chain[4], b"tail", depth=4)
        self.assertEqual(self.lookup(ns, chain), 3, "keys 0-2 and 4 present")
        self.put(ns, chain[3], b"fill", depth=3)
        self.assertEqual(self.lookup(ns, chain), 5, "all 5 present")

        # Missing head: nothing matches.
        other = self.new_ns()
        self.put(other, chain[1], b"x", depth=1)
        self.assertEqual(self.lookup(other, chain), 0, "only key 1 present")

    # ---- Delete / Clear ---------------------------------------------------

    def test_delete(self):
        ns = self.new_ns()
        self.put(ns, b"doomed", b"value")
        self.put(ns, b"kept", b"value")
        self.assertTrue(self.client.Delete(DeleteRequest(ns=ns, key=b"doomed")).deleted)
        self.assertMissing(ns, b"doomed")
        self.assertFalse(self.client.Exists(ExistsRequest(ns=ns, key=b"doomed")).present)
        self.assertFalse(self.client.Delete(DeleteRequest(ns=ns, key=b"doomed")).deleted)
        self.assertFound(ns, b"kept", b"value")
        # A deleted key can be put again.
        self.assertFalse(self.put(ns, b"doomed", b"again").existed)
        self.assertFound(ns, b"doomed", b"again")

    def test_clear(self):
        ns, bystander = self.new_ns(), self.new_ns()
        for i in range(3):
            self.put(ns, b"c-%d" % i, payload(100, i))
        self.put(bystander, b"c-0", b"survives")
        self.assertEqual(self.client.Clear(ClearRequest(ns=ns)).removed, 3)
        for i in range(3):
            self.assertMissing(ns, b"c-%d" % i)
        self.assertEqual(self.lookup(ns, [b"c-0"]), 0, "after Clear")
        self.assertFound(bystander, b"c-0", b"survives")

    # ---- Stats ------------------------------------------------------------

    def test_stats(self):
        ns = self.new_ns()
        self.put(ns, b"s-0", payload(100, 0))
        self.put(ns, b"s-1", payload(200, 1))
        self.assertFound(ns, b"s-0", payload(100, 0))

        resp = self.client.Stats(StatsRequest(ns=""))
        self.assertTrue(resp.tiers, "Stats: no tiers")
        self.assertGreaterEqual(resp.uptime_ms, 0)
        by_ns = {s.ns: s for s in resp.namespaces}
        self.assertIn(ns, by_ns, "Stats(all) does not list the namespace")
        st = by_ns[ns]
        self.assertEqual(st.blocks, 2)
        self.assertGreaterEqual(st.bytes, 300)
        self.assertGreaterEqual(st.puts, 2)
        self.assertGreaterEqual(st.hits, 1)

        resp = self.client.Stats(StatsRequest(ns=ns))
        self.assertIn(ns, [s.ns for s in resp.namespaces], "Stats(ns) does not list the namespace")

    # ---- errors -----------------------------------------------------------

    def test_key_too_long(self):
        ns = self.new_ns()
        key = b"k" * (MAX_KEY_BYTES + 1)
        self.assertTidepoolError(ErrorCode.INVALID_ARGUMENT, self.put, ns, key, b"v")
        self.assertTidepoolError(ErrorCode.INVALID_ARGUMENT, self.get, ns, key)

    def test_empty_key(self):
        ns = self.new_ns()
        self.assertTidepoolError(ErrorCode.INVALID_ARGUMENT, self.put, ns, b"", b"v")
        self.assertTidepoolError(ErrorCode.INVALID_ARGUMENT, self.get, ns, b"")

    def test_empty_namespace(self):
        self.assertTidepoolError(ErrorCode.INVALID_ARGUMENT, self.put, "", b"key", b"v")
        self.assertTidepoolError(ErrorCode.INVALID_ARGUMENT, self.get, "", b"key")

    def test_value_too_large(self):
        ns = self.new_ns()
        big = payload(3 * MiB, 9)
        self.assertGreater(len(big), MAX_VALUE_BYTES)
        self.assertTidepoolError(ErrorCode.TOO_LARGE, self.put, ns, b"big", big)
        self.assertMissing(ns, b"big")

    def test_batch_too_large(self):
        ns = self.new_ns()
        max_batch = self.hello().limits.max_batch
        if max_batch > 100000:
            self.skipTest("max_batch %d too large to exercise" % max_batch)
        over = [b"o-%d" % i for i in range(max_batch + 1)]
        items = [PutItem(key=k, value=b"v") for k in over]
        self.assertTidepoolError(
            ErrorCode.BATCH_TOO_LARGE, self.client.BatchPut, BatchPutRequest(ns=ns, items=items)
        )
        self.assertTidepoolError(
            ErrorCode.BATCH_TOO_LARGE, self.client.BatchGet, BatchGetRequest(ns=ns, keys=over)
        )
        self.assertTidepoolError(
            ErrorCode.BATCH_TOO_LARGE, self.client.BatchExists, BatchExistsRequest(ns=ns, keys=over)
        )
        self.assertTidepoolError(
            ErrorCode.BATCH_TOO_LARGE, self.client.Lookup, LookupRequest(ns=ns, keys=over)
        )
        # Nothing of the refused BatchPut was stored.
        self.assertMissing(ns, over[0])

        # Exactly max_batch is accepted.
        resp = self.client.BatchGet(BatchGetRequest(ns=ns, keys=over[:max_batch]))
        self.assertEqual(len(resp.results), max_batch)
        self.assertTrue(all(r.code == ErrorCode.NOT_FOUND for r in resp.results))

    # ---- Scope, durable puts, Prefetch, Members -----------------------------

    def test_local_scope(self):
        ns = self.new_ns()
        self.put(ns, b"sc-0", b"v0")
        for scope in (Scope.DEFAULT, Scope.LOCAL):
            name = Scope._VALUES_TO_NAMES[scope]
            with self.subTest(name):
                resp = self.client.Get(GetRequest(ns=ns, key=b"sc-0", scope=scope))
                self.assertTrue(resp.found and resp.value == b"v0")
                resp = self.client.Exists(ExistsRequest(ns=ns, key=b"sc-0", scope=scope))
                self.assertTrue(resp.present)
                resp = self.client.Lookup(LookupRequest(ns=ns, keys=[b"sc-0", b"sc-1"], scope=scope))
                self.assertEqual(resp.matched, 1)

    def test_durable_put(self):
        if "ssd" not in [t.name for t in self.hello().tiers]:
            self.skipTest("server has no ssd tier")
        ns = self.new_ns()
        value = payload(8 * KiB, 30)
        resp = self.client.Put(PutRequest(ns=ns, key=b"d-0", value=value, durable=True))
        self.assertFalse(resp.existed)
        self.assertFound(ns, b"d-0", value)
        resp = self.client.BatchPut(
            BatchPutRequest(ns=ns, items=[PutItem(key=b"d-1", value=value)], durable=True)
        )
        self.assertEqual([r.code for r in resp.results], [ErrorCode.OK])
        self.assertFound(ns, b"d-1", value)

    def test_prefetch(self):
        ns = self.new_ns()
        self.put(ns, b"pf-0", b"v")
        keys = [b"pf-0", b"pf-missing"]
        queued = self.client.Prefetch(PrefetchRequest(ns=ns, keys=keys)).queued
        self.assertGreaterEqual(queued, 0)
        self.assertLessEqual(queued, len(keys))
        self.assertFound(ns, b"pf-0", b"v")

    def test_members(self):
        node_id = self.hello().node_id
        members = self.client.Members(MembersRequest()).members
        self.assertGreaterEqual(len(members), 1)
        is_self = field_name(Member, 6)
        mine = [m for m in members if getattr(m, is_self)]
        self.assertEqual(len(mine), 1, "exactly one member is this node")
        self.assertEqual(mine[0].name, node_id)
        self.assertTrue(mine[0].state)

    # ---- zero copy: Reserve/Commit/Abort, Acquire/Renew/Release ------------

    def shared_arenas(self):
        """{id: ArenaInfo} from Hello; skips when the server shares none."""
        arenas = self.hello().arenas
        if not arenas:
            self.skipTest("server advertises no shared arenas (zero-copy off)")
        for a in arenas:
            self.assertTrue(os.path.isabs(a.path), a.path)
            self.assertGreater(a.size, 0)
        return {a.id: a for a in arenas}

    def map_arena(self, arena, writable):
        f = open(arena.path, "r+b" if writable else "rb")
        self.addCleanup(f.close)
        m = mmap.mmap(
            f.fileno(), arena.size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        )
        self.addCleanup(m.close)
        return m

    def slot_view(self, arenas, maps, slot, writable=False):
        """(mapping, start, end) of a slot, after checking it fits its arena."""
        self.assertIn(slot.arena, arenas, "slot in an arena Hello did not list")
        arena = arenas[slot.arena]
        self.assertGreaterEqual(slot.offset, 0)
        self.assertLessEqual(slot.offset + slot.length, arena.size)
        key = (slot.arena, writable)
        if key not in maps:
            maps[key] = self.map_arena(arena, writable)
        return maps[key], slot.offset, slot.offset + slot.length

    def reserve(self, ns, values):
        items = [ReserveItem(key=k, size=len(v), depth=i) for i, (k, v) in enumerate(values)]
        return self.client.Reserve(ReserveRequest(ns=ns, items=items)).results

    def test_reserve_commit(self):
        arenas, maps = self.shared_arenas(), {}
        ns = self.new_ns()
        values = [(b"zc-0", payload(4 * KiB, 40)), (b"zc-1", payload(64 * KiB + 3, 41))]
        results = self.reserve(ns, values)
        self.assertEqual(len(results), len(values))
        commits = []
        for i, ((key, value), r) in enumerate(zip(values, results)):
            self.assertEqual(r.code, ErrorCode.OK, "%r: %s %r" % (key, code_name(r.code), r.message))
            self.assertEqual(r.slot.length, len(value))
            self.assertGreater(r.deadline_unix_ms, int(time.time() * 1000) - 1000)
            m, start, end = self.slot_view(arenas, maps, r.slot, writable=True)
            m[start:end] = value
            # The first item sends its checksum, the second lets the server compute it.
            if i == 0:
                commits.append(CommitItem(token=r.token, has_checksum=True, checksum=as_i32(crc32c(value))))
            else:
                commits.append(CommitItem(token=r.token, has_checksum=False))
        # Reserved is not yet visible.
        self.assertMissing(ns, b"zc-0")
        resp = self.client.Commit(CommitRequest(items=commits))
        self.assertEqual([code_name(r.code) for r in resp.results], ["OK", "OK"])
        for key, value in values:
            self.assertFound(ns, key, value)
        # Reserving a key that exists: EXISTS, nothing to write.
        again = self.reserve(ns, values[:1])
        self.assertEqual(again[0].code, ErrorCode.EXISTS, code_name(again[0].code))

    def test_commit_checksum_mismatch(self):
        arenas, maps = self.shared_arenas(), {}
        ns = self.new_ns()
        value = payload(4 * KiB, 42)
        (r,) = self.reserve(ns, [(b"bad-crc", value)])
        self.assertEqual(r.code, ErrorCode.OK, code_name(r.code))
        m, start, end = self.slot_view(arenas, maps, r.slot, writable=True)
        m[start:end] = value
        wrong = as_i32(crc32c(value) ^ 1)
        resp = self.client.Commit(CommitRequest(items=[CommitItem(token=r.token, has_checksum=True, checksum=wrong)]))
        self.assertEqual(resp.results[0].code, ErrorCode.CHECKSUM_MISMATCH, code_name(resp.results[0].code))
        self.assertMissing(ns, b"bad-crc")

    def test_abort(self):
        self.shared_arenas()
        ns = self.new_ns()
        (r,) = self.reserve(ns, [(b"aborted", payload(1 * KiB, 43))])
        self.assertEqual(r.code, ErrorCode.OK, code_name(r.code))
        resp = self.client.Abort(AbortRequest(tokens=[r.token]))
        self.assertEqual(resp.results[0].code, ErrorCode.OK, code_name(resp.results[0].code))
        self.assertMissing(ns, b"aborted")
        # An aborted reservation cannot be committed.
        resp = self.client.Commit(CommitRequest(items=[CommitItem(token=r.token)]))
        self.assertNotEqual(resp.results[0].code, ErrorCode.OK)
        self.assertMissing(ns, b"aborted")

    def test_acquire_renew_release(self):
        arenas, maps = self.shared_arenas(), {}
        ns = self.new_ns()
        values = {b"aq-0": payload(4 * KiB, 44), b"aq-1": payload(256 * KiB + 1, 45)}
        for key, value in values.items():
            self.put(ns, key, value)
        keys = [b"aq-0", b"aq-missing", b"aq-1"]
        resp = self.client.Acquire(AcquireRequest(ns=ns, keys=keys))
        self.assertEqual(len(resp.results), len(keys))
        self.assertGreater(resp.deadline_unix_ms, int(time.time() * 1000))
        leases = []
        for key, lease in zip(keys, resp.results):
            if key not in values:
                self.assertEqual(lease.code, ErrorCode.NOT_FOUND, code_name(lease.code))
                continue
            self.assertEqual(lease.code, ErrorCode.OK, "%r: %s" % (key, code_name(lease.code)))
            self.assertTrue(lease.tier)
            self.assertEqual(lease.slot.length, len(values[key]))
            m, start, end = self.slot_view(arenas, maps, lease.slot)
            self.assertTrue(m[start:end] == values[key], "%r: arena bytes differ" % key)
            self.assertEqual(lease.checksum, as_i32(crc32c(values[key])))
            leases.append(lease.lease_id)
        resp = self.client.Renew(RenewRequest(lease_ids=leases, lease_ms=5000))
        self.assertEqual([code_name(r.code) for r in resp.results], ["OK"] * len(leases))
        resp = self.client.Release(ReleaseRequest(lease_ids=leases))
        self.assertEqual([code_name(r.code) for r in resp.results], ["OK"] * len(leases))
        # Released blocks can still be read and deleted.
        self.assertFound(ns, b"aq-1", values[b"aq-1"])
        self.assertTrue(self.client.Delete(DeleteRequest(ns=ns, key=b"aq-0")).deleted)


class BufferedTransportTest(InteropCases, unittest.TestCase):
    transport_class = TTransport.TBufferedTransport


class FramedTransportTest(InteropCases, unittest.TestCase):
    transport_class = TTransport.TFramedTransport


class PutSocketTest(unittest.TestCase):
    """The put socket beside the engine socket (`<socket>.put`): a plain
    Thrift client's Put there (binary protocol, unframed; the generated
    encoder puts the value before depth, so the server reads it whole)
    stores what the engine socket reads back; errors arrive as on the
    engine socket; another method is UNKNOWN_METHOD."""

    def connect(self, path):
        sock = TSocket.TSocket(unix_socket=path)
        sock.setTimeout(SOCKET_TIMEOUT_MS)
        transport = TTransport.TBufferedTransport(sock)
        transport.open()
        self.addCleanup(transport.close)
        return Tidepool.Client(TBinaryProtocol.TBinaryProtocol(transport))

    def setUp(self):
        self.engine = self.connect(SOCKET)
        hello = self.engine.Hello(HelloRequest(client_version=CLIENT_VERSION, client_name="python-interop"))
        if "put_socket" not in (hello.features or []):
            self.skipTest("the server does not list put_socket")
        self.puts = self.connect(SOCKET + ".put")
        self.ns = "py-" + uuid.uuid4().hex[:16]
        self.addCleanup(lambda: self.engine.Clear(ClearRequest(ns=self.ns)))

    def test_put_roundtrip(self):
        for i, size in enumerate([1, 4 * KiB, 1 * MiB, MAX_VALUE_BYTES]):
            with self.subTest(size=size):
                key, value = b"ps-%d" % i, payload(size, 100 + i)
                self.assertFalse(self.puts.Put(PutRequest(ns=self.ns, key=key, value=value, depth=i)).existed)
                got = self.engine.Get(GetRequest(ns=self.ns, key=key))
                self.assertTrue(got.found)
                self.assertTrue(got.value == value, "value differs")
                self.assertTrue(self.puts.Put(PutRequest(ns=self.ns, key=key, value=value)).existed)

    def test_errors_keep_the_connection(self):
        for code, req in [
            (ErrorCode.TOO_LARGE, PutRequest(ns=self.ns, key=b"big", value=b"x" * (MAX_VALUE_BYTES + 1))),
            (ErrorCode.INVALID_ARGUMENT, PutRequest(ns=self.ns, key=b"", value=b"x")),
            (ErrorCode.INVALID_ARGUMENT, PutRequest(ns=self.ns, key=b"k" * (MAX_KEY_BYTES + 1), value=b"x")),
        ]:
            with self.subTest(code=code_name(code)):
                with self.assertRaises(TidepoolError) as cm:
                    self.puts.Put(req)
                self.assertEqual(cm.exception.code, code, code_name(cm.exception.code))
        self.assertFalse(self.engine.Get(GetRequest(ns=self.ns, key=b"big")).found)
        self.assertFalse(self.puts.Put(PutRequest(ns=self.ns, key=b"after", value=b"v")).existed)

    def test_other_methods_refused(self):
        with self.assertRaises(TApplicationException) as cm:
            self.puts.Get(GetRequest(ns=self.ns, key=b"k"))
        self.assertEqual(cm.exception.type, TApplicationException.UNKNOWN_METHOD)
        self.assertFalse(self.puts.Put(PutRequest(ns=self.ns, key=b"after", value=b"v")).existed)


if __name__ == "__main__":
    if not SOCKET:
        sys.exit("TIDEPOOL_SOCKET is not set; run scripts/test-python.sh")
    unittest.main()
