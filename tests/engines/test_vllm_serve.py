"""The connector the way users run it: vLLM's OpenAI-compatible server as
a process, `--kv-transfer-config` on its command line, requests over HTTP,
two servers on two clustered `tidepool serve` sidecars, and a server with
no connector as the reference.

    python -m vllm.entrypoints.openai.api_server --model DIR \\
        --kv-transfer-config '{"kv_connector":"TidepoolConnector", ...}' ...

(`vllm serve` starts the same server; on the CPU build the `vllm` command
fails before it starts, see docs/engines.md.) The server runs vLLM's engine
core in a process of its own (AsyncLLM always does; the servers here are
started with VLLM_ENABLE_V1_MULTIPROCESSING=1 all the same).

One test, one set of processes (three servers, two sidecars), to keep the
time down:
  - server Y starts before its sidecar: it logs one line, serves by
    recomputation, and loads once the sidecar is up;
  - server X computes P and is stopped (SIGTERM) right after answering:
    every block of P is in its sidecar;
  - server Y (the other node) answers P + suffix with the same tokens and
    logprobs as server R (no connector), with P's blocks fetched from X's
    node.

Run with scripts/test-engines.sh.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from test_vllm_connector import (  # noqa: E402
    ABS_TOL, BLOCK, P, P_BLOCKS, SUFFIX, Sidecar, cluster_pair, free_port, held_blocks, kv_config,
    max_logprob_diff, poll, prompt, wait_members)
from run_engine import write_tiny_llama  # noqa: E402

SERVER_TIMEOUT_S = float(os.environ.get("ENGINE_TIMEOUT_S", "600"))


class Server:
    """python -m vllm.entrypoints.openai.api_server on a free port."""

    def __init__(self, root, name, model, kv=None):
        self.name = name
        self.model = model
        self.port = free_port()
        self.log_path = os.path.join(root, "server-%s.log" % name)
        args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                "--host", "127.0.0.1", "--port", str(self.port), "--skip-tokenizer-init",
                "--return-tokens-as-token-ids", "--dtype", "float32", "--block-size", str(BLOCK),
                "--max-model-len", "1024", "--max-num-seqs", "4", "--max-num-batched-tokens", "1024",
                "--enable-prefix-caching", "--enforce-eager", "--seed", "0"]
        if kv is not None:
            args += ["--kv-transfer-config", json.dumps(kv)]
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1",
                   VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
        env.pop("PYTHONHASHSEED", None)
        self._logf = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._logf, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def healthy(self):
        if self.proc.poll() is not None:
            raise AssertionError("server %s exited with %s:\n%s" % (self.name, self.proc.returncode,
                                                                     self.log()[-6000:]))
        try:
            return urllib.request.urlopen("http://127.0.0.1:%d/health" % self.port, timeout=5).status == 200
        except (urllib.error.URLError, OSError):
            return False

    def complete(self, tokens, max_tokens=6):
        body = json.dumps({"model": self.model, "prompt": tokens, "max_tokens": max_tokens, "temperature": 0.0,
                           "logprobs": 5, "return_tokens_as_token_ids": True}).encode()
        req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % self.port, data=body,
                                     headers={"Content-Type": "application/json"})
        out = json.load(urllib.request.urlopen(req, timeout=SERVER_TIMEOUT_S))
        lp = out["choices"][0]["logprobs"]
        ids = [int(t.split(":", 1)[1]) for t in lp["tokens"]]
        tops = [sorted(((int(t.split(":", 1)[1]), v) for t, v in step.items()), key=lambda x: -x[1])
                for step in lp["top_logprobs"]]
        return {"token_ids": ids, "logprobs": tops}

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._logf.close()


class ServeTests(unittest.TestCase):
    def setUp(self):
        base = os.environ.get("ENGINE_TMPDIR") or ("/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
        self.tmp = tempfile.mkdtemp(prefix="tp-serve.", dir=base)
        self.model = write_tiny_llama(os.path.join(self.tmp, "model"))
        self.addCleanup(lambda: None if os.environ.get("KEEP_ENGINE_TMP") else
                        shutil.rmtree(self.tmp, ignore_errors=True))

    def sidecar(self, name, extra=(), start=True):
        s = Sidecar(self.tmp, name, extra)
        if start:
            s.start()
        self.addCleanup(s.stop)
        return s

    def server(self, name, kv=None):
        srv = Server(self.tmp, name, self.model, kv)
        self.addCleanup(srv.stop)
        return srv

    def test_two_servers_on_two_nodes(self):
        s1, s2 = cluster_pair(self.tmp, self.sidecar, start_second=False)
        x = self.server("x", kv_config(s1.socket))
        y = self.server("y", kv_config(s2.socket))  # its sidecar is not up yet
        r = self.server("r")
        for srv in (x, y, r):
            poll(srv.healthy, SERVER_TIMEOUT_S, "server %s" % srv.name)
        # Y's sidecar is not up: Y answers by recomputation, and says so
        # once per side (no error per try).
        early = prompt(77, 5 * BLOCK + 3)
        self.assertLessEqual(max_logprob_diff(y.complete(early), r.complete(early)), ABS_TOL)
        ylog = y.log()
        self.assertNotIn("Could not connect", ylog)
        lines = re.findall(r"tidepool: sidecar at \S+ unavailable \(not up yet\? ([\w-]+) side\)", ylog)
        self.assertTrue(lines, ylog[-3000:])
        self.assertEqual(sorted(lines), sorted(set(lines)), "more than one line per side")
        ref = r.complete(P + SUFFIX)
        s2.start()
        wait_members(s2)
        # X computes P, answers, and is stopped at once: its saves finish
        # before its engine core exits.
        x.complete(P, max_tokens=1)
        x.stop()
        self.assertEqual(held_blocks(s1.socket, P), P_BLOCKS, x.log()[-3000:])
        # Y, on the other node, answers P + SUFFIX from P's blocks (once
        # node-1's background pushes to the blocks' owners are done, node-2
        # finds all of P).
        poll(lambda: held_blocks(s2.socket, P) == P_BLOCKS, 60, "node-2 to find P in the cluster")
        acquires = s2.counter("tidepool_request_duration_seconds_count", method="Acquire")
        remote = s2.counter("tidepool_remote_hits_total")
        got = poll(lambda: y.complete(P + SUFFIX) if y.healthy() else None, 30, "server y")
        self.assertLessEqual(max_logprob_diff(got, ref), ABS_TOL, "server Y differs from the no-connector server:\n%s\n%s"
                             % (got, ref))
        self.assertGreater(s2.counter("tidepool_request_duration_seconds_count", method="Acquire") - acquires, 0,
                           "server Y did not load (its sidecar came up after it started)")
        self.assertGreater(s2.counter("tidepool_remote_hits_total") - remote, 0, "no block came from node-1")


if __name__ == "__main__":
    unittest.main(verbosity=2)
