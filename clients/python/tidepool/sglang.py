"""TidepoolStorage: an SGLang HiCache storage backend (the L3 tier) backed
by a tidepool sidecar.

Load it as a dynamic backend:

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name":"tidepool",
        "module_path":"tidepool.sglang","class_name":"TidepoolStorage",
        "interface_v1":1,"socket":"/run/tidepool/tidepool.sock"}'

One tidepool block is one SGLang page (page_size tokens) of K and V of all
layers of one tensor-parallel rank: a 64-byte header (magic + layout
digest), then the byte ranges the host pool's get_page_buffer_meta names
for the page, in its order (layer_first: K and V of layer 0, of layer 1,
...; page_first, page_first_direct, page_head: the page's K block, then its
V block). The plain calls (get/set with flat page tensors, SGLang's
generic path) store and read the same bytes, so either path finds what the
other saved.

Keys are SGLang's own page hashes (chained SHA-256 over the page's tokens
and its parent's hash; a chain starts from a seed that folds in the
request's extra_key, which SGLang extends with the LoRA id, and its
cache_salt), under a namespace naming everything else that changes the
bytes: model, dtype, layout, page size, head geometry, TP/PP/CP ranks.
docs/engines.md, "SGLang", has the whole story.

The sidecar is a cache, never a dependency: when it is absent, dies or
refuses, lookups count no hit, reads report their pages as not loaded and
writes as not saved; one warning per cause is logged and the backend
reconnects when the sidecar is back. A page is reported loaded only after
its size and header matched under a live lease (and its CRC-32C, with
verify_reads).

SGLang 0.5.23 allocates the host pool before it builds the storage backend
and lets a dynamic backend choose no allocator of its own (only
"allocator":"shm", a memfd the sidecar cannot take: it is not sealable), so
the pool cannot live in tidepool's arenas: a set copies each page from the
pool into its reserved arena slot (one copy) and commits it, a get copies
each leased block from the read-only arena mapping into the pool's page
(one copy).
"""

import ctypes
import hashlib
import json
import logging
import os
import threading
from typing import Any, List, Optional

import torch

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

from ._link import Counters, Link, Once
from .client import OK, Error, ErrorCode, Scope

logger = logging.getLogger("tidepool.sglang")

HEADER_BYTES = 64
_MAGIC = b"tidepool/sglang1"  # 16 bytes; then a 32-byte layout digest; 16 zero bytes
DEFAULT_SOCKET = "/run/tidepool/tidepool.sock"
MAX_KEY_BYTES = 128  # the sidecar's key limit

# Host pool layouts whose page bytes get_page_buffer_meta describes.
LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")

# Keys of the extra config this backend reads; SGLang's own keys pass
# through it; any other key is named in a warning (a typo is not silent).
OWN_KEYS = {"socket", "namespace", "model_id", "timeout_s", "retry_s", "lease_ms", "verify_reads",
            "lookup_scope"}
SGLANG_KEYS = {"backend_name", "module_path", "class_name", "interface_v1", "tp_lcm_size", "allocator",
               "prefetch_threshold", "prefetch_timeout_base", "prefetch_timeout_per_ki_token",
               "hicache_storage_pass_prefix_keys"}

_once = Once(logger)

# Counters of this process, for tests and logs (stats()).
_STATS = Counters(("exists_calls", "exists_hit_pages", "get_pages", "got_pages", "get_errors", "set_pages",
                   "saved_pages", "set_exists", "set_errors"))
_count = _STATS.add
stats = _STATS.snapshot


def _key(k):
    b = k.encode("utf-8") if isinstance(k, str) else bytes(k)
    if not b or len(b) > MAX_KEY_BYTES:
        raise ValueError("a key of %d bytes (1 to %d)" % (len(b), MAX_KEY_BYTES))
    return b


def _tensor_bytes(t):
    """A writable byte memoryview over a contiguous CPU tensor's memory
    (it keeps the tensor alive)."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("a page tensor must be contiguous host memory")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def namespace_descriptor(cfg, pool, model):
    """Everything besides the tokens that changes a page's bytes."""
    return {
        "v": 1,
        "model": model,
        "pool": type(pool).__name__,
        "dtype": str(pool.dtype),
        "layout": pool.layout,
        "page_size": pool.page_size,
        "layers": pool.layer_num,
        "heads": pool.head_num,
        "head_dim": pool.head_dim,
        "v_head_dim": getattr(pool, "v_head_dim", pool.head_dim),
        "tp": [cfg.tp_rank, cfg.tp_size],
        "pp": [cfg.pp_rank, cfg.pp_size],
        "cp": [cfg.attn_cp_rank, cfg.attn_cp_size],
    }


def namespace_for(desc, override=None):
    digest = hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:24]
    base = override or "sglang/" + os.path.basename(str(desc["model"]).rstrip("/"))[:64]
    return "%s/tp%d/pp%d/%s" % (base, desc["tp"][0], desc["pp"][0], digest)


class TidepoolStorage(HiCacheStorage):
    """SGLang HiCache storage backend storing KV pages in a tidepool sidecar."""

    def __init__(self, storage_config, kwargs=None):
        x = dict(storage_config.extra_config or {})
        unknown = set(x) - OWN_KEYS - SGLANG_KEYS
        if unknown:
            logger.warning("tidepool: extra config keys %s are neither this backend's (%s) nor SGLang's",
                           sorted(unknown), sorted(OWN_KEYS))
        if storage_config.should_split_heads:
            raise NotImplementedError("tidepool.sglang: tp_lcm_size head splitting is not implemented")
        if storage_config.is_mla_model:
            raise NotImplementedError("tidepool.sglang: MLA (rank-replicated) KV is not implemented")
        if getattr(storage_config, "dcp_size", 1) > 1:
            raise NotImplementedError("tidepool.sglang: decode context parallelism is not implemented")
        self._cfg = storage_config
        self._x = x
        self._socket = str(x.get("socket", DEFAULT_SOCKET))
        self._timeout_s = float(x.get("timeout_s", 5.0))
        self._retry_s = float(x.get("retry_s", 2.0))
        self._lease_ms = int(x.get("lease_ms", 0))
        self._verify = bool(x.get("verify_reads", False))
        scope = str(x.get("lookup_scope", "default")).upper()
        if not hasattr(Scope, scope):
            raise ValueError("tidepool.sglang: lookup_scope must be default, local or cluster")
        self._scope = getattr(Scope, scope)
        self._model = x.get("model_id") or storage_config.model_name
        if not self._model:
            raise ValueError("tidepool.sglang: no model name (SGLang passed none): set model_id in the "
                             "extra config, or pages of different models would share keys")
        self._local = threading.local()
        self._pool = None
        self._ns = None

    # ---- the host pool ---------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host):
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
        pool = mem_pool_host
        # Subclasses (asymmetric K/V widths, MXFP8 scales, sparse pools) lay
        # pages out differently: refused rather than stored wrongly.
        if type(pool) is not MHATokenToKVPoolHost:
            raise NotImplementedError("tidepool.sglang: host pool %s is not implemented (MHATokenToKVPoolHost "
                                      "only)" % type(pool).__name__)
        if pool.layout not in LAYOUTS:
            raise NotImplementedError("tidepool.sglang: host pool layout %r is not implemented (%s)"
                                      % (pool.layout, ", ".join(LAYOUTS)))
        if getattr(pool, "v_head_dim", pool.head_dim) != pool.head_dim:
            raise NotImplementedError("tidepool.sglang: K and V of different widths are not implemented")
        if pool.kv_buffer is None or pool.kv_buffer.device.type != "cpu" or not pool.kv_buffer.is_contiguous():
            raise NotImplementedError("tidepool.sglang: the host pool is not contiguous host memory")
        super().register_mem_pool_host(pool)
        self._pool = pool
        self._page = pool.page_size
        self._page_bytes = 2 * pool.layer_num * pool.page_size * pool.head_num * pool.head_dim * pool.dtype.itemsize
        self._base = pool.kv_buffer.data_ptr()
        self._end = self._base + pool.kv_buffer.numel() * pool.kv_buffer.element_size()
        # The regions of one page, as the v1 calls address them.
        ptrs, sizes = pool.get_page_buffer_meta(torch.arange(pool.page_size, dtype=torch.int64))
        if sum(sizes) != self._page_bytes:
            raise NotImplementedError("tidepool.sglang: %d bytes in a page's regions, %d expected"
                                      % (sum(sizes), self._page_bytes))
        self._regions = len(ptrs)
        self._desc = namespace_descriptor(self._cfg, pool, self._model)
        self._ns = namespace_for(self._desc, self._x.get("namespace"))
        sig = [self._ns, list(sizes), list(pool.kv_buffer.shape)]
        self._header = _MAGIC + hashlib.sha256(json.dumps(sig).encode()).digest() + bytes(HEADER_BYTES - 48)
        logger.info("tidepool: socket %s, namespace %s, %d bytes per page (+%d header)", self._socket, self._ns,
                    self._page_bytes, HEADER_BYTES)

    @property
    def namespace(self):
        return self._ns

    def _need_pool(self):
        if self._pool is None:
            raise RuntimeError("tidepool.sglang: no host pool registered (register_mem_pool_host)")

    def _v1_parts(self, n, host_indices):
        """Per page, the writable byte views of its regions in the host pool,
        or None when host_indices does not name n whole pages inside it."""
        if host_indices is None or host_indices.numel() != n * self._page:
            _once.warn("indices", "%s host indices for %d pages of %d tokens; pages not transferred",
                       None if host_indices is None else host_indices.numel(), n, self._page)
            return None
        idx = host_indices.to("cpu", torch.int64)
        if n and (int(idx.min()) < 0 or int(idx.max()) >= self._pool.size):
            _once.warn("range", "host indices outside the host pool; pages not transferred")
            return None
        ptrs, sizes = self._pool.get_page_buffer_meta(idx)
        if len(ptrs) != n * self._regions:
            return None
        out = []
        for i in range(n):
            page = []
            for p, s in zip(ptrs[i * self._regions:(i + 1) * self._regions],
                            sizes[i * self._regions:(i + 1) * self._regions]):
                if p < self._base or p + s > self._end:
                    _once.warn("range", "a page region outside the host pool; pages not transferred")
                    return None
                page.append(memoryview((ctypes.c_char * s).from_address(p)).cast("B"))
            out.append(page)
        return out

    # ---- the link to the sidecar ----------------------------------------------

    def _link(self):
        # One connection per thread: SGLang calls from its prefetch, prefetch
        # I/O and backup threads, and a Client is not thread-safe.
        link = getattr(self._local, "link", None)
        if link is None:
            name = threading.current_thread().name
            link = self._local.link = Link(self._socket, self._timeout_s, self._retry_s, name, logger, _once,
                                           "tidepool-sglang/" + name)
        return link

    def _failed(self, link, e, what):
        if isinstance(e, Error):
            _once.warn("%s:%s" % (what, e.code), "%s refused (%s)", what, e)
        else:
            link.failed(e)

    def _first(self, what, fn):
        """(client, fn(client)) for a call's first request, or (None, None)
        when there is no sidecar or it refused. A connection that fails
        there is remade at once, once: it may be to a sidecar that
        restarted since this thread's last call."""
        link = self._link()
        for attempt in (0, 1):
            c = link.get()
            if c is None:
                return None, None
            try:
                return c, fn(c)
            except Exception as e:  # noqa: BLE001
                if isinstance(e, Error):
                    self._failed(link, e, what)
                    return None, None
                link.failed(e, retry_now=attempt == 0)
        return None, None

    # ---- pages in and out -------------------------------------------------------

    def _set_pages(self, keys, parts, depth0):
        """Stores each page (header + parts) under its key; True per page
        stored now or already there."""
        n = len(keys)
        _count("set_pages", n)
        link = self._link()
        size = HEADER_BYTES + self._page_bytes
        c, rs = self._first("Reserve", lambda c: c.reserve(self._ns, [(k, size, depth0 + i)
                                                                      for i, k in enumerate(keys)]))
        if c is None:
            _count("set_errors", n)
            return [False] * n
        ok, commits, where = [False] * n, [], []
        try:
            for i, r in enumerate(rs):
                if r.code == ErrorCode.EXISTS:
                    ok[i] = True
                    _count("set_exists")
                    continue
                if r.code != OK:
                    _once.warn("reserve-item:%s" % r.code, "page not saved (%s: %s)",
                               ErrorCode._VALUES_TO_NAMES.get(r.code, r.code), r.message)
                    continue
                c.write_slot(r.slot, [self._header] + parts[i])
                # No checksum sent: the sidecar computes it from the slot at Commit.
                commits.append((r.token, None))
                where.append(i)
        except BaseException as e:
            try:
                c.abort([r.token for r in rs if r.code == OK])
            except Exception:  # noqa: BLE001
                pass
            if not isinstance(e, Exception):
                raise
            self._failed(link, e, "write")
            _count("set_errors", n)
            return [False] * n
        if commits:
            try:
                codes = c.commit(commits)
            except Exception as e:  # noqa: BLE001
                self._failed(link, e, "Commit")
                _count("set_errors", n)
                return [False] * n
            for i, code in zip(where, codes):
                ok[i] = code in (OK, ErrorCode.EXISTS)
                _count("saved_pages" if code == OK else "set_exists" if code == ErrorCode.EXISTS else "set_errors")
        return ok

    def _get_pages(self, keys, parts):
        """Copies each page found into its parts; True per page whose bytes
        are now there (size and header checked under a live lease)."""
        n = len(keys)
        _count("get_pages", n)
        link = self._link()
        want = HEADER_BYTES + self._page_bytes
        c, got = self._first("Acquire", lambda c: c.acquire(self._ns, keys, lease_ms=self._lease_ms,
                                                             scope=self._scope))
        if c is None:
            return [False] * n
        leases = got[0]
        held = [l.lease_id for l in leases if l.code == OK]
        ok = [False] * n
        try:
            for i, l in enumerate(leases):
                if l.code != OK:
                    if l.code != ErrorCode.NOT_FOUND:
                        _once.warn("acq-item:%s" % l.code, "page refused (%s)",
                                   ErrorCode._VALUES_TO_NAMES.get(l.code, l.code))
                        _count("get_errors")
                    continue
                if l.slot.length != want:
                    _once.warn("size", "block of %d bytes where this layout needs %d (another model under a "
                               "colliding key?); not loaded", l.slot.length, want)
                    _count("get_errors")
                    continue
                try:
                    view = c.slot_view(l, verify=self._verify)
                except Error as e:
                    _once.warn("verify:%s" % e.code, "page failed its check (%s); not loaded", e)
                    _count("get_errors")
                    continue
                try:
                    if view[:HEADER_BYTES] != self._header:
                        _once.warn("header", "block with another layout's header; not loaded")
                        _count("get_errors")
                        continue
                    off = HEADER_BYTES
                    for dst in parts[i]:
                        dst[:] = view[off:off + len(dst)]
                        off += len(dst)
                    ok[i] = True
                finally:
                    view.release()
        except Exception as e:  # noqa: BLE001
            _once.warn("load:%s" % type(e).__name__, "load failed: %r", e)
            ok = [False] * n
        finally:
            if held:
                try:
                    codes = c.release(held)
                    expired = {held[j] for j, code in enumerate(codes) if code != OK}
                    if expired:
                        # Bytes copied under an expired lease may be wrong.
                        _once.warn("expired", "a lease expired during a load; its pages are not loaded")
                        ok = [o and l.lease_id not in expired for o, l in zip(ok, leases)]
                except Exception as e:  # noqa: BLE001
                    self._failed(link, e, "Release")
                    ok = [False] * n
        _count("got_pages", sum(ok))
        return ok

    # ---- SGLang's v1 (zero-copy) calls -----------------------------------------

    def batch_exists(self, keys: List[str], extra_info: Optional[Any] = None) -> int:
        """How many leading keys the sidecar holds (one Lookup)."""
        self._need_pool()
        _count("exists_calls")
        if not keys:
            return 0
        kb = [_key(k) for k in keys]
        c, hit = self._first("Lookup", lambda c: c.lookup(self._ns, kb, scope=self._scope))
        if c is None:
            return 0
        hit = max(0, min(int(hit), len(keys)))
        _count("exists_hit_pages", hit)
        return hit

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor, extra_info: Optional[Any] = None) -> List[bool]:
        self._need_pool()
        parts = self._v1_parts(len(keys), host_indices)
        if parts is None:
            return [False] * len(keys)
        return self._get_pages([_key(k) for k in keys], parts)

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor, extra_info: Optional[Any] = None) -> List[bool]:
        self._need_pool()
        parts = self._v1_parts(len(keys), host_indices)
        if parts is None:
            return [False] * len(keys)
        prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
        return self._set_pages([_key(k) for k in keys], parts, len(prefix) if prefix else 0)

    # ---- SGLang's plain calls (flat page tensors) -------------------------------

    def _flat_ok(self, t):
        return (isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dtype == self._pool.dtype
                and t.numel() * t.element_size() == self._page_bytes)

    def _flat_parts(self, t):
        """A flat page tensor (get_data_page) in the block's byte order."""
        if self._pool.layout == "layer_first":
            # Flat order (K|V, layer, token...); the block holds it layer by
            # layer (layer, K|V, token...), as get_page_buffer_meta.
            return [_tensor_bytes(t.reshape(2, self._pool.layer_num, -1).transpose(0, 1).contiguous())]
        return [_tensor_bytes(t.contiguous())]

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None):
        self._need_pool()
        targets: List[Any] = list(target_locations) if target_locations is not None else [None] * len(keys)
        if len(targets) != len(keys):
            raise ValueError("tidepool.sglang: %d keys, %d target locations" % (len(keys), len(targets)))
        out = [None] * len(keys)
        idx, parts, staged = [], [], []
        for i, t in enumerate(targets):
            if t is None:
                t = targets[i] = self._pool.get_dummy_flat_data_page()
            if not self._flat_ok(t) or not t.is_contiguous():
                _once.warn("target", "a target of %s %s where a page is %d contiguous bytes of %s; not loaded",
                           getattr(t, "dtype", type(t).__name__), tuple(getattr(t, "shape", ())),
                           self._page_bytes, self._pool.dtype)
                continue
            # layer_first: read into a block-ordered copy, then reorder into t.
            s = torch.empty_like(t) if self._pool.layout == "layer_first" else t
            idx.append(i)
            parts.append([_tensor_bytes(s)])
            staged.append(s)
        if not idx:
            return out
        got = self._get_pages([_key(keys[i]) for i in idx], parts)
        for i, s, g in zip(idx, staged, got):
            if not g:
                continue
            t = targets[i]
            if s is not t:
                L = self._pool.layer_num
                t.view(2, L, -1).copy_(s.view(L, 2, -1).transpose(0, 1))
            out[i] = t
        return out

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        self._need_pool()
        values = list(values) if values is not None else []
        if len(values) != len(keys):
            raise ValueError("tidepool.sglang: %d keys, %d values" % (len(keys), len(values)))
        for v in values:
            if not self._flat_ok(v):
                _once.warn("value", "a value of %s %s where a page is %d bytes of %s; not saved",
                           getattr(v, "dtype", type(v).__name__), tuple(getattr(v, "shape", ())),
                           self._page_bytes, self._pool.dtype)
                return False
        parts = [self._flat_parts(v) for v in values]
        return all(self._set_pages([_key(k) for k in keys], parts, 0))

    # ---- the rest ------------------------------------------------------------------

    def clear(self) -> bool:
        """Deletes every page of this backend's namespace (SGLang's
        /clear_hicache_storage_backend), for every engine that shares it."""
        self._need_pool()
        c, _ = self._first("Clear", lambda c: c.clear(self._ns))
        return c is not None

    def close(self):
        link = getattr(self._local, "link", None)
        if link is not None and link.client is not None:
            try:
                link.client.close()
            except Exception:  # noqa: BLE001
                pass
            link.client = None
