"""TidepoolConnector: a vLLM V1 KV connector backed by a tidepool sidecar.

Load it with

    --kv-transfer-config '{"kv_connector":"TidepoolConnector",
        "kv_connector_module_path":"tidepool.vllm","kv_role":"kv_both",
        "kv_connector_extra_config":{"socket":"/run/tidepool/tidepool.sock"}}'

One tidepool block is one vLLM block (block_size tokens) of every layer of
one tensor-parallel rank: a 64-byte header (magic + layout digest) followed,
layer by layer, by the bytes that layer's paged KV tensor holds for that
block, in the tensor's own layout. docs/engines.md has the whole story: keys,
namespaces, failure handling, figures.

vLLM builds the connector twice: in the scheduler (Scheduler below: lookups
and the plan of each step's loads and saves) and in each worker (Worker:
the copies between the paged KV tensors and the sidecar's shared arenas).
TidepoolConnector is the class vLLM names; it hands each call to its side.

Keys are vLLM's own block hashes (chained; they fold in every token before
the block, LoRA, multimodal inputs, cache_salt and prompt embeddings) under a
namespace that names everything else that changes the KV bytes (model,
dtypes, layout, block size, ranks). vLLM's hashes are stable across
processes with sha256/sha256_cbor, or with xxhash when PYTHONHASHSEED is set
to one value everywhere; with xxhash and no PYTHONHASHSEED each process
draws a random seed, and the connector refuses to start.

The sidecar is a cache, never a dependency: when it is absent or dies, the
connector answers "no hit", loads report their blocks as failed (vLLM
recomputes them), saves are dropped, one line is logged, and the
connector reconnects when the sidecar is back.
"""

import atexit
import collections
import functools
import hashlib
import json
import os
import queue
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.logger import init_logger

from . import checksum as _crc
from ._link import Link, Once
from .client import OK, BlockMeta, Error, ErrorCode, RELEASE_MARGIN_MS, Scope

logger = init_logger("vllm.kv_connector.tidepool")
# Loads view the read-only arena mapping as a tensor that is only read.
warnings.filterwarnings("ignore", message="The given buffer is not writable")  # under "vllm": its log configuration applies

HEADER_BYTES = 64
_MAGIC = b"tidepool/vllm/1\0"  # 16 bytes; then a 32-byte layout digest; 16 zero bytes
DEFAULT_SOCKET = "/run/tidepool/tidepool.sock"

# One load or save call moves at most this share of the sidecar's DRAM tier
# (and at most its max_batch keys): the rest of a long prefix goes in
# further calls, so that a prefix larger than DRAM streams through it
# (saves: committed blocks demote to SSD as the next call reserves; loads:
# blocks promoted from SSD for one call are released before the next).
DRAM_SHARE = 4
# Leases a load left to ride on the next Acquire are released on their own
# once they are this old, so that an engine that goes idle does not keep
# them pinned until their deadline.
RELEASE_IDLE_S = 0.5
# The scratch buffer a load gathers blocks into before it scatters them
# (when their KV blocks are not one run): made once per worker.
SCRATCH_BYTES = 8 << 20
# Blocks loaded through the slot index (no call) are reported to the
# sidecar as reads this long after the load (an Acquire of this lease and
# its Release, on the save thread), so that its eviction policy keeps them
# as recently used without the step waiting for it.
TOUCH_DELAY_S = 0.05
TOUCH_LEASE_MS = 1000
# Remembered keys of blocks this engine stored or found stored (not
# offered again): a bound, oldest forgotten first.
KNOWN_KEYS = 1 << 18

# Counters of this process, for logs, benchmarks and tests (stats()).
# rpc_* count round trips to the sidecar by call.
_STATS: "collections.Counter[str]" = collections.Counter()
_STATS_LOCK = threading.Lock()


def _count(name, n=1):
    with _STATS_LOCK:
        _STATS[name] += n


def stats():
    """A copy of this process's connector counters: lookups, blocks loaded
    and saved (and their seconds and bytes), errors, and round trips to
    the sidecar by call (rpc_lookup, rpc_acquire, rpc_release,
    rpc_reserve, rpc_commit)."""
    with _STATS_LOCK:
        return dict(_STATS)


_once = Once(logger)


class _Link(Link):
    """The shared Link (tidepool._link), with what the connector needs of
    the sidecar it connects to: the most blocks one call may carry
    (max_batch) and DRAM_SHARE of its DRAM tier in bytes (budget)."""

    def __init__(self, socket_path, timeout_s, retry_s, name):
        super().__init__(socket_path, timeout_s, retry_s, name, logger, _once, "tidepool-vllm/" + name)
        self.max_batch = 256
        self.budget = 1 << 62  # bytes one call may move (DRAM_SHARE)

    def get(self):
        fresh = self.client is None
        c = super().get()
        if c is None or not fresh:
            return c
        h = c.server_info()  # the Hello the client mapped its arenas from: no second call
        if h.limits is not None and h.limits.max_batch > 0:
            self.max_batch = h.limits.max_batch
        dram = [t.capacity_bytes for t in (h.tiers or ()) if t.name == "dram" and t.capacity_bytes > 0]
        if dram:
            self.budget = max(dram[0] // DRAM_SHARE, 1)
        return c

    def chunk(self, block_bytes):
        """Blocks per call: max_batch, and DRAM_SHARE of the DRAM tier."""
        return max(1, min(self.max_batch, self.budget // max(block_bytes, 1)))


def _is_server_error(e):
    return isinstance(e, Error)


def _chunks(seq, n):
    for i in range(0, len(seq), n):
        yield seq[i:i + n]


# ---- metadata -----------------------------------------------------------------

@dataclass
class _Transfer:
    req_id: str
    keys: list  # tidepool keys (bytes), one per block; a load's may hold None (no key: fails)
    block_ids: list  # vLLM block ids, same length
    first_index: int  # chain index (depth) of keys[0]; the keys follow one another in the chain
    parent: Optional[bytes] = None  # a save's: the key of the block before keys[0] (None: keys[0] is first)
    metas: Optional[list] = None  # a save's: a BlockMeta per key (the sidecar's KV events: docs/events.md)


@dataclass
class TidepoolConnectorMetadata(KVConnectorMetadata):
    loads: list = field(default_factory=list)  # [_Transfer]
    saves: list = field(default_factory=list)  # [_Transfer]


try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata as _WM
except ImportError:  # pragma: no cover
    _WM = object


@dataclass
class TidepoolWorkerMetadata(_WM):
    """Worker -> scheduler: blocks saved since the last step (for events and
    to not offer them again), and keys whose save failed (to offer again)."""
    stored: list = field(default_factory=list)  # [(keys, parent, block_size)]
    failed: list = field(default_factory=list)  # [key]

    def aggregate(self, other):
        return TidepoolWorkerMetadata(stored=list(self.stored) + list(getattr(other, "stored", [])),
                                      failed=list(self.failed) + list(getattr(other, "failed", [])))


# ---- configuration ------------------------------------------------------------

@dataclass
class Settings:
    """kv_connector_extra_config, checked (docs/engines.md lists the keys)."""
    socket: str = DEFAULT_SOCKET
    namespace: Optional[str] = None
    model_id: Optional[str] = None
    timeout_s: float = 5.0
    retry_s: float = 2.0
    lease_ms: int = 0
    load: Optional[bool] = None
    save: Optional[bool] = None
    lookup_scope: str = "default"
    verify_reads: bool = False
    slot_index: bool = True  # local hits found and copied without a call (docs/zerocopy.md)
    shutdown_timeout_s: float = 30.0
    gpu_path: str = "engine"  # a KV cache on CUDA only: engine (layer 1) or sidecar (layer 2); docs/gpu.md

    @classmethod
    def parse(cls, extra):
        x = dict(extra or {})
        known = set(cls.__dataclass_fields__)
        unknown = set(x) - known
        if unknown:
            raise ValueError("TidepoolConnector: unknown kv_connector_extra_config keys %s (known: %s)"
                             % (sorted(unknown), sorted(known)))
        s = cls(**x)
        s.timeout_s, s.retry_s, s.shutdown_timeout_s = float(s.timeout_s), float(s.retry_s), float(s.shutdown_timeout_s)
        s.lease_ms, s.verify_reads, s.slot_index = int(s.lease_ms), bool(s.verify_reads), bool(s.slot_index)
        if not hasattr(Scope, str(s.lookup_scope).upper()):
            raise ValueError("TidepoolConnector: lookup_scope must be default, local or cluster")
        if s.shutdown_timeout_s < 0:
            raise ValueError("TidepoolConnector: shutdown_timeout_s must not be negative")
        if s.gpu_path not in ("engine", "sidecar"):
            raise ValueError("TidepoolConnector: gpu_path %r: engine or sidecar" % (s.gpu_path,))
        return s


def check_stable_keys(vllm_config, environ=os.environ):
    """Raises ValueError when vLLM's block hashes would differ between
    processes, so that keys saved by one engine could never be found by
    another (or, worse, a per-process seed would make them meaningless)."""
    cc = vllm_config.cache_config
    if not cc.enable_prefix_caching:
        raise ValueError("TidepoolConnector needs prefix caching (vLLM computes block hashes only "
                         "with it): remove --no-enable-prefix-caching")
    algo = cc.prefix_caching_hash_algo
    if algo in ("xxhash", "xxhash_cbor") and environ.get("PYTHONHASHSEED") is None:
        raise ValueError(
            "TidepoolConnector: --prefix-caching-hash-algo %s without PYTHONHASHSEED gives every "
            "process a random hash seed, so block keys would differ between engines and tidepool "
            "could never be hit. Use sha256 or sha256_cbor (the default is sha256), or set "
            "PYTHONHASHSEED to the same value on every engine." % algo)


def namespace_descriptor(vllm_config, kv_cache_config, tp_rank, pp_rank, extra):
    """Everything besides the tokens that changes the KV bytes of a block."""
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    from vllm.platforms import current_platform
    spec = ""
    groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
    if groups:
        spec = repr(groups[0].kv_cache_spec)
    model_id = extra.get("model_id") if isinstance(extra, dict) else extra.model_id
    model = model_id or (mc.served_model_name if isinstance(mc.served_model_name, str) else None) or mc.model
    return {
        "v": 1,
        "model": model,
        "revision": getattr(mc, "revision", None),
        "load_format": str(getattr(vllm_config.load_config, "load_format", "")),
        "dtype": str(mc.dtype),
        "kv_cache_dtype": str(cc.cache_dtype),
        "block_size": cc.block_size,
        "hash_algo": cc.prefix_caching_hash_algo,
        "hash_seed": os.environ.get("PYTHONHASHSEED"),
        "device": current_platform.device_type,
        "tp": [tp_rank, pc.tensor_parallel_size],
        "pp": [pp_rank, pc.pipeline_parallel_size],
        "layers": len(groups[0].layer_names) if groups else None,
        "spec": spec,
    }


def namespace_for(desc, override=None):
    digest = hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:24]
    base = override or "vllm/" + os.path.basename(str(desc["model"]).rstrip("/"))[:64]
    return "%s/tp%d/pp%d/%s" % (base, desc["tp"][0], desc["pp"][0], digest)


# ---- the connector vLLM names --------------------------------------------------

def block_metas(request, keys, first, block_size, parent=None):
    """The BlockMeta of each of keys, blocks first, first+1, ... of request
    (parent: the key of block first-1, None for block 0): the block's token
    ids, the key before it and the block size, which the sidecar publishes
    in its KV events so that routers (llm-d, Dynamo) can index the blocks it
    holds (docs/events.md). A block whose tokens are not all known gets no
    token ids."""
    toks = getattr(request, "all_token_ids", None)
    if toks is None:
        toks = getattr(request, "prompt_token_ids", None) or []
    out = []
    for i, _ in enumerate(keys):
        b = first + i
        t = list(toks[b * block_size:(b + 1) * block_size])
        out.append(BlockMeta(t if len(t) == block_size else [], keys[i - 1] if i > 0 else parent, block_size))
    return out


class TidepoolConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM V1 KV connector storing KV blocks in a tidepool sidecar. Each
    instance is one side: a Scheduler in the scheduler, a Worker in each
    worker; the calls of the other side are not made on it."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        check_stable_keys(vllm_config)
        tc = self._kv_transfer_config
        s = Settings.parse(tc.kv_connector_extra_config)
        do_load = bool(tc.kv_role in ("kv_both", "kv_consumer") if s.load is None else s.load)
        do_save = bool(tc.kv_role in ("kv_both", "kv_producer") if s.save is None else s.save)
        # A block that cannot be loaded is recomputed, never an error of the
        # request: tidepool is a cache. The scheduler reads this policy right
        # after it builds the scheduler-side connector.
        if getattr(tc, "kv_load_failure_policy", "recompute") != "recompute":
            logger.info("tidepool: setting kv_load_failure_policy=recompute (blocks that cannot be "
                        "loaded from the cache are recomputed)")
            tc.kv_load_failure_policy = "recompute"
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
        if len(groups) > 1:
            # vLLM cannot map block-level load errors back to requests with
            # several KV-cache groups (hybrid models): stay out of the way.
            logger.warning("tidepool: %d KV-cache groups (hybrid model): the connector supports one; "
                           "it stays inactive (no loads, no saves)", len(groups))
            do_load = do_save = False
        pc = vllm_config.parallel_config
        tp_rank = pp_rank = 0
        if role != KVConnectorRole.SCHEDULER:
            from vllm.distributed.parallel_state import get_pp_group, get_tp_group
            tp_rank = get_tp_group().rank_in_group if pc.tensor_parallel_size > 1 else 0
            pp_rank = get_pp_group().rank_in_group if pc.pipeline_parallel_size > 1 else 0
        desc = namespace_descriptor(vllm_config, kv_cache_config, tp_rank, pp_rank, s)
        ns = namespace_for(desc, s.namespace)
        block_size = vllm_config.cache_config.block_size
        logger.info("tidepool: %s side, socket %s, namespace %s",
                    "scheduler" if role == KVConnectorRole.SCHEDULER else "worker", s.socket, ns)
        self._ns = ns
        self._sched = self._worker = None
        if role == KVConnectorRole.SCHEDULER:
            self._sched = Scheduler(s, ns, block_size, do_load, do_save, lambda: self._kv_cache_manager)
        else:
            self._worker = Worker(s, ns, block_size, do_load, do_save, kv_cache_config)

    # ---- scheduler side -----------------------------------------------------------
    def on_new_request(self, request):
        self._sched.on_new_request(request)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self._sched.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._sched.update_state_after_alloc(request, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return self._sched.build_connector_meta(scheduler_output)

    def request_finished(self, request, block_ids):
        return self._sched.request_finished(request)

    def request_finished_all_groups(self, request, block_ids):
        return self._sched.request_finished(request)

    def update_connector_output(self, connector_output):
        self._sched.update_connector_output(connector_output)

    def take_events(self):
        return self._sched.take_events()

    # ---- worker side --------------------------------------------------------------
    def register_kv_caches(self, kv_caches):
        self._worker.register_kv_caches(kv_caches)

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None:
            self._worker.step_started()

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._connector_metadata
        if isinstance(meta, TidepoolConnectorMetadata):
            self._worker.start_load_kv(meta)

    def wait_for_layer_load(self, layer_name):
        self._worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return  # whole blocks are saved after the forward (wait_for_save)

    def wait_for_save(self):
        meta = self._connector_metadata
        if isinstance(meta, TidepoolConnectorMetadata):
            self._worker.wait_for_save(meta)

    def handle_preemptions(self, kv_connector_metadata):
        self._worker.drain()  # preempted requests' blocks are about to be reused

    def get_finished(self, finished_req_ids):
        return self._worker.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self):
        return self._worker.get_block_ids_with_load_errors()

    def build_connector_worker_meta(self):
        return self._worker.build_worker_meta()

    def shutdown(self):
        if self._worker is not None:
            self._worker.shutdown()
        if self._sched is not None:
            self._sched.shutdown()


# ==== scheduler side ==============================================================

@dataclass
class _ReqState:
    request: Any
    planned: int = 0  # blocks [0, planned) were loaded, offered for saving or need no save
    hit: int = 0  # blocks the last Lookup found in the sidecar
    has_saves: bool = False


class Scheduler:
    """The scheduler's half: one Lookup per scheduling attempt, and per step
    the plan of loads (blocks the lookup found) and saves (blocks that
    became full and that neither the lookup found nor this engine stored
    before)."""

    def __init__(self, s, ns, block_size, do_load, do_save, kv_cache_manager):
        self._s = s
        self._ns = ns
        self._block_size = block_size
        self._do_load = do_load
        self._do_save = do_save
        self._manager = kv_cache_manager  # () -> vLLM's KVCacheManager or None
        self._scope = getattr(Scope, s.lookup_scope.upper())
        self._link = _Link(s.socket, s.timeout_s, s.retry_s, "scheduler")
        self._reqs: dict = {}
        self._pending_loads: dict = {}  # req_id -> num external tokens
        self._known = collections.OrderedDict()  # keys stored (or being stored) in the sidecar
        self._events: list = []

    def _keys(self, request, n_blocks=None):
        """Keys of the request's full blocks (vLLM's block hashes)."""
        hashes = request.block_hashes
        hbs = getattr(request, "hash_block_size", None) or self._block_size
        ratio = max(1, self._block_size // hbs)
        n = len(hashes) // ratio
        if n_blocks is not None:
            n = min(n, n_blocks)
        return [bytes(hashes[(i + 1) * ratio - 1]) for i in range(n)]

    def _know(self, keys):
        for k in keys:
            self._known[k] = True
            self._known.move_to_end(k)
        while len(self._known) > KNOWN_KEYS:
            self._known.popitem(last=False)

    def on_new_request(self, request):
        self._reqs[request.request_id] = _ReqState(request)

    def _state(self, request):
        st = self._reqs.get(request.request_id)
        if st is None:
            st = self._reqs[request.request_id] = _ReqState(request)
        return st

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """One Lookup of the request's prompt blocks. vLLM may call it
        several times: it only remembers the last answer (which blocks need
        no save)."""
        if not self._do_load:
            return 0, False
        # vLLM must compute at least the last prompt token itself.
        max_blocks = (request.num_prompt_tokens - 1) // self._block_size
        if max_blocks * self._block_size <= num_computed_tokens:
            return 0, False
        keys = self._keys(request, max_blocks)
        if not keys:
            return 0, False
        c = self._link.get()
        if c is None:
            return 0, False
        hit = self._indexed(c, keys)
        if hit == len(keys):  # every block in this node's DRAM: no call
            _count("index_lookups")
            return self._matched(request, hit, num_computed_tokens)
        try:
            hit = 0
            for chunk in _chunks(keys, self._link.max_batch):  # a chain longer than max_batch: in pieces
                _count("rpc_lookup")
                n = c.lookup(self._ns, chunk, scope=self._scope)
                hit += n
                if n < len(chunk):
                    break
        except Exception as e:  # noqa: BLE001
            if _is_server_error(e):
                _once.warn("lookup:%s" % e.code, "Lookup refused (%s); treating as a miss", e)
            else:
                self._link.failed(e)
            return 0, False
        return self._matched(request, hit, num_computed_tokens)

    def _indexed(self, c, keys):
        """How many of keys, from the first, the sidecar's slot index lists
        (0 without one)."""
        if not self._s.slot_index:
            return 0
        try:
            idx = c.slot_index()
        except Exception:  # noqa: BLE001 - the Lookup says what is wrong
            return 0
        return idx.prefix(self._ns, keys) if idx is not None else 0

    def _matched(self, request, hit, num_computed_tokens):
        _count("lookups")
        _count("lookup_hit_blocks", hit)
        self._state(request).hit = hit
        ext = hit * self._block_size - num_computed_tokens
        return (ext, False) if ext > 0 else (0, False)

    def update_state_after_alloc(self, request, num_external_tokens):
        self._state(request)
        if num_external_tokens > 0:
            self._pending_loads[request.request_id] = num_external_tokens
            _count("matched_tokens", num_external_tokens)

    def _block_ids(self, req_id):
        m = self._manager()
        if m is None:
            return None
        try:
            return list(m.get_block_ids(req_id)[0])
        except Exception:  # noqa: BLE001
            return None

    def build_connector_meta(self, scheduler_output):
        meta = TidepoolConnectorMetadata()
        sched = scheduler_output.num_scheduled_tokens
        progress = []  # (req_id, tokens computed after this step, block ids or None, computed before)
        for nr in scheduler_output.scheduled_new_reqs:
            progress.append((nr.req_id, nr.num_computed_tokens + sched.get(nr.req_id, 0),
                             list(nr.block_ids[0]) if nr.block_ids else None, nr.num_computed_tokens))
        cr = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cr.req_ids):
            progress.append((rid, cr.num_computed_tokens[i] + sched.get(rid, 0), None,
                             cr.num_computed_tokens[i]))
        for rid, after, bids, before in progress:
            st = self._reqs.get(rid)
            if st is None:
                continue
            if bids is None or len(bids) * self._block_size < after:
                bids = self._block_ids(rid)
            if bids is None:
                continue
            load = self._plan_load(rid, st, bids, before)
            if load is not None:
                meta.loads.append(load)
            if self._do_save:
                meta.saves.extend(self._plan_saves(rid, st, bids, after))
        return meta

    def _plan_load(self, rid, st, bids, before):
        ext = self._pending_loads.pop(rid, 0)
        if ext > 0 and before < ext:  # cannot happen with vLLM's scheduler
            _once.warn("plan", "request %s: %d external tokens but %d computed; not loading", rid, ext, before)
            ext = 0
        if ext <= 0:
            return None
        first = (before - ext) // self._block_size
        last = before // self._block_size
        keys = self._keys(st.request, last)[first:last]
        # vLLM counts these tokens as computed: every block must be loaded
        # or reported failed by the worker. A block without a key (None)
        # is reported failed.
        keys = list(keys) + [None] * (last - first - len(keys))
        st.planned = max(st.planned, last)
        self._know(k for k in keys if k is not None)
        return _Transfer(rid, keys, bids[first:last], first)

    def _plan_saves(self, rid, st, bids, after):
        """The blocks that become full in this step and that the sidecar
        does not hold as far as this engine knows (its Lookup found them,
        or this engine stored them or offered them already): one _Transfer
        per run of consecutive blocks."""
        full = min(after // self._block_size, len(bids))
        if full <= st.planned:
            return []
        keys = self._keys(st.request, full)
        start, st.planned = st.planned, max(st.planned, len(keys))
        out, run = [], None
        for i in range(start, len(keys)):
            k = keys[i]
            if i < st.hit or k in self._known:
                run = None
                continue
            if run is None:
                run = _Transfer(rid, [], [], i, keys[i - 1] if i > 0 else None)
                out.append(run)
            run.keys.append(k)
            run.block_ids.append(bids[i])
        for tr in out:
            self._know(tr.keys)
            tr.metas = block_metas(st.request, tr.keys, tr.first_index, self._block_size, tr.parent)
            _count("offered_blocks", len(tr.keys))
        if out:
            st.has_saves = True
        return out

    def request_finished(self, request):
        """Keeps the blocks while saves of the request may be in flight;
        the worker reports the request in get_finished when they are done."""
        st = self._reqs.pop(request.request_id, None)
        self._pending_loads.pop(request.request_id, None)
        return bool(st is not None and st.has_saves), None

    def update_connector_output(self, connector_output):
        meta = connector_output.kv_connector_worker_meta
        if not isinstance(meta, TidepoolWorkerMetadata):
            return
        if meta.stored:
            self._events.extend(meta.stored)
        for k in meta.failed:
            self._known.pop(k, None)  # offer it again next time

    def take_events(self):
        """BlockStored events for the blocks this engine saved into tidepool,
        so that vLLM's KV-event publisher announces them to routers."""
        if not self._events:
            return ()
        from vllm.distributed.kv_events import BlockStored
        evs, self._events = self._events, []
        return [BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=[], block_size=bs,
                            lora_id=None, medium="tidepool", lora_name=None)
                for hashes, parent, bs in evs]

    def shutdown(self):
        self._link.close()


# ==== worker side =================================================================

# Element types a block's bytes are viewed as for the copies: the widest
# that every offset involved is a multiple of (torch copies uint8 rows
# element by element, several times slower).
_ELEMS = ((8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.uint8))


def _elem_for(*sizes):
    for n, dt in _ELEMS:
        if all(s % n == 0 for s in sizes):
            return n, dt
    return _ELEMS[-1]


class _Part:
    """One run of a block's bytes in one KV tensor: layer l's block (the
    CPU backend's and other blocks-first layouts), or its K or V half
    (FlashAttention's (2, num_blocks, ...)). rows is a (num_blocks, n)
    view of the tensor, one row per block, n elements of its dtype."""

    def __init__(self, rows, offset, layer):
        self.rows = rows
        self.nbytes = rows.shape[1] * rows.element_size()
        self.offset = offset  # byte offset in the tidepool block (after the header)
        self.layer = layer  # the KV tensor's name: vLLM's layer name
        self._as = {}

    def view(self, dtype):
        """rows reinterpreted as dtype (same bytes)."""
        v = self._as.get(dtype)
        if v is None:
            v = self._as[dtype] = self.rows.view(torch.uint8).view(dtype) if self.rows.dtype != dtype else self.rows
        return v


def _parts_of(name, t, num_blocks):
    """The _Parts of one layer's KV tensor, or None for a layout whose
    block bytes are not contiguous runs."""
    if num_blocks is not None and t.dim() >= 2 and t.shape[0] == num_blocks:
        halves = [t]  # blocks first: the CPU backend, FlashInfer, MLA
    elif num_blocks is not None and t.dim() >= 3 and t.shape[0] == 2 and t.shape[1] == num_blocks:
        halves = [t[0], t[1]]  # FlashAttention: (2, num_blocks, block_size, heads, head_size)
    else:
        return None
    out = []
    for h in halves:
        one = h[0]
        if not one.is_contiguous() or (h.shape[0] > 1 and h.stride(0) < one.numel()):
            return None
        out.append(h.as_strided((h.shape[0], one.numel()), (h.stride(0), 1)))
    return out


def _gpu_layers(kv_caches, nb):
    """The KV tensors on CUDA as tidepool.cuda takes them: (name, tensor,
    block dim, bytes per block); [] when the cache is not on CUDA or its
    layout is not one of the two it knows."""
    out = []
    for name, t in kv_caches.items():
        if not isinstance(t, torch.Tensor) or not t.is_cuda:
            return []
        if nb is not None and t.dim() >= 2 and t.shape[0] == nb:
            bdim = 0  # blocks first
        elif nb is not None and t.dim() >= 3 and t.shape[0] == 2 and t.shape[1] == nb:
            bdim = 1  # FlashAttention: (2, num_blocks, block_size, heads, head_size)
        else:
            return []
        out.append((name, t, bdim, t.select(bdim, 0).numel() * t.element_size()))
    return out


class _GPUConn:
    """What tidepool.cuda reads of the connector, over a Worker."""

    def __init__(self, w, layers):
        self._w = w
        self._layers = layers
        self._socket, self._timeout_s = w._s.socket, w._s.timeout_s
        self._ns, self._block_size = w._ns, w._block_size
        self._lease_ms, self._verify = w._s.lease_ms, w._s.verify_reads
        self._lock = w._lock
        self._load_link = w._link

    @property
    def _stored(self):
        return self._w._stored

    @property
    def _block_bytes(self):
        return self._w._block_bytes

    def _header(self):
        return self._w._header


@dataclass
class _Group:
    """A chunk's blocks in one arena, headers checked: arena tensor a (the
    mapping viewed as dtype, esize bytes each), the blocks' byte offsets
    (and as element offsets, offs), the KV blocks they go to, and their
    indexes in the chunk."""
    a: Any
    esize: int
    dtype: Any
    offsets: list
    offs: Any
    bids: list
    js: list

    @functools.cached_property
    def targets(self):
        """The KV block ids as a tensor, their lowest, and, when they make
        one run (in any order, as a fresh engine's free list hands them
        out), offs in the run's order (each part's gather then lands
        straight in the run's rows, with no scatter after it), else None.
        Worked out once: a load copied layer by layer asks once a layer."""
        bids = self.bids
        dst, lo = torch.tensor(bids, dtype=torch.int64), min(bids)
        if max(bids) - lo != len(bids) - 1 or len(set(bids)) != len(bids):
            return dst, lo, None
        order = torch.empty(len(bids), dtype=torch.int64)
        order[dst - lo] = torch.arange(len(bids))
        return dst, lo, self.offs.index_select(0, order)


@dataclass
class _Touch:
    """Keys read through the slot index, to report to the sidecar (on the
    save thread, not before not_before)."""
    keys: list
    not_before: float


class _Chunk:
    """One Acquire of a load, or the blocks of a load found in the slot
    index: its leases, what to copy, and what ends it (end, after the
    copies: drops from loaded what may be wrong and lets go of the rest)."""

    def __init__(self, c, tr, chunk, leases, deadline, end=None):
        self.c, self.tr, self.chunk = c, tr, chunk
        self.leases, self.deadline = leases, deadline
        self.held = [l.lease_id for l in leases if l.code == OK]
        self.groups: list = []
        self.loaded: set = set()  # indexes in chunk copied
        self.end = end

    def planned(self):
        """The transfer's indexes this chunk will copy."""
        return {self.chunk[j] for g in self.groups for j in g.js}


class _Layered:
    """A transfer whose chunks are copied in the forward, one layer at a
    time right before that layer's attention reads it (wait_for_layer_load):
    the layers not copied yet, and the seconds spent on it so far."""

    def __init__(self, tr, chunks, layers, seconds):
        self.tr, self.chunks, self.left, self.seconds = tr, chunks, set(layers), seconds
        self.late = False  # a forward read its blocks before their copy


class Worker:
    """The worker's half: loads (found and checked before the forward, the
    slot index first, then one Acquire per chunk; copied in the forward
    layer by layer, or before it: one gather per layer out of the arena
    mapping and one scatter into the paged KV tensor; the leases ride on
    the next Acquire) and saves (queued to a thread: one Reserve per chunk, the blocks
    written into their slots, one Commit)."""

    def __init__(self, s, ns, block_size, do_load, do_save, kv_cache_config):
        self._s = s
        self._layered: list = []  # this step's _Layered loads, copied in the forward
        self._layered_leases = 0  # the blocks they hold leases on
        self._called: set = set()  # the layers wait_for_layer_load was called for in this step so far
        # None until a step calls it for every layer of self._parts before
        # the step's end (get_block_ids_with_load_errors), then True; False
        # for good once a forward read a layer before its copy.
        self._layerwise: Optional[bool] = None
        self._ns = ns
        self._block_size = block_size
        self._do_load = do_load
        self._do_save = do_save
        self._num_blocks = getattr(kv_cache_config, "num_blocks", None)
        self._parts: list = []
        self._layers: frozenset = frozenset()  # the layers of self._parts
        self._block_bytes = 0
        self._layout_digest = b""
        self._link = _Link(s.socket, s.timeout_s, s.retry_s, "worker")
        self._arena_tensors = {}  # (id(client), arena, dtype) -> 1-D tensor over the mapping
        self._link.on_close = self._forget_client
        self._to_release: list = []  # lease ids that ride on the next Acquire
        self._release_by = 0.0  # monotonic time by which they are released anyway
        self._load_errors: set = set()
        self._warmed = None  # the client whose arenas _warm filled the page tables of
        self._warm_stop = threading.Event()
        self._save_q: "queue.Queue" = queue.Queue()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._outstanding: dict = {}  # req_id -> saves not done
        self._save_reqs: set = set()  # req ids that had a save and are not reported done
        self._finished_waiting: set = set()
        self._stored: list = []
        self._failed: list = []
        self._saver = None
        self._closed = False
        self._gpu = None  # tidepool.cuda's hook: a KV cache on CUDA only
        self._scratch = None  # _scratch_rows
        self._load_lock = threading.Lock()  # held by start_load_kv
        # Saves in flight finish before the process exits: vLLM calls
        # shutdown() when it shuts the worker down; atexit covers an
        # engine left to the interpreter's exit.
        ref = weakref.ref(self)
        atexit.register(lambda: ref() is not None and ref().shutdown())

    # -- layout --------------------------------------------------------------
    def register_kv_caches(self, kv_caches):
        parts, sig, off = [], [], 0
        for name, t in kv_caches.items():
            if not isinstance(t, torch.Tensor):
                continue
            ps = _parts_of(name, t, self._num_blocks)
            if ps is None:
                _once.warn("layout", "KV tensor %s has shape %s, strides %s with %s blocks: layout not "
                           "supported, connector disabled", name, tuple(t.shape), tuple(t.stride()),
                           self._num_blocks)
                self._parts = []
                return
            for p in ps:
                parts.append(_Part(p, off, name))
                off += parts[-1].nbytes
            sig.append([name, list(t.shape), 0 if len(ps) == 1 else 1, str(t.dtype), list(t.stride())])
        self._parts = parts
        self._layers = frozenset(p.layer for p in parts)
        self._block_bytes = off
        self._layout_digest = hashlib.sha256(json.dumps([self._ns, sig]).encode()).digest()
        self._header = _MAGIC + self._layout_digest + bytes(HEADER_BYTES - len(_MAGIC) - len(self._layout_digest))
        self._header_t = torch.frombuffer(bytearray(self._header), dtype=torch.uint8)
        self._elem = _elem_for(HEADER_BYTES, *[p.nbytes for p in parts])
        logger.info("tidepool: %d KV tensors, %d bytes per block (+%d header)", len(kv_caches),
                    self._block_bytes, HEADER_BYTES)
        if self._do_load and self._link.get() is not None:
            self._warm()  # the sidecar is up: its arenas mapped before the first load
        # --- GPU hook (tidepool.cuda, docs/gpu.md): only a KV cache on CUDA.
        layers = _gpu_layers(kv_caches, self._num_blocks)
        if layers:
            from . import cuda as _cuda
            self._gpu_conn = _GPUConn(self, layers)
            self._gpu = _cuda.attach(self._gpu_conn, layers, self._num_blocks, self._header, self._s.gpu_path)
        # --- end of the GPU hook

    @property
    def block_bytes(self):
        return HEADER_BYTES + self._block_bytes

    # -- load: arena -> paged KV, in the step ---------------------------------------
    #
    # start_load_kv finds a load's blocks (the slot index, then one Acquire
    # per chunk for the rest) and checks their slots and headers. Once a
    # forward has shown that vLLM calls wait_for_layer_load before every
    # layer's attention, a load that fits one chunk is copied there, a
    # layer at a time, on the forward's own thread: the attention then
    # reads KV the copy has just brought into the CPU caches, not memory
    # (docs/PERFORMANCE.md section 33). Otherwise, and for a prefix larger
    # than one chunk (each Acquire releases the previous chunk's leases,
    # so it streams through the sidecar's DRAM), each chunk is copied in
    # start_load_kv, before the forward. A block found wrong after its copy
    # (evicted from the index, a lease expired) is reported to vLLM with
    # get_block_ids_with_load_errors, which vLLM calls after the forward:
    # it drops the step's output for that request and recomputes. Copying
    # beside the forward on a thread was tried and removed: on CPU the
    # forward's OpenMP threads use every core (section 27); on CUDA the
    # copy is tidepool.cuda's.

    def start_load_kv(self, meta):
        self._warm()
        if not meta.loads or not self._do_load:
            return
        with self._load_lock:  # no touch (_send_touch) beside a load
            self._load(meta)

    def _load(self, meta):
        for tr in meta.loads:
            t0 = time.perf_counter()
            if not self._parts:
                self._fail_load(tr, set())
                continue
            if self._gpu is not None:  # GPU hook (tidepool.cuda)
                self._account(tr, self._gpu.load(self._gpu_conn, tr), time.perf_counter() - t0)
                continue
            found = self._indexed(tr)
            skip = found.planned() if found is not None else set()
            rest = sum(1 for i, k in enumerate(tr.keys) if k is not None and i not in skip)
            if self._layerwise and self._layered_leases + rest <= self._link.chunk(self.block_bytes):
                chunks = [found] if found is not None else []
                chunks.extend(self._plan(tr, skip=skip))  # one Acquire at most
                self._layered_leases += rest
                self._layered.append(_Layered(tr, chunks, self._layers, time.perf_counter() - t0))
                continue
            ok = set()
            if found is not None:  # a block evicted during the copy is tried again through Acquire
                self._copy_now(found)
                ok = self._end(found)
            for ch in self._plan(tr, skip=ok):
                self._copy_now(ch)
                ok |= self._end(ch)
            self._account(tr, ok, time.perf_counter() - t0)

    def wait_for_layer_load(self, layer_name):
        """Copies layer_name's KV of this step's layered loads."""
        self._called.add(layer_name)
        for ld in [ld for ld in self._layered if layer_name in ld.left]:
            self._copy_layer(ld, layer_name)

    def _copy_layer(self, ld, layer_name):
        t0 = time.perf_counter()
        ld.left.discard(layer_name)
        for ch in ld.chunks:
            self._copy_now(ch, layer_name)
        if ld.left:
            ld.seconds += time.perf_counter() - t0
            return
        self._layered.remove(ld)
        ok = set()
        for ch in ld.chunks:
            ok |= self._end(ch)
        if not ld.late:
            _count("layered_loaded_blocks", len(ok))
        self._account(ld.tr, set() if ld.late else ok, ld.seconds + time.perf_counter() - t0)

    def step_started(self):
        """vLLM binds a step's metadata: what wait_for_layer_load hears from
        here to the step's end is this step's. (A layer asked for after the
        end, as a speculative decoder's draft model is, after vLLM's
        get_block_ids_with_load_errors, never counts: such an engine keeps
        its loads before the forward.)"""
        self._called = set()

    def _end_step(self):
        """After the step's forward: a layered load left with layers not
        copied is copied now; if the step ran a forward (it called
        wait_for_layer_load for other layers), that forward read the KV
        blocks before their copy, and they are reported as load errors and
        layered loads end for good. A step that called every layer of the
        cache before its end starts them."""
        ran = bool(self._called)
        for ld in list(self._layered):
            if ran:
                _once.warn("layerwise", "the forward did not ask for layers %s before reading them; "
                           "recomputing, loads copied before the forward from now on",
                           sorted(self._layers - self._called))
                self._layerwise = False
                ld.late = True
            for name in sorted(ld.left):
                self._copy_layer(ld, name)
        if self._layerwise is None and self._layers and self._called >= self._layers:
            self._layerwise = True
        self._called = set()
        self._layered_leases = 0

    def _end(self, ch):
        """The transfer's indexes that ch loaded, once its copies are done."""
        try:
            ch.end(ch)
        except Exception as e:  # noqa: BLE001
            _once.warn("settle:%s" % type(e).__name__, "load failed: %r; recomputing", e)
            ch.loaded.clear()
        return {ch.chunk[j] for j in ch.loaded}

    def _account(self, tr, ok, seconds):
        _count("load_seconds", seconds)
        _count("loaded_bytes", len(ok) * self.block_bytes)
        _count("loaded_blocks", len(ok))
        self._fail_load(tr, ok)

    def _fail_load(self, tr, ok):
        bad = [b for i, b in enumerate(tr.block_ids) if i not in ok]
        if bad:
            self._load_errors.update(bad)
            _count("load_errors", len(bad))

    def _indexed(self, tr):
        """The blocks of tr that the sidecar's slot index lists, found
        without a call, headers checked, as a _Chunk to copy (None when
        there is none); once copied, its end checks each entry unchanged
        (a block evicted during the copy fails and is recomputed) and
        reports the reads to the sidecar later, off this step (_touch)."""
        if not self._s.slot_index or self._s.verify_reads or not self._parts:
            return None
        c = self._link.get()
        if c is None:
            return None
        try:
            idx = c.slot_index()
            if idx is None:
                return None
            pos = [i for i, k in enumerate(tr.keys) if k is not None]
            found = idx.find(self._ns, [tr.keys[i] for i in pos])
            views = c.arena_views()
        except Exception as e:  # noqa: BLE001 - _plan reads them through Acquire
            _once.warn("index:%s" % type(e).__name__, "slot index not read: %r; using Acquire", e)
            return None
        want, nblocks = self.block_bytes, self._parts[0].rows.shape[0]
        by_arena = collections.defaultdict(list)
        for i, f in zip(pos, found):
            if f is None or f.length != want or not 0 <= f.arena < len(views) \
                    or f.offset + want > len(views[f.arena]) or not 0 <= tr.block_ids[i] < nblocks:
                continue
            by_arena[f.arena].append((i, f))
        if not by_arena:
            return None
        slots = {}

        def end(ch):
            ok = {i for i in ch.loaded if idx.unchanged(slots[i])}
            _count("index_loaded_blocks", len(ok))
            _count("index_changed_blocks", len(ch.loaded) - len(ok))
            if ok:
                self._touch([tr.keys[i] for i in sorted(ok)])
            ch.loaded = ok
        ch = _Chunk(c, tr, list(range(len(tr.keys))), [], 0, end)
        for arena, items in by_arena.items():
            slots.update(items)
            g = self._checked(c, arena, [f.offset for _, f in items], [tr.block_ids[i] for i, _ in items],
                              [i for i, _ in items])
            if g is not None:
                ch.groups.append(g)
        return ch if ch.groups else None

    def _touch(self, keys):
        """Reads made through the slot index, told to the sidecar on the
        save thread a moment later (an Acquire and a Release): its eviction
        policy and hit counters see them as reads, and this step does not
        wait for it."""
        self._save_q.put(_Touch(keys, time.monotonic() + TOUCH_DELAY_S))
        self._start_saver()

    def _plan(self, tr, skip=()):
        """Yields the chunks of one transfer, each Acquired with its copies
        planned (no bytes moved yet), the next Acquired only when the
        caller asks for it. A chunk that fails ends the plan: the rest of
        the transfer is recomputed. Indexes in skip are loaded already."""
        idx = [i for i, k in enumerate(tr.keys) if k is not None and i not in skip]
        if not idx:
            return
        c = self._link.get()
        if c is None:
            return
        for chunk in _chunks(idx, self._link.chunk(self.block_bytes)):
            try:
                ch = self._plan_chunk(c, tr, chunk)
            except Exception as e:  # noqa: BLE001
                if _is_server_error(e):
                    _once.warn("acquire:%s" % e.code, "Acquire refused (%s); recomputing", e)
                elif isinstance(e, (OSError, EOFError)) or type(e).__name__.startswith("TTransport"):
                    self._link.failed(e)
                else:
                    _once.warn("load:%s" % type(e).__name__, "load failed: %r; recomputing", e)
                return
            yield ch

    def _forget_client(self):
        """The worker's client is about to close: its arena views and the
        leases it holds go with it (the sidecar ends them)."""
        self._warm_stop.set()
        self._warmed = None
        self._arena_tensors.clear()
        self._to_release = []

    def _warm(self):
        """Once per client: fills this process's page tables for all of the
        sidecar's arenas, on a thread (MADV_POPULATE_READ, 64 MiB at a
        time). A load then copies without a page fault per 64 KiB of
        blocks it has not read before (half of a 2,048-token load's time
        on this project's test machine, docs/PERFORMANCE.md, "vLLM loads layer by layer"); the cost
        is the page tables, about 2 MiB per GiB of arena in each worker."""
        c = self._link.client
        if c is None or c is self._warmed:
            return
        try:
            sizes = [len(v) for v in c.arena_views()]
        except Exception:  # noqa: BLE001 - the next load says what is wrong
            return
        self._warmed = c
        self._warm_stop = stop = threading.Event()

        def run():
            step = 64 << 20
            try:
                for i, n in enumerate(sizes):
                    for off in range(0, n, step):
                        if stop.is_set():
                            return
                        c.populate_reads(i, [off], min(step, n - off))
            except Exception:  # noqa: BLE001 - best effort: loads fault the pages in instead
                return
        threading.Thread(target=run, name="tidepool-warm", daemon=True).start()

    def _take_releases(self):
        ids, self._to_release = self._to_release, []
        return ids or None

    def _plan_chunk(self, c, tr, chunk):
        """One Acquire (with the last call's leases to release) and the
        checks of what it granted: sizes, slots, headers, block ids."""
        keys = [tr.keys[i] for i in chunk]
        _count("rpc_acquire")
        leases, deadline = c.acquire(self._ns, keys, lease_ms=self._s.lease_ms, release=self._take_releases())
        ch = _Chunk(c, tr, chunk, leases, deadline,
                    lambda ch: self._settle(ch.c, ch.held, ch.deadline, ch.leases, ch.loaded))
        want = self.block_bytes
        views = c.arena_views()
        nblocks = self._parts[0].rows.shape[0]
        good = []  # (index in chunk, lease)
        try:
            for j, l in enumerate(leases):
                if l.code != OK:
                    if l.code != ErrorCode.NOT_FOUND:
                        _once.warn("acq-item:%s" % l.code, "block refused (%s); recomputing",
                                   ErrorCode._VALUES_TO_NAMES.get(l.code, l.code))
                    continue
                if l.slot.length != want:
                    _once.warn("size", "block of %d bytes where this layout needs %d (another model "
                               "under a colliding key?); recomputing", l.slot.length, want)
                    continue
                if not 0 <= l.slot.arena < len(views) or l.slot.offset < 0 \
                        or l.slot.offset + want > len(views[l.slot.arena]):
                    _once.warn("slot", "slot %r outside the arenas; recomputing", l.slot)
                    continue
                if not 0 <= tr.block_ids[chunk[j]] < nblocks:
                    _once.warn("bid", "KV block %d outside the cache's %d; recomputing",
                               tr.block_ids[chunk[j]], nblocks)
                    continue
                good.append((j, l))
            if self._s.verify_reads:
                good = [(j, l) for j, l in good if self._verified(c, l)]
            by_arena = collections.defaultdict(list)
            for j, l in good:
                by_arena[l.slot.arena].append((j, l))
            for arena, items in by_arena.items():
                g = self._checked(c, arena, [l.slot.offset for _, l in items],
                                  [tr.block_ids[chunk[j]] for j, _ in items], [j for j, _ in items])
                if g is not None:
                    ch.groups.append(g)
        except BaseException:
            self._settle(c, ch.held, deadline, leases, set())
            raise
        return ch

    def _verified(self, c, lease):
        try:
            c.slot_view(lease, verify=True).release()
            return True
        except Error as e:
            _once.warn("verify:%s" % e.code, "block failed its check (%s); recomputing", e)
            return False

    def _arena(self, c, arena, dtype, esize):
        key = (id(c), arena, dtype)
        t = self._arena_tensors.get(key)
        if t is None:
            if any(k[0] != id(c) for k in self._arena_tensors):
                self._arena_tensors.clear()  # a new client: the old mappings are gone
            v = c.arena_views()[arena]
            t = self._arena_tensors[key] = torch.frombuffer(v, dtype=dtype, count=len(v) // esize)
        return t

    def _checked(self, c, arena, offsets, bids, js):
        """The blocks at offsets (one arena) whose header is this layout's,
        as a _Group to copy into KV blocks bids; None when none is."""
        esize, dtype = _elem_for(self._elem[0], *offsets)
        a = self._arena(c, arena, dtype, esize)
        c.populate_reads(arena, offsets, self.block_bytes)  # the page tables, in one call
        offs = torch.tensor(offsets, dtype=torch.int64) // esize
        rows = a.numel()
        # Row r of a.as_strided((rows - at - n + 1, n), (1, 1), at) is the
        # n elements at r + at: the rows overlap, and index_select picks one
        # per block (its offset).
        hn = HEADER_BYTES // esize
        hdr = a.as_strided((rows - hn + 1, hn), (1, 1), 0).index_select(0, offs)
        ok = (hdr == self._header_t.view(dtype)).all(dim=1)
        if not bool(ok.all()):
            _once.warn("header", "block with another layout's header; recomputing")
            keep = ok.nonzero().flatten().tolist()
            offsets = [offsets[i] for i in keep]
            bids, js = [bids[i] for i in keep], [js[i] for i in keep]
            if not js:
                return None
            offs = torch.tensor(offsets, dtype=torch.int64) // esize
        return _Group(a, esize, dtype, offsets, offs, bids, js)

    def _copy_now(self, ch, layer=None):
        """A chunk's copies (of one layer's parts, or all), here and now:
        per part one gather out of the mapping and one scatter into the KV
        tensor."""
        for g in ch.groups:
            a, dtype, offs, bids = g.a, g.dtype, g.offs, g.bids
            rows = a.numel()
            dst, lo, offs_run = g.targets
            for p in self._parts:
                if layer is not None and p.layer != layer:
                    continue
                rows_p = p.view(dtype)
                at = (HEADER_BYTES + p.offset) // g.esize
                n = p.nbytes // g.esize
                src = a.as_strided((rows - at - n + 1, n), (1, 1), at)
                if offs_run is not None and rows_p.device.type == "cpu" and rows_p.is_contiguous():
                    torch.index_select(src, 0, offs_run, out=rows_p[lo:lo + len(bids)])
                    continue
                # Gathered through a scratch buffer of this worker's, a
                # piece at a time, then scattered: a temporary as large as
                # the gather (32 MiB and more) would be mapped and faulted
                # in afresh at every load (glibc maps allocations of 32 MiB
                # and more), twice the time of the copy at 16,384 tokens.
                k = max(1, SCRATCH_BYTES // p.nbytes)
                scratch = self._scratch_rows(dtype, g.esize, n, k)
                for s0 in range(0, len(bids), k):
                    m = min(k, len(bids) - s0)
                    g2 = torch.index_select(src, 0, offs[s0:s0 + m], out=scratch[:m])
                    rows_p.index_copy_(0, dst[s0:s0 + m].to(rows_p.device), g2.to(rows_p.device))
            ch.loaded.update(g.js)

    def _scratch_rows(self, dtype, esize, n, k):
        """This worker's scratch buffer (SCRATCH_BYTES, or one part if that
        is larger; made once) as k rows of n elements of dtype (esize
        bytes each)."""
        need = k * n * esize
        if self._scratch is None or self._scratch.numel() < need:
            self._scratch = torch.empty(max(SCRATCH_BYTES, need), dtype=torch.uint8)
        return self._scratch[:need].view(dtype).view(k, n)

    def _settle(self, c, held, deadline, leases, loaded):
        """The chunk's leases: copied well before their deadline, they ride
        on the next Acquire (the bytes were pinned throughout); otherwise
        released now, and a lease that had expired fails its block."""
        if not held:
            return
        if time.time() * 1000 + RELEASE_MARGIN_MS < deadline:
            if not self._to_release:
                self._release_by = time.monotonic() + RELEASE_IDLE_S
            self._to_release.extend(held)
            if len(self._to_release) + self._link.max_batch // 2 > self._link.max_batch:
                self._flush_releases()
            return
        try:
            _count("rpc_release")
            codes = c.release(held)
        except Exception as e:  # noqa: BLE001
            # The sidecar is gone: nobody can rewrite the mapped arena
            # any more, and every block was checked before its copy.
            if _is_server_error(e):
                loaded.clear()
            else:
                self._link.failed(e)
            return
        expired = {held[k] for k, code in enumerate(codes) if code != OK}
        if expired:
            # The bytes copied under an expired lease may be wrong.
            _once.warn("expired", "a lease expired during a load; recomputing its blocks")
            for j, l in enumerate(leases):
                if l.lease_id in expired:
                    loaded.discard(j)

    def _flush_releases(self):
        ids = self._take_releases()
        c = self._link.client
        if not ids or c is None:
            return
        try:
            _count("rpc_release")
            c.release(ids)
        except Exception as e:  # noqa: BLE001 - the leases lapse at their deadline anyway
            if not _is_server_error(e):
                self._link.failed(e)

    def get_block_ids_with_load_errors(self):
        self._end_step()  # vLLM calls this after every step's forward
        errs, self._load_errors = self._load_errors, set()
        return errs

    # -- save: paged KV -> arena, on a thread ----------------------------------------
    def wait_for_save(self, meta):
        if self._to_release and time.monotonic() > self._release_by:
            self._flush_releases()  # idle since the last load: unpin its blocks
        if not meta.saves:
            return
        with self._lock:
            for tr in meta.saves:
                self._save_reqs.add(tr.req_id)
                if self._parts and not self._closed:
                    self._outstanding[tr.req_id] = self._outstanding.get(tr.req_id, 0) + 1
        if not self._parts or self._closed:
            return
        if self._gpu is not None:  # GPU hook (tidepool.cuda)
            self._gpu.mark_saves(meta.saves)
        for tr in meta.saves:
            self._save_q.put(tr)
        self._start_saver()

    def _start_saver(self):
        if self._saver is None:
            self._saver = threading.Thread(target=self._save_loop, name="tidepool-save", daemon=True)
            self._saver.start()

    def _save_loop(self):
        link = _Link(self._s.socket, self._s.timeout_s, self._s.retry_s, "worker-save")
        while True:
            tr = self._save_q.get()
            if tr is None:
                break
            if isinstance(tr, _Touch):
                self._send_touch(link, tr)
                continue
            try:
                self.save(link, tr)
            except Exception as e:  # noqa: BLE001
                _once.warn("save:%s" % type(e).__name__, "save failed: %s", e)
            finally:
                with self._lock:
                    n = self._outstanding.get(tr.req_id, 1) - 1
                    if n <= 0:
                        self._outstanding.pop(tr.req_id, None)
                    else:
                        self._outstanding[tr.req_id] = n
                    self._idle.notify_all()
        link.close()

    def _send_touch(self, link, t):
        """After this worker's loads (a touch pins its blocks for a moment,
        and a load in a small DRAM tier needs the room), and only of the
        blocks the slot index still lists (a block gone to SSD is not
        brought back for a touch)."""
        wait = t.not_before - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        c = link.get()
        if c is None:
            return
        try:
            with self._load_lock:
                self._touch_now(link, c, t.keys)
        except Exception as e:  # noqa: BLE001 - only the sidecar's recency is lost
            if not _is_server_error(e):
                link.failed(e)

    def _touch_now(self, link, c, keys):
        idx = c.slot_index()
        if idx is not None:
            keys = [k for k, f in zip(keys, idx.find(self._ns, keys)) if f is not None]
        for chunk in _chunks(keys, link.max_batch):
            _count("rpc_touch")
            leases, _ = c.acquire(self._ns, chunk, lease_ms=TOUCH_LEASE_MS, scope=Scope.LOCAL)
            held = [l.lease_id for l in leases if l.code == OK]
            if held:
                c.release(held)

    def save(self, link, tr):
        """Saves one transfer (a run of consecutive blocks of one request),
        DRAM_SHARE of the sidecar's DRAM at a time: Reserve, write each
        block (header, then every part) into its slot, Commit with each
        block's CRC-32C. Blocks another engine stored first (EXISTS) count
        as stored. Reports what was stored (for BlockStored events) and
        what failed (to be offered again)."""
        if self._gpu is not None:  # GPU hook (tidepool.cuda)
            return self._gpu.save(self._gpu_conn, link, tr)
        t0 = time.perf_counter()
        size = self.block_bytes
        n = len(tr.keys)
        stored = []  # indexes into tr.keys, in order
        i = 0
        while i < n:
            c = link.get()
            if c is None:
                break
            m = min(link.chunk(size), n - i)
            got = self._save_chunk(link, c, tr, i, m)
            if got is None:
                break
            stored.extend(got)
            i += m
        failed = sorted(set(range(n)) - set(stored))
        _count("save_errors", len(failed))
        _count("save_seconds", time.perf_counter() - t0)
        with self._lock:
            if failed:
                self._failed.extend(tr.keys[j] for j in failed)
            # One BlockStored per run of consecutive stored blocks.
            run = []
            for j in stored + [None]:
                if run and (j is None or j != run[-1] + 1):
                    parent = tr.keys[run[0] - 1] if run[0] > 0 else tr.parent
                    self._stored.append(([tr.keys[k] for k in run], parent, self._block_size))
                    run = []
                if j is not None:
                    run.append(j)

    def _save_chunk(self, link, c, tr, i, m):
        """Blocks i..i+m of tr: one Reserve, the writes, one Commit. Returns
        the indexes stored (EXISTS included), or None when the sidecar
        failed (the rest of the transfer is dropped)."""
        size = self.block_bytes
        header = self._header
        try:
            _count("rpc_reserve")
            rs = c.reserve(self._ns, [(tr.keys[j], size, tr.first_index + j) for j in range(i, i + m)])
        except Exception as e:  # noqa: BLE001
            if _is_server_error(e):
                _once.warn("reserve:%s" % e.code, "Reserve refused (%s); not saving", e)
            else:
                link.failed(e)
            return None
        writes, commits, where, stored = [], [], [], []
        for k, r in enumerate(rs):
            j = i + k
            if r.code == ErrorCode.EXISTS:
                _count("save_exists")
                stored.append(j)
                continue
            if r.code != OK:
                _once.warn("reserve-item:%s" % r.code, "block not saved (%s: %s)",
                           ErrorCode._VALUES_TO_NAMES.get(r.code, r.code), r.message)
                continue
            bid = tr.block_ids[j]
            data = [header] + [self._host_row(p, bid) for p in self._parts]
            writes.append((r.slot, data))
            commits.append((r.token, _crc.crc32c_parts(data), tr.metas[j] if tr.metas else None))
            where.append(j)
        try:
            if writes:
                c.write_slots(writes)
        except BaseException as e:
            try:
                c.abort([r.token for r in rs if r.code == OK])
            except Exception:  # noqa: BLE001
                pass
            if not _is_server_error(e) and not isinstance(e, (ValueError, RuntimeError)):
                link.failed(e)
                return None
            raise
        if not commits:
            return stored
        try:
            _count("rpc_commit")
            codes = c.commit(commits)
        except Exception as e:  # noqa: BLE001
            if not _is_server_error(e):
                link.failed(e)
                return None
            return stored
        good = [j for j, code in zip(where, codes) if code in (OK, ErrorCode.EXISTS)]
        k = sum(1 for code in codes if code == OK)
        _count("saved_blocks", k)
        _count("saved_bytes", k * size)
        return sorted(stored + good)

    @staticmethod
    def _host_row(p, bid):
        """Block bid's bytes of part p as a byte buffer: a view of the KV
        tensor's own memory in host memory, a copy to the host otherwise
        (a GPU's KV cache)."""
        row = p.rows[bid]
        if row.device.type != "cpu":
            row = row.to("cpu")
        return row.view(torch.uint8).numpy()

    # -- completion, shutdown -----------------------------------------------------
    def drain(self, timeout_s=60.0):
        """Waits (at most timeout_s) for the saves queued so far; True when
        none is left."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._outstanding and time.monotonic() < deadline:
                self._idle.wait(timeout=0.1)
            return not self._outstanding

    def get_finished(self, finished_req_ids):
        with self._lock:
            self._finished_waiting |= {r for r in finished_req_ids if r in self._save_reqs}
            done = {r for r in self._finished_waiting if r not in self._outstanding}
            self._finished_waiting -= done
            self._save_reqs -= done
        return (done or None), None

    def build_worker_meta(self):
        with self._lock:
            stored, self._stored = self._stored, []
            failed, self._failed = self._failed, []
        if not stored and not failed:
            return None
        return TidepoolWorkerMetadata(stored=stored, failed=failed)

    def shutdown(self):
        """Lets the saves in flight finish (at most shutdown_timeout_s),
        then stops the saver and releases the leases this worker holds.
        Safe to call twice (vLLM's shutdown, then atexit)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._saver is not None:
            t0 = time.monotonic()
            if not self.drain(self._s.shutdown_timeout_s):
                logger.warning("tidepool: %d saves not finished after shutdown_timeout_s=%.0fs; dropped",
                               sum(self._outstanding.values()), self._s.shutdown_timeout_s)
            elif time.monotonic() - t0 > 0.1:
                logger.info("tidepool: waited %.1fs for the last saves", time.monotonic() - t0)
            self._save_q.put(None)
            self._saver.join(timeout=5)
        self._flush_releases()
        if self._gpu is not None:  # GPU hook (tidepool.cuda)
            self._gpu.close()
        self._link.close()
