"""TTFT of a vLLM engine with its prompt prefix in tidepool versus
recomputed, in one engine process (scripts/bench-vllm.sh runs it).

Each round: a fresh random prompt of PREFIX tokens is prefilled (recompute
TTFT; the connector saves its blocks), vLLM's own prefix cache is reset,
then the same prefix plus a short suffix is prefilled again: its blocks
come from tidepool (hit TTFT). TTFT = time of generate(max_tokens=1).
Prints one JSON object per round and a summary.
"""

import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run_engine import write_tiny_llama  # noqa: E402


def reset_local_cache(llm, sp, TokensPrompt):
    """Empties vLLM's own prefix cache. Blocks whose saves were in flight
    when their request finished are freed at the next engine step, so step
    the engine with a one-token request until the reset succeeds."""
    for _ in range(50):
        if llm.reset_prefix_cache():
            return
        llm.generate([TokensPrompt(prompt_token_ids=[3])], sp, use_tqdm=False)
    raise AssertionError("vLLM refused to reset its prefix cache")


def main():
    model_dir, socket, rounds, prefix = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    layers, hidden = int(os.environ.get("BENCH_LAYERS", "8")), int(os.environ.get("BENCH_HIDDEN", "1536"))
    write_tiny_llama(model_dir, layers=layers, hidden=hidden, heads=hidden // 64, kv_heads=4, vocab=2048,
                     ctx=prefix + 256)
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt
    import tidepool
    from tidepool import vllm as tv

    # BENCH_SAVE_MAPPED=1: every save through writable_slot and torch's
    # copy_ (how the connector saved every block before it wrote host
    # blocks with write_slot), for a before/after in one tree.
    mapped = os.environ.get("BENCH_SAVE_MAPPED") == "1"
    if mapped:
        tv.TidepoolConnector._host_parts = lambda self, bid: None

    llm = LLM(model=model_dir, skip_tokenizer_init=True, dtype="float32", block_size=32,
              max_model_len=prefix + 256, enable_prefix_caching=True, max_num_seqs=1,
              max_num_batched_tokens=prefix + 256, enforce_eager=True, seed=0,
              gpu_memory_utilization=0.05,
              kv_transfer_config=KVTransferConfig(
                  kv_connector="TidepoolConnector", kv_connector_module_path="tidepool.vllm",
                  kv_role="kv_both", kv_connector_extra_config={"socket": socket}))
    sp = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False)
    c = tidepool.Client(socket)
    r = random.Random(7)
    results = []
    for i in range(rounds + 1):  # round 0 warms up
        p = [r.randrange(3, 2000) for _ in range(prefix)]
        want = prefix // 32
        v0 = tv.test_stats()
        t0 = time.perf_counter()
        llm.generate([TokensPrompt(prompt_token_ids=p + [5])], sp, use_tqdm=False)
        recompute = time.perf_counter() - t0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # saves are asynchronous
            ns = [n for n in c.stats().namespaces if n.ns.startswith("vllm/")]
            if ns and ns[0].blocks >= want * (i + 1) and tv.test_stats()["saved_blocks"] - v0["saved_blocks"] >= want:
                break
            time.sleep(0.05)
        v1 = tv.test_stats()
        reset_local_cache(llm, sp, TokensPrompt)
        s0 = tv.test_stats()
        t0 = time.perf_counter()
        llm.generate([TokensPrompt(prompt_token_ids=p + [6, 7, 8])], sp, use_tqdm=False)
        hit = time.perf_counter() - t0
        s1 = tv.test_stats()
        reset_local_cache(llm, sp, TokensPrompt)
        row = {"round": i, "prefix_tokens": prefix, "ttft_recompute_s": recompute, "ttft_hit_s": hit,
               "loaded_blocks": s1["loaded_blocks"] - s0["loaded_blocks"],
               "load_s": s1["load_seconds"] - s0["load_seconds"],
               "loaded_bytes": s1["loaded_bytes"] - s0["loaded_bytes"]}
        row["load_MBps"] = row["loaded_bytes"] / row["load_s"] / 1e6 if row["load_s"] else 0.0
        # The saver thread's time in the recompute pass's saves: Reserve,
        # the copies into the slots, Commit.
        row["save_s"] = v1["save_seconds"] - v0["save_seconds"]
        row["saved_bytes"] = v1["saved_bytes"] - v0["saved_bytes"]
        row["save_MBps"] = row["saved_bytes"] / row["save_s"] / 1e6 if row["save_s"] else 0.0
        print(json.dumps(row), flush=True)
        if i > 0:
            results.append(row)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    summary = {"rounds": len(results), "layers": layers, "hidden": hidden,
               "median_ttft_recompute_s": med([x["ttft_recompute_s"] for x in results]),
               "median_ttft_hit_s": med([x["ttft_hit_s"] for x in results]),
               "median_load_MBps": med([x["load_MBps"] for x in results]),
               "median_save_MBps": med([x["save_MBps"] for x in results]),
               "save_path": "writable_slot" if mapped else "write_slot"}
    summary["hit_over_recompute"] = summary["median_ttft_hit_s"] / summary["median_ttft_recompute_s"]
    print("SUMMARY " + json.dumps(summary), flush=True)
    c.close()


if __name__ == "__main__":
    main()
