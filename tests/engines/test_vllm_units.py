"""Unit tests of TidepoolConnector's bookkeeping against the real vLLM
classes (VllmConfig, Request with vLLM's block hasher, NewRequestData,
SchedulerOutput, KV tensors of both layouts), without a model. A real
`tidepool serve` (bin/tidepool) backs the tests that need a sidecar.

Run with scripts/test-engines.sh (the engine venv).
"""

import os
import re
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
from run_engine import write_tiny_llama  # noqa: E402

BIN = os.path.join(ROOT, "bin", "tidepool")
BS = 32


def make_config(model, socket, **kw):
    from vllm.engine.arg_utils import EngineArgs
    extra = {"socket": socket, "timeout_s": 2.0, "retry_s": 0.0}
    extra.update(kw.pop("extra", {}))
    args = EngineArgs(model=model, skip_tokenizer_init=True, block_size=BS, enable_prefix_caching=True,
                      max_model_len=1024, kv_transfer_config={
                          "kv_connector": "TidepoolConnector", "kv_connector_module_path": "tidepool.vllm",
                          "kv_role": "kv_both", "kv_connector_extra_config": extra}, **kw)
    return args.create_engine_config()


def make_request(rid, tokens, algo="sha256", cache_salt=None):
    from vllm import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request
    fn = get_hash_fn_by_name(algo)
    init_none_hash(fn)
    return Request(rid, tokens, SamplingParams(max_tokens=4), None, cache_salt=cache_salt,
                   block_hasher=get_request_block_hasher(BS, fn))


def scheduler_output(new=(), num_scheduled=None):
    from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput
    out = SchedulerOutput.make_empty()
    out.scheduled_new_reqs = [NewRequestData.from_request(r, (bids,)) for r, bids in new]
    out.num_scheduled_tokens = dict(num_scheduled or {})
    out.total_num_scheduled_tokens = sum(out.num_scheduled_tokens.values())
    return out


class UnitTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="tp-units.", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
        cls.model = write_tiny_llama(os.path.join(cls.tmp, "model"))
        cls.socket = os.path.join(cls.tmp, "tp.sock")
        cls.log = open(os.path.join(cls.tmp, "serve.log"), "wb")
        cls.proc = subprocess.Popen(
            [BIN, "serve", "--socket", cls.socket, "--data-dir", os.path.join(cls.tmp, "data"),
             "--arena-dir", os.path.join(cls.tmp, "arenas"), "--dram-capacity", "32MiB",
             "--max-value-size", "4MiB", "--metrics-addr", "127.0.0.1:0", "--ssd-capacity", "0",
             "--log-level", "warn"], stdout=subprocess.PIPE, stderr=cls.log, stdin=subprocess.DEVNULL)
        line = cls.proc.stdout.readline().decode()
        assert re.search("serving on socket", line), line

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        cls.proc.wait(timeout=15)
        cls.proc.stdout.close()
        cls.log.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def connector(self, role, cfg=None, **kw):
        from tidepool.vllm import TidepoolConnector
        return TidepoolConnector(cfg or make_config(self.model, self.socket, **kw), role, None)

    # -- keys ---------------------------------------------------------------
    def test_refuses_unstable_keys(self):
        from tidepool.vllm import check_stable_keys
        cfg = make_config(self.model, self.socket, prefix_caching_hash_algo="xxhash")
        with self.assertRaisesRegex(ValueError, "PYTHONHASHSEED"):
            check_stable_keys(cfg, environ={})
        check_stable_keys(cfg, environ={"PYTHONHASHSEED": "7"})
        check_stable_keys(make_config(self.model, self.socket), environ={})  # sha256: stable
        nocache = make_config(self.model, self.socket)
        nocache.cache_config.enable_prefix_caching = False
        with self.assertRaisesRegex(ValueError, "prefix caching"):
            check_stable_keys(nocache, environ={})

    def test_keys_are_vllm_block_hashes_and_stable(self):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from run_engine import vllm_hashes_of
        c = self.connector(KVConnectorRole.SCHEDULER)._sched
        toks = list(range(5, 5 + 3 * BS + 7))
        r = make_request("r", toks)
        keys = c._keys(r)
        self.assertEqual(len(keys), 3)
        self.assertEqual(keys, vllm_hashes_of(toks, BS, "sha256"))  # a fresh chain: same keys
        salted = make_request("s", toks, cache_salt="tenant-a")
        self.assertNotEqual(c._keys(salted)[0], keys[0])  # cache_salt is in the key

    def test_namespace_names_what_changes_the_bytes(self):
        from tidepool.vllm import namespace_descriptor, namespace_for
        cfg = make_config(self.model, self.socket, dtype="float32")
        d0 = namespace_descriptor(cfg, None, 0, 0, {})
        self.assertEqual(namespace_for(d0), namespace_for(namespace_descriptor(cfg, None, 0, 0, {})))
        self.assertNotEqual(namespace_for(d0), namespace_for(namespace_descriptor(cfg, None, 1, 0, {})))
        cfg16 = make_config(self.model, self.socket, dtype="bfloat16")
        self.assertNotEqual(namespace_for(d0), namespace_for(namespace_descriptor(cfg16, None, 0, 0, {})))
        self.assertLessEqual(len(namespace_for(d0)), 256)

    # -- scheduler side -------------------------------------------------------
    def test_scheduler_lookup_alloc_meta_finish(self):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        c = self.connector(KVConnectorRole.SCHEDULER)._sched
        toks = list(range(100, 100 + 5 * BS + 3))
        r = make_request("req-1", toks)
        c.on_new_request(r)
        keys = c._keys(r)
        cl = tidepool.Client(self.socket)
        self.addCleanup(cl.close)
        self.addCleanup(lambda: cl.clear(c._ns))
        for k in keys[:3]:
            cl.put(c._ns, k, b"x")
        # Lookup: 3 blocks beyond the 32 locally computed tokens; no side effects.
        self.assertEqual(c.get_num_new_matched_tokens(r, BS), (2 * BS, False))
        self.assertEqual(c.get_num_new_matched_tokens(r, BS), (2 * BS, False))
        self.assertEqual(c._pending_loads, {})
        self.assertEqual(c.get_num_new_matched_tokens(r, 3 * BS), (0, False))
        c.update_state_after_alloc(r, 2 * BS)
        bids = [7, 8, 9, 10, 11, 12]
        meta = c.build_connector_meta(scheduler_output([(r, bids)], {"req-1": len(toks) - 3 * BS}))
        # r.num_computed_tokens is 0 in a bare Request; the scheduler sets it.
        self.assertEqual(len(meta.loads), 0 if r.num_computed_tokens == 0 else 1)
        r.num_computed_tokens = 3 * BS
        c.update_state_after_alloc(r, 2 * BS)
        meta = c.build_connector_meta(scheduler_output([(r, bids)], {"req-1": len(toks) - 3 * BS}))
        (load,) = meta.loads
        self.assertEqual((load.req_id, load.block_ids, load.keys, load.first_index),
                         ("req-1", [8, 9], keys[1:3], 1))
        (save,) = meta.saves  # blocks 3 and 4 become full in this step; 0-2 need no save
        self.assertEqual((save.block_ids, save.keys, save.first_index), ([10, 11], keys[3:5], 3))
        again = c.build_connector_meta(scheduler_output())
        self.assertEqual((again.loads, again.saves), ([], []))  # per-step state was reset
        self.assertEqual(c.request_finished(r), (True, None))  # saves in flight: keep blocks
        r2 = make_request("req-2", toks[:BS - 1])
        c.on_new_request(r2)
        self.assertEqual(c.request_finished(r2), (False, None))

    def test_scheduler_without_sidecar(self):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        c = self.connector(KVConnectorRole.SCHEDULER,
                           cfg=make_config(self.model, os.path.join(self.tmp, "absent.sock")))._sched
        r = make_request("r", list(range(3 * BS + 1)))
        self.assertEqual(c.get_num_new_matched_tokens(r, 0), (0, False))
        self.assertEqual(c._pending_loads, {})

    def start_sidecar(self, socket, *extra):
        d = os.path.dirname(socket)
        log = open(os.path.join(d, "serve2.log"), "ab")
        self.addCleanup(log.close)
        p = subprocess.Popen(
            [BIN, "serve", "--socket", socket, "--data-dir", os.path.join(d, "data2"),
             "--arena-dir", os.path.join(d, "arenas2"), "--dram-capacity", "16MiB",
             "--max-value-size", "4MiB", "--metrics-addr", "127.0.0.1:0", "--ssd-capacity", "0",
             "--log-level", "warn"] + list(extra), stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)

        def stop():
            p.terminate()
            p.wait(timeout=15)
            p.stdout.close()
        self.addCleanup(stop)
        line = p.stdout.readline().decode()
        self.assertIn("serving on socket", line)
        return p

    def test_reconnects_when_sidecar_returns(self):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        d = tempfile.mkdtemp(dir=self.tmp)
        sock = os.path.join(d, "late.sock")
        c = self.connector(KVConnectorRole.SCHEDULER, cfg=make_config(self.model, sock))._sched
        r = make_request("late", list(range(7, 7 + 2 * BS + 1)))
        self.assertEqual(c.get_num_new_matched_tokens(r, 0), (0, False))  # absent: a miss
        self.start_sidecar(sock)
        cl = tidepool.Client(sock)
        self.addCleanup(cl.close)
        for k in c._keys(r):
            cl.put(c._ns, k, b"x")
        import time
        deadline = time.monotonic() + 30
        while c.get_num_new_matched_tokens(r, 0) != (2 * BS, False):  # retry_s is 0 here
            self.assertLess(time.monotonic(), deadline, "the connector did not reconnect")
            time.sleep(0.05)

    def test_refused_namespace_is_a_miss(self):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        d = tempfile.mkdtemp(dir=self.tmp)
        sock = os.path.join(d, "strict.sock")
        self.start_sidecar(sock, "--namespaces", "only/this")
        c = self.connector(KVConnectorRole.SCHEDULER, cfg=make_config(self.model, sock))._sched
        r = make_request("strict", list(range(9, 9 + 2 * BS + 1)))
        with self.assertLogs("vllm.kv_connector.tidepool", level="WARNING") as logs:
            self.assertEqual(c.get_num_new_matched_tokens(r, 0), (0, False))
            self.assertEqual(c.get_num_new_matched_tokens(r, 0), (0, False))
            logger = __import__("logging").getLogger("vllm.kv_connector.tidepool")
            logger.warning("end")  # assertLogs needs one record even if the connector logged none
        refusals = [m for m in logs.output if "Lookup refused" in m]
        self.assertEqual(len(refusals), 1, logs.output)  # logged once per cause, not per call

    def test_hybrid_models_leave_the_connector_inactive(self):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from tidepool.vllm import TidepoolConnector

        class Group:
            kv_cache_spec = "spec"
            layer_names = ["l0"]

        class KVC:
            kv_cache_groups = [Group(), Group()]
            num_blocks = 4
        cfg = make_config(self.model, self.socket)
        c = TidepoolConnector(cfg, KVConnectorRole.SCHEDULER, KVC())._sched
        r = make_request("h", list(range(3 * BS + 1)))
        cl = tidepool.Client(self.socket)
        self.addCleanup(cl.close)
        for k in c._keys(r):
            cl.put(c._ns, k, b"x")
        self.assertEqual(c.get_num_new_matched_tokens(r, 0), (0, False))

    def test_load_failure_policy_becomes_recompute(self):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        cfg = make_config(self.model, self.socket)
        cfg.kv_transfer_config.kv_load_failure_policy = "fail"
        self.connector(KVConnectorRole.SCHEDULER, cfg=cfg)
        self.assertEqual(cfg.kv_transfer_config.kv_load_failure_policy, "recompute")

    # -- worker side: both layouts, save then load through the sidecar ------------
    def worker(self, tag, kv, num_blocks=10, extra=None):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from tidepool.vllm import TidepoolConnector

        class KVC:
            pass
        KVC.num_blocks = num_blocks
        x = {"namespace": "unit/" + tag}
        x.update(extra or {})
        cfg = make_config(self.model, self.socket, extra=x)
        c = TidepoolConnector(cfg, KVConnectorRole.WORKER, KVC())
        c.register_kv_caches(kv)
        self.addCleanup(c.shutdown)
        return c, cfg

    def save_blocks(self, w, req, keys, bids, first=0):
        from tidepool.vllm import TidepoolConnectorMetadata, _Transfer
        import time
        w.bind_connector_metadata(TidepoolConnectorMetadata(saves=[_Transfer(req, keys, bids, first)]))
        w.wait_for_save()
        w.clear_connector_metadata()
        deadline = time.monotonic() + 30
        done = None
        while time.monotonic() < deadline:
            done, _ = w.get_finished({req})
            if done:
                break
            time.sleep(0.02)
        self.assertEqual(done, {req})

    def load_blocks(self, w, keys, bids):
        """One forward step that loads keys into KV blocks bids."""
        from tidepool.vllm import TidepoolConnectorMetadata, _Transfer
        w.bind_connector_metadata(TidepoolConnectorMetadata(loads=[_Transfer("l", keys, bids, 0)]))
        w.start_load_kv(None)
        w.wait_for_save()
        errs = w.get_block_ids_with_load_errors()
        w.clear_connector_metadata()
        return errs

    def roundtrip(self, shape_of, tag, dtype=torch.float32):
        """Saves blocks 1-3 of two layers, loads two back into blocks 5-6
        (consecutive: gathered straight into the KV tensor) and into 9, 4
        (scattered: gathered, then index_copy_)."""
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from tidepool.vllm import TidepoolConnector, stats

        g = torch.Generator().manual_seed(1)
        kv = {"layer.%d" % i: torch.randn(*shape_of(10), generator=g).to(dtype) for i in range(2)}
        w, cfg = self.worker(tag, kv)
        self.assertGreater(w._worker.block_bytes, 64)
        keys = [bytes([i]) * 32 for i in range(1, 4)]
        before = stats()
        self.save_blocks(w, "a", keys, [1, 2, 3])
        after = stats()
        # One Reserve and one Commit for the three blocks.
        self.assertEqual((after.get("rpc_reserve", 0) - before.get("rpc_reserve", 0),
                          after.get("rpc_commit", 0) - before.get("rpc_commit", 0)), (1, 1))
        # take_events: the scheduler turns the worker's report into BlockStored.
        from vllm.v1.outputs import KVConnectorOutput
        wm = w.build_connector_worker_meta()
        self.assertIsNotNone(wm)
        sched = TidepoolConnector(cfg, KVConnectorRole.SCHEDULER, None)
        sched.update_connector_output(KVConnectorOutput(kv_connector_worker_meta=wm))
        (ev,) = list(sched.take_events())
        self.assertEqual((ev.block_hashes, ev.parent_block_hash, ev.medium), (keys, None, "tidepool"))
        self.assertEqual(list(sched.take_events()), [])
        ref = {n: t.clone() for n, t in kv.items()}
        bdim = 0 if next(iter(kv.values())).shape[0] == 10 else 1
        for dst in ([5, 6, 7], [9, 4, 7], [6, 5, 8]):  # a run, scattered, a run out of order
            for t in kv.values():
                for b in dst:
                    t.select(bdim, b).zero_()
            missing = bytes([9]) * 32
            self.assertEqual(self.load_blocks(w, [keys[1], keys[2], missing], dst), {dst[2]})
            for n, t in kv.items():
                self.assertTrue(torch.equal(t.select(bdim, dst[0]), ref[n].select(bdim, 2)), n)
                self.assertTrue(torch.equal(t.select(bdim, dst[1]), ref[n].select(bdim, 3)), n)
                self.assertEqual(float(t.select(bdim, dst[2]).float().abs().sum()), 0.0)
                self.assertTrue(torch.equal(t.select(bdim, 1), ref[n].select(bdim, 1)), n)  # untouched
        self.assertEqual(w.get_block_ids_with_load_errors(), set())
        return w

    def test_cpu_layout_roundtrip(self):
        # CPU attention backend: (num_blocks, num_kv_heads, block_size, 2 * head_size)
        w = self.roundtrip(lambda nb: (nb, 2, BS, 128), "cpu")
        self.assertEqual(len(w._worker._parts), 2)

    def test_cpu_layout_roundtrip_bf16(self):
        w = self.roundtrip(lambda nb: (nb, 2, BS, 128), "cpu-bf16", dtype=torch.bfloat16)
        self.assertEqual(len(w._worker._parts), 2)

    def test_flash_attention_layout_roundtrip(self):
        # FlashAttention: (2, num_blocks, block_size, num_kv_heads, head_size):
        # a block's K and V are two parts of each layer.
        w = self.roundtrip(lambda nb: (2, nb, BS, 2, 64), "fa")
        self.assertEqual(len(w._worker._parts), 4)

    def test_wrong_layout_block_is_a_load_error(self):
        # A block saved under another layout (same size, other header) is refused.
        from tidepool.vllm import HEADER_BYTES
        kv = {"l0": torch.ones(4, 2, BS, 128)}
        w, _ = self.worker("bad", kv, num_blocks=4)
        cl = tidepool.Client(self.socket)
        self.addCleanup(cl.close)
        k1, k2 = b"\x01" * 32, b"\x02" * 32
        cl.put(w._ns, k1, b"\x00" * (HEADER_BYTES + w._worker._block_bytes))  # right size, wrong header
        cl.put(w._ns, k2, b"\x00" * 100)  # wrong size
        self.assertEqual(self.load_blocks(w, [k1, k2], [1, 2]), {1, 2})
        self.assertEqual(float(kv["l0"][1].sum()), float(kv["l0"][0].sum()))  # untouched

    def test_long_transfers_go_in_chunks(self):
        # A transfer longer than the sidecar's max_batch, or than DRAM_SHARE
        # of its DRAM, goes in several calls; every block arrives.
        from tidepool.vllm import stats
        nb = 40
        g = torch.Generator().manual_seed(2)
        kv = {"l0": torch.randn(nb, 2, BS, 128, generator=g)}
        # (Loads through Acquire: the slot index would find them all at once.)
        w, _ = self.worker("chunks", kv, num_blocks=nb, extra={"slot_index": False})
        w._worker._link.get()
        w._worker._link.budget = 7 * w._worker.block_bytes  # as a small DRAM tier would
        orig = tidepool.vllm._Link.get

        def small(link):  # the saver thread's own link, same budget
            c = orig(link)
            if c is not None:
                link.budget = 7 * w._worker.block_bytes
            return c
        tidepool.vllm._Link.get = small
        self.addCleanup(setattr, tidepool.vllm._Link, "get", orig)
        keys = [os.urandom(32) for _ in range(16)]
        before = stats()
        self.save_blocks(w, "c", keys, list(range(16)))
        mid = stats()
        self.assertEqual(mid["rpc_reserve"] - before.get("rpc_reserve", 0), 3)  # 7 + 7 + 2
        self.assertEqual(mid["saved_blocks"] - before.get("saved_blocks", 0), 16)
        ref = kv["l0"][:16].clone()
        kv["l0"][20:36].zero_()
        self.assertEqual(self.load_blocks(w, keys, list(range(20, 36))), set())
        self.assertEqual(stats()["rpc_acquire"] - mid.get("rpc_acquire", 0), 3)
        self.assertTrue(torch.equal(kv["l0"][20:36], ref))

    def test_slot_index_loads_check_after_the_copy(self):
        # Loads through the sidecar's slot index: no Acquire for blocks it
        # lists. A block deleted after it was found (as an eviction during
        # the copy would) fails the check after the copy and goes through
        # Acquire, which finds it gone: a load error, the others loaded.
        from tidepool import slots
        from tidepool.vllm import stats
        if not slots.supported():
            self.skipTest("the slot index is read on x86-64 only")
        nb = 12
        kv = {"l0": torch.randn(nb, 2, BS, 128, generator=torch.Generator().manual_seed(3))}
        w, _ = self.worker("index", kv, num_blocks=nb)
        keys = [os.urandom(32) for _ in range(4)]
        self.save_blocks(w, "i", keys, [0, 1, 2, 3])
        ref = kv["l0"][:4].clone()
        kv["l0"][6:10].zero_()
        cl = tidepool.Client(self.socket)
        self.addCleanup(cl.close)
        checked = w._worker._checked

        def delete_then_check(*a, **kw):
            cl.delete(w._ns, keys[1])
            return checked(*a, **kw)
        w._worker._checked = delete_then_check
        before = stats()
        self.assertEqual(self.load_blocks(w, keys, [6, 7, 8, 9]), {7})
        after = stats()
        self.assertEqual(after["index_loaded_blocks"] - before.get("index_loaded_blocks", 0), 3)
        self.assertEqual(after["index_changed_blocks"] - before.get("index_changed_blocks", 0), 1)
        self.assertEqual(after.get("rpc_acquire", 0) - before.get("rpc_acquire", 0), 1)  # block 7's, NOT_FOUND
        for dst, src in ((6, 0), (8, 2), (9, 3)):
            self.assertTrue(torch.equal(kv["l0"][dst], ref[src]), dst)

    def test_loads_copied_layer_by_layer(self):
        # Once a forward has called wait_for_layer_load for every layer, a
        # load is copied there, each layer right before its attention: not
        # in start_load_kv. A forward that skips a layer makes its blocks
        # load errors (it read them before their copy) and ends layered
        # loads; a step with no forward copies them at its end.
        from tidepool.vllm import TidepoolConnectorMetadata, _Transfer, stats
        nb, names = 12, ["l0", "l1", "l2"]
        g = torch.Generator().manual_seed(5)
        kv = {n: torch.randn(nb, 2, BS, 128, generator=g) for n in names}
        w, _ = self.worker("layered", kv, num_blocks=nb)
        keys = [os.urandom(32) for _ in range(4)]
        self.save_blocks(w, "s", keys, [0, 1, 2, 3])
        ref = {n: kv[n][:4].clone() for n in names}

        def step(layers, check=None):
            for n in names:
                kv[n][6:10].zero_()
            w.bind_connector_metadata(TidepoolConnectorMetadata(loads=[_Transfer("l", keys, [6, 7, 8, 9], 0)]))
            w.start_load_kv(None)
            for n in layers:
                if check:
                    check(n)
                w.wait_for_layer_load(n)
            w.wait_for_save()
            errs = w.get_block_ids_with_load_errors()
            w.clear_connector_metadata()
            return errs

        def copied(n):
            return torch.equal(kv[n][6:10], ref[n])
        # The first step copies before the forward (nothing is known of it).
        self.assertEqual(step(names, check=lambda n: self.assertTrue(copied(n), n)), set())
        # Then each layer is copied at its call, not before.
        before = stats()

        def not_yet(n):
            self.assertFalse(copied(n), n)
            for m in names[:names.index(n)]:
                self.assertTrue(copied(m), m)
        self.assertEqual(step(names, check=not_yet), set())
        self.assertTrue(all(copied(n) for n in names))
        self.assertEqual(stats()["layered_loaded_blocks"] - before.get("layered_loaded_blocks", 0), 4)
        # A step with no forward: copied at its end, nothing lost.
        self.assertEqual(step([]), set())
        self.assertTrue(all(copied(n) for n in names))
        # A block deleted during the forward fails; the others load.
        cl = tidepool.Client(self.socket)
        self.addCleanup(cl.close)
        self.assertEqual(step(names, check=lambda n: n == "l1" and cl.delete(w._ns, keys[2])), {8})
        self.assertTrue(torch.equal(kv["l0"][6], ref["l0"][0]))
        # A forward that skips a layer: every block of the step is a load
        # error, and loads are copied before the forward from then on.
        self.save_blocks(w, "s2", keys[2:3], [2])
        self.assertEqual(step(["l0", "l2"]), {6, 7, 8, 9})
        self.assertFalse(w._worker._layerwise)
        for _ in range(2):  # for good
            self.assertEqual(step(names, check=lambda n: self.assertTrue(copied(n), n)), set())

    def test_layers_asked_for_after_the_step_keep_loads_before_the_forward(self):
        # A layer vLLM asks for only after the step's end (a speculative
        # decoder's draft model runs after get_block_ids_with_load_errors):
        # the engine never copies in the forward, and nothing is lost.
        from tidepool.vllm import TidepoolConnectorMetadata, _Transfer
        nb, names = 12, ["t0", "t1", "draft"]
        kv = {n: torch.randn(nb, 2, BS, 128, generator=torch.Generator().manual_seed(6)) for n in names}
        w, _ = self.worker("layered-draft", kv, num_blocks=nb)
        keys = [os.urandom(32) for _ in range(3)]
        self.save_blocks(w, "s", keys, [0, 1, 2])
        ref = {n: kv[n][:3].clone() for n in names}
        for _ in range(3):
            for n in names:
                kv[n][6:9].zero_()
            w.bind_connector_metadata(TidepoolConnectorMetadata(loads=[_Transfer("l", keys, [6, 7, 8], 0)]))
            w.start_load_kv(None)
            for n in names:
                self.assertTrue(torch.equal(kv[n][6:9], ref[n]), n)  # copied before the forward
            w.wait_for_layer_load("t0")
            w.wait_for_layer_load("t1")
            self.assertEqual(w.get_block_ids_with_load_errors(), set())
            w.wait_for_layer_load("draft")
            w.wait_for_save()
            w.clear_connector_metadata()
        self.assertIsNone(w._worker._layerwise)

    def test_shutdown_waits_for_saves(self):
        # Saves queued just before shutdown() are all stored when it returns.
        nb = 24
        kv = {"l0": torch.randn(nb, 2, BS, 128)}
        w, _ = self.worker("shutdown", kv, num_blocks=nb)
        from tidepool.vllm import TidepoolConnectorMetadata, _Transfer
        keys = [os.urandom(32) for _ in range(nb)]
        w.bind_connector_metadata(TidepoolConnectorMetadata(
            saves=[_Transfer("s%d" % i, [k], [i], i) for i, k in enumerate(keys)]))
        w.wait_for_save()
        w.clear_connector_metadata()
        w.shutdown()
        cl = tidepool.Client(self.socket)
        self.addCleanup(cl.close)
        self.assertEqual(cl.lookup(w._ns, keys), nb)
        w.shutdown()  # twice: nothing happens

    def test_saves_skip_what_the_sidecar_holds(self):
        # Blocks the lookup found, and blocks this engine saved before, are
        # not offered again; a save the worker reports failed is.
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.v1.outputs import KVConnectorOutput
        from tidepool.vllm import TidepoolWorkerMetadata
        c = self.connector(KVConnectorRole.SCHEDULER, extra={"namespace": "unit/skip"})._sched
        toks = list(range(200, 200 + 6 * BS + 3))
        cl = tidepool.Client(self.socket)
        self.addCleanup(cl.close)
        r1 = make_request("s1", toks)
        c.on_new_request(r1)
        keys = c._keys(r1)
        for k in keys[:2]:
            cl.put(c._ns, k, b"x")
        self.assertEqual(c.get_num_new_matched_tokens(r1, 0), (2 * BS, False))
        r1.num_computed_tokens = 2 * BS
        c.update_state_after_alloc(r1, 2 * BS)
        meta = c.build_connector_meta(scheduler_output([(r1, list(range(7)))], {"s1": len(toks) - 2 * BS}))
        (save,) = meta.saves
        self.assertEqual((save.keys, save.first_index, save.parent), (keys[2:6], 2, keys[1]))
        c.request_finished(r1)
        # The same prompt again (vLLM's own prefix cache has it: no lookup
        # is asked for it) plus one block: only the new block is offered.
        r2 = make_request("s2", toks + list(range(BS)))
        c.on_new_request(r2)
        meta = c.build_connector_meta(scheduler_output([(r2, list(range(8)))], {"s2": len(toks) + BS}))
        (save,) = meta.saves
        self.assertEqual((save.keys, save.first_index), (c._keys(r2)[6:7], 6))
        # The worker reports block 6 failed: a third request offers it again.
        c.update_connector_output(KVConnectorOutput(
            kv_connector_worker_meta=TidepoolWorkerMetadata(failed=list(save.keys))))
        r3 = make_request("s3", toks + list(range(BS)) + [1])
        c.on_new_request(r3)
        meta = c.build_connector_meta(scheduler_output([(r3, list(range(8)))], {"s3": len(toks) + BS + 1}))
        self.assertEqual([t.keys for t in meta.saves], [c._keys(r3)[6:7]])

if __name__ == "__main__":
    unittest.main(verbosity=2)
