"""One "SGLang engine process" for tests/engines/test_sglang_backend.py:
SGLang's own HiCache objects on host tensors, no GPU and no model.

    python sglang_engine.py SPEC.json OUT.json

It builds what an SGLang scheduler builds for hierarchical caching with a
storage tier, from SGLang's classes: a device KV pool (MHATokenToKVPool,
on the CPU), its page allocator, the host pool (MHATokenToKVPoolHost,
the L2 tier, in the layout asked) and the HiCacheController, whose attach
creates tidepool.sglang.TidepoolStorage through StorageBackendFactory
("dynamic", the extra config) and starts its prefetch and backup threads.
Then it runs the spec's steps in order:

  save   writes each page's K and V (seeded, from the page's tokens) into
         host pool pages, hashes the tokens with SGLang's
         get_storage_hash_str and hands the pages to the controller's
         backup path (write_storage -> backup thread -> batch_set_v1, or
         batch_set without interface_v1); reports completed tokens.
  load   the controller's prefetch path: prefetch -> prefetch thread
         (_storage_hit_query: page hashes, batch_exists) -> host pages
         allocated as the scheduler does -> prefetch I/O thread
         (_page_transfer: batch_get_v1, or batch_get) -> acks; reports
         the hit count, the tokens loaded and a SHA-256 of every loaded
         page's bytes next to that of the bytes the seed gives.
  wait   waits for a file (the test's go-ahead).

OUT.json is rewritten after every step: {"steps": [...], "done": bool}.
A step may name a "barrier" directory: the step's first Acquire, once
answered, creates barrier/acquired and waits for barrier/go (the test kills
the sidecar in between).
"""

import hashlib
import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

import torch  # noqa: E402

LAYERS, HEADS, HEAD_DIM = 2, 2, 16
STEP_TIMEOUT_S = 120.0


def page_values(seed, tokens, page_size, dtype):
    """The flat page (get_data_page order, (K|V, layer, token, head, dim))
    of each whole page: a function of the seed and the page's tokens only,
    so any process computes the same bytes."""
    out = []
    for i in range(len(tokens) // page_size):
        h = hashlib.sha256(json.dumps([seed, tokens[:(i + 1) * page_size]]).encode()).digest()
        g = torch.Generator().manual_seed(int.from_bytes(h[:8], "little"))
        out.append(torch.randn(2 * LAYERS * page_size * HEADS * HEAD_DIM, generator=g).to(dtype))
    return out


def digest(t):
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def publish_config(spec, page):
    """What an SGLang process publishes before it builds its caches: the
    server configuration (here SGLang's test helper's dummy ServerArgs with
    the HiCache flags of the command line) and this process's ranks."""
    from sglang.srt.runtime_context import get_context, get_parallel
    get_context().override_server_args(
        enable_hierarchical_cache=True, page_size=page, device="cpu",
        hicache_mem_layout=spec.get("layout", "layer_first"), hicache_storage_backend="dynamic",
        hicache_storage_backend_extra_config=json.dumps(spec.get("extra", {}))).install()
    get_parallel().override_permanently(tp_rank=0, pp_rank=0, attn_tp_rank=0, attn_dp_rank=0, attn_cp_rank=0,
                                        attn_dcp_rank=0)


class Engine:
    def __init__(self, spec):
        from sglang.srt.managers.cache_controller import HiCacheController
        from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

        self.page = int(spec.get("page_size", 16))
        publish_config(spec, self.page)
        self.dtype = getattr(torch, spec.get("dtype", "float32"))
        self.device_pool = MHATokenToKVPool(1024, self.page, self.dtype, HEADS, HEAD_DIM, LAYERS, "cpu", False)
        self.allocator = PagedTokenToKVPoolAllocator(1024, self.page, self.dtype, "cpu", self.device_pool, False)
        info = self.device_pool.get_device_pool_infos()[0].buffer_info
        # A budget of its own: SGLang otherwise keeps 10 GiB of the
        # machine's free memory out of reach (a 2 MiB pool here).
        with host_memory_budget_scope(1 << 30):
            self.host = MHATokenToKVPoolHost(info, 2.0, 0, self.page, spec.get("layout", "layer_first"),
                                             pin_memory=False, device="cpu",
                                             device_capacity_tokens=self.device_pool.size,
                                             start_layer=0, end_layer=LAYERS)
        extra = {"backend_name": "tidepool", "module_path": "tidepool.sglang", "class_name": "TidepoolStorage",
                 "socket": spec["socket"], "timeout_s": 5.0, "retry_s": 0.2}
        if spec.get("interface_v1", 1):
            extra["interface_v1"] = 1
        extra.update(spec.get("extra", {}))
        self.ctl = HiCacheController(self.allocator, self.host, self.page, None, threading.Event(),
                                     write_policy="write_through", io_backend="direct",
                                     storage_backend="dynamic", model_name=spec.get("model", "tiny-test"),
                                     storage_backend_extra_config=extra)
        self.backend = self.ctl.storage_backend
        self.n = 0

    def hashes(self, tokens):
        from sglang.srt.mem_cache.utils import get_storage_hash_str
        return get_storage_hash_str(tokens, None, page_size=self.page)

    def save(self, step):
        tokens = step["tokens"]
        values = page_values(step.get("seed", 0), tokens, self.page, self.dtype)
        idx = self.host.alloc(len(values) * self.page)
        for i, v in enumerate(values):
            self.host.set_from_flat_data_page(int(idx[i * self.page]), v)
        hashes = self.hashes(tokens)[:len(values)]
        self.ctl.write_storage(idx, tokens[:len(values) * self.page], hash_value=hashes)
        op = self.ctl.ack_backup_queue.get(timeout=STEP_TIMEOUT_S)
        saved = [digest(self.host.get_data_page(int(idx[i * self.page]))) for i in range(len(values))]
        self.host.free(idx)
        return {"op": "save", "completed_tokens": op.completed_tokens, "pages": len(values), "hashes": hashes,
                "saved": saved, "expected": [digest(v) for v in values]}

    def load(self, step):
        tokens = step["tokens"]
        self.n += 1
        rid = "req-%d" % self.n
        op = self.ctl.prefetch(rid, tokens)
        # What the scheduler does with a hit query (UnifiedRadixCache's
        # prefetch drain): allocate host pages for the hit, hand the
        # operation to the prefetch I/O thread.
        op = self.ctl.prefetch_hit_queue.get(timeout=STEP_TIMEOUT_S)
        hit = op.storage_hit_count
        out = {"op": "load", "hit_tokens": hit, "completed_tokens": 0, "loaded": [], "hashes": op.hash_value}
        if hit == 0:
            return out
        idx = self.ctl.alloc_prefetch_host_buffers(op, hit)
        op.host_indices = idx
        self.ctl.prefetch_buffer.put(op)
        completed = 0
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while time.monotonic() < deadline:
            ack = self.ctl.ack_prefetch_queue.get(timeout=STEP_TIMEOUT_S)
            if ack.rid != rid:
                continue
            if ack.completed_req:
                break
            if ack.completed_tokens is not None:
                completed = ack.completed_tokens
        out["completed_tokens"] = completed
        pages = completed // self.page
        out["loaded"] = [digest(self.host.get_data_page(int(idx[i * self.page]))) for i in range(pages)]
        values = page_values(step.get("seed", 0), tokens, self.page, self.dtype)
        out["expected"] = [digest(v) for v in values]
        self.ctl.free_prefetch_host_buffers(op, idx)
        return out


def with_barrier(d):
    """The next Acquire, once answered, announces d/acquired and waits for d/go."""
    from tidepool import client as tc
    orig = tc.Client.acquire

    def acquire(self, *a, **kw):
        tc.Client.acquire = orig
        r = orig(self, *a, **kw)
        open(os.path.join(d, "acquired"), "w").close()
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while not os.path.exists(os.path.join(d, "go")) and time.monotonic() < deadline:
            time.sleep(0.02)
        return r
    tc.Client.acquire = acquire


def main():
    spec = json.load(open(sys.argv[1]))
    out_path = sys.argv[2]
    result = {"steps": [], "done": False}

    def dump():
        tmp = out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, out_path)
    eng = Engine(spec)
    result["namespace"] = eng.backend.namespace if hasattr(eng.backend, "namespace") else None
    result["backend"] = type(eng.backend).__name__
    for step in spec["steps"]:
        if step["op"] == "wait":
            deadline = time.monotonic() + STEP_TIMEOUT_S
            while not os.path.exists(step["file"]) and time.monotonic() < deadline:
                time.sleep(0.05)
            result["steps"].append({"op": "wait"})
        else:
            if step.get("barrier"):
                with_barrier(step["barrier"])
            result["steps"].append(getattr(eng, step["op"])(step))
        from tidepool.sglang import stats
        result["stats"] = stats()
        result["threads_alive"] = all(t.is_alive() for t in (eng.ctl.prefetch_thread, eng.ctl.backup_thread,
                                                              eng.ctl.prefetch_io_aux_thread))
        dump()
    result["done"] = True
    dump()


if __name__ == "__main__":
    main()
