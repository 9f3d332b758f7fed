"""Real `tidepool serve` processes for the engine tests (tests/engines):
one on a scratch directory, or two clustered ones (gossip key and cluster
secret shared, as serve requires of a cluster)."""

import json
import os
import re
import signal
import subprocess
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.path.join(ROOT, "bin", "tidepool")


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def poll(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.05)


class Sidecar:
    """A real `tidepool serve` on a scratch directory."""

    def __init__(self, root, name, extra=()):
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir, exist_ok=True)
        self.socket = os.path.join(self.dir, "tp.sock")
        self.name = name
        self.extra = list(extra)
        self.proc = None
        self.metrics = None

    def start(self):
        self.log = open(os.path.join(self.dir, "serve.log"), "ab")
        self.proc = subprocess.Popen(
            [BIN, "serve", "--socket", self.socket, "--data-dir", os.path.join(self.dir, "data"),
             "--arena-dir", os.path.join(self.dir, "arenas"), "--dram-capacity", "64MiB",
             "--max-value-size", "8MiB", "--metrics-addr", "127.0.0.1:0", "--ssd-capacity", "0",
             "--log-level", "warn", "--node-name", self.name] + self.extra,
            stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL)
        line = self.proc.stdout.readline().decode()
        m = re.search(r"metrics (http://\S+/metrics)", line)
        if not m:
            self.stop()
            raise AssertionError("sidecar %s did not start: %r\n%s" % (self.name, line, self.stderr()))
        self.metrics = m.group(1)
        return self

    def stderr(self):
        try:
            return open(os.path.join(self.dir, "serve.log")).read()[-4000:]
        except OSError:
            return ""

    def counter(self, name, **labels):
        """Sum of a Prometheus counter over the series whose labels include
        labels (counter("x_total", method="Reserve"))."""
        body = urllib.request.urlopen(self.metrics, timeout=10).read().decode()
        want = ['%s="%s"' % kv for kv in labels.items()]
        total = 0.0
        for line in body.splitlines():
            if not (line.startswith(name + " ") or line.startswith(name + "{")):
                continue
            head = line.rsplit(" ", 1)[0]
            if all(w in head for w in want):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()
        if self.proc:
            self.log.close()


def cluster_pair(tmp, start):
    """Two clustered sidecars, node-1 and node-2 (which joins node-1), made
    by start(name, extra_args) (a started Sidecar); returns them once
    node-2 sees both alive."""
    g1 = "127.0.0.1:%d" % free_port()
    # A secured cluster, as serve requires: one gossip key and one
    # cluster secret shared by both members.
    key = os.path.join(tmp, "gossip.key")
    secret = os.path.join(tmp, "peer.secret")
    for path, n in ((key, 32), (secret, 32)):
        with open(path, "wb") as f:
            f.write(os.urandom(n))
        os.chmod(path, 0o600)
    common = ["--cluster-label", "engines-test", "--replicas", "1",
              "--gossip-key-file", key, "--peer-secret-file", secret]
    s1 = start("node-1", ["--gossip-addr", g1, "--peer-addr", "127.0.0.1:%d" % free_port(),
                          "--transfer-addr", "127.0.0.1:%d" % free_port()] + common)
    s2 = start("node-2", ["--gossip-addr", "127.0.0.1:%d" % free_port(),
                          "--peer-addr", "127.0.0.1:%d" % free_port(),
                          "--transfer-addr", "127.0.0.1:%d" % free_port(), "--join", g1] + common)

    def both_alive():
        out = subprocess.run([BIN, "members", "--socket", s2.socket, "--json", "--timeout", "5s"],
                             capture_output=True, text=True)
        try:
            ms = json.loads(out.stdout)
        except ValueError:
            return False
        return sum(1 for m in ms if m.get("State", m.get("state")) in ("alive", "Alive")) >= 2
    poll(both_alive, 60, "two cluster members")
    return s1, s2
