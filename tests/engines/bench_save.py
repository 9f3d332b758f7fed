"""The vLLM connector's save path alone: MB/s of TidepoolConnector._save
(Reserve, the copies into the slots, Commit) for 64 blocks of 8 CPU-layout
layers (512 KiB a block), against a `tidepool serve` of its own, the two
ways the connector writes a block, alternating:

  write_slot     the client copies the layers' bytes from the KV tensors'
                 memory (a keyed mapping where the machine has protection
                 keys, else pwritev): blocks contiguous in host memory
  writable_slot  the slot's pages mapped for the block and torch's copy_:
                 GPU KV caches and layouts whose block is not contiguous

each in a fresh worker (its first writes to each arena page) and in one
whose client ran prepare_writes() first (as after a first pass over the
arenas: a long-running engine). Prints one JSON object per mode.

  .venv-engines/bin/python tests/engines/bench_save.py [ROUNDS]   (default 3)
"""

import json
import os
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
    from tidepool.vllm import TidepoolConnector, _Link, _Transfer

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    tmp = tempfile.mkdtemp(prefix="tp-bench-save.", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    model = U.write_tiny_llama(os.path.join(tmp, "model"))
    sock = os.path.join(tmp, "tp.sock")
    serve = subprocess.Popen([U.BIN, "serve", "--socket", sock, "--data-dir", os.path.join(tmp, "data"),
                              "--arena-dir", os.path.join(tmp, "arenas"), "--dram-capacity", "1GiB",
                              "--max-value-size", "4MiB", "--metrics-addr", "127.0.0.1:0", "--ssd-capacity", "0",
                              "--log-level", "warn"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        serve.stdout.readline()

        class KVC:
            num_blocks = 128

        out = {}
        for rnd in range(rounds):
            for prepared in (False, True):
                for path in ("write_slot", "writable_slot"):
                    ns = "bench/%s/%d/%d" % (path, prepared, rnd)
                    w = TidepoolConnector(U.make_config(model, sock, extra={"namespace": ns}),
                                          KVConnectorRole.WORKER, KVC())
                    w.register_kv_caches({"l%d" % i: torch.randn(128, 4, 32, 128) for i in range(8)})
                    if path == "writable_slot":
                        w._host_parts = lambda bid: None
                    link = _Link(sock, 5.0, 0.0, "bench")
                    if prepared:
                        link.get().prepare_writes()
                    keys = [os.urandom(32) for _ in range(64)]
                    t0 = time.perf_counter()
                    w._save(link, _Transfer("r", keys, list(range(64)), 0))
                    dt = time.perf_counter() - t0
                    c = link.get()
                    assert c.lookup(w._ns, keys) == 64, "not every block was saved"
                    c.close()
                    out.setdefault((path, prepared), []).append(64 * w._block_bytes / dt / 1e6)
                    block = w._block_bytes
        for (path, prepared), v in out.items():
            print(json.dumps({"path": path, "prepare_writes": prepared, "block_bytes": block,
                              "MBps": [round(x) for x in v], "median_MBps": round(sorted(v)[len(v) // 2])}))
    finally:
        serve.terminate()
        serve.wait(timeout=15)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
