"""One vLLM engine for the connector benchmark (bench_vllm.py drives it).

    python bench_engine.py SPEC.json

SPEC: {"model", "block_size", "max_model_len", "kv_transfer_config" (or
null), "profile": path or null}. Prints "READY" (or "FAILED <error>") once
the engine is up, then answers one JSON line per command line on stdin:
  {"op": "ttft", "prompt": [ids]}  -> {"ttft_s", "cached", "stats"}:
      generate(max_tokens=1) timed in this process; stats are the
      connector's counters after it (tidepool.vllm.stats()). With
      "copy": n, the timed part then copies n bytes in one torch
      copy_ between two contiguous buffers written before (no page
      fault; torch's intra-op threads): the bytes a connector's hit moves
      into the paged KV cache, at the best speed this machine copies, with
      nothing else a connector does. With "warm": true, an untimed
      two-token request runs first, back to back with the timed one
  {"op": "reset"}                  -> {"ok"}: vLLM's own prefix cache emptied
  {"op": "quit"}
With "profile", the ttft commands run under cProfile, dumped there at quit.
"""

import cProfile
import json
import os
import sys
import time
import traceback


def connector_stats(kv):
    if not kv or "tidepool" not in kv.get("kv_connector_module_path", ""):
        return {}
    import importlib
    m = importlib.import_module(kv["kv_connector_module_path"])
    f = getattr(m, "stats", None) or m.test_stats
    return {k: v for k, v in f().items() if not isinstance(v, list)}


def reset(llm, sp, TokensPrompt):
    """Empties vLLM's own prefix cache. Blocks whose saves were in flight
    when their request finished are freed at the next engine step, so step
    the engine with a one-token request until the reset succeeds."""
    for _ in range(200):
        if llm.reset_prefix_cache():
            return True
        llm.generate([TokensPrompt(prompt_token_ids=[3])], sp, use_tqdm=False)
        time.sleep(0.01)
    return False


_BUFS = {}


def copy_bytes(n):
    """n bytes in one contiguous copy."""
    bufs = _BUFS.get(n)
    if bufs is None:
        import torch
        src = torch.randint(0, 256, (n,), dtype=torch.uint8)
        dst = torch.ones((n,), dtype=torch.uint8)  # written once: no page fault when timed
        bufs = _BUFS[n] = (src, dst)
    src, dst = bufs
    dst.copy_(src)


def main():
    spec = json.load(open(sys.argv[1]))
    kv = spec.get("kv_transfer_config")
    try:
        from vllm import LLM, SamplingParams
        from vllm.config import KVTransferConfig
        from vllm.inputs import TokensPrompt
        kw = {"kv_transfer_config": KVTransferConfig(**kv)} if kv else {}
        llm = LLM(model=spec["model"], skip_tokenizer_init=True, dtype="float32", block_size=spec["block_size"],
                  max_model_len=spec["max_model_len"], enable_prefix_caching=True, max_num_seqs=1,
                  max_num_batched_tokens=spec.get("max_num_batched_tokens", 4096), enforce_eager=True, seed=0,
                  gpu_memory_utilization=0.05, **kw)
    except Exception as e:  # noqa: BLE001
        print("FAILED " + json.dumps("%s: %s" % (type(e).__name__, e)), flush=True)
        traceback.print_exc()
        return
    sp = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False)
    prof = cProfile.Profile() if spec.get("profile") else None
    print("READY", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        if cmd["op"] == "reset":
            print(json.dumps({"ok": reset(llm, sp, TokensPrompt)}), flush=True)
            continue
        if cmd.get("warm"):
            # Two tokens: vLLM 0.32's ExampleConnector fails a one-token
            # prompt after its prefix cache was emptied (IndexError in
            # _prepare_inputs).
            llm.generate([TokensPrompt(prompt_token_ids=[3, 4])], sp, use_tqdm=False)
        if prof is not None:
            prof.enable()
        t0 = time.perf_counter()
        o = llm.generate([TokensPrompt(prompt_token_ids=cmd["prompt"])], sp, use_tqdm=False)[0]
        if cmd.get("copy"):
            # After the hit: a copy before it pushes the hit's weights and
            # KV out of the CPU caches and times that too (docs/PERFORMANCE.md
            # section 31).
            copy_bytes(cmd["copy"])
        dt = time.perf_counter() - t0
        if prof is not None:
            prof.disable()
        print(json.dumps({"ttft_s": dt, "cached": o.num_cached_tokens, "stats": connector_stats(kv)}), flush=True)
    if prof is not None:
        prof.dump_stats(spec["profile"])
    os._exit(0)  # the benchmark does not wait for the engine's teardown


if __name__ == "__main__":
    main()
