"""Benchmark of tidepool.sglang.TidepoolStorage against one real sidecar:
pages between SGLang's host pool and tidepool's arenas, through the calls
the HiCache controller makes (batch_set_v1 / batch_get_v1 with host-pool
indices, and the plain batch_set / batch_get with flat page tensors),
next to a memcpy of the same pages inside the host pool and SGLang's own
file backend (HiCacheFile) on /dev/shm. Rounds interleave the modes.

    .venv-sglang/bin/python tests/engines/bench_sglang.py [ROUNDS] [PAGES]

A page: 32 tokens of 8 layers, 8 KV heads, head size 128, bfloat16 (1 MiB,
page_first layout). Each round sets PAGES fresh pages in one batch (new
keys: every set stores) and gets them back into other host pages.
"""

import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "clients", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from sidecar import Sidecar  # noqa: E402

PAGE, LAYERS, HEADS, DIM = 32, 8, 8, 128


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    dev = MHATokenToKVPool(2 * n * PAGE, PAGE, torch.bfloat16, HEADS, DIM, LAYERS, "cpu", False)
    with host_memory_budget_scope(8 << 30):
        pool = MHATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 1.5, 0, PAGE, "page_first",
                                    pin_memory=False, device="cpu", device_capacity_tokens=dev.size,
                                    start_layer=0, end_layer=LAYERS)
    tmp = tempfile.mkdtemp(prefix="bench-sgl-", dir="/dev/shm")
    sc = Sidecar(tmp, "bench", ["--dram-capacity", "2GiB"]).start()
    try:
        def cfg(extra):
            return HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                        is_mla_model=False, enable_storage_metrics=False,
                                        is_page_first_layout=True, model_name="bench", extra_config=extra)
        tp = StorageBackendFactory.create_backend("dynamic", cfg({
            "backend_name": "tidepool", "module_path": "tidepool.sglang", "class_name": "TidepoolStorage",
            "interface_v1": 1, "socket": sc.socket}), pool)
        tp.register_mem_pool_host(pool)
        os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = os.path.join(tmp, "file")
        fb = StorageBackendFactory.create_backend("file", cfg({}), pool)
        fb.register_mem_pool_host(pool)
        src, dst = pool.alloc(n * PAGE), pool.alloc(n * PAGE)
        g = torch.Generator().manual_seed(1)
        for i in range(n):
            pool.set_from_flat_data_page(int(src[i * PAGE]),
                                         torch.randn(pool.get_dummy_flat_data_page().numel(), generator=g)
                                         .to(torch.bfloat16))
        mb = n * 2 * LAYERS * PAGE * HEADS * DIM * 2 / 1e6
        firsts = [int(src[i * PAGE]) for i in range(n)]
        dfirsts = [int(dst[i * PAGE]) for i in range(n)]

        def v1(r):
            keys = ["v1-%d-%d" % (r, i) for i in range(n)]
            t0 = time.perf_counter()
            assert all(tp.batch_set_v1(keys, src))
            t1 = time.perf_counter()
            assert all(tp.batch_get_v1(keys, dst))
            t2 = time.perf_counter()
            return t1 - t0, t2 - t1

        def plain(r, backend=tp, tag="plain"):
            keys = ["%s-%d-%d" % (tag, r, i) for i in range(n)]
            t0 = time.perf_counter()
            # What the controller's generic path does around the calls.
            assert backend.batch_set(keys, [pool.get_data_page(f) for f in firsts])
            t1 = time.perf_counter()
            got = backend.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys])
            for f, page in zip(dfirsts, got):
                pool.set_from_flat_data_page(f, page)
            t2 = time.perf_counter()
            return t1 - t0, t2 - t1

        def memcpy(r):
            t0 = time.perf_counter()
            for a, b in zip(firsts, dfirsts):
                pool.kv_buffer[:, b:b + PAGE].copy_(pool.kv_buffer[:, a:a + PAGE])
            t1 = time.perf_counter()
            return t1 - t0, t1 - t0

        modes = [("tidepool v1", v1), ("tidepool plain", plain), ("file /dev/shm", lambda r: plain(r, fb, "file")),
                 ("memcpy", memcpy)]
        print("pages %d x %.2f MB per batch, %d rounds (round 0 warm-up), load %s"
              % (n, mb / n, rounds, open("/proc/loadavg").read().split()[:3]))
        res = {m: ([], []) for m, _ in modes}
        for r in range(rounds + 1):
            for m, f in modes:
                s, g_ = f(r)
                if r:
                    res[m][0].append(mb / s)
                    res[m][1].append(mb / g_)
        for m, _ in modes:
            sets, gets = sorted(res[m][0]), sorted(res[m][1])
            print("%-15s set MB/s %s  median %.0f | get MB/s %s  median %.0f"
                  % (m, " ".join("%.0f" % x for x in res[m][0]), sets[len(sets) // 2],
                     " ".join("%.0f" % x for x in res[m][1]), gets[len(gets) // 2]))
    finally:
        sc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
