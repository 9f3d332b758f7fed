"""One vLLM engine process for the engine tests (tests/engines).

    python run_engine.py SPEC.json OUT.json

SPEC: {"model": dir, "prompts": [[token ids]...], "max_tokens": n,
       "kv_transfer_config": {...} or null, "logprobs": 5, "block_size": 32}
Writes OUT: {"outputs": [{"token_ids": [...], "logprobs": [[[id, lp]...]...],
"num_cached_tokens": n}...], "connector": {...stats}}. Runs on CPU with
dummy (deterministic) weights and no tokenizer.
"""

import json
import os
import sys
import time


def write_tiny_llama(d, layers=2, hidden=256, heads=4, kv_heads=2, vocab=512, ctx=2048):
    """A tiny Llama-style config.json (grouped KV heads); no weights: the
    engine runs with load_format=spec.get("load_format", "safetensors")."""
    os.makedirs(d, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": hidden * 2,
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": hidden // heads,
        "vocab_size": vocab, "max_position_embeddings": ctx,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "float32",
        "hidden_act": "silu", "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2,
    }
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    # Seeded weights of a realistic scale. vLLM's load_format=spec.get("load_format", "safetensors") draws
    # every weight from U(-1e-3, 1e-3): every logprob is then -ln(vocab)
    # within 1e-6 and no comparison of outputs could tell right KV from
    # wrong KV. These weights are as deterministic and need no download.
    import torch
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(20261203)
    hd = hidden // heads

    def w(*shape, std):
        return (torch.randn(*shape, generator=g) * std).contiguous()

    t = {"model.embed_tokens.weight": w(vocab, hidden, std=1.0),
         "model.norm.weight": torch.ones(hidden),
         "lm_head.weight": w(vocab, hidden, std=2.0 / hidden ** 0.5)}
    for i in range(layers):
        p = "model.layers.%d." % i
        t[p + "input_layernorm.weight"] = torch.ones(hidden)
        t[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
        t[p + "self_attn.q_proj.weight"] = w(heads * hd, hidden, std=2.0 / hidden ** 0.5)
        t[p + "self_attn.k_proj.weight"] = w(kv_heads * hd, hidden, std=2.0 / hidden ** 0.5)
        t[p + "self_attn.v_proj.weight"] = w(kv_heads * hd, hidden, std=1.0 / hidden ** 0.5)
        t[p + "self_attn.o_proj.weight"] = w(hidden, heads * hd, std=1.0 / hidden ** 0.5)
        t[p + "mlp.gate_proj.weight"] = w(hidden * 2, hidden, std=1.0 / hidden ** 0.5)
        t[p + "mlp.up_proj.weight"] = w(hidden * 2, hidden, std=1.0 / hidden ** 0.5)
        t[p + "mlp.down_proj.weight"] = w(hidden, hidden * 2, std=1.0 / (2 * hidden) ** 0.5)
    save_file(t, os.path.join(d, "model.safetensors"))
    return d


def vllm_hashes_of(tokens, block_size, hash_algo="sha256"):
    """vLLM's block hashes of a plain token prompt (no LoRA, multimodal
    input or salt), as the scheduler computes them: the connector's keys."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as kcu
    fn = get_hash_fn_by_name(hash_algo)
    if getattr(kcu, "NONE_HASH", None) is None:
        kcu.init_none_hash(fn)
    out, parent = [], None
    for i in range(len(tokens) // block_size):
        parent = kcu.hash_block_tokens(fn, parent, tokens[i * block_size:(i + 1) * block_size], None)
        out.append(bytes(parent))
    return out


def install_test_hooks(hooks, block_size):
    """Test seams, set from the spec's "hooks" (in-process engines only:
    they patch this process's tidepool.Client.acquire and
    tidepool.slots.SlotIndex.find, which loads call):
      load_keys_of, load_keys_for: [token ids] each: a load of a block of
        load_keys_for acquires (or finds in the slot index) the block of the
        same depth of load_keys_of instead (a negative control: another
        prompt's KV);
      load_barrier: dir: after a load's Acquire, create dir/acquired and
        wait (at most 120 s) for dir/go: lets a test kill the sidecar
        while the engine holds leases it has not copied from."""
    import tidepool
    orig = tidepool.Client.acquire
    swap = {}
    if hooks.get("load_keys_of") is not None:
        swap = dict(zip(vllm_hashes_of(hooks["load_keys_for"], block_size),
                        vllm_hashes_of(hooks["load_keys_of"], block_size)))
    barrier = hooks.get("load_barrier")

    def acquire(self, ns, keys, *a, **kw):
        r = orig(self, ns, [swap.get(k, k) for k in keys], *a, **kw)
        if barrier:
            open(os.path.join(barrier, "acquired"), "w").close()
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(barrier, "go")) and time.monotonic() < deadline:
                time.sleep(0.02)
        return r
    tidepool.Client.acquire = acquire
    if swap:
        from tidepool import slots
        find = slots.SlotIndex.find
        slots.SlotIndex.find = lambda self, ns, keys: find(self, ns, [swap.get(k, k) for k in keys])


def main():
    spec = json.load(open(sys.argv[1]))
    if spec.get("hooks"):
        install_test_hooks(spec["hooks"], spec.get("block_size", 32))
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    kw = {}
    if spec.get("kv_transfer_config"):
        kw["kv_transfer_config"] = KVTransferConfig(**spec["kv_transfer_config"])
    if spec.get("kv_events_capture"):
        # vLLM's own KV events, as its publisher gets them, written to a
        # file (msgpack, as its ZMQ publisher encodes them) instead of a
        # ZMQ socket, whose delivery a loaded 2-core machine delays past
        # the engine's life. The engine core runs in this process.
        import msgspec
        from vllm.config import KVEventsConfig
        from vllm.distributed import kv_events as ke

        class Capture(ke.EventPublisher):
            def __init__(self, data_parallel_rank=0, **_):
                super().__init__(data_parallel_rank)
                self._f = open(spec["kv_events_capture"], "ab")
                self._enc = msgspec.msgpack.Encoder()

            def publish(self, events):
                b = self._enc.encode(events)
                self._f.write(len(b).to_bytes(4, "big") + b)
                self._f.flush()

            def shutdown(self):
                self._f.close()

        ke.EventPublisherFactory._registry["zmq"] = Capture
        kw["kv_events_config"] = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq")
    t0 = time.time()
    llm = LLM(model=spec["model"], load_format=spec.get("load_format", "safetensors"), skip_tokenizer_init=True,
              dtype=spec.get("dtype", "float32"), block_size=spec.get("block_size", 32),
              max_model_len=spec.get("max_model_len", 1024), enable_prefix_caching=True,
              max_num_seqs=4, max_num_batched_tokens=spec.get("max_num_batched_tokens", 1024),
              enforce_eager=True, seed=0, gpu_memory_utilization=spec.get("mem", 0.05),
              tensor_parallel_size=spec.get("tp", 1), **kw)
    t_init = time.time() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=spec.get("max_tokens", 8),
                        logprobs=spec.get("logprobs", 5), detokenize=False)
    outs = []
    for p in spec["prompts"]:  # one at a time: the order of saves is the test's
        t1 = time.time()
        o = llm.generate([TokensPrompt(prompt_token_ids=p)], sp, use_tqdm=False)[0]
        c = o.outputs[0]
        lps = []
        for step in c.logprobs or []:
            lps.append(sorted([[int(t), float(l.logprob)] for t, l in step.items()],
                              key=lambda x: -x[1])[:spec.get("logprobs", 5)])
        outs.append({"token_ids": list(c.token_ids), "logprobs": lps,
                     "num_cached_tokens": o.num_cached_tokens, "seconds": time.time() - t1})
    res = {"outputs": outs, "init_seconds": t_init}
    try:
        from tidepool import vllm as tv
        res["connector"] = tv.stats()
    except Exception as e:  # noqa: BLE001
        res["connector_error"] = repr(e)
    json.dump(res, open(sys.argv[2], "w"))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--write-model":
        write_tiny_llama(sys.argv[2])
    else:
        main()
