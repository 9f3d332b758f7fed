#!/usr/bin/env python3
"""KV events against a real `tidepool serve`, decoded by a subscriber written
with pyzmq and msgpack (Debian's python3-zmq and python3-msgpack), not by
anything of the project's: what llm-d's indexer or Dynamo's router would
receive (docs/events.md).

Run by scripts/test-python-client.sh (TIDEPOOL_BIN names the binary; the
test starts its own servers on scratch directories and loopback ports):

  - a scripted workload: puts with token ids (inline, batch and zero-copy
    commit), a delete, evictions forced by a small DRAM budget (demotion to
    SSD), a promotion back into DRAM, a clear; every event is present, in
    order, under gapless sequence numbers, with the token ids, parent hash
    and block size sent with the put;
  - a subscriber process killed with SIGKILL misses events; a new one
    reconnects and recovers the gap through the replay socket;
  - a restart that keeps the SSD tier publishes a startup snapshot of it;
    replay from sequence 0 gives the full state;
  - bad input: a token list not matching the block size, a huge token
    list, garbage on the replay socket: a clear error or a dropped request,
    and nothing else changes;
  - two clustered sidecars: blocks put on one with token ids and read
    through the other (which fetches them from their owner) are published
    by the reader with the same token ids, parent hash and block size.

Where the vLLM package is importable (the engines venv), every payload is
also re-encoded with vLLM's own KVEventBatch classes (msgspec) and must be
byte for byte what the sidecar sent.
"""

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import zmq

try:
    import msgpack

    def unpack(b):
        return msgpack.unpackb(b, raw=False, strict_map_key=False)
except ImportError:  # the engines venv has msgspec's msgpack instead
    import msgspec

    def unpack(b):
        return msgspec.msgpack.decode(b)

from tidepool import BlockMeta, Client, ErrorCode, Error, OK, Scope

BIN = os.environ.get("TIDEPOOL_BIN", "bin/tidepool")
NS = "evt/model-a"
POD = "pod-a"
BS = 4  # tokens per block
VALUE = 4 << 20  # 4 MiB blocks: 16 fill the DRAM budget below
DRAM = "64MiB"
DEADLINE_S = 30.0

try:  # vLLM's own classes, when this interpreter has them
    import msgspec
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
    HAVE_VLLM = True
except Exception:  # noqa: BLE001
    HAVE_VLLM = False


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def hash_int(key):
    return int.from_bytes(key[-8:], "big")


def key_of(i):
    return hashlib.sha256(b"block %d" % i).digest()


def tokens_of(i):
    return [1000 + i * BS + j for j in range(BS)]


class Server:
    def __init__(self, tmp, pub, rep, pod=POD, extra=()):
        self.tmp, self.pub, self.rep = tmp, pub, rep
        self.pod, self.extra = pod, list(extra)
        self.sock = os.path.join(tmp, "tp.sock")
        self.proc = None

    def start(self):
        env = dict(os.environ, POD_NAME=self.pod)
        if getattr(self, "log", None):
            self.log.close()
        self.log = open(os.path.join(self.tmp, "server.log"), "ab")
        self.metrics = free_port()
        self.proc = subprocess.Popen(
            [BIN, "serve", "--socket", self.sock, "--data-dir", os.path.join(self.tmp, "data"),
             "--arena-dir", os.path.join(self.tmp, "arenas"), "--dram-capacity", DRAM,
             "--arena-size", "16MiB", "--ssd-capacity", "1GiB", "--scrub-rate", "0",
             "--max-value-size", "8MiB", "--metrics-addr", "127.0.0.1:%d" % self.metrics,
             "--log-level", "warn", "--kv-events-endpoint", "tcp://127.0.0.1:%d" % self.pub,
             "--kv-events-replay-endpoint", "tcp://127.0.0.1:%d" % self.rep] + self.extra,
            env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("serve exited: %s" % self.read_log())
            try:
                c = Client(self.sock)
                c.hello()
                return c
            except Exception:  # noqa: BLE001
                time.sleep(0.1)
        raise RuntimeError("serve not ready: %s" % self.read_log())

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if getattr(self, "log", None):
            self.log.close()
            self.log = None

    def read_log(self):
        with open(os.path.join(self.tmp, "server.log"), "rb") as f:
            return f.read().decode(errors="replace")[-4000:]

    def metric(self, name):
        body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.metrics, timeout=5).read().decode()
        total = 0.0
        for line in body.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total


def decode(payload):
    batch = unpack(payload)
    assert isinstance(batch, list) and len(batch) == 3, batch
    ts, events, rank = batch
    assert isinstance(ts, float) and rank == 0
    if HAVE_VLLM:  # the pinned vLLM encodes the same batch to the same bytes
        evs = []
        for e in events:
            cls = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved,
                   "AllBlocksCleared": AllBlocksCleared}[e["type"]]
            evs.append(cls(**{k: v for k, v in e.items() if k != "type"}))
        again = msgspec.msgpack.encode(KVEventBatch(ts=ts, events=evs, data_parallel_rank=0))
        assert again == payload, "vLLM's encoding differs:\n%r\n%r" % (again, payload)
    return events


class Subscriber:
    """A SUB socket on the PUB endpoint and a DEALER on the replay one."""

    def __init__(self, pub, rep):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.connect("tcp://127.0.0.1:%d" % pub)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.rep_ep = "tcp://127.0.0.1:%d" % rep
        self.batches = {}  # seq -> (topic, events)
        self.last = None

    def close(self):
        self.sub.close(0)
        self.ctx.term()

    def recv(self, timeout_s):
        if not self.sub.poll(int(timeout_s * 1000)):
            return None
        topic, seq, payload = self.sub.recv_multipart()
        return topic.decode(), int.from_bytes(seq, "big"), payload

    def replay(self, start):
        d = self.ctx.socket(zmq.DEALER)
        d.connect(self.rep_ep)
        d.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        try:
            while True:
                if not d.poll(int(DEADLINE_S * 1000)):
                    raise AssertionError("replay: no answer")
                parts = d.recv_multipart()
                assert len(parts) == 4 and parts[0] == b"", parts
                seq = int.from_bytes(parts[2], "big", signed=True)
                if seq == -1:
                    return out
                out.append((parts[1].decode(), seq, parts[3]))
        finally:
            d.close(0)

    def take(self, topic, seq, payload):
        """Applies one batch; a gap is filled from the replay socket first."""
        if self.last is not None and seq <= self.last:
            return
        if self.last is not None and seq > self.last + 1:
            for t, s, p in self.replay(self.last + 1):
                self.take_one(t, s, p)
            if seq <= self.last:
                return
        self.take_one(topic, seq, payload)

    def take_one(self, topic, seq, payload):
        if self.last is not None and seq <= self.last:
            return
        self.batches[seq] = (topic, decode(payload))
        self.last = seq

    def drain(self, until, timeout_s=DEADLINE_S):
        """Receives until until(events so far) holds."""
        deadline = time.monotonic() + timeout_s
        while not until(self.events()):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("events not seen in %.0fs; got %s" % (timeout_s, self.events()[-20:]))
            m = self.recv(min(left, 1.0))
            if m is not None:
                self.take(*m)

    def events(self):
        out = []
        for seq in sorted(self.batches):
            topic, evs = self.batches[seq]
            out.extend((seq, topic, e) for e in evs)
        return out

    def gapless(self):
        seqs = sorted(self.batches)
        return seqs == list(range(seqs[0], seqs[-1] + 1))


def find(events, typ, key=None, medium=None):
    out = []
    for i, (_seq, _topic, e) in enumerate(events):
        if e["type"] != typ:
            continue
        if key is not None and hash_int(key) not in e.get("block_hashes", []):
            continue
        if medium is not None and e.get("medium") != medium:
            continue
        out.append(i)
    return out


SUB_CHILD = r"""
import sys, zmq, json
ctx = zmq.Context(); s = ctx.socket(zmq.SUB); s.connect(sys.argv[1]); s.setsockopt(zmq.SUBSCRIBE, b"kv@")
out = open(sys.argv[2], "a")
while True:
    t, q, p = s.recv_multipart()
    out.write(json.dumps(int.from_bytes(q, "big")) + "\n"); out.flush()
"""


class KVEventsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tp-kvev-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.pub, self.rep = free_port(), free_port()
        self.srv = Server(self.tmp, self.pub, self.rep)
        self.c = self.srv.start()
        self.subs = []

    def tearDown(self):
        for s in self.subs:
            s.close()
        self.c.close()
        self.srv.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def subscriber(self):
        s = Subscriber(self.pub, self.rep)
        self.subs.append(s)
        # The startup snapshot (sequence 0...) is history: take it by
        # replay, then live batches (a PUB drops what it publishes before a
        # subscription arrives, so a warm-up put is repeated until one is
        # seen).
        for t, q, p in s.replay(0):
            s.take_one(t, q, p)
        warm = b"warm-up-key-" + os.urandom(8)
        deadline = time.monotonic() + DEADLINE_S
        while True:
            self.c.delete("warm/up", warm)
            self.c.put("warm/up", warm, b"x")
            m = s.recv(0.5)
            if m is not None:
                s.take(*m)
                break
            self.assertLess(time.monotonic(), deadline, "no live batch")
        return s

    def put_chain(self, first, n, how="put"):
        keys = []
        for i in range(first, first + n):
            parent = key_of(i - 1) if i > first else None
            meta = BlockMeta(tokens_of(i), parent, BS)
            if how == "put":
                self.assertFalse(self.c.put(NS, key_of(i), bytes([i % 256]) * VALUE, depth=i - first, meta=meta))
            elif how == "batch":
                self.assertEqual(self.c.batch_put(NS, [(key_of(i), bytes([i % 256]) * VALUE, i - first, meta)]), [OK])
            else:
                r = self.c.reserve(NS, [(key_of(i), VALUE, i - first)])[0]
                self.assertEqual(r.code, OK)
                self.c.write_slot(r.slot, [bytes([i % 256]) * VALUE])
                self.assertEqual(self.c.commit([(r.token, None, meta)]), [OK])
            keys.append(key_of(i))
        return keys

    def check_stored(self, e, i):
        self.assertEqual(e["block_hashes"], [hash_int(key_of(i))])
        self.assertEqual(e["token_ids"], tokens_of(i))
        self.assertEqual(e["block_size"], BS)
        self.assertIsNone(e["lora_id"])

    def test_workload(self):
        s = self.subscriber()
        topic = "kv@%s@%s" % (POD, NS)
        # Puts with token ids: inline, batch and zero-copy commit.
        self.put_chain(0, 3, "put")
        self.put_chain(3, 2, "batch")
        self.put_chain(5, 1, "commit")
        s.drain(lambda ev: all(find(ev, "BlockStored", key_of(i), "CPU") for i in range(6)))
        ev = s.events()
        for i in range(6):
            j = find(ev, "BlockStored", key_of(i), "CPU")[0]
            self.assertEqual(ev[j][1], topic)
            self.check_stored(ev[j][2], i)
            first = i in (0, 3, 5)  # the chains put_chain made
            self.assertEqual(ev[j][2]["parent_block_hash"], None if first else hash_int(key_of(i - 1)))
        self.assertIsNone(ev[find(ev, "BlockStored", key_of(0), "CPU")[0]][2]["parent_block_hash"])
        self.assertEqual(ev[find(ev, "BlockStored", key_of(1), "CPU")[0]][2]["parent_block_hash"], hash_int(key_of(0)))
        # A delete.
        self.assertTrue(self.c.delete(NS, key_of(5)))
        s.drain(lambda ev: find(ev, "BlockRemoved", key_of(5), "CPU"))
        # Evictions: 20 more blocks of 4 MiB through a 64 MiB DRAM budget
        # demote the oldest to SSD: removed from CPU, stored in STORAGE,
        # with the token ids the put carried.
        self.put_chain(10, 20, "put")
        cand = [i for i in list(range(5)) + list(range(10, 30))]

        def demoted(ev):
            return [i for i in cand if find(ev, "BlockRemoved", key_of(i), "CPU") and
                    find(ev, "BlockStored", key_of(i), "STORAGE")]
        s.drain(demoted)
        ev = s.events()
        d = demoted(ev)[0]
        rm = find(ev, "BlockRemoved", key_of(d), "CPU")[0]
        st = find(ev, "BlockStored", key_of(d), "STORAGE")[0]
        self.assertLess(find(ev, "BlockStored", key_of(d), "CPU")[0], rm)
        self.check_stored(ev[st][2], d)
        # Promotion back: a Get of the demoted block stores it in DRAM again.
        self.assertEqual(self.c.get(NS, key_of(d))[:4], bytes([d % 256]) * 4)
        s.drain(lambda ev: len(find(ev, "BlockStored", key_of(d), "CPU")) == 2)
        ev = s.events()
        self.assertGreater(find(ev, "BlockStored", key_of(d), "CPU")[1], rm)
        self.check_stored(ev[find(ev, "BlockStored", key_of(d), "CPU")[1]][2], d)
        # A clear.
        self.assertGreater(self.c.clear(NS), 0)
        s.drain(lambda ev: find(ev, "AllBlocksCleared"))
        ev = s.events()
        j = find(ev, "AllBlocksCleared")[0]
        self.assertEqual(ev[j][1], topic)
        self.assertTrue(s.gapless(), sorted(s.batches))
        # Every change in order: per key, stored and removed alternate per
        # medium, starting with stored.
        state = {}
        for _seq, t, e in ev[:j]:
            if t != topic:
                continue
            for h in e.get("block_hashes", []):
                k = (h, e["medium"])
                if e["type"] == "BlockStored":
                    self.assertFalse(state.get(k), "stored twice: %s" % (k,))
                    state[k] = True
                else:
                    self.assertTrue(state.get(k), "removed before stored: %s" % (k,))
                    state[k] = False
        self.assertEqual(self.srv.metric("tidepool_kv_events_dropped_total"), 0)
        self.assertGreaterEqual(self.srv.metric("tidepool_kv_events_subscribers"), 1)

    def test_killed_subscriber_recovers_gap_by_replay(self):
        seen = os.path.join(self.tmp, "seen.jsonl")
        child = subprocess.Popen([sys.executable, "-c", SUB_CHILD, "tcp://127.0.0.1:%d" % self.pub, seen])
        try:
            deadline = time.monotonic() + DEADLINE_S
            i = 100
            while not (os.path.exists(seen) and os.path.getsize(seen) > 0):
                self.c.put(NS, key_of(i), b"v", meta=BlockMeta(tokens_of(i), None, BS))
                i += 1
                time.sleep(0.05)
                self.assertLess(time.monotonic(), deadline, "child saw nothing")
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        with open(seen) as f:
            last = max(json.loads(l) for l in f if l.strip())
        # Missed while nobody listened.
        self.put_chain(200, 5, "put")
        s = Subscriber(self.pub, self.rep)
        self.subs.append(s)
        s.last = last
        # The next live batch shows the gap; take() fills it by replay.
        deadline = time.monotonic() + DEADLINE_S
        while not all(find(s.events(), "BlockStored", key_of(i), "CPU") for i in range(200, 205)):
            self.c.put("warm/up", os.urandom(16), b"x")
            m = s.recv(0.5)
            if m is not None:
                s.take(*m)
            self.assertLess(time.monotonic(), deadline, "gap not recovered")
        self.assertEqual(min(s.batches), last + 1)
        self.assertTrue(s.gapless())
        for i in range(200, 205):
            e = s.events()[find(s.events(), "BlockStored", key_of(i), "CPU")[0]][2]
            self.check_stored(e, i)
        self.assertGreater(self.srv.metric("tidepool_kv_events_replayed_total"), 0)

    def test_restart_with_ssd_publishes_snapshot(self):
        """The startup snapshot after a restart that kept the SSD tier
        describes every block as it was put: token ids, parent hash and
        block size, whether the block reached SSD by demotion (DRAM
        pressure) or by the stop spill; a block promoted back into DRAM
        after the restart is stored in CPU with them too."""
        # 20 blocks of 4 MiB through a 64 MiB DRAM budget: the oldest are
        # demoted while serving, the rest spilled at the stop.
        n, first = 20, 300
        self.put_chain(first, n, "put")
        deadline = time.monotonic() + DEADLINE_S
        while self.srv.metric("tidepool_demotions_total") < 1:
            self.assertLess(time.monotonic(), deadline, "nothing demoted")
            time.sleep(0.1)
        self.c.close()
        self.srv.stop()  # SIGTERM: a clean stop spills DRAM into SSD
        self.c = self.srv.start()
        s = Subscriber(self.pub, self.rep)
        self.subs.append(s)
        snap = s.replay(0)
        self.assertEqual(snap[0][1], 0)
        evs = [e for t, q, p in snap for e in decode(p)]
        for i in range(first, first + n):
            got = [e for e in evs if e["type"] == "BlockStored" and e["medium"] == "STORAGE"
                   and e["block_hashes"] == [hash_int(key_of(i))]]
            self.assertEqual(len(got), 1, "block %d not in the startup snapshot" % i)
            self.check_stored(got[0], i)
            self.assertEqual(got[0]["parent_block_hash"], None if i == first else hash_int(key_of(i - 1)))
        # Promotion back into DRAM, seen live.
        for t, q, p in s.replay(0):
            s.take_one(t, q, p)
        self.assertEqual(self.c.get(NS, key_of(first))[:4], bytes([first % 256]) * 4)
        s.drain(lambda ev: find(ev, "BlockStored", key_of(first), "CPU"))
        ev = s.events()
        self.check_stored(ev[find(ev, "BlockStored", key_of(first), "CPU")[0]][2], first)

    def test_bad_input(self):
        s = self.subscriber()
        # Token ids not matching the block size.
        with self.assertRaises(Error) as cm:
            self.c.put(NS, key_of(400), b"v", meta=BlockMeta([1, 2, 3], None, BS))
        self.assertEqual(cm.exception.code, ErrorCode.INVALID_ARGUMENT)
        self.assertIn("token_ids", str(cm.exception))
        # A huge token list.
        with self.assertRaises(Error) as cm:
            self.c.put(NS, key_of(401), b"v", meta=BlockMeta(list(range(100000)), None, 100000))
        self.assertEqual(cm.exception.code, ErrorCode.INVALID_ARGUMENT)
        self.assertEqual(self.c.batch_put(NS, [(key_of(402), b"v", 0, BlockMeta([1], None, BS))]),
                         [ErrorCode.INVALID_ARGUMENT])
        for i in (400, 401, 402):
            self.assertIsNone(self.c.get(NS, key_of(i)))
        # Garbage on the replay socket: raw bytes (the connection is
        # closed) and a DEALER sending a request that is not one (dropped,
        # counted).
        g = socket.create_connection(("127.0.0.1", self.rep))
        g.sendall(os.urandom(200) + b"\xff" * 64)
        g.settimeout(10)
        try:
            while g.recv(4096):
                pass
        except (ConnectionResetError, socket.timeout):
            pass
        g.close()
        d = s.ctx.socket(zmq.DEALER)
        d.connect(s.rep_ep)
        d.send_multipart([b"", b"abc"])
        d.send_multipart([b"x" * 9])
        deadline = time.monotonic() + DEADLINE_S
        while self.srv.metric("tidepool_kv_events_bad_requests_total") < 2:
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.1)
        d.close(0)
        # Nothing else changed: no event for the refused puts, the stream
        # goes on, replay still answers.
        self.put_chain(410, 1, "put")
        s.drain(lambda ev: find(ev, "BlockStored", key_of(410), "CPU"))
        for i in (400, 401, 402):
            self.assertFalse(find(s.events(), "BlockStored", key_of(i)))
        self.assertTrue(s.replay(0))
        self.assertTrue(s.gapless())


class ClusterFetchTest(unittest.TestCase):
    """Two clustered sidecars (pod-a, pod-b): a block put on pod-a with its
    description and owned by pod-a reaches pod-b only by a fetch (a read
    through pod-b); pod-b's BlockStored for its copy carries the token ids,
    parent hash and block size the put on pod-a carried."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tp-kvev-cl-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.srvs, self.clients, self.subs = [], [], []
        gossip = None
        for pod in ("pod-a", "pod-b"):
            d = os.path.join(self.tmp, pod)
            os.mkdir(d)
            g = "127.0.0.1:%d" % free_port()
            extra = ["--gossip-addr", g, "--peer-addr", "127.0.0.1:%d" % free_port(),
                     "--transfer-addr", "127.0.0.1:%d" % free_port(), "--cluster-label", "kvev-test",
                     "--insecure-cluster", "true", "--ssd-capacity", "0"]
            if gossip:
                extra += ["--join", gossip]
            gossip = gossip or g
            srv = Server(d, free_port(), free_port(), pod=pod, extra=extra)
            self.srvs.append(srv)
            self.clients.append(srv.start())

    def tearDown(self):
        for s in self.subs:
            s.close()
        for c in self.clients:
            c.close()
        for srv in self.srvs:
            srv.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def alive(self, srv):
        out = subprocess.run([BIN, "members", "--json", "--socket", srv.sock, "--timeout", "5s"],
                             capture_output=True, timeout=30)
        if out.returncode != 0:
            return set()
        return {m["name"] for m in json.loads(out.stdout) if m["state"] == "alive"}

    def test_fetched_block_published_with_description(self):
        a, b = self.clients
        deadline = time.monotonic() + 60
        while not all(self.alive(srv) == {"pod-a", "pod-b"} for srv in self.srvs):
            self.assertLess(time.monotonic(), deadline, "the two sidecars never saw each other")
            time.sleep(0.2)
        # pod-b's subscriber, live (warm-up puts on pod-b until one is seen).
        srv_b = self.srvs[1]
        s = Subscriber(srv_b.pub, srv_b.rep)
        self.subs.append(s)
        while True:
            warm = b"warm-up-key-" + os.urandom(8)
            b.put("warm/up", warm, b"x")
            m = s.recv(0.5)
            if m is not None:
                s.take(*m)
                break
            self.assertLess(time.monotonic(), deadline, "no live batch")
        # Blocks put on pod-a until three are pod-a's own: pod-b finds them
        # in the cluster (at pod-a) but holds none (a block pod-b owns is
        # pushed there, and once pod-b sees it in the cluster it has it).
        mine, i = [], 700
        while len(mine) < 3:
            self.assertLess(i, 800, "no three blocks owned by pod-a in 100")
            meta = BlockMeta(tokens_of(i), key_of(i - 1), BS)
            self.assertFalse(a.put(NS, key_of(i), bytes([i % 256]) * 65536, meta=meta))
            while not b.exists(NS, key_of(i), Scope.CLUSTER).present:
                self.assertLess(time.monotonic(), deadline + 60, "pod-b never found block %d" % i)
                time.sleep(0.05)
            if not b.exists(NS, key_of(i), Scope.LOCAL).present:
                mine.append(i)
            i += 1
        for i in mine:
            self.assertFalse(find(s.events(), "BlockStored", key_of(i)))
            self.assertEqual(b.get(NS, key_of(i), Scope.CLUSTER), bytes([i % 256]) * 65536)
        s.drain(lambda ev: all(find(ev, "BlockStored", key_of(i), "CPU") for i in mine))
        ev = s.events()
        for i in mine:
            seq, topic, e = ev[find(ev, "BlockStored", key_of(i), "CPU")[0]]
            self.assertEqual(topic, "kv@pod-b@%s" % NS)
            self.check_stored(e, i)
            self.assertEqual(e["parent_block_hash"], hash_int(key_of(i - 1)))

    check_stored = KVEventsTest.check_stored


if __name__ == "__main__":
    unittest.main()
