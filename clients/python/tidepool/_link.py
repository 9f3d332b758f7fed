"""A lazily (re)connected sidecar client and a log-once helper, shared by
the engine integrations (tidepool.vllm, tidepool.sglang): the sidecar is a
cache, never a dependency, so a connection failure is logged once per
outage and answered as "no sidecar" until a reconnect succeeds."""

import threading
import time
from typing import Optional

from .client import Client


class Counters:
    """Named counters of a process, for tests and logs; thread-safe."""

    def __init__(self, names):
        self._lock = threading.Lock()
        self._c = dict.fromkeys(names, 0)

    def add(self, name, n=1):
        with self._lock:
            self._c[name] += n

    def snapshot(self):
        with self._lock:
            return dict(self._c)


class Once:
    """Logs each cause once (per outage for connection causes)."""

    def __init__(self, logger):
        self._logger = logger
        self._seen = set()
        self._lock = threading.Lock()

    def warn(self, cause, msg, *args):
        with self._lock:
            if cause in self._seen:
                return
            self._seen.add(cause)
        self._logger.warning("tidepool: " + msg, *args)

    def forget(self, cause):
        with self._lock:
            self._seen.discard(cause)


class Link:
    """A lazily (re)connected Client. get() returns a Client or None while
    the sidecar is unreachable; reconnects at most every retry_s. Not
    thread-safe: each thread has its own Link."""

    def __init__(self, socket_path, timeout_s, retry_s, name, logger, once, client_name):
        self.path = socket_path
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.name = name
        self.client: Optional[Client] = None
        self._logger = logger
        self._once = once
        self._client_name = client_name
        self._next_try = 0.0
        self._down = False

    def get(self):
        if self.client is not None:
            return self.client
        now = time.monotonic()
        if now < self._next_try:
            return None
        self._next_try = now + self.retry_s
        try:
            c = Client(self.path, timeout=self.timeout_s, client_name=self._client_name)
            c._map()  # Hello, and map the arenas now: a load never needs the socket to read bytes
        except Exception as e:  # noqa: BLE001 - any failure means "no sidecar"
            self._mark_down(e)
            return None
        if self._down:
            self._logger.info("tidepool: sidecar at %s is back (%s side)", self.path, self.name)
            self._once.forget("down:" + self.name)
        self._down = False
        self.client = c
        return c

    def _mark_down(self, err):
        self._down = True
        self._once.warn("down:" + self.name,
                        "sidecar at %s unavailable (%s side): %s; serving by recomputation "
                        "and retrying every %.1fs", self.path, self.name, repr(err), self.retry_s)

    def failed(self, err, retry_now=False):
        """The connection broke (transport error, timeout): drop it. With
        retry_now the next get() connects at once (a sidecar that restarted
        answers a new connection), else after retry_s."""
        c, self.client = self.client, None
        if c is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
        self._next_try = 0.0 if retry_now else time.monotonic() + self.retry_s
        self._mark_down(err)
