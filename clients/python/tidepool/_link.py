"""A lazily (re)connected sidecar client and a log-once helper, shared by
the engine integrations (tidepool.vllm, tidepool.sglang): the sidecar is a
cache, never a dependency, so a connection failure is logged once per
outage and answered as "no sidecar" until a reconnect succeeds."""

import os
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

    def warn(self, cause, msg, *args, level="warning"):
        with self._lock:
            if cause in self._seen:
                return
            self._seen.add(cause)
        getattr(self._logger, level)("tidepool: " + msg, *args)

    def forget(self, cause):
        with self._lock:
            self._seen.discard(cause)


def _socket_id(path):
    """The identity of the socket file at path, None when there is none. A
    sidecar that (re)starts binds a new one (serve removes a stale socket
    first): inode numbers may be reused, their creation times are not."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_ctime_ns


class Link:
    """A lazily (re)connected Client. get() returns a Client or None while
    the sidecar is unreachable. After a failure the same socket is tried
    again only after retry_s (a hung sidecar costs one timeout per retry_s,
    not one per call), but a new socket at the path (a sidecar that came
    up or restarted since) is tried at once: the first call after the
    sidecar is ready connects. An engine that starts before its sidecar
    logs one info line ("not up yet"), not a warning. Not thread-safe: each
    thread has its own Link."""

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
        self._failed_id = None  # the socket (_socket_id) whose failure _next_try waits out
        self._conn_id = None  # the socket of client
        self._down = False
        self._ever = False  # connected once: a failure is an outage, not "not up yet"
        self.on_close = None  # called before the client is closed (views of its arenas must go first)

    def get(self):
        if self.client is not None:
            return self.client
        now = time.monotonic()
        sid = _socket_id(self.path)
        if now < self._next_try and sid == self._failed_id:
            return None
        try:
            c = Client(self.path, timeout=self.timeout_s, client_name=self._client_name)
            c._map()  # Hello, and map the arenas now: a load never needs the socket to read bytes
        except Exception as e:  # noqa: BLE001 - any failure means "no sidecar"
            self._failed_id, self._next_try = sid, time.monotonic() + self.retry_s
            self._mark_down(e)
            return None
        self._conn_id = sid
        if self._down:
            self._logger.info("tidepool: sidecar at %s is back (%s side)", self.path, self.name)
            self._once.forget("down:" + self.name)
        self._down = False
        self._ever = True
        self.client = c
        return c

    def _mark_down(self, err):
        self._down = True
        if self._ever:
            self._once.warn("down:" + self.name,
                            "sidecar at %s unavailable (%s side): %s; serving by recomputation "
                            "and retrying every %.1fs", self.path, self.name, repr(err), self.retry_s)
        else:  # not up yet: the engine started first, nothing is wrong
            self._once.warn("down:" + self.name,
                            "sidecar at %s unavailable (not up yet? %s side); serving by recomputation "
                            "until it is", self.path, self.name, level="info")

    def close(self):
        """Closes the client (after on_close), if connected."""
        c, self.client = self.client, None
        if c is None:
            return
        if self.on_close is not None:
            self.on_close()
        try:
            c.close()
        except Exception:  # noqa: BLE001
            pass

    def failed(self, err, retry_now=False):
        """The connection broke (transport error, timeout): drop it. With
        retry_now the next get() connects at once (the sidecar may have
        closed an idle connection), else after retry_s unless a new socket
        is at the path by then."""
        self.close()
        self._failed_id = self._conn_id
        self._next_try = 0.0 if retry_now else time.monotonic() + self.retry_s
        self._mark_down(err)
