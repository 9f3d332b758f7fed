"""Where a tidepool hit's time goes, beside vLLM's own prefix-cache hit in
the same engine (docs/PERFORMANCE.md section 30). A diagnostic, not a
test: it wraps vLLM's and the connector's methods with timers.

    VLLM_CPU_KVCACHE_SPACE=1 .venv-engines/bin/python tests/engines/hit_breakdown.py \
        bin/tidepool ROUNDS PREFIX_TOKENS BLOCK_SIZE [--no-slot-index] [--cold] [--before-forward]

One `tidepool serve` and one engine in this process (the model of
bench_vllm.py, BENCH_LAYERS layers). Each round, for a fresh prompt p:
p + 1 token computed and saved, one untimed prefix hit, then, timed:

  prefix            vLLM's prefix-cache hit, right after the untimed one
  prefix, idle      the same after 10 ms of sleep
  bound             the same, timed with one contiguous copy of as many
                    bytes as a hit moves after it (bench_vllm.py's bound)
  tidepool          the prefix cache emptied: p's blocks from the sidecar
  tidepool, warm    the same right after an untimed two-token request

--no-slot-index: the connector with slot_index false (a Lookup and an
Acquire per hit). --before-forward: every load copied in start_load_kv,
before the forward, never layer by layer in it. --cold: before every
timed request, untimed, 128 MiB of other memory written, so that no way finds the prompt's KV or the weights
in the CPU caches from the request before it (as in a server where other
requests ran in between). Prints per way the median TTFT, its ratio to the prefix
hit's median and the median of the rounds' own ratios (each round's way
over that round's prefix hit), and the median time inside each wrapped
method (the connector's save thread included).
"""

import collections
import functools
import os
import random
import subprocess
import sys
import tempfile
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "clients", "python"))
import bench_vllm  # noqa: E402
from bench_engine import copy_bytes, reset  # noqa: E402
from run_engine import write_tiny_llama  # noqa: E402

TIMES = collections.defaultdict(float)


def timed(cls, name):
    f = getattr(cls, name)
    label = "%s.%s" % (cls.__name__, name)

    @functools.wraps(f)
    def w(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            TIMES[label] += time.perf_counter() - t0
    setattr(cls, name, w)


def instrument(before_forward):
    import tidepool.vllm as tv
    if before_forward:
        end_step = tv.Worker._end_step

        def never_layered(self):
            end_step(self)
            self._layerwise = False
        tv.Worker._end_step = never_layered
    from tidepool import client as tc
    from vllm.v1.core.sched import scheduler as vs
    from vllm.v1.worker import cpu_model_runner as cmr
    for n in ("schedule", "update_from_output"):
        timed(vs.Scheduler, n)
    for n in ("get_num_new_matched_tokens", "build_connector_meta"):
        timed(tv.Scheduler, n)
    for n in ("start_load_kv", "_indexed", "_plan_chunk", "_checked", "_copy_now", "_copy_layer", "wait_for_save"):
        timed(tv.Worker, n)
    for n in ("acquire", "lookup"):
        timed(tc.Client, n)
    for n in ("_update_states", "_prepare_inputs", "_model_forward"):
        if hasattr(cmr.CPUModelRunner, n):
            timed(cmr.CPUModelRunner, n)


def main():
    bin_, rounds, prefix, bs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    slot_index = "--no-slot-index" not in sys.argv[5:]
    cold = "--cold" in sys.argv[5:]
    before_forward = "--before-forward" in sys.argv[5:]
    layers = int(os.environ.get("BENCH_LAYERS", "8"))
    tmp = tempfile.mkdtemp(prefix="tp-hit-")
    os.environ["BENCH_SHM"] = tempfile.mkdtemp(dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else tmp)
    proc, sock, _ = bench_vllm.serve(bin_, tmp, "node", ["--dram-capacity", "1GiB", "--max-value-size", "64MiB",
                                                         "--ssd-capacity", "0"])
    try:
        model = write_tiny_llama(os.path.join(tmp, "model"), layers=layers, hidden=512, heads=8, kv_heads=4,
                                 vocab=2048, ctx=prefix + 256)
        instrument(before_forward)
        from vllm import LLM, SamplingParams
        from vllm.config import KVTransferConfig
        from vllm.inputs import TokensPrompt
        kv = KVTransferConfig(kv_connector="TidepoolConnector", kv_connector_module_path="tidepool.vllm",
                              kv_role="kv_both", kv_connector_extra_config={"socket": sock, "slot_index": slot_index})
        llm = LLM(model=model, skip_tokenizer_init=True, dtype="float32", block_size=bs,
                  max_model_len=prefix + 256, enable_prefix_caching=True, max_num_seqs=1,
                  max_num_batched_tokens=prefix + 256, enforce_eager=True, seed=0,
                  gpu_memory_utilization=0.05, kv_transfer_config=kv)
        sp = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False)

        hit_bytes = (prefix // bs) * (bench_vllm.kv_block_bytes(bs, layers) + 64)

        import torch
        other = torch.zeros(128 << 20, dtype=torch.uint8) if cold else None

        def gen(prompt, copy=0, timed=False):
            if timed and other is not None:
                other.add_(1)  # the CPU caches filled with other memory
            t0 = time.perf_counter()
            o = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)[0]
            if copy:  # after the hit: the copy's traffic does not cool the caches the hit reads
                copy_bytes(copy)
            return time.perf_counter() - t0, o.num_cached_tokens
        r = random.Random(1)
        ttft, parts = collections.defaultdict(list), collections.defaultdict(lambda: collections.defaultdict(list))
        ways = (("prefix", [6, 1]), ("prefix, idle", [6, 4]), ("bound", [6, 2]), ("tidepool", [7, 1]),
                ("tidepool, warm", [7, 2]))
        for i in range(rounds + 1):
            p = [r.randrange(3, 2000) for _ in range(prefix)]
            gen(p + [5])
            bench_vllm.wait_held(sock, p, bs, prefix // bs)
            gen(p + [6, 3])
            for way, tail in ways:
                if way == "prefix, idle":
                    time.sleep(0.01)
                if way.startswith("tidepool"):
                    reset(llm, sp, TokensPrompt)
                    if way == "tidepool, warm":
                        gen([3, 4])
                TIMES.clear()
                dt, cached = gen(p + tail, hit_bytes if way == "bound" else 0, timed=True)
                if cached < prefix:
                    print("round %d %s: only %d tokens cached" % (i, way, cached), flush=True)
                if i > 0:
                    ttft[way].append(dt)
                    for k, v in TIMES.items():
                        parts[way][k].append(v)

        def med(xs):
            return sorted(xs)[len(xs) // 2]
        print("hit_breakdown: prefix %d tokens, block %d, %d layers, %d rounds%s%s%s" %
              (prefix, bs, layers, rounds, "" if slot_index else ", slot_index off", ", cold caches" if cold else "",
               ", copied before the forward" if before_forward else ""))
        base = med(ttft["prefix"])
        for way, _ in ways:
            paired = med([x / y for x, y in zip(ttft[way], ttft["prefix"])])
            print("%-15s TTFT median %6.2f ms (%.2f of prefix; per round %.2f)  rounds %s" % (
                way, med(ttft[way]) * 1e3, med(ttft[way]) / base, paired,
                " ".join("%.1f" % (x * 1e3) for x in ttft[way])))
            for k, v in sorted(parts[way].items(), key=lambda kv: -med(kv[1])):
                if med(v) >= 50e-6:
                    print("    %-42s %7.3f ms" % (k, med(v) * 1e3))
        sys.stdout.flush()
    finally:
        proc.kill()
        subprocess.run(["rm", "-rf", tmp, os.environ["BENCH_SHM"]])
        os._exit(0)


if __name__ == "__main__":
    main()
