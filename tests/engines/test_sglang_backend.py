"""Tests of tidepool.sglang.TidepoolStorage with the pinned SGLang (0.5.23)
and real `tidepool serve` processes. No GPU, no model: SGLang's engine does
not run on a CPU without its CUDA kernels (docs/engines.md, "SGLang"), so
the backend is driven through SGLang's own storage code on host tensors:

- in this process: StorageBackendFactory ("dynamic"), a real host KV pool
  (MHATokenToKVPoolHost built from a CPU MHATokenToKVPool) in every layout
  the backend takes, the v1 calls against it and the plain calls with
  SGLang's own flat pages (get_data_page, get_dummy_flat_data_page,
  set_from_flat_data_page);
- "engine processes" (tests/engines/sglang_engine.py): each builds the
  device pool, the allocator, the host pool and a HiCacheController, whose
  attach creates the backend; pages are saved through the controller's
  backup thread and loaded through its prefetch threads.

Run with scripts/test-sglang.sh (make test-sglang), which installs the venv
(scripts/install-sglang.sh) and builds bin/tidepool.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import tidepool  # noqa: E402
from sidecar import Sidecar, cluster_pair, poll  # noqa: E402

ENGINE_TIMEOUT_S = float(os.environ.get("ENGINE_TIMEOUT_S", "600"))
PAGE = 16
P = [(7 * i + 3) % 500 for i in range(5 * PAGE)]  # 5 pages
Q = [(11 * i + 5) % 500 for i in range(5 * PAGE)]


def storage_config(extra, model="tiny-test", tp=(0, 1)):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    x = {"backend_name": "tidepool", "module_path": "tidepool.sglang", "class_name": "TidepoolStorage"}
    x.update(extra)
    return HiCacheStorageConfig(tp_rank=tp[0], tp_size=tp[1], pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                                is_page_first_layout=False, model_name=model, extra_config=x)


def host_pool(layout, page=PAGE, dtype=torch.float32):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    dev = MHATokenToKVPool(256, page, dtype, 2, 16, 2, "cpu", False)
    info = dev.get_device_pool_infos()[0].buffer_info
    with host_memory_budget_scope(1 << 30):  # not SGLang's "free memory less 10 GiB"
        return MHATokenToKVPoolHost(info, 2.0, 0, page, layout, pin_memory=False, device="cpu",
                                    device_capacity_tokens=dev.size, start_layer=0, end_layer=2)


def make_backend(pool, extra, **kw):
    from sglang.srt.mem_cache.storage import StorageBackendFactory
    b = StorageBackendFactory.create_backend("dynamic", storage_config(extra, **kw), pool)
    b.register_mem_pool_host(pool)
    b.on_host_pools_registered()
    return b


def fill(pool, idx, seed):
    """Random bytes in the pages at idx; returns the pages' flat copies."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(0, idx.numel(), pool.page_size):
        v = torch.randn(pool.get_dummy_flat_data_page().numel(), generator=g).to(pool.dtype)
        pool.set_from_flat_data_page(int(idx[i]), v)
        out.append(v)
    return out


def pages(pool, idx):
    return [pool.get_data_page(int(idx[i])).clone() for i in range(0, idx.numel(), pool.page_size)]


class InProcess(unittest.TestCase):
    """The factory, the host pool in every layout, v1 and plain calls."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tp-sgl-")
        cls.sc = Sidecar(cls.tmp, "node-0").start()

    @classmethod
    def tearDownClass(cls):
        cls.sc.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def extra(self, **kw):
        x = {"socket": self.sc.socket, "interface_v1": 1, "retry_s": 0.2}
        x.update(kw)
        return x

    def test_factory_creates_the_backend(self):
        from tidepool.sglang import TidepoolStorage
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
        pool = host_pool("page_first")
        b = make_backend(pool, self.extra())
        self.assertIsInstance(b, TidepoolStorage)
        self.assertIsInstance(b, HiCacheStorage)
        self.assertTrue(b.namespace.startswith("sglang/tiny-test/tp0/pp0/"), b.namespace)
        # What it does not implement raises; it never answers.
        with self.assertRaises(NotImplementedError):
            b.batch_get_v2([])
        with self.assertRaises(NotImplementedError):
            b.batch_set_v2([])
        with self.assertRaises(NotImplementedError):
            b.batch_exists_v2(["k"])

    def test_refuses_what_it_cannot_store(self):
        from sglang.srt.mem_cache.storage import StorageBackendFactory
        with self.assertRaises(ValueError):  # no model name: keys of different models would collide
            StorageBackendFactory.create_backend("dynamic", storage_config(self.extra(), model=None), None)
        b = StorageBackendFactory.create_backend("dynamic", storage_config(self.extra()), None)
        with self.assertRaises(RuntimeError):  # no host pool registered yet
            b.batch_exists(["k"])
        pool = host_pool("page_first")
        pool.layout_saved, pool.layout = pool.layout, "page_unified"
        with self.assertRaises(NotImplementedError):
            b.register_mem_pool_host(pool)

    def test_v1_and_plain_calls_every_layout(self):
        for layout in ("layer_first", "page_first", "page_first_direct", "page_head"):
            with self.subTest(layout=layout):
                pool = host_pool(layout)
                b = make_backend(pool, self.extra())
                keys = ["%s-%d" % (layout, i) for i in range(4)]
                src = pool.alloc(4 * PAGE)
                want = fill(pool, src, seed=len(layout))
                self.assertEqual(b.batch_exists(keys), 0)
                self.assertEqual(b.batch_set_v1(keys[:3], src[:3 * PAGE]), [True] * 3)
                self.assertEqual(b.batch_exists(keys), 3)
                self.assertTrue(b.exists(keys[2]))
                self.assertFalse(b.exists(keys[3]))
                # Again: EXISTS counts as stored.
                self.assertEqual(b.batch_set_v1(keys[:3], src[:3 * PAGE]), [True] * 3)
                dst = pool.alloc(4 * PAGE)
                self.assertEqual(b.batch_get_v1(keys, dst), [True, True, True, False])
                got = pages(pool, dst)
                for i in range(3):
                    self.assertTrue(torch.equal(got[i], want[i]), "v1 page %d" % i)
                # Plain calls read what v1 stored, into SGLang's dummy flat
                # pages, in the layout's flat order.
                flat = b.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys])
                self.assertIsNone(flat[3])
                for i in range(3):
                    pool.set_from_flat_data_page(int(dst[i * PAGE]), flat[i])
                    self.assertTrue(torch.equal(pool.get_data_page(int(dst[i * PAGE])), want[i]), "plain get %d" % i)
                self.assertIsNone(b.get(keys[3], pool.get_dummy_flat_data_page()))
                # v1 reads what the plain calls stored.
                self.assertTrue(b.set(keys[3], pool.get_data_page(int(src[3 * PAGE]))))
                self.assertEqual(b.batch_get_v1(keys[3:], dst[3 * PAGE:]), [True])
                self.assertTrue(torch.equal(pool.get_data_page(int(dst[3 * PAGE])), want[3]))
                # Bad input: an answer of "no", nothing written.
                self.assertEqual(b.batch_get_v1(keys[:2], dst[:PAGE]), [False, False])
                bad = dst[:2 * PAGE].clone()
                bad[-1] = pool.size + 10_000_000
                self.assertEqual(b.batch_set_v1(["x1", "x2"], bad), [False, False])
                self.assertFalse(b.set("x3", torch.zeros(3)))
                self.assertEqual(b.batch_exists(["x1"]), 0)
                pool.free(src)
                pool.free(dst)

    def test_namespace_names_what_changes_the_bytes(self):
        base = make_backend(host_pool("page_first"), self.extra()).namespace
        for pool, extra, kw, what in (
                (host_pool("layer_first"), self.extra(), {}, "layout"),
                (host_pool("page_first", page=32), self.extra(), {}, "page size"),
                (host_pool("page_first", dtype=torch.bfloat16), self.extra(), {}, "dtype"),
                (host_pool("page_first"), self.extra(), {"model": "other"}, "model"),
                (host_pool("page_first"), self.extra(), {"tp": (1, 2)}, "tp rank")):
            with self.subTest(what=what):
                self.assertNotEqual(make_backend(pool, extra, **kw).namespace, base)
        self.assertEqual(make_backend(host_pool("page_first"), self.extra()).namespace, base)

    def test_keys_are_sglang_page_hashes(self):
        """SGLang's own chained page hashes: the salt and extra_key (where
        the LoRA id goes) seed the chain, so they change every key."""
        from sglang.srt.mem_cache.radix_cache import RadixKey
        from sglang.srt.mem_cache.utils import get_storage_hash_str
        plain = get_storage_hash_str(P, None, page_size=PAGE)
        self.assertEqual(len(plain), len(P) // PAGE)
        self.assertEqual(get_storage_hash_str(P[:2 * PAGE], None, page_size=PAGE), plain[:2])  # chained
        self.assertEqual(get_storage_hash_str(P[2 * PAGE:], plain[1], page_size=PAGE), plain[2:])
        salted = get_storage_hash_str(RadixKey(P, cache_salt="tenant-a"), None, page_size=PAGE)
        lora = get_storage_hash_str(RadixKey(P, extra_key="lora-7"), None, page_size=PAGE)
        self.assertTrue(set(plain).isdisjoint(salted) and set(plain).isdisjoint(lora) and set(salted).isdisjoint(lora))

    def test_sidecar_absent_then_back(self):
        """No sidecar: misses, nothing saved or loaded. The first call after
        the sidecar is up succeeds, and again after it was killed and
        restarted: the pause after a failure (retry_s, an hour here) waits
        out the socket that failed, not a new one."""
        sock = os.path.join(self.tmp, "late", "tp.sock")  # where Sidecar(tmp, "late") listens
        pool = host_pool("page_first")
        b = make_backend(pool, self.extra(socket=sock, retry_s=3600))
        idx = pool.alloc(2 * PAGE)
        want = fill(pool, idx, seed=9)
        self.assertEqual(b.batch_exists(["a", "b"]), 0)
        self.assertEqual(b.batch_set_v1(["a", "b"], idx), [False, False])
        self.assertEqual(b.batch_get_v1(["a", "b"], idx), [False, False])
        self.assertTrue(torch.equal(pages(pool, idx)[0], want[0]), "a miss wrote into the pool")
        late = [Sidecar(self.tmp, "late").start()]
        try:
            self.assertEqual(b.batch_set_v1(["a", "b"], idx), [True, True], "the sidecar is up")
            self.assertEqual(b.batch_exists(["a", "b"]), 2)
            late[0].kill()  # its socket file stays, refusing
            self.assertEqual(b.batch_exists(["a", "b"]), 0)
            self.assertEqual(b.batch_set_v1(["a", "b"], idx), [False, False])
            late.append(Sidecar(self.tmp, "late").start())
            self.assertEqual(b.batch_set_v1(["a", "b"], idx), [True, True], "the sidecar is back")
            fill(pool, idx, seed=10)
            self.assertEqual(b.batch_get_v1(["a", "b"], idx), [True, True])
            got = pages(pool, idx)
            self.assertTrue(all(torch.equal(g, w) for g, w in zip(got, want)), "loaded bytes differ")
        finally:
            b.close()
            for s in late:
                s.stop()


class EngineProcesses(unittest.TestCase):
    """Two processes with SGLang's host pool and HiCacheController."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tp-sgl-eng-")
        cls.n = 0

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.sidecars = []

    def tearDown(self):
        for s in self.sidecars:
            s.stop()

    def sidecar(self, name, extra=()):
        s = Sidecar(self.tmp, name, extra).start()
        self.sidecars.append(s)
        return s

    def engine(self, socket, steps, wait=True, **spec):
        type(self).n += 1
        d = os.path.join(self.tmp, "engine%d" % self.n)
        os.makedirs(d)
        spec.update({"socket": socket, "steps": steps, "page_size": PAGE})
        with open(os.path.join(d, "spec.json"), "w") as f:
            json.dump(spec, f)
        out = os.path.join(d, "out.json")
        log = open(os.path.join(d, "engine.log"), "wb")
        p = subprocess.Popen([sys.executable, os.path.join(HERE, "sglang_engine.py"), os.path.join(d, "spec.json"),
                              out], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()  # the child has its own descriptor
        p.out, p.logpath = out, os.path.join(d, "engine.log")
        if wait:
            return self.finish(p)
        return p

    def finish(self, p):
        try:
            rc = p.wait(timeout=ENGINE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "timeout"
        if rc != 0:
            self.fail("engine process failed (%s):\n%s" % (rc, open(p.logpath, errors="replace").read()[-4000:]))
        with open(p.out) as f:
            return json.load(f)

    def assert_shared(self, save, load):
        s, l = save["steps"][0], load["steps"][0]
        self.assertEqual(s["completed_tokens"], len(P), s)
        self.assertEqual(s["saved"], s["expected"])
        self.assertEqual(l["hashes"], s["hashes"])  # the same keys in both processes
        self.assertEqual(l["hit_tokens"], len(P), l)
        self.assertEqual(l["completed_tokens"], len(P), l)
        self.assertEqual(l["loaded"], s["saved"], "B's pages differ from A's")

    def test_1_two_engines_one_sidecar(self):
        sc = self.sidecar("one")
        for layout, v1 in (("page_first", 1), ("layer_first", 0)):
            with self.subTest(layout=layout, interface_v1=v1):
                seed = 100 + len(layout) + v1
                a = self.engine(sc.socket, [{"op": "save", "tokens": P, "seed": seed}], layout=layout,
                                interface_v1=v1, model="m-%s-%d" % (layout, v1))
                b = self.engine(sc.socket, [{"op": "load", "tokens": P, "seed": seed},
                                            {"op": "load", "tokens": Q, "seed": seed}],
                                layout=layout, interface_v1=v1, model="m-%s-%d" % (layout, v1))
                self.assertEqual(a["backend"], "TidepoolStorage")
                self.assertEqual(a["namespace"], b["namespace"])
                self.assert_shared(a, b)
                self.assertEqual(b["steps"][1]["hit_tokens"], 0)  # an unsaved prompt is a miss

    def test_2_two_engines_two_clustered_sidecars(self):
        s1, s2 = cluster_pair(self.tmp, self.sidecar)
        before = s2.counter("tidepool_remote_hits_total")
        a = self.engine(s1.socket, [{"op": "save", "tokens": P, "seed": 7}])
        b = self.engine(s2.socket, [{"op": "load", "tokens": P, "seed": 7}])
        self.assert_shared(a, b)
        self.assertGreater(s2.counter("tidepool_remote_hits_total") - before, 0, "no page came from node-1")

    def test_3_altered_page(self):
        """Negative control: a page's bytes altered inside the sidecar's
        arena. With verify_reads the CRC-32C refuses it (that page and the
        rest of the prefix are not loaded); without, the loaded bytes
        visibly differ from the saved ones. The sidecar's scrubber is off:
        it would find the damage and remove the block, in a fraction of a
        second at its default rate, before either engine reads it."""
        sc = self.sidecar("alter", ["--scrub-rate", "0"])
        a = self.engine(sc.socket, [{"op": "save", "tokens": P, "seed": 3}])
        ns, key = a["namespace"], a["steps"][0]["hashes"][2].encode()
        c = tidepool.Client(sc.socket)
        try:
            (lease,), _ = c.acquire(ns, [key])
            self.assertEqual(lease.code, tidepool.OK)
            arena = c.hello().arenas[lease.slot.arena]
            path = arena.path if os.path.isabs(arena.path) else os.path.join(sc.dir, "arenas", arena.path)
            with open(path, "r+b") as f:
                f.seek(lease.slot.offset + lease.slot.length - 8)
                old = f.read(4)
                f.seek(lease.slot.offset + lease.slot.length - 8)
                f.write(bytes(x ^ 0xFF for x in old))
            c.release([lease.lease_id])
        finally:
            c.close()
        checked = self.engine(sc.socket, [{"op": "load", "tokens": P, "seed": 3}], extra={"verify_reads": True})
        l = checked["steps"][0]
        self.assertEqual(l["hit_tokens"], len(P))
        self.assertEqual(l["completed_tokens"], 2 * PAGE, "the altered page was loaded")
        self.assertEqual(l["loaded"], a["steps"][0]["saved"][:2])
        unchecked = self.engine(sc.socket, [{"op": "load", "tokens": P, "seed": 3}])
        u = unchecked["steps"][0]
        self.assertEqual(u["completed_tokens"], len(P))
        self.assertEqual(u["loaded"][:2] + u["loaded"][3:], a["steps"][0]["saved"][:2] + a["steps"][0]["saved"][3:])
        self.assertNotEqual(u["loaded"][2], a["steps"][0]["saved"][2], "altering the arena changed nothing: no teeth")

    def test_4_sidecar_down_and_killed_mid_batch(self):
        """No sidecar: misses, saves fail, the controller's threads keep
        serving. Up: the next save succeeds. Killed after Acquire, mid-load:
        that load reports nothing loaded. Back: the same engine saves and
        loads again at once (the backup thread's connection to the killed
        sidecar is remade). retry_s is an hour: every success here is the
        first call after the sidecar is ready, none waits out a pause."""
        sock = os.path.join(self.tmp, "restart", "tp.sock")
        go = os.path.join(self.tmp, "restart-go")
        barrier = os.path.join(self.tmp, "kill-barrier")
        os.makedirs(barrier)
        steps = [{"op": "load", "tokens": P, "seed": 5},       # 0: no sidecar: miss
                 {"op": "save", "tokens": P, "seed": 5},       # 1: not saved
                 {"op": "wait", "file": go + "1"},              # 2
                 {"op": "save", "tokens": P, "seed": 5},       # 3: saved
                 {"op": "load", "tokens": P, "seed": 5, "barrier": barrier},  # 4: killed mid-load
                 {"op": "load", "tokens": P, "seed": 5},       # 5: down: miss
                 {"op": "wait", "file": go + "2"},              # 6
                 {"op": "save", "tokens": P, "seed": 5},       # 7: back (a stale connection is remade)
                 {"op": "save", "tokens": Q, "seed": 6},       # 8
                 {"op": "load", "tokens": Q, "seed": 6}]       # 9
        p = self.engine(sock, steps, wait=False, extra={"retry_s": 3600})
        try:
            poll(lambda: p.poll() is not None or os.path.exists(p.out) and len(json.load(open(p.out))["steps"]) >= 2,
                 ENGINE_TIMEOUT_S, "the engine's first steps")
            sc = Sidecar(self.tmp, "restart").start()
            self.sidecars.append(sc)
            open(go + "1", "w").close()
            poll(lambda: os.path.exists(os.path.join(barrier, "acquired")) or p.poll() is not None, ENGINE_TIMEOUT_S,
                 "the load's Acquire")
            sc.kill()
            open(os.path.join(barrier, "go"), "w").close()
            poll(lambda: p.poll() is not None or len(json.load(open(p.out))["steps"]) >= 6, ENGINE_TIMEOUT_S,
                 "the load after the kill")
            sc2 = Sidecar(self.tmp, "restart").start()
            self.sidecars.append(sc2)
            open(go + "2", "w").close()
            r = self.finish(p)
        finally:
            if p.poll() is None:
                p.kill()
        s = r["steps"]
        self.assertEqual((s[0]["hit_tokens"], s[0]["completed_tokens"]), (0, 0), s[0])
        self.assertEqual(s[1]["completed_tokens"], 0, s[1])
        self.assertEqual(s[3]["completed_tokens"], len(P), s[3])
        self.assertEqual(s[4]["hit_tokens"], len(P), s[4])
        self.assertEqual(s[4]["completed_tokens"], 0, "pages of a load whose sidecar died were reported loaded")
        self.assertEqual((s[5]["hit_tokens"], s[5]["completed_tokens"]), (0, 0), s[5])
        self.assertEqual(s[7]["completed_tokens"], len(P), s[7])
        self.assertEqual(s[8]["completed_tokens"], len(Q), s[8])
        self.assertEqual(s[9]["completed_tokens"], len(Q), s[9])
        self.assertEqual(s[9]["loaded"], s[8]["saved"])
        self.assertTrue(r["threads_alive"])


if __name__ == "__main__":
    unittest.main()
