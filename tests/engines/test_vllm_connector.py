"""End-to-end tests of tidepool.vllm.TidepoolConnector: real vLLM (CPU build)
engines in separate processes, real `tidepool serve` processes.

Run with scripts/test-engines.sh (make test-engines), which installs the
venv (scripts/install-engines.sh) and builds bin/tidepool. Every engine
runs tests/engines/run_engine.py in its own process with a tiny seeded
Llama written here (no download, no tokenizer, token-id prompts).

Tolerance: greedy token ids must be equal and each of the top-5 logprobs
of every generated position must agree within ABS_TOL (1e-4): the same
float32 kernels on the same machine give bit-equal results in practice;
the tolerance only leaves room for summation order. The negative control
must differ by more than 100x ABS_TOL.
"""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, HERE)

import tidepool  # noqa: E402
from run_engine import vllm_hashes_of, write_tiny_llama  # noqa: E402
from sidecar import Sidecar, free_port, poll  # noqa: E402

BIN = os.path.join(ROOT, "bin", "tidepool")
BLOCK = 32  # the CPU attention backend wants a multiple of 32
ABS_TOL = 1e-4
ENGINE_TIMEOUT_S = float(os.environ.get("ENGINE_TIMEOUT_S", "600"))


def kv_config(socket, **extra):
    x = {"socket": socket, "timeout_s": 5.0, "retry_s": 0.5}
    x.update(extra)
    return {"kv_connector": "TidepoolConnector", "kv_connector_module_path": "tidepool.vllm",
            "kv_role": "kv_both", "kv_connector_extra_config": x}


class EngineRun:
    """Runs run_engine.py in a fresh process and returns its JSON."""

    def __init__(self, root):
        self.root = root
        self.n = 0

    def __call__(self, model, prompts, kv=None, max_tokens=6, background=False, multiprocess=False, hooks=None,
                 **spec_extra):
        self.n += 1
        extra_env = spec_extra.pop("env", {})
        spec = os.path.join(self.root, "spec%d.json" % self.n)
        out = os.path.join(self.root, "out%d.json" % self.n)
        log = os.path.join(self.root, "engine%d.log" % self.n)
        with open(spec, "w") as f:
            d = {"model": model, "prompts": prompts, "max_tokens": max_tokens,
                 "kv_transfer_config": kv, "logprobs": 5, "block_size": BLOCK, "hooks": hooks}
            d.update(spec_extra)
            json.dump(d, f)
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1" if multiprocess else "0",
                   VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
        env.update(extra_env)
        env.pop("PYTHONHASHSEED", None)
        with open(log, "wb") as logf:
            p = subprocess.Popen([sys.executable, os.path.join(HERE, "run_engine.py"), spec, out],
                                 stdout=logf, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
        if background:
            return p, out, log
        return self.finish(p, out, log)

    def finish(self, p, out, log):
        try:
            rc = p.wait(timeout=ENGINE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = "timeout"
        with open(log, errors="replace") as f:
            text = f.read()
        if rc != 0:
            raise AssertionError("engine exited with %s:\n%s" % (rc, text[-6000:]))
        with open(out) as f:
            res = json.load(f)
        res["log"] = text
        return res


def cluster_pair(tmp, start_sidecar, start_second=True):
    """Two sidecars of one secured cluster (gossip key, peer secret); the
    second joins the first. start_sidecar(name, extra) starts one. With
    start_second False the second is returned unstarted (a Sidecar whose
    start() joins it later)."""
    g1 = "127.0.0.1:%d" % free_port()
    key = os.path.join(tmp, "gossip.key")
    secret = os.path.join(tmp, "peer.secret")
    for path, n in ((key, 32), (secret, 32)):
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(os.urandom(n))
            os.chmod(path, 0o600)
    common = ["--cluster-label", "engines-test", "--replicas", "1",
              "--gossip-key-file", key, "--peer-secret-file", secret]
    s1 = start_sidecar("node-1", ["--gossip-addr", g1, "--peer-addr", "127.0.0.1:%d" % free_port(),
                                  "--transfer-addr", "127.0.0.1:%d" % free_port()] + common)
    extra2 = ["--gossip-addr", "127.0.0.1:%d" % free_port(), "--peer-addr", "127.0.0.1:%d" % free_port(),
              "--transfer-addr", "127.0.0.1:%d" % free_port(), "--join", g1] + common
    s2 = start_sidecar("node-2", extra2, start=start_second)
    return s1, s2


def wait_members(s, n=2):
    def alive():
        out = subprocess.run([BIN, "members", "--socket", s.socket, "--json", "--timeout", "5s"],
                             capture_output=True, text=True)
        try:
            ms = json.loads(out.stdout)
        except ValueError:
            return False
        return sum(1 for m in ms if m.get("State", m.get("state")) in ("alive", "Alive")) >= n
    poll(alive, 60, "%d cluster members" % n)


def held_blocks(socket, tokens, block=None, scope=None):
    """How many of the prompt's leading blocks the sidecar holds (a Lookup
    of vLLM's block hashes of tokens in the namespace that has blocks)."""
    c = tidepool.Client(socket)
    try:
        nss = [n.ns for n in c.stats().namespaces if n.ns.startswith("vllm/")]
        if not nss:
            return 0
        kw = {} if scope is None else {"scope": scope}
        return max(c.lookup(ns, vllm_hashes_of(tokens, block or BLOCK), **kw) for ns in nss)
    finally:
        c.close()


def prompt(seed, n):
    r = random.Random(seed)
    return [r.randrange(3, 500) for _ in range(n)]


P = prompt(1, 13 * BLOCK + 5)        # 13 full blocks (vLLM loads at most 13: it computes the last token)
Q = prompt(2, 13 * BLOCK + 5)        # another prompt of the same length (negative control)
SUFFIX = prompt(3, 40)
P_BLOCKS = 13
LONG_BLOCKS = 30                     # test 5: 965 tokens, within max_model_len 1024
SSD_BLOCKS = 160                     # test 7: 160 blocks of 64 tokens, 128 KiB + 64 bytes each


def max_logprob_diff(a, b):
    """Largest |difference| between top-5 logprobs; inf when token ids or
    the top-5 ids differ."""
    if a["token_ids"] != b["token_ids"]:
        return float("inf")
    worst = 0.0
    for sa, sb in zip(a["logprobs"], b["logprobs"]):
        if [t for t, _ in sa] != [t for t, _ in sb]:
            return float("inf")
        worst = max(worst, max(abs(x - y) for (_, x), (_, y) in zip(sa, sb)))
    return worst


class EngineTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        base = os.environ.get("ENGINE_TMPDIR") or ("/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
        cls.tmp = tempfile.mkdtemp(prefix="tp-engines.", dir=base)
        cls.model = write_tiny_llama(os.path.join(cls.tmp, "model"))
        cls.run_engine = EngineRun(cls.tmp)
        cls.sidecars = []
        # Engine C: no connector, the reference for every comparison.
        cls.ref = cls.run_engine(cls.model, [P + SUFFIX])["outputs"][0]

    @classmethod
    def tearDownClass(cls):
        for s in cls.sidecars:
            s.stop()
        if os.environ.get("KEEP_ENGINE_TMP"):
            print("kept", cls.tmp)
        else:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def sidecar(self, name, extra=(), start=True):
        s = Sidecar(self.tmp, name, extra)
        if start:
            s.start()
        self.sidecars.append(s)
        self.addCleanup(s.stop)
        return s

    def assert_same_as_reference(self, out, what):
        d = max_logprob_diff(out, self.ref)
        self.assertLessEqual(d, ABS_TOL, "%s: output differs from the no-connector engine "
                             "(max |dlogprob| %s)\n%s\n%s" % (what, d, out, self.ref))

    # 1 + 2 -------------------------------------------------------------------
    def test_1_reuse_across_engine_processes_and_2_negative_control(self):
        s = self.sidecar("single")
        # Engine A computes P (and Q for the control), saves, exits.
        a = self.run_engine(self.model, [P, Q], kv=kv_config(s.socket))
        ca = a["connector"]
        self.assertEqual(ca["saved_blocks"], 2 * P_BLOCKS, ca)
        hits_before = s.counter("tidepool_namespace_hits_total")
        # Engine B: a fresh process with an empty local cache runs P + suffix.
        b = self.run_engine(self.model, [P + SUFFIX], kv=kv_config(s.socket))
        cb, ob = b["connector"], b["outputs"][0]
        self.assertEqual(cb["matched_tokens"], P_BLOCKS * BLOCK, cb)
        self.assertEqual(cb["loaded_blocks"], P_BLOCKS, cb)
        self.assertEqual(cb.get("load_errors", 0), 0, cb)
        self.assertGreaterEqual(ob["num_cached_tokens"], P_BLOCKS * BLOCK, ob)
        self.assertGreaterEqual(s.counter("tidepool_namespace_hits_total") - hits_before, P_BLOCKS)
        # The keys are vLLM's block hashes of P, the same in every process.
        c = tidepool.Client(s.socket)
        try:
            ns = [n.ns for n in c.stats().namespaces if n.blocks > 0][0]
            self.assertEqual(c.lookup(ns, vllm_hashes_of(P, BLOCK)), P_BLOCKS)
        finally:
            c.close()
        self.assert_same_as_reference(ob, "engine B (P loaded from tidepool)")
        # The same with vLLM's production process layout: scheduler in the
        # EngineCore process, worker in its own, metadata serialized between
        # them (the connector's counters live there: count on the sidecar).
        hits_before = s.counter("tidepool_namespace_hits_total")
        m = self.run_engine(self.model, [P + SUFFIX], kv=kv_config(s.socket), multiprocess=True)
        self.assertIn("EngineCore", m["log"])
        self.assertGreaterEqual(m["outputs"][0]["num_cached_tokens"], P_BLOCKS * BLOCK)
        self.assertGreaterEqual(s.counter("tidepool_namespace_hits_total") - hits_before, P_BLOCKS)
        self.assert_same_as_reference(m["outputs"][0], "engine B in multiprocess mode")
        # An engine that has run a forward copies a hit in the next one, a
        # layer at a time right before that layer's attention reads it.
        # SUFFIX alone is a miss; then P + SUFFIX's 14 blocks (B saved the
        # 14th) are loaded layer by layer.
        w = self.run_engine(self.model, [SUFFIX, P + SUFFIX], kv=kv_config(s.socket))
        cw = w["connector"]
        self.assertEqual((cw.get("loaded_blocks"), cw.get("layered_loaded_blocks"), cw.get("load_errors", 0)),
                         (P_BLOCKS + 1, P_BLOCKS + 1, 0), cw)
        self.assert_same_as_reference(w["outputs"][1], "a warm engine B (P + SUFFIX copied layer by layer)")
        # 2: the same run with Q's blocks loaded in place of P's must differ.
        # (B saved one more block, P + SUFFIX's 14th: Q + SUFFIX has no such
        # block, so that one is a load error and is recomputed.)
        n = self.run_engine(self.model, [P + SUFFIX], kv=kv_config(s.socket),
                            hooks={"load_keys_of": Q + SUFFIX, "load_keys_for": P + SUFFIX})
        cn, on = n["connector"], n["outputs"][0]
        self.assertGreaterEqual(cn["loaded_blocks"], P_BLOCKS, cn)
        self.assertGreater(max_logprob_diff(on, self.ref), 100 * ABS_TOL,
                           "loading another prompt's KV did not change the output: test 1 has no teeth")

    # 3 -----------------------------------------------------------------------
    def test_3_across_nodes(self):
        s1, s2 = cluster_pair(self.tmp, self.sidecar)
        wait_members(s2)
        self.run_engine(self.model, [P], kv=kv_config(s1.socket))
        fetched_before = s2.counter("tidepool_remote_hits_total")
        b = self.run_engine(self.model, [P + SUFFIX], kv=kv_config(s2.socket))
        cb = b["connector"]
        self.assertEqual(cb["loaded_blocks"], P_BLOCKS, cb)
        self.assertEqual(cb.get("load_errors", 0), 0, cb)
        self.assertGreater(s2.counter("tidepool_remote_hits_total") - fetched_before, 0,
                           "no block came from node-1")
        self.assert_same_as_reference(b["outputs"][0], "engine B on node-2")

    # 4 -----------------------------------------------------------------------
    def test_4a_sidecar_absent_at_start(self):
        sock = os.path.join(self.tmp, "nobody-here.sock")
        b = self.run_engine(self.model, [P + SUFFIX], kv=kv_config(sock))
        cb = b["connector"]
        self.assertEqual(cb.get("loaded_blocks", 0), 0, cb)
        self.assertIn("unavailable", b["log"])
        self.assert_same_as_reference(b["outputs"][0], "engine without its sidecar")

    def test_4b_sidecar_killed_while_loading(self):
        s = self.sidecar("killed")
        self.run_engine(self.model, [P], kv=kv_config(s.socket))
        barrier = os.path.join(self.tmp, "barrier")
        os.makedirs(barrier, exist_ok=True)
        # (Through Acquire: a load through the slot index holds no lease.)
        p, out, log = self.run_engine(self.model, [P + SUFFIX],
                                      kv=kv_config(s.socket, slot_index=False), hooks={"load_barrier": barrier},
                                      background=True)
        try:
            poll(lambda: os.path.exists(os.path.join(barrier, "acquired")) or p.poll() is not None,
                 ENGINE_TIMEOUT_S, "engine B to acquire its blocks")
            s.kill()  # SIGKILL while B holds leases and has not copied
        finally:
            open(os.path.join(barrier, "go"), "w").close()
        b = self.run_engine.finish(p, out, log)
        # The leased bytes stayed mapped and verified: B used them.
        self.assertEqual(b["connector"]["loaded_blocks"], P_BLOCKS, b["connector"])
        # No engine error and no exception out of the connector (vLLM's own
        # "Chat template warmup failed" warning prints a traceback with no
        # tokenizer: that one is not ours).
        self.assertNotRegex(b["log"], r"\bERROR\b|tidepool/vllm\.py\", line")
        self.assert_same_as_reference(b["outputs"][0], "engine B whose sidecar was killed mid-load")
        # Saves after the kill failed quietly; the engine kept serving.
        self.assertIn("unavailable", b["log"])

    def test_4c_bad_block_is_recomputed(self):
        # A block of the wrong size under one of P's keys (another model's
        # block under a colliding key) is a load error for that block:
        # vLLM recomputes from it, output unchanged, no engine error.
        s = self.sidecar("badblock")
        self.run_engine(self.model, [P], kv=kv_config(s.socket))
        keys = vllm_hashes_of(P, BLOCK)
        c = tidepool.Client(s.socket)
        try:
            ns = [n.ns for n in c.stats().namespaces if n.blocks > 0][0]
            self.assertTrue(c.delete(ns, keys[5]))
            c.put(ns, keys[5], b"\x00" * 1000)
        finally:
            c.close()
        b = self.run_engine(self.model, [P + SUFFIX], kv=kv_config(s.socket))
        cb = b["connector"]
        self.assertGreaterEqual(cb["load_errors"], 1, cb)
        self.assertIn("colliding key", b["log"])
        self.assert_same_as_reference(b["outputs"][0], "engine B with one bad block")


    # 5 -----------------------------------------------------------------------
    def test_5_saves_survive_the_end_of_the_engine(self):
        # The engine process ends right after generate() (run_engine.py
        # writes its answer and returns): the saves still in flight finish
        # first (vLLM's shutdown hook, or atexit), in vLLM's in-process and
        # multiprocess layouts. Every full block is in the sidecar.
        s = self.sidecar("shutdown")
        for i, mp in enumerate((False, True)):
            long = prompt(50 + i, LONG_BLOCKS * BLOCK + 5)
            self.run_engine(self.model, [long], kv=kv_config(s.socket), max_tokens=1, multiprocess=mp)
            self.assertEqual(held_blocks(s.socket, long), LONG_BLOCKS, "multiprocess" if mp else "in-process")

    # 6 -----------------------------------------------------------------------
    def test_6_round_trips_per_request(self):
        # A runs P, then P + SUFFIX (vLLM's own prefix cache has P): the
        # second request offers only its one new block. A fresh B runs
        # P + SUFFIX: one Acquire, no Reserve (every block is stored).
        s = self.sidecar("trips")
        a = self.run_engine(self.model, [P, P + SUFFIX], kv=kv_config(s.socket))
        ca = a["connector"]
        self.assertEqual(ca.get("offered_blocks"), P_BLOCKS + 1, ca)
        self.assertEqual(ca.get("save_exists", 0), 0, ca)  # nothing offered that the sidecar had
        self.assertEqual(ca.get("saved_blocks"), P_BLOCKS + 1, ca)
        # Per request: one Lookup, one Reserve, one Commit (the prefill
        # fills all of a request's blocks in one step).
        self.assertEqual((ca.get("rpc_lookup"), ca.get("rpc_reserve"), ca.get("rpc_commit"),
                          ca.get("rpc_acquire", 0)), (2, 2, 2, 0), ca)
        reserves = s.counter("tidepool_request_duration_seconds_count", method="Reserve")
        hits = s.counter("tidepool_namespace_hits_total")
        # B finds every block in the sidecar's slot index: no call on the
        # request's path at all (the reads are reported to the sidecar
        # after it, one Acquire and one Release on the save thread).
        b = self.run_engine(self.model, [P + SUFFIX], kv=kv_config(s.socket))
        cb = b["connector"]
        self.assertEqual(cb["loaded_blocks"], P_BLOCKS + 1, cb)
        self.assertEqual((cb.get("rpc_lookup", 0), cb.get("rpc_acquire", 0), cb.get("rpc_reserve", 0),
                          cb.get("offered_blocks", 0), cb.get("index_lookups"), cb.get("index_loaded_blocks"),
                          cb.get("rpc_touch")), (0, 0, 0, 0, 1, P_BLOCKS + 1, 1), cb)
        self.assertGreaterEqual(s.counter("tidepool_namespace_hits_total") - hits, P_BLOCKS + 1)
        self.assert_same_as_reference(b["outputs"][0], "engine B, through the slot index")
        # Without the slot index: one Lookup and one Acquire.
        c = self.run_engine(self.model, [P + SUFFIX], kv=kv_config(s.socket, slot_index=False))
        cc = c["connector"]
        self.assertEqual(cc["loaded_blocks"], P_BLOCKS + 1, cc)
        self.assertEqual((cc.get("rpc_lookup"), cc.get("rpc_acquire"), cc.get("rpc_reserve", 0),
                          cc.get("offered_blocks", 0), cc.get("index_loaded_blocks", 0)), (1, 1, 0, 0, 0), cc)
        self.assertEqual(s.counter("tidepool_request_duration_seconds_count", method="Reserve") - reserves, 0)
        self.assert_same_as_reference(c["outputs"][0], "engine C, one Acquire")

    # 7 -----------------------------------------------------------------------
    def test_7_long_context_through_the_ssd(self):
        # A prompt ten times the sidecar's DRAM (160 blocks of 128 KiB + 64
        # against 2 MiB): saves stream through DRAM into the SSD tier, and a
        # fresh engine loads all of it back through DRAM in chunks.
        s = self.sidecar("ssd", ["--dram-capacity", "2MiB", "--max-value-size", "1MiB",
                                 "--ssd-capacity", "512MiB"])
        model = write_tiny_llama(os.path.join(self.tmp, "model-long"), ctx=SSD_BLOCKS * 64 + 256)
        long = prompt(60, SSD_BLOCKS * 64 + 5)
        kw = dict(block_size=64, max_model_len=SSD_BLOCKS * 64 + 128, max_tokens=4)
        a = self.run_engine(model, [long], kv=kv_config(s.socket), **kw)
        ca = a["connector"]
        self.assertEqual((ca.get("saved_blocks"), ca.get("save_errors", 0)), (SSD_BLOCKS, 0), ca)
        self.assertEqual(held_blocks(s.socket, long, 64), SSD_BLOCKS)
        self.assertGreater(s.counter("tidepool_demotions_total"), SSD_BLOCKS // 2)
        b = self.run_engine(model, [long], kv=kv_config(s.socket), **kw)
        cb = b["connector"]
        self.assertEqual((cb.get("loaded_blocks"), cb.get("load_errors", 0)), (SSD_BLOCKS, 0), cb)
        self.assertGreater(cb["rpc_acquire"], 1, cb)  # in chunks
        self.assertLessEqual(max_logprob_diff(b["outputs"][0], a["outputs"][0]), ABS_TOL,
                             "engine B (loaded from SSD) differs from engine A (computed)")


    # 8 -----------------------------------------------------------------------
    def test_8_tensor_parallel_2(self):
        # TP=2 (vLLM's CPU build binds one core per rank with
        # VLLM_CPU_OMP_THREADS_BIND; its automatic binding refuses a single
        # NUMA node): each rank saves and loads its own blocks under its own
        # namespace. One block of rank 1 is deleted before B runs: that
        # rank's load error makes vLLM recompute from that block on both
        # ranks, and B's output still equals A's.
        s = self.sidecar("tp2")
        env = {"VLLM_CPU_OMP_THREADS_BIND": os.environ.get("TP2_THREADS_BIND", "0|1")}
        a = self.run_engine(self.model, [P + SUFFIX], kv=kv_config(s.socket), multiprocess=True, tp=2, env=env)
        c = tidepool.Client(s.socket)
        try:
            nss = sorted(n.ns for n in c.stats().namespaces if n.ns.startswith("vllm/"))
            self.assertEqual([("/tp0/" in n, "/tp1/" in n) for n in nss], [(True, False), (False, True)], nss)
            keys = vllm_hashes_of(P + SUFFIX, BLOCK)
            for ns in nss:
                poll(lambda ns=ns: c.lookup(ns, keys) == len(keys), 60, "the saves of " + ns)
            self.assertTrue(c.delete(nss[1], keys[5]))
        finally:
            c.close()
        acquires = s.counter("tidepool_request_duration_seconds_count", method="Acquire")
        b = self.run_engine(self.model, [P + SUFFIX], kv=kv_config(s.socket), multiprocess=True, tp=2, env=env)
        self.assertGreaterEqual(s.counter("tidepool_request_duration_seconds_count", method="Acquire") - acquires, 2)
        self.assertGreaterEqual(b["outputs"][0]["num_cached_tokens"], 5 * BLOCK)
        self.assertLessEqual(max_logprob_diff(b["outputs"][0], a["outputs"][0]), ABS_TOL,
                             "TP=2 engine B (loaded, one block of rank 1 recomputed) differs from A")


    # 9 -----------------------------------------------------------------------
    def test_9_kv_events_name_vllms_block_hashes(self):
        """The sidecar's KV events for engine A's prompt name the block
        hashes vLLM's own KV events name for it, with the same token ids
        (vLLM's event publisher on in the same engine, its batches written
        to a file; both decoded with msgspec's msgpack, not the project's
        code)."""
        import msgspec
        import zmq
        pub, rep = free_port(), free_port()
        s = self.sidecar("events", ["--kv-events-endpoint", "tcp://127.0.0.1:%d" % pub,
                                    "--kv-events-replay-endpoint", "tcp://127.0.0.1:%d" % rep])
        capture = os.path.join(self.tmp, "vllm-events.bin")
        ctx = zmq.Context()
        try:
            a = self.run_engine(self.model, [P], kv=kv_config(s.socket), kv_events_capture=capture)
            self.assertEqual(a["connector"]["saved_blocks"], P_BLOCKS, a["connector"])
            vllm_blocks = {}  # hash -> token ids, from vLLM's BlockStored events
            with open(capture, "rb") as f:
                data = f.read()
            while data:
                n = int.from_bytes(data[:4], "big")
                for e in msgspec.msgpack.decode(data[4:4 + n])[1]:
                    if e["type"] == "BlockStored" and e["medium"] == "GPU":
                        bs = e["block_size"]
                        for i, h in enumerate(e["block_hashes"]):
                            vllm_blocks[h] = e["token_ids"][i * bs:(i + 1) * bs]
                data = data[4 + n:]
            # The sidecar's events so far, from its replay socket (from 0).
            d = ctx.socket(zmq.DEALER)
            d.connect("tcp://127.0.0.1:%d" % rep)
            d.send_multipart([b"", (0).to_bytes(8, "big")])
            ours = {}
            while True:
                self.assertTrue(d.poll(30000), "replay socket did not answer")
                parts = d.recv_multipart()
                if int.from_bytes(parts[2], "big", signed=True) == -1:
                    break
                for e in msgspec.msgpack.decode(parts[3])[1]:
                    if e["type"] == "BlockStored" and e["medium"] == "CPU":
                        ours[e["block_hashes"][0]] = (e["token_ids"], e["parent_block_hash"], e["block_size"])
        finally:
            ctx.destroy(linger=0)
        self.assertEqual(len(ours), P_BLOCKS, ours)
        self.assertTrue(vllm_blocks, "vLLM published no BlockStored")
        for h, (toks, parent, size) in ours.items():
            self.assertIn(h, vllm_blocks, "block hash %d of the sidecar's events is not vLLM's" % h)
            self.assertEqual(size, BLOCK)
            self.assertEqual(toks, vllm_blocks[h])
            self.assertTrue(parent is None or parent in ours, "parent %s of %d not a block of the prompt" % (parent, h))
        # The chain's head is the prompt's first block.
        firsts = [h for h, (_, parent, _) in ours.items() if parent is None]
        self.assertEqual(len(firsts), 1)
        self.assertEqual(ours[firsts[0]][0], P[:BLOCK])

if __name__ == "__main__":
    unittest.main(verbosity=2)
