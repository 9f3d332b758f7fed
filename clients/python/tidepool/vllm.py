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

Keys are vLLM's own block hashes (chained; they fold in every token before
the block, LoRA, multimodal inputs, cache_salt and prompt embeddings) under a
namespace that names everything else that changes the KV bytes (model,
dtypes, layout, block size, ranks). vLLM's hashes are stable across
processes with sha256/sha256_cbor, or with xxhash when PYTHONHASHSEED is set
to one value everywhere; with xxhash and no PYTHONHASHSEED each process
draws a random seed, and the connector refuses to start.

The sidecar is a cache, never a dependency: when it is absent or dies, the
connector answers "no hit", loads report their blocks as failed (vLLM
recomputes them), saves are dropped, one warning is logged, and the
connector reconnects when the sidecar is back.
"""

import hashlib
import json
import os
import queue
import threading
import time
import warnings
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
from .client import OK, BlockMeta, Error, ErrorCode

logger = init_logger("vllm.kv_connector.tidepool")
# Loads wrap the read-only arena mapping in a tensor that is only read.
warnings.filterwarnings("ignore", message="The given buffer is not writable")  # under "vllm": its log configuration applies

HEADER_BYTES = 64
_MAGIC = b"tidepool/vllm/1\0"  # 16 bytes; then a 32-byte layout digest; 16 zero bytes
DEFAULT_SOCKET = "/run/tidepool/tidepool.sock"

# Counters of this process, for tests and logs (test_stats()).
_STATS = {"lookups": 0, "lookup_hit_blocks": 0, "matched_tokens": 0, "loaded_blocks": 0,
          "load_seconds": 0.0, "loaded_bytes": 0,
          "load_errors": 0, "saved_blocks": 0, "save_exists": 0, "save_errors": 0,
          "save_seconds": 0.0, "saved_bytes": 0,
          "keys": []}
_STATS_LOCK = threading.Lock()


def _count(name, n=1):
    with _STATS_LOCK:
        _STATS[name] += n


def test_stats():
    """A copy of this process's connector counters (used by the tests)."""
    with _STATS_LOCK:
        return json.loads(json.dumps(_STATS))


_once = Once(logger)


class _Link(Link):
    """Link with the connector's logger and client name."""

    def __init__(self, socket_path, timeout_s, retry_s, name):
        super().__init__(socket_path, timeout_s, retry_s, name, logger, _once, "tidepool-vllm/" + name)


def _is_server_error(e):
    return isinstance(e, Error)


# ---- metadata -----------------------------------------------------------------

@dataclass
class _Transfer:
    req_id: str
    keys: list  # tidepool keys (bytes), one per block
    block_ids: list  # vLLM block ids, same length
    first_index: int  # chain index of keys[0] (the block's depth)
    metas: Optional[list] = None  # saves: a BlockMeta per key (for the sidecar's KV events)


@dataclass
class TidepoolConnectorMetadata(KVConnectorMetadata):
    loads: list = field(default_factory=list)  # [_Transfer]
    saves: list = field(default_factory=list)  # [_Transfer]


@dataclass
class _ReqState:
    request: Any
    saved_upto: int = 0  # blocks [0, saved_upto) were saved or need no save
    has_saves: bool = False


# ---- configuration ------------------------------------------------------------

_KNOWN_KEYS = {"socket", "namespace", "model_id", "timeout_s", "retry_s", "lease_ms", "load", "save",
               "lookup_scope", "verify_reads", "test_only_load_keys_of", "test_only_load_barrier",
               "gpu_path"}  # gpu_path: tidepool.cuda (a KV cache on CUDA only)


def _test_barrier(d, timeout_s=120.0):
    """Test hook: announce d/acquired, wait (bounded) for d/go."""
    open(os.path.join(d, "acquired"), "w").close()
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(os.path.join(d, "go")) and time.monotonic() < deadline:
        time.sleep(0.02)


def _extra(cfg):
    x = dict(cfg.kv_connector_extra_config or {})
    unknown = set(x) - _KNOWN_KEYS
    if unknown:
        raise ValueError("TidepoolConnector: unknown kv_connector_extra_config keys %s (known: %s)"
                         % (sorted(unknown), sorted(_KNOWN_KEYS)))
    if x.get("gpu_path", "engine") not in ("engine", "sidecar"):
        raise ValueError("TidepoolConnector: gpu_path %r: engine or sidecar" % (x["gpu_path"],))
    return x


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
    model = extra.get("model_id") or (mc.served_model_name if isinstance(mc.served_model_name, str)
                                       else None) or mc.model
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


def block_metas(request, keys, first, block_size, parent=None):
    """The BlockMeta of each of keys, blocks first, first+1, ... of request
    (parent: the key of block first-1, None for block 0): the block's token
    ids, the key before it and the block
    size, which the sidecar publishes in its KV events so that routers
    (llm-d, Dynamo) can index the blocks it holds (docs/events.md). A block
    whose tokens are not all known gets no token ids."""
    toks = getattr(request, "all_token_ids", None)
    if toks is None:
        toks = getattr(request, "prompt_token_ids", None) or []
    out = []
    for i, _ in enumerate(keys):
        b = first + i
        t = list(toks[b * block_size:(b + 1) * block_size])
        out.append(BlockMeta(t if len(t) == block_size else [], keys[i - 1] if i > 0 else parent, block_size))
    return out


def _vllm_hashes_of(tokens, block_size, hash_algo):
    """vLLM's block hashes of a plain token prompt (no LoRA, multimodal
    input or salt), as the scheduler computes them. Test hook only."""
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


# ---- the connector -------------------------------------------------------------

class TidepoolConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM V1 KV connector storing KV blocks in a tidepool sidecar."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        check_stable_keys(vllm_config)
        self._x = _extra(self._kv_transfer_config)
        tc = self._kv_transfer_config
        self._block_size = vllm_config.cache_config.block_size
        self._hash_algo = vllm_config.cache_config.prefix_caching_hash_algo
        self._socket = self._x.get("socket", DEFAULT_SOCKET)
        self._timeout_s = float(self._x.get("timeout_s", 5.0))
        self._retry_s = float(self._x.get("retry_s", 2.0))
        self._lease_ms = int(self._x.get("lease_ms", 0))
        self._verify = bool(self._x.get("verify_reads", False))
        self._do_load = bool(self._x.get("load", tc.kv_role in ("kv_both", "kv_consumer")))
        self._do_save = bool(self._x.get("save", tc.kv_role in ("kv_both", "kv_producer")))
        scope = str(self._x.get("lookup_scope", "default")).upper()
        from .client import Scope
        if not hasattr(Scope, scope):
            raise ValueError("TidepoolConnector: lookup_scope must be default, local or cluster")
        self._scope = getattr(Scope, scope)
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
            self._do_load = self._do_save = False
        pc = vllm_config.parallel_config
        if role == KVConnectorRole.SCHEDULER:
            self._tp_rank, self._pp_rank = 0, 0
        else:
            from vllm.distributed.parallel_state import get_pp_group, get_tp_group
            self._tp_rank = get_tp_group().rank_in_group if pc.tensor_parallel_size > 1 else 0
            self._pp_rank = get_pp_group().rank_in_group if pc.pipeline_parallel_size > 1 else 0
        self._desc = namespace_descriptor(vllm_config, kv_cache_config, self._tp_rank, self._pp_rank, self._x)
        self._ns = namespace_for(self._desc, self._x.get("namespace"))
        logger.info("tidepool: %s side, socket %s, namespace %s",
                    "scheduler" if role == KVConnectorRole.SCHEDULER else "worker", self._socket, self._ns)
        if role == KVConnectorRole.SCHEDULER:
            self._init_scheduler()
        else:
            self._init_worker()

    # ==== scheduler side ==========================================================

    def _init_scheduler(self):
        self._link = _Link(self._socket, self._timeout_s, self._retry_s, "scheduler")
        self._reqs: dict = {}
        self._pending_loads: dict = {}  # req_id -> num external tokens
        self._events: list = []
        self._test_keys = None
        if self._x.get("test_only_load_keys_of") is not None:
            logger.warning("tidepool: TEST HOOK test_only_load_keys_of is set: loads take the blocks "
                           "of another prompt (for negative-control tests only)")
            self._test_keys = _vllm_hashes_of(list(self._x["test_only_load_keys_of"]),
                                               self._block_size, self._hash_algo)

    def _keys(self, request, n_blocks=None):
        """Keys of the request's full blocks (vLLM's block hashes)."""
        hashes = request.block_hashes
        hbs = getattr(request, "hash_block_size", None) or self._block_size
        ratio = max(1, self._block_size // hbs)
        n = len(hashes) // ratio
        if n_blocks is not None:
            n = min(n, n_blocks)
        return [bytes(hashes[(i + 1) * ratio - 1]) for i in range(n)]

    def on_new_request(self, request):
        self._reqs[request.request_id] = _ReqState(request)

    def _state(self, request):
        st = self._reqs.get(request.request_id)
        if st is None:
            st = self._reqs[request.request_id] = _ReqState(request)
        return st

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """One Lookup of the request's prompt blocks; no side effects on the
        connector's state (vLLM may call it several times)."""
        if not self._do_load:
            return 0, False
        # vLLM must compute at least the last prompt token itself.
        n_prompt = request.num_prompt_tokens
        max_blocks = (n_prompt - 1) // self._block_size
        if max_blocks * self._block_size <= num_computed_tokens:
            return 0, False
        keys = self._keys(request, max_blocks)
        if not keys:
            return 0, False
        c = self._link.get()
        if c is None:
            return 0, False
        try:
            hit = c.lookup(self._ns, keys, scope=self._scope)
        except Exception as e:  # noqa: BLE001
            if _is_server_error(e):
                _once.warn("lookup:%s" % e.code, "Lookup refused (%s); treating as a miss", e)
            else:
                self._link.failed(e)
            return 0, False
        _count("lookups")
        _count("lookup_hit_blocks", hit)
        with _STATS_LOCK:
            if len(_STATS["keys"]) < 4096:
                _STATS["keys"].append([k.hex() for k in keys])
        ext = hit * self._block_size - num_computed_tokens
        if ext <= 0:
            return 0, False
        return ext, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        st = self._state(request)
        if num_external_tokens > 0:
            self._pending_loads[request.request_id] = num_external_tokens
            _count("matched_tokens", num_external_tokens)
        return st

    def _block_ids(self, req_id):
        m = self._kv_cache_manager
        if m is None:
            return None
        try:
            return list(m.get_block_ids(req_id)[0])
        except Exception:  # noqa: BLE001
            return None

    def build_connector_meta(self, scheduler_output):
        meta = TidepoolConnectorMetadata()
        sched = scheduler_output.num_scheduled_tokens
        progress = []  # (req_id, tokens computed after this step, block ids or None)
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
            ext = self._pending_loads.pop(rid, 0)
            if ext > 0 and before < ext:  # cannot happen with vLLM's scheduler
                _once.warn("plan", "request %s: %d external tokens but %d computed; not loading",
                           rid, ext, before)
                ext = 0
            if ext > 0:
                first = (before - ext) // self._block_size
                last = before // self._block_size
                keys = self._keys(st.request, last)[first:last]
                if self._test_keys is not None:
                    keys = self._test_keys[first:last]
                # vLLM counts these tokens as computed: every block must be
                # loaded or reported failed by the worker. A block without
                # a key (None) is reported failed.
                keys = list(keys) + [None] * (last - first - len(keys))
                meta.loads.append(_Transfer(rid, keys, bids[first:last], first))
                st.saved_upto = max(st.saved_upto, last)
            if not self._do_save:
                continue
            full = min(after // self._block_size, len(bids))
            if full > st.saved_upto:
                keys = self._keys(st.request, full)
                if len(keys) > st.saved_upto:
                    n = len(keys)
                    tr = _Transfer(rid, keys[st.saved_upto:n], bids[st.saved_upto:n], st.saved_upto)
                    tr.metas = block_metas(st.request, tr.keys, st.saved_upto, self._block_size,
                                           keys[st.saved_upto - 1] if st.saved_upto > 0 else None)
                    meta.saves.append(tr)
                    st.saved_upto = n
                    st.has_saves = True
        return meta

    def request_finished(self, request, block_ids):
        """Keeps the blocks while saves of the request may be in flight;
        the worker reports the request in get_finished when they are done."""
        st = self._reqs.pop(request.request_id, None)
        self._pending_loads.pop(request.request_id, None)
        return bool(st is not None and st.has_saves), None

    def request_finished_all_groups(self, request, block_ids):
        return self.request_finished(request, block_ids[0] if block_ids else [])

    def update_connector_output(self, connector_output):
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, TidepoolWorkerMetadata) and meta.stored:
            self._events.extend(meta.stored)

    def take_events(self):
        """BlockStored events for the blocks this engine saved into tidepool,
        so that vLLM's KV-event publisher announces them to routers."""
        if not self._events:
            return ()
        from vllm.distributed.kv_events import BlockStored
        evs, self._events = self._events, []
        out = []
        for hashes, parent, bs in evs:
            out.append(BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=[],
                                   block_size=bs, lora_id=None, medium="tidepool", lora_name=None))
        return out

    # ==== worker side ==============================================================

    def _init_worker(self):
        self._layers = []  # [(name, tensor, block_dim, nbytes per block)]
        self._block_bytes = 0
        self._layout_digest = b""
        self._load_link = _Link(self._socket, self._timeout_s, self._retry_s, "worker")
        self._load_errors: set = set()
        self._save_q: "queue.Queue" = queue.Queue()
        self._lock = threading.Lock()
        self._outstanding: dict = {}  # req_id -> saves not done
        self._save_reqs: set = set()  # req ids that ever had a save
        self._finished_waiting: set = set()
        self._stored: list = []
        self._idle = threading.Condition(self._lock)
        self._saver = None

    def register_kv_caches(self, kv_caches):
        nb = getattr(self._kv_cache_config, "num_blocks", None)
        layers, sig = [], []
        for name, t in kv_caches.items():
            if not isinstance(t, torch.Tensor):
                continue
            if nb is not None and t.dim() >= 2 and t.shape[0] == nb:
                bdim = 0  # blocks first: the CPU backend, FlashInfer, MLA
            elif nb is not None and t.dim() >= 3 and t.shape[0] == 2 and t.shape[1] == nb:
                bdim = 1  # FlashAttention: (2, num_blocks, block_size, heads, head_size)
            else:
                _once.warn("layout", "KV tensor %s has shape %s with %s blocks: layout not supported, "
                           "connector disabled", name, tuple(t.shape), nb)
                self._layers = []
                return
            one = t.select(bdim, 0)
            nbytes = one.numel() * t.element_size()
            layers.append((name, t, bdim, nbytes))
            sig.append([name, list(t.shape), bdim, str(t.dtype), list(t.stride())])
        self._layers = layers
        self._block_bytes = sum(l[3] for l in layers)
        self._layout_digest = hashlib.sha256(json.dumps([self._ns, sig]).encode()).digest()
        logger.info("tidepool: %d KV layers, %d bytes per block (+%d header)", len(layers),
                    self._block_bytes, HEADER_BYTES)
        # --- GPU hook (tidepool.cuda, docs/gpu.md): only a KV cache on CUDA.
        self._gpu = None
        if layers and layers[0][1].is_cuda:
            from . import cuda as _cuda
            self._gpu = _cuda.attach(self, layers, nb, self._header(), self._x.get("gpu_path", "engine"))
        # --- end of the GPU hook

    def _header(self):
        return _MAGIC + self._layout_digest + bytes(HEADER_BYTES - len(_MAGIC) - len(self._layout_digest))

    # -- load: arena -> paged KV, synchronously before the forward ----------------

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        if not isinstance(meta, TidepoolConnectorMetadata) or not meta.loads or not self._do_load:
            return
        for tr in meta.loads:
            t0 = time.perf_counter()
            ok = self._load(tr) if self._layers else set()
            _count("load_seconds", time.perf_counter() - t0)
            _count("loaded_bytes", len(ok) * (HEADER_BYTES + self._block_bytes))
            bad = [b for i, b in enumerate(tr.block_ids) if i not in ok]
            if bad:
                self._load_errors.update(bad)
                _count("load_errors", len(bad))
            _count("loaded_blocks", len(ok))

    def _load(self, tr):
        """Loads what it can of one transfer; returns the indexes loaded."""
        if getattr(self, "_gpu", None) is not None:  # GPU hook (tidepool.cuda)
            return self._gpu.load(self, tr)
        c = self._load_link.get()
        if c is None:
            return set()
        want = HEADER_BYTES + self._block_bytes
        header = self._header()
        done = set()
        idx = [i for i, k in enumerate(tr.keys) if k is not None]
        try:
            leases, _ = c.acquire(self._ns, [tr.keys[i] for i in idx], lease_ms=self._lease_ms)
        except Exception as e:  # noqa: BLE001
            if _is_server_error(e):
                _once.warn("acquire:%s" % e.code, "Acquire refused (%s); recomputing", e)
            else:
                self._load_link.failed(e)
            return done
        held = [l.lease_id for l in leases if l.code == OK]
        leases = dict(zip(idx, leases))
        barrier = self._x.get("test_only_load_barrier")
        if barrier:  # test hook: lets a test kill the sidecar mid-load
            _test_barrier(barrier)
        try:
            for i, l in leases.items():
                if l.code != OK:
                    if l.code != ErrorCode.NOT_FOUND:
                        _once.warn("acq-item:%s" % l.code, "block refused (%s); recomputing",
                                   ErrorCode._VALUES_TO_NAMES.get(l.code, l.code))
                    continue
                if l.slot.length != want:
                    _once.warn("size", "block of %d bytes where this layout needs %d (another model "
                               "under a colliding key?); recomputing", l.slot.length, want)
                    continue
                view = c.slot_view(l, verify=self._verify)
                try:
                    if bytes(view[:HEADER_BYTES]) != header:
                        _once.warn("header", "block with another layout's header; recomputing")
                        continue
                    src = torch.frombuffer(view, dtype=torch.uint8)
                    off = HEADER_BYTES
                    bid = tr.block_ids[i]
                    for _name, t, bdim, nbytes in self._layers:
                        dst = t.select(bdim, bid)
                        dst.copy_(src[off:off + nbytes].view(t.dtype).view(dst.shape))
                        off += nbytes
                    del src
                    done.add(i)
                except Error as e:
                    _once.warn("verify:%s" % e.code, "block failed its check (%s); recomputing", e)
                finally:
                    view.release()
        except Exception as e:  # noqa: BLE001
            _once.warn("load:%s" % type(e).__name__, "load failed: %r; recomputing", e)
        finally:
            if held:
                try:
                    codes = c.release(held)
                    expired = {held[j] for j, code in enumerate(codes) if code != OK}
                    if expired:
                        # The bytes copied under an expired lease may be wrong.
                        _once.warn("expired", "a lease expired during a load; recomputing its blocks")
                        done -= {i for i, l in leases.items() if l.lease_id in expired}
                except Exception as e:  # noqa: BLE001
                    # The sidecar is gone: nobody can rewrite the mapped arena
                    # any more, and every block was verified before its copy.
                    if _is_server_error(e):
                        done = set()
                    else:
                        self._load_link.failed(e)
        return done

    def wait_for_layer_load(self, layer_name):
        return  # whole blocks are loaded in start_load_kv

    # -- save: paged KV -> arena, asynchronously ------------------------------------

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return  # whole blocks are saved after the forward (wait_for_save)

    def wait_for_save(self):
        meta = self._get_connector_metadata() if self.has_connector_metadata() else None
        if not isinstance(meta, TidepoolConnectorMetadata) or not meta.saves or not self._layers:
            if isinstance(meta, TidepoolConnectorMetadata):
                with self._lock:
                    for tr in meta.saves:
                        self._save_reqs.add(tr.req_id)
            return
        if getattr(self, "_gpu", None) is not None:  # GPU hook (tidepool.cuda)
            self._gpu.mark_saves(meta.saves)
        with self._lock:
            for tr in meta.saves:
                self._save_reqs.add(tr.req_id)
                self._outstanding[tr.req_id] = self._outstanding.get(tr.req_id, 0) + 1
        for tr in meta.saves:
            self._save_q.put(tr)
        if self._saver is None:
            self._saver = threading.Thread(target=self._save_loop, name="tidepool-save", daemon=True)
            self._saver.start()

    def _save_loop(self):
        link = _Link(self._socket, self._timeout_s, self._retry_s, "worker-save")
        while True:
            tr = self._save_q.get()
            if tr is None:
                return
            try:
                self._save(link, tr)
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

    def _save(self, link, tr):
        t0 = time.perf_counter()
        if getattr(self, "_gpu", None) is not None:  # GPU hook (tidepool.cuda)
            return self._gpu.save(self, link, tr)
        c = link.get()
        if c is None:
            _count("save_errors", len(tr.keys))
            return
        size = HEADER_BYTES + self._block_bytes
        header = self._header()
        try:
            rs = c.reserve(self._ns, [(k, size, tr.first_index + i) for i, k in enumerate(tr.keys)])
        except Exception as e:  # noqa: BLE001
            if _is_server_error(e):
                _once.warn("reserve:%s" % e.code, "Reserve refused (%s); not saving", e)
            else:
                link.failed(e)
            _count("save_errors", len(tr.keys))
            return
        commits, stored = [], []
        try:
            for i, r in enumerate(rs):
                if r.code == ErrorCode.EXISTS:
                    _count("save_exists")
                    continue
                if r.code != OK:
                    _once.warn("reserve-item:%s" % r.code, "block not saved (%s: %s)",
                               ErrorCode._VALUES_TO_NAMES.get(r.code, r.code), r.message)
                    _count("save_errors")
                    continue
                parts = self._host_parts(tr.block_ids[i])
                if parts is not None:
                    # Host memory, contiguous per layer: the client copies
                    # the parts into the slot itself (a keyed mapping, or
                    # one pwritev), with no mapping made per block.
                    c.write_slot(r.slot, [header] + parts)
                    v = c.slot_view(r.slot)
                    try:
                        crc = _crc.crc32c(v)
                    finally:
                        v.release()
                else:
                    with c.writable_slot(r.slot) as v:
                        dst = torch.frombuffer(v, dtype=torch.uint8)
                        dst[:HEADER_BYTES].copy_(torch.frombuffer(bytearray(header), dtype=torch.uint8))
                        off = HEADER_BYTES
                        bid = tr.block_ids[i]
                        for _name, t, bdim, nbytes in self._layers:
                            src = t.select(bdim, bid)
                            dst[off:off + nbytes].view(t.dtype).view(src.shape).copy_(src)
                            off += nbytes
                        del dst
                        crc = _crc.crc32c(v)
                commits.append((r.token, crc, tr.metas[i] if tr.metas else None))
                stored.append(i)
        except BaseException as e:
            try:
                c.abort([r.token for r in rs if r.code == OK])
            except Exception:  # noqa: BLE001
                pass
            if not _is_server_error(e) and not isinstance(e, (ValueError, RuntimeError)):
                link.failed(e)
            raise
        if not commits:
            return
        try:
            codes = c.commit(commits)
        except Exception as e:  # noqa: BLE001
            if not _is_server_error(e):
                link.failed(e)
            _count("save_errors", len(commits))
            return
        good = [tr.keys[i] for i, code in zip(stored, codes) if code in (OK, ErrorCode.EXISTS)]
        n = sum(1 for code in codes if code == OK)
        _count("saved_blocks", n)
        _count("saved_bytes", n * size)
        _count("save_seconds", time.perf_counter() - t0)
        if good:
            parent = tr.keys[stored[0] - 1] if stored and stored[0] > 0 else None
            with self._lock:
                self._stored.append((good, parent, self._block_size))

    def _host_parts(self, bid):
        """Block bid of every layer as a byte buffer over the KV tensors'
        own memory, in layer order, or None when a layer's block is not in
        host memory or not contiguous (a GPU's KV cache, FlashAttention's
        K/V split): those go through writable_slot and torch's copy_."""
        parts = []
        for _name, t, bdim, nbytes in self._layers:
            src = t.select(bdim, bid)
            if src.device.type != "cpu" or not src.is_contiguous():
                return None
            try:
                b = src.reshape(-1).view(torch.uint8).numpy()
            except (RuntimeError, TypeError):  # a dtype numpy or view() refuses
                return None
            if b.nbytes != nbytes:
                return None
            parts.append(b)
        return parts

    def _drain_saves(self, timeout_s=60.0):
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._outstanding and time.monotonic() < deadline:
                self._idle.wait(timeout=0.1)

    def handle_preemptions(self, kv_connector_metadata):
        # Preempted requests' blocks are about to be reused: finish reading them.
        self._drain_saves()

    def get_finished(self, finished_req_ids):
        with self._lock:
            self._finished_waiting |= {r for r in finished_req_ids if r in self._save_reqs}
            done = {r for r in self._finished_waiting if r not in self._outstanding}
            self._finished_waiting -= done
            self._save_reqs -= done
        return (done or None), None

    def get_block_ids_with_load_errors(self):
        errs, self._load_errors = self._load_errors, set()
        return errs

    def build_connector_worker_meta(self):
        with self._lock:
            stored, self._stored = self._stored, []
        if not stored:
            return None
        return TidepoolWorkerMetadata(stored=stored)

    def shutdown(self):
        if getattr(self, "_saver", None) is not None:
            self._drain_saves(timeout_s=10.0)
            self._save_q.put(None)
        if getattr(self, "_gpu", None) is not None:  # GPU hook (tidepool.cuda)
            self._gpu.close()
        link = getattr(self, "_load_link", None) or getattr(self, "_link", None)
        if link is not None and link.client is not None:
            try:
                link.client.close()
            except Exception:  # noqa: BLE001
                pass


try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata as _WM
except ImportError:  # pragma: no cover
    _WM = object


@dataclass
class TidepoolWorkerMetadata(_WM):
    """Worker -> scheduler: blocks saved since the last step (for events)."""
    stored: list = field(default_factory=list)

    def aggregate(self, other):
        return TidepoolWorkerMetadata(stored=list(self.stored) + list(getattr(other, "stored", [])))
