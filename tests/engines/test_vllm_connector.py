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
from run_engine import write_tiny_llama  # noqa: E402
from sidecar import Sidecar, cluster_pair, poll  # noqa: E402

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

    def __call__(self, model, prompts, kv=None, max_tokens=6, background=False, multiprocess=False, capture=None):
        self.n += 1
        spec = os.path.join(self.root, "spec%d.json" % self.n)
        out = os.path.join(self.root, "out%d.json" % self.n)
        log = os.path.join(self.root, "engine%d.log" % self.n)
        with open(spec, "w") as f:
            json.dump({"model": model, "prompts": prompts, "max_tokens": max_tokens,
                       "kv_transfer_config": kv, "logprobs": 5, "block_size": BLOCK,
                       "kv_events_capture": capture}, f)
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1" if multiprocess else "0",
                   VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
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


def prompt(seed, n):
    r = random.Random(seed)
    return [r.randrange(3, 500) for _ in range(n)]


P = prompt(1, 13 * BLOCK + 5)        # 13 full blocks (vLLM loads at most 13: it computes the last token)
Q = prompt(2, 13 * BLOCK + 5)        # another prompt of the same length (negative control)
SUFFIX = prompt(3, 40)
P_BLOCKS = 13


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
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
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

    def sidecar(self, name, extra=()):
        s = Sidecar(self.tmp, name, extra).start()
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
        self.assertEqual(cb["load_errors"], 0, cb)
        self.assertGreaterEqual(ob["num_cached_tokens"], P_BLOCKS * BLOCK, ob)
        self.assertGreaterEqual(s.counter("tidepool_namespace_hits_total") - hits_before, P_BLOCKS)
        # Two processes computed the same keys for P.
        self.assertEqual(ca["keys"][0][:P_BLOCKS], cb["keys"][0][:P_BLOCKS])
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
        # 2: the same run with Q's blocks loaded in place of P's must differ.
        # (B saved one more block, P + SUFFIX's 14th: Q + SUFFIX has no such
        # block, so that one is a load error and is recomputed.)
        n = self.run_engine(self.model, [P + SUFFIX],
                            kv=kv_config(s.socket, test_only_load_keys_of=Q + SUFFIX))
        cn, on = n["connector"], n["outputs"][0]
        self.assertGreaterEqual(cn["loaded_blocks"], P_BLOCKS, cn)
        self.assertGreater(max_logprob_diff(on, self.ref), 100 * ABS_TOL,
                           "loading another prompt's KV did not change the output: test 1 has no teeth")

    # 3 -----------------------------------------------------------------------
    def test_3_across_nodes(self):
        s1, s2 = cluster_pair(self.tmp, self.sidecar)
        self.run_engine(self.model, [P], kv=kv_config(s1.socket))
        fetched_before = s2.counter("tidepool_remote_hits_total")
        b = self.run_engine(self.model, [P + SUFFIX], kv=kv_config(s2.socket))
        cb = b["connector"]
        self.assertEqual(cb["loaded_blocks"], P_BLOCKS, cb)
        self.assertEqual(cb["load_errors"], 0, cb)
        self.assertGreater(s2.counter("tidepool_remote_hits_total") - fetched_before, 0,
                           "no block came from node-1")
        self.assert_same_as_reference(b["outputs"][0], "engine B on node-2")

    # 4 -----------------------------------------------------------------------
    def test_4a_sidecar_absent_at_start(self):
        sock = os.path.join(self.tmp, "nobody-here.sock")
        b = self.run_engine(self.model, [P + SUFFIX], kv=kv_config(sock))
        cb = b["connector"]
        self.assertEqual(cb["loaded_blocks"], 0, cb)
        self.assertIn("unavailable", b["log"])
        self.assert_same_as_reference(b["outputs"][0], "engine without its sidecar")

    def test_4b_sidecar_killed_while_loading(self):
        s = self.sidecar("killed")
        self.run_engine(self.model, [P], kv=kv_config(s.socket))
        barrier = os.path.join(self.tmp, "barrier")
        os.makedirs(barrier, exist_ok=True)
        p, out, log = self.run_engine(self.model, [P + SUFFIX],
                                      kv=kv_config(s.socket, test_only_load_barrier=barrier),
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
        a = self.run_engine(self.model, [P], kv=kv_config(s.socket))
        keys = [bytes.fromhex(k) for k in a["connector"]["keys"][0]]
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
    def test_5_kv_events_name_vllms_block_hashes(self):
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
            a = self.run_engine(self.model, [P], kv=kv_config(s.socket), capture=capture)
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
