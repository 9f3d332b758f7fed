"""The vLLM connector's load path alone (Worker.start_load_kv: Acquire, the
copies into the paged KV tensors, the leases' release), MB/s for N blocks
of the CPU backend's layout, against a `tidepool serve` of its own; with
BENCH_BEFORE_PKG (a directory holding an older clients/python/tidepool as
the package tidepool_before, as scripts/bench-vllm.sh makes it), the older
connector too, alternating in one run. With PROFILE=path, a cProfile of
each connector's loads is written to path.<name> and its top entries
printed.

  .venv-engines/bin/python tests/engines/bench_load.py [ROUNDS] [BLOCKS] [LAYERS]   (3 64 2)

torch runs on BENCH_THREADS threads (default 1: on a busy machine torch's
parallel copies wait on each other's threads far longer than they copy;
vLLM's CPU worker binds its own threads).

A block is LAYERS x 64 KiB (+64 bytes of header): LAYERS=2 gives 128 KiB
blocks, LAYERS=8 512 KiB. Each round loads the same blocks into other KV
blocks (the engine's situation after its first pass over the arenas); the
first round of each connector is a warm-up and is left out.
"""

import cProfile
import importlib
import io
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "clients", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import test_vllm_units as U  # noqa: E402


def main():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    layers = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    mods = {"current": importlib.import_module("tidepool.vllm")}
    if os.environ.get("BENCH_BEFORE_PKG"):
        sys.path.insert(0, os.environ["BENCH_BEFORE_PKG"])
        mods["before"] = importlib.import_module("tidepool_before.vllm")
    tmp = tempfile.mkdtemp(prefix="tp-bench-load.", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    model = U.write_tiny_llama(os.path.join(tmp, "model"))
    sock = os.path.join(tmp, "tp.sock")
    serve = subprocess.Popen([U.BIN, "serve", "--socket", sock, "--data-dir", os.path.join(tmp, "data"),
                              "--arena-dir", os.path.join(tmp, "arenas"), "--dram-capacity", "1GiB",
                              "--max-value-size", "16MiB", "--metrics-addr", "127.0.0.1:0", "--ssd-capacity", "0",
                              "--log-level", "warn"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        serve.stdout.readline()
        nb = 2 * n + 2

        class KVC:
            num_blocks = nb

        kv = {"l%d" % i: torch.randn(nb, 2, 32, 256) for i in range(layers)}  # 64 KiB a layer's block
        cfg = U.make_config(model, sock, extra={"namespace": "bench/load"})
        conns = {}
        for name, m in mods.items():
            w = m.TidepoolConnector(cfg, KVConnectorRole.WORKER, KVC())
            w.register_kv_caches(kv)
            conns[name] = (m, w)
        m, w = conns["current"]
        keys = [os.urandom(32) for _ in range(n)]
        w.bind_connector_metadata(m.TidepoolConnectorMetadata(saves=[m._Transfer("s", keys, list(range(n)), 0)]))
        w.wait_for_save()
        w.clear_connector_metadata()
        w._worker.drain()
        ref = [t[:n].clone() for t in kv.values()]
        profs = {name: cProfile.Profile() for name in conns} if os.environ.get("PROFILE") else {}
        out = {name: [] for name in conns}
        block = None
        for rnd in range(rounds + 1):
            for name, (m, w) in conns.items():
                dst = list(range(n + 1, 2 * n + 1))
                for t in kv.values():
                    t[n + 1:2 * n + 1].zero_()
                w.bind_connector_metadata(m.TidepoolConnectorMetadata(loads=[m._Transfer("l", keys, dst, 0)]))
                p = profs.get(name)
                if p is not None:
                    p.enable()
                t0 = time.perf_counter()
                w.start_load_kv(None)
                dt = time.perf_counter() - t0
                if p is not None:
                    p.disable()
                w.clear_connector_metadata()
                assert not w.get_block_ids_with_load_errors(), name
                for t, r in zip(kv.values(), ref):
                    assert torch.equal(t[n + 1:2 * n + 1], r), name
                block = (w._worker.block_bytes if hasattr(w, "_worker") else 64 + w._block_bytes)
                if rnd > 0:
                    out[name].append(n * block / dt / 1e6)
        for name, v in out.items():
            print(json.dumps({"connector": name, "blocks": n, "block_bytes": block,
                              "MBps": [round(x) for x in v], "median_MBps": round(sorted(v)[len(v) // 2]),
                              "best_MBps": round(max(v)),
                              "ms_per_load": round(n * block / sorted(v)[len(v) // 2] / 1e3, 3)}), flush=True)
        for name, p in profs.items():
            p.dump_stats(os.environ["PROFILE"] + "." + name)
            s = io.StringIO()
            pstats.Stats(p, stream=s).sort_stats("tottime").print_stats(8)
            print("PROFILE %s (%d loads of %d blocks), top by own time:" % (name, rounds + 1, n))
            print("\n".join(line for line in s.getvalue().splitlines() if line.strip())[-1400:])
    finally:
        serve.terminate()
        serve.wait(timeout=15)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
