"""Time to first token of a prefix hit through each way vLLM can get it,
side by side, in interleaved rounds (scripts/bench-vllm.sh runs it).

    bench_vllm.py TMPDIR BIN ROUNDS PREFIX_TOKENS BLOCK_SIZE

Starts three `tidepool serve` (node-1 and node-2 clustered; one with a
small DRAM tier over an SSD tier) and one engine process per way
(bench_engine.py), then, each round, for a fresh random prompt p of
PREFIX_TOKENS tokens:

  recompute            engine T (tidepool on node-1) prefills p + 1 token
  vLLM prefix cache    T again, p + another token: vLLM's own cache, same process
  the copy's bound     T again, p + a third token: the prefix cache's hit, then
                       one contiguous copy of as many bytes as a hit moves
                       (torch's copy_), timed together: a connector whose only
                       work is that copy, overlapping nothing (the copy comes
                       after the hit: before it, it would also time the hit's
                       weights and KV coming back into the CPU caches)
  tidepool             T with its prefix cache emptied: p's blocks from node-1
  tidepool, peer       engine P on node-2: p's blocks, saved through node-1,
                       fetched from the cluster (the share that came from
                       node-1 is printed)
  tidepool, SSD        engine S on the small-DRAM node: p computed and saved,
                       DRAM flushed (other blocks put), then p's blocks from SSD
  ExampleConnector     engine E: p computed and saved to files, prefix cache
                       emptied, p's blocks from the files
  OffloadingConnector  engine O: vLLM's CPU offloading, if it runs here
  tidepool (before)    engine B: the connector of BENCH_BEFORE_PKG (a copy
                       of an older clients/python/tidepool), if given

TTFT = generate(max_tokens=1), timed in the engine. Every timed request
follows, untimed and back to back, a two-token request in the same engine
(BENCH_WARM=0: not): each row then starts from the same state, an engine
that has just run a forward. Without it, rows differed in what came just
before them: the prefix-cache row followed a hit of its own, the
connector rows an emptying of the prefix cache (no forward), and on this
project's 2-core test machine an engine idle for 10 ms answers vLLM's own
prefix hit about 2 ms slower (docs/PERFORMANCE.md section 30). Every hit prompt is p
plus two tokens (ExampleConnector matches a saved prompt only one token
shorter than the one it serves: it saves p + 1 token as p's blocks), so
every hit row computes the same two tokens. Round 0 warms up and
is left out. Prints one JSON line per round and row, then a Markdown table
(per row: the median TTFT, min-max, its ratio to the prefix hit's median,
and the median of the rounds' own ratios to that round's prefix hit) and
the load path's MB/s.
"""

import json
import os
import random
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "clients", "python"))
from run_engine import vllm_hashes_of, write_tiny_llama  # noqa: E402
from test_vllm_connector import free_port  # noqa: E402

import tidepool  # noqa: E402

WARM = os.environ.get("BENCH_WARM", "1") != "0"


def kv_block_bytes(bs, layers):
    """One vLLM block's KV bytes in this benchmark's model (4 KV heads of
    64, float32, K and V), without tidepool's 64-byte header."""
    return bs * layers * 4 * 64 * 2 * 4


def serve(bin_, tmp, name, extra):
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    sock = os.path.join(d, "tp.sock")
    p = subprocess.Popen([bin_, "serve", "--socket", sock, "--data-dir", os.path.join(d, "data"),
                          "--arena-dir", os.path.join(os.environ.get("BENCH_SHM", d), name + "-arenas"),
                          "--metrics-addr", "127.0.0.1:0",
                          "--log-level", os.environ.get("BENCH_LOG_LEVEL", "warn"), "--node-name", name] + extra,
                         stdout=subprocess.PIPE, stderr=open(os.path.join(d, "serve.log"), "wb"),
                         stdin=subprocess.DEVNULL)
    line = p.stdout.readline().decode()
    m = re.search(r"metrics (http://\S+/metrics)", line)
    if not m:
        p.kill()
        raise SystemExit("sidecar %s did not start: %r" % (name, line))
    return p, sock, m.group(1)


def counter(url, name):
    import urllib.request
    body = urllib.request.urlopen(url, timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


class Engine:
    def __init__(self, tmp, name, spec):
        self.name = name
        path = os.path.join(tmp, "engine-%s.json" % name)
        json.dump(spec, open(path, "w"))
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
        if spec.get("pythonpath"):
            env["PYTHONPATH"] = spec["pythonpath"] + os.pathsep + env.get("PYTHONPATH", "")
        self.log = open(os.path.join(tmp, "engine-%s.log" % name), "wb")
        self.p = subprocess.Popen([sys.executable, os.path.join(HERE, "bench_engine.py"), path],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env)
        self.error = None

    def ready(self):
        while True:
            line = self.p.stdout.readline().decode()
            if not line:
                self.error = "exited before it was ready (see engine-%s.log)" % self.name
                return False
            if line.startswith("READY"):
                return True
            if line.startswith("FAILED"):
                self.error = json.loads(line[7:])
                return False

    def call(self, **cmd):
        self.p.stdin.write((json.dumps(cmd) + "\n").encode())
        self.p.stdin.flush()
        while True:
            line = self.p.stdout.readline().decode()
            if not line:
                raise SystemExit("engine %s died (see engine-%s.log)" % (self.name, self.name))
            if line.startswith("{"):
                return json.loads(line)

    def ttft(self, prompt, copy=None):
        return self.call(op="ttft", prompt=prompt, copy=copy, warm=WARM)

    def reset(self):
        if not self.call(op="reset")["ok"]:
            raise SystemExit("engine %s refused to reset its prefix cache" % self.name)

    def quit(self):
        try:
            self.p.stdin.write(b'{"op": "quit"}\n')
            self.p.stdin.flush()
            self.p.wait(timeout=60)
        except Exception:  # noqa: BLE001
            self.p.kill()


def held(sock, tokens, bs):
    try:
        return _held(sock, tokens, bs)
    except Exception:  # noqa: BLE001 - a busy machine: a slow answer is asked again
        return 0


def _held(sock, tokens, bs):
    c = tidepool.Client(sock, timeout=120)
    try:
        nss = [n.ns for n in c.stats().namespaces if n.ns.startswith("vllm/")]
        keys = vllm_hashes_of(tokens, bs)
        return max([c.lookup(ns, keys) for ns in nss] or [0])
    finally:
        c.close()


def wait_held(sock, tokens, bs, want):
    deadline = time.monotonic() + 300
    while held(sock, tokens, bs) < want:
        if time.monotonic() > deadline:
            raise SystemExit("the saves of %d blocks did not arrive" % want)
        time.sleep(0.05)


def flush_dram(sock, nbytes):
    """Puts nbytes of other blocks, so that DRAM demotes what it held to SSD."""
    c = tidepool.Client(sock)
    try:
        blob = os.urandom(1 << 20)
        for i in range(nbytes >> 20):
            c.put("bench/flush", os.urandom(16) + i.to_bytes(4, "big"), blob)
    finally:
        c.close()


def main():
    procs, engines = [], {}
    try:
        run(procs, engines)
    finally:  # no sidecar or engine outlives the benchmark, whatever failed
        for e in engines.values():
            if e.p.poll() is None:
                e.p.kill()
        for p_ in procs:
            if p_.poll() is None:
                p_.terminate()
        for p_ in procs:
            try:
                p_.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p_.kill()


def run(procs, engines):
    tmp, bin_, rounds, prefix, bs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    layers = int(os.environ.get("BENCH_LAYERS", "8"))
    hidden = int(os.environ.get("BENCH_HIDDEN", "512"))
    model = write_tiny_llama(os.path.join(tmp, "model"), layers=layers, hidden=hidden, heads=hidden // 64,
                             kv_heads=4, vocab=2048, ctx=prefix + 256)
    block_bytes = kv_block_bytes(bs, layers)
    ssd_dram = max(16 << 20, 8 * block_bytes)
    key = os.path.join(tmp, "gossip.key")
    secret = os.path.join(tmp, "peer.secret")
    for path in (key, secret):
        with open(path, "wb") as f:
            f.write(os.urandom(32))
        os.chmod(path, 0o600)
    g1 = "127.0.0.1:%d" % free_port()
    common = ["--dram-capacity", "1GiB", "--max-value-size", "64MiB", "--ssd-capacity", "0",
              "--cluster-label", "bench", "--replicas", "1", "--gossip-key-file", key, "--peer-secret-file", secret,
              "--peer-addr", "127.0.0.1:%d", "--transfer-addr", "127.0.0.1:%d"]

    def node(extra):
        return [a % free_port() if "%d" in a else a for a in common] + extra
    p1, s1, m1 = serve(bin_, tmp, "node-1", node(["--gossip-addr", g1]))
    procs.append(p1)
    p2, s2, m2 = serve(bin_, tmp, "node-2", node(["--gossip-addr", "127.0.0.1:%d" % free_port(), "--join", g1]))
    procs.append(p2)
    p3, s3, m3 = serve(bin_, tmp, "ssd", ["--dram-capacity", str(ssd_dram), "--max-value-size", str(ssd_dram // 4),
                                          "--ssd-capacity", "4GiB"])
    procs.append(p3)

    def tp(sock, **x):
        extra = {"socket": sock}
        extra.update(x)
        return {"kv_connector": "TidepoolConnector", "kv_connector_module_path": "tidepool.vllm",
                "kv_role": "kv_both", "kv_connector_extra_config": extra}
    base = {"model": model, "block_size": bs, "max_model_len": prefix + 256,
            "max_num_batched_tokens": prefix + 256}  # ExampleConnector cannot save a chunked prefill
    prof = os.environ.get("BENCH_PROFILE")
    specs = {
        "T": dict(base, kv_transfer_config=tp(s1), profile=prof and prof + ".T"),
        "P": dict(base, kv_transfer_config=tp(s2)),
        "S": dict(base, kv_transfer_config=tp(s3)),
        "E": dict(base, kv_transfer_config={"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                                            "kv_connector_extra_config": {
                                                "shared_storage_path": os.path.join(tmp, "example")}}),
        "O": dict(base, kv_transfer_config={"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                                            "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 30}}),
    }
    before = os.environ.get("BENCH_BEFORE_PKG")  # a directory holding an older package "tidepool_before"
    if before:
        specs["B"] = dict(base, pythonpath=before, profile=prof and prof + ".B",
                          kv_transfer_config=dict(tp(s1), kv_connector_module_path="tidepool_before.vllm"))
    for k, v in specs.items():
        engines[k] = Engine(tmp, k, v)
    unavailable = {}
    for k, e in list(engines.items()):
        if not e.ready():
            unavailable[k] = e.error
            print(json.dumps({"engine": k, "unavailable": e.error}), flush=True)
            del engines[k]
    for k in ("T", "P", "S", "E"):
        if k not in engines:
            raise SystemExit("engine %s did not start: %s" % (k, unavailable.get(k)))
    deadline = time.monotonic() + 60
    # Both nodes see both (a node that has not yet seen the other owns
    # every key, and pushes nothing).
    while min(counter(m1, "tidepool_cluster_members"), counter(m2, "tidepool_cluster_members")) < 2 \
            and time.monotonic() < deadline:
        time.sleep(0.2)

    rows = {}
    want = prefix // bs
    r = random.Random(7)
    T, P, S, E = engines["T"], engines["P"], engines["S"], engines["E"]
    for i in range(rounds + 1):
        p = [r.randrange(3, 2000) for _ in range(prefix)]
        got = {}
        got["recompute"] = T.ttft(p + [5])
        # The prefix-cache row is timed with nothing else running: T's saves
        # of p's blocks done, and node-1's pushes of them to their owners
        # (which the peer row reads) too.
        wait_held(s1, p, bs, want)
        deadline = time.monotonic() + 60
        while counter(m1, "tidepool_push_queue_depth") > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        # Engine T's first hit after its prefill was slower here (by 50 ms
        # at 16,384 tokens), though not in an engine without a connector,
        # where the first hit after a prefill is as fast as the next: one
        # untimed hit first, so that the row times vLLM's own hit.
        T.ttft(p + [6, 3])
        got["vLLM prefix cache (same process)"] = T.ttft(p + [6, 1])
        got["prefix cache + one copy of the hit's bytes (bound)"] = T.ttft(
            p + [6, 2], copy=want * block_bytes)
        T.reset()
        got["tidepool, local"] = T.ttft(p + [7, 1])
        T.reset()
        wait_held(s2, p, bs, want)
        remote0 = counter(m2, "tidepool_remote_hits_total")
        got["tidepool, via peer sidecar"] = P.ttft(p + [8, 1])
        got["tidepool, via peer sidecar"]["remote_hits"] = counter(m2, "tidepool_remote_hits_total") - remote0
        P.reset()
        if "B" in engines:
            got["tidepool, before (main's connector)"] = engines["B"].ttft(p + [9, 1])
            engines["B"].reset()
        E.ttft(p + [5])
        E.reset()
        got["ExampleConnector"] = E.ttft(p + [6, 1])
        E.reset()
        if "O" in engines:
            engines["O"].ttft(p + [5])
            engines["O"].reset()
            got["OffloadingConnector"] = engines["O"].ttft(p + [6, 1])
            engines["O"].reset()
        S.ttft(p + [5])
        wait_held(s3, p, bs, want)
        S.reset()
        flush_dram(s3, 2 * ssd_dram)
        got["tidepool, from SSD"] = S.ttft(p + [6, 1])
        S.reset()
        for name, v in got.items():
            st = v.get("stats", {})
            row = {"round": i, "row": name, "ttft_s": v["ttft_s"], "cached_tokens": v["cached"]}
            for k in ("loaded_blocks", "load_seconds", "loaded_bytes", "rpc_acquire"):
                if k in st:
                    row[k] = st[k]
            if "remote_hits" in v:
                row["remote_hits"] = v["remote_hits"]
            print(json.dumps(row), flush=True)
            if i > 0:
                rows.setdefault(name, []).append(v)
    for e in engines.values():
        e.quit()

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2
    prefix_hit = med([v["ttft_s"] for v in rows["vLLM prefix cache (same process)"]])
    example = med([v["ttft_s"] for v in rows["ExampleConnector"]])
    print("SUMMARY " + json.dumps({"rounds": rounds, "prefix_tokens": prefix, "block_size": bs, "warm": WARM,
                                   "block_bytes": block_bytes + 64, "layers": layers, "hidden": hidden,
                                   "unavailable": unavailable}), flush=True)
    # Per round: the median of each round's TTFT over that round's prefix
    # hit (rounds spread widely on a small machine; a round's ways ran
    # minutes apart at most).
    prefix_rounds = [v["ttft_s"] for v in rows["vLLM prefix cache (same process)"]]
    print("| way (prefix %d tokens, block %d tokens = %d bytes) | TTFT median (ms) | min–max (ms) "
          "| / vLLM prefix cache | per round | / ExampleConnector | cached tokens |" % (prefix, bs, block_bytes + 64))
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, vs in rows.items():
        t = [v["ttft_s"] for v in vs]
        m = med(t)
        per_round = med([x / y for x, y in zip(t, prefix_rounds)])
        print("| %s | %.1f | %.1f–%.1f | %.2f | %.2f | %.2f | %d |" % (
            name, m * 1e3, min(t) * 1e3, max(t) * 1e3, m / prefix_hit, per_round, m / example, vs[-1]["cached"]))
    for k, err in unavailable.items():
        print("| %s | did not start: %s | | | | | |" % ({"O": "OffloadingConnector"}.get(k, k), err[:300]))
    # The load path's own speed (the connector's counters, engine T's
    # local hits): bytes copied per second of the load work (start_load_kv,
    # and the copies made layer by layer in the forward).
    st = [v["stats"] for v in rows["tidepool, local"]]
    if all("load_seconds" in x for x in st) and len(st) > 1:
        print("LOAD " + json.dumps({"note": "engine T's cumulative counters after its last hit",
                                    "loaded_MB": st[-1]["loaded_bytes"] / 1e6,
                                    "load_s": st[-1]["load_seconds"],
                                    "MBps": st[-1]["loaded_bytes"] / st[-1]["load_seconds"] / 1e6}), flush=True)


if __name__ == "__main__":
    main()
