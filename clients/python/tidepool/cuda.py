"""The vLLM connector's GPU paths (docs/gpu.md), used only when the KV
cache is on a CUDA device (``tensor.is_cuda``); the CPU path of
tidepool.vllm does not come here and stays exactly as it is.

Two layers, chosen by the connector setting ``gpu_path`` (kv_connector_extra_config):

- ``"engine"`` (layer 1, the default): the engine copies. Each arena
  mapping the client reads or writes is registered once as pinned host
  memory (``torch.cuda.cudart().cudaHostRegister``), and block copies run
  on a side CUDA stream with ``non_blocking=True``: a load's copies are
  issued before the forward and the forward's stream waits on their event
  (so they complete before any layer reads them); a save's copies wait on
  an event recorded after the forward and are synchronized on the saver
  thread, never on the step. Default because it needs nothing of the
  sidecar but its arenas (the sidecar may run without a driver, in a
  container without the GPU) and keeps every copy in the engine's own CUDA
  context.
- ``"sidecar"`` (layer 2): the sidecar copies. The connector hands it the
  KV tensors' CUDA IPC memory handles once (``GpuRegister``) and then names
  block slots and keys (``GpuSave``/``GpuLoad``); the engine's Python
  thread only waits for the answer. Used when the sidecar's Hello lists
  "gpu"; otherwise the connector falls back to "engine".

Neither layer was run on a GPU in development (no GPU there); the one
script scripts/device-check.sh runs both on a GPU machine.
"""

import threading

import torch

from .client import FEATURE_GPU, OK, Client

GPU_PATHS = ("engine", "sidecar")
_HOST_REGISTER_READ_ONLY = 0x08  # cudaHostRegisterReadOnly (CUDA >= 11.1)


def ipc_buffer(t):
    """(device, device_uuid, ipc_handle, offset, size) of tensor t's storage,
    from ``untyped_storage()._share_cuda_()``: the CUDA IPC handle of the
    allocation that holds the storage and the storage's place in it."""
    st = t.untyped_storage()
    share = st._share_cuda_()
    device, handle, size, offset = share[0], share[1], share[2], share[3]
    try:
        uuid = bytes.fromhex(str(torch.cuda.get_device_properties(device).uuid).replace("-", ""))
    except Exception:  # noqa: BLE001 - an older torch: by ordinal
        uuid = b""
    return int(device), uuid, bytes(handle), int(offset), int(size)


def layout_segments(layers):
    """Buffers and segments of the connector's layers [(name, t, bdim, nbytes)]
    in the order the CPU path lays a block out (layer by layer; with the
    block dimension second, K then V). Offsets are relative to the storage."""
    buffers, segments = [], []
    for _name, t, bdim, nbytes in layers:
        es = t.element_size()
        base = t.storage_offset() * es
        buffers.append(ipc_buffer(t))
        b = len(buffers) - 1
        if bdim == 0:
            if not t.select(0, 0).is_contiguous():
                raise ValueError("a block of %s is not contiguous" % _name)
            segments.append((b, base, t.stride(0) * es, nbytes))
        else:
            one = t.select(1, 0)
            half = nbytes // one.shape[0]
            for k in range(one.shape[0]):
                if not one.select(0, k).is_contiguous():
                    raise ValueError("a block of %s is not contiguous" % _name)
                segments.append((b, base + k * t.stride(0) * es, t.stride(1) * es, half))
    return buffers, segments


class SidecarSlots:
    """Layer 2: the sidecar saves and loads GPU block slots itself."""

    def __init__(self, client, layers, num_blocks, header):
        buffers, segments = layout_segments(layers)
        self._c = client
        self.id, self.block_bytes = client.gpu_register(buffers, segments, num_blocks, header)

    @staticmethod
    def available(client):
        return FEATURE_GPU in (client.hello().features or [])

    def save(self, ns, slots, keys, first_depth):
        """Saves slot i under keys[i]; the caller has waited for the work
        that wrote them. Returns one code per block."""
        return self._c.gpu_save(self.id, ns, [(s, k, first_depth + i) for i, (s, k) in enumerate(zip(slots, keys))])

    def load(self, ns, slots, keys):
        """Loads keys[i] into slot i; returns the indexes loaded."""
        codes = self._c.gpu_load(self.id, ns, list(zip(slots, keys)))
        return {i for i, c in enumerate(codes) if c == OK}

    def close(self):
        try:
            self._c.gpu_unregister(self.id)
        except Exception:  # noqa: BLE001 - the connection's end ends it too
            pass


class EngineCopies:
    """Layer 1: pinned arena mappings and copies on a side stream."""

    def __init__(self, device):
        self.stream = torch.cuda.Stream(device=device)
        self._pinned = {}  # address -> size
        self._lock = threading.Lock()

    def pin(self, view, read_only=False):
        """Registers the mapping under memoryview view as pinned host memory,
        once per mapping (cudaHostRegister through torch; a read-only
        mapping, as the client maps the arenas to read, with
        cudaHostRegisterReadOnly)."""
        t = torch.frombuffer(view, dtype=torch.uint8)
        addr, size = t.data_ptr(), t.numel()
        with self._lock:
            if addr in self._pinned:
                return
            err = torch.cuda.cudart().cudaHostRegister(addr, size, _HOST_REGISTER_READ_ONLY if read_only else 0)
            if int(err) != 0:
                raise RuntimeError("cudaHostRegister failed: %s" % err)
            self._pinned[addr] = size

    def load_block(self, view, layers, bid, off):
        """Issues the copies of one block's bytes (view, from offset off) into
        block bid of every layer, on the side stream."""
        src = torch.frombuffer(view, dtype=torch.uint8)
        with torch.cuda.stream(self.stream):
            for _name, t, bdim, nbytes in layers:
                dst = t.select(bdim, bid)
                dst.copy_(src[off:off + nbytes].view(t.dtype).view(dst.shape), non_blocking=True)
                off += nbytes
        return off

    def loads_done(self):
        """The forward's stream waits for the loads issued so far."""
        ev = torch.cuda.Event()
        ev.record(self.stream)
        torch.cuda.current_stream().wait_event(ev)
        return ev

    def save_block(self, view, layers, bid, off, after):
        """Issues the copies of block bid of every layer into view (from off)
        on the side stream, after event after (recorded behind the forward)."""
        dst = torch.frombuffer(view, dtype=torch.uint8)
        self.stream.wait_event(after)
        with torch.cuda.stream(self.stream):
            for _name, t, bdim, nbytes in layers:
                src = t.select(bdim, bid)
                dst[off:off + nbytes].view(t.dtype).view(src.shape).copy_(src, non_blocking=True)
                off += nbytes
        return off

    def synchronize(self):
        self.stream.synchronize()

    def close(self):
        with self._lock:
            for addr in list(self._pinned):
                torch.cuda.cudart().cudaHostUnregister(addr)
            self._pinned.clear()


def attach(conn, layers, num_blocks, header, gpu_path):
    """The connector's GPU hook (tidepool.vllm.register_kv_caches): layer 2
    (_Sidecar) when gpu_path is "sidecar" and the sidecar's Hello lists
    "gpu", else layer 1 (EngineSlots)."""
    if gpu_path not in GPU_PATHS:
        raise ValueError("gpu_path %r: one of %s" % (gpu_path, ", ".join(GPU_PATHS)))
    if gpu_path == "sidecar":
        try:
            c = Client(conn._socket, timeout=conn._timeout_s, client_name="tidepool-vllm/gpu")
            try:
                ok = SidecarSlots.available(c)
            finally:
                c.close()
        except Exception:  # noqa: BLE001 - no sidecar now: the engine copies
            ok = False
        if ok:
            return _Sidecar(conn, layers, num_blocks, header)
    return EngineSlots(layers[0][1].device)


class _Sidecar:
    """The hook's face of layer 2: one connection of its own (the
    registration lives on it), used by the loading and the saving thread in
    turn, registered again after the connection is lost."""

    def __init__(self, conn, layers, num_blocks, header):
        self._args = (layers, num_blocks, header)
        self._socket, self._timeout = conn._socket, conn._timeout_s
        self._lock = threading.Lock()
        self._slots = None
        self._after = {}  # id(transfer) -> event recorded behind its step

    def _get(self):
        if self._slots is None:
            c = Client(self._socket, timeout=self._timeout, client_name="tidepool-vllm/gpu")
            try:
                self._slots = SidecarSlots(c, *self._args)
            except BaseException:
                c.close()
                raise
        return self._slots

    def _drop(self, err):
        from . import vllm as _v
        _v._once.warn("gpu-sidecar:%s" % type(err).__name__, "GPU call to the sidecar failed: %r", err)
        if self._slots is not None:
            try:
                self._slots._c.close()
            except Exception:  # noqa: BLE001
                pass
            self._slots = None

    def mark_saves(self, saves):
        ev = torch.cuda.Event()
        ev.record()
        for tr in saves:
            self._after[id(tr)] = ev

    def load(self, conn, tr):
        idx = [i for i, k in enumerate(tr.keys) if k is not None]
        with self._lock:
            try:
                got = self._get().load(conn._ns, [tr.block_ids[i] for i in idx], [tr.keys[i] for i in idx])
            except Exception as e:  # noqa: BLE001 - the blocks are recomputed
                self._drop(e)
                return set()
        return {idx[j] for j in got}

    def save(self, conn, link, tr):
        from . import vllm as _v
        ev = self._after.pop(id(tr), None)
        if ev is not None:
            ev.synchronize()  # the step that wrote the blocks is done
        with self._lock:
            try:
                s = self._get()
                codes = s.save(conn._ns, tr.block_ids, tr.keys, tr.first_index)
            except Exception as e:  # noqa: BLE001 - not saved
                self._drop(e)
                _v._count("save_errors", len(tr.keys))
                return
        n = sum(1 for c in codes if c == OK)
        _v._count("saved_blocks", n)
        _v._count("saved_bytes", n * s.block_bytes)
        stored = [i for i, c in enumerate(codes) if c in (OK, _v.ErrorCode.EXISTS)]
        if stored:  # for KV events, as tidepool.vllm's _save reports them
            parent = tr.keys[stored[0] - 1] if stored[0] > 0 else None
            with conn._lock:
                conn._stored.append(([tr.keys[i] for i in stored], parent, conn._block_size))

    def close(self):
        with self._lock:
            if self._slots is not None:
                self._slots.close()
                self._slots._c.close()
                self._slots = None


class EngineSlots:
    """The hook's face of layer 1: the connector's own zero-copy load and
    save (Acquire/Release, Reserve/Commit), with the copies between the KV
    tensors and the arenas on a side stream from and to pinned mappings."""

    def __init__(self, device):
        self.x = EngineCopies(device)
        self._rw = {}  # arena index -> writable mapping (memoryview), pinned
        self._after = {}  # id(transfer) -> event recorded behind its step
        self._lock = threading.Lock()

    def _ro(self, c, slot):
        a = c._arena(slot)
        self.x.pin(a.view, read_only=True)
        return a.view[slot.offset:slot.offset + slot.length]

    def _wr(self, c, slot):
        a = c._arena(slot)
        with self._lock:
            mv = self._rw.get(slot.arena)
            if mv is None:
                import mmap
                m = mmap.mmap(a.fd, a.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
                mv = self._rw[slot.arena] = memoryview(m)
        self.x.pin(mv)
        return mv[slot.offset:slot.offset + slot.length]

    def mark_saves(self, saves):
        """In wait_for_save (the step's thread): an event behind the step's
        work, which the saves' copies wait for on the side stream."""
        ev = torch.cuda.Event()
        ev.record()
        for tr in saves:
            self._after[id(tr)] = ev

    def load(self, conn, tr):
        """As tidepool.vllm's _load: returns the indexes loaded. The copies
        are issued on the side stream and complete before the leases are
        released and before the forward starts."""
        from . import vllm as _v
        c = conn._load_link.get()
        if c is None:
            return set()
        want = _v.HEADER_BYTES + conn._block_bytes
        header = conn._header()
        idx = [i for i, k in enumerate(tr.keys) if k is not None]
        try:
            leases, _ = c.acquire(conn._ns, [tr.keys[i] for i in idx], lease_ms=conn._lease_ms)
        except Exception as e:  # noqa: BLE001
            if not _v._is_server_error(e):
                conn._load_link.failed(e)
            return set()
        held = [l.lease_id for l in leases if l.code == OK]
        leases = dict(zip(idx, leases))
        done = set()
        try:
            for i, l in leases.items():
                if l.code != OK or l.slot.length != want:
                    continue
                view = self._ro(c, l.slot)
                if bytes(view[:_v.HEADER_BYTES]) != header:
                    continue
                if conn._verify and _v._crc.crc32c(view) != l.checksum:
                    continue
                self.x.load_block(view, conn._layers, tr.block_ids[i], _v.HEADER_BYTES)
                done.add(i)
            self.x.loads_done()
            self.x.synchronize()
        except Exception as e:  # noqa: BLE001
            _v._once.warn("gpu-load:%s" % type(e).__name__, "GPU load failed: %r; recomputing", e)
            self.x.synchronize()
            done = set()
        finally:
            if held:
                try:
                    codes = c.release(held)
                    expired = {held[j] for j, code in enumerate(codes) if code != OK}
                    done -= {i for i, l in leases.items() if l.lease_id in expired}
                except Exception as e:  # noqa: BLE001
                    if _v._is_server_error(e):
                        done = set()
                    else:
                        conn._load_link.failed(e)
        return done

    def save(self, conn, link, tr):
        """As tidepool.vllm's _save, on the saver thread: never on the step."""
        from . import vllm as _v
        c = link.get()
        after = self._after.pop(id(tr), None)
        if c is None:
            _v._count("save_errors", len(tr.keys))
            return
        if after is None:
            after = torch.cuda.Event()
            after.record()
        size = _v.HEADER_BYTES + conn._block_bytes
        header = conn._header()
        try:
            rs = c.reserve(conn._ns, [(k, size, tr.first_index + i) for i, k in enumerate(tr.keys)])
        except Exception as e:  # noqa: BLE001
            if not _v._is_server_error(e):
                link.failed(e)
            _v._count("save_errors", len(tr.keys))
            return
        ok = [i for i, r in enumerate(rs) if r.code == OK]
        try:
            views = {}
            for i in ok:
                v = views[i] = self._wr(c, rs[i].slot)
                v[:_v.HEADER_BYTES] = header
                self.x.save_block(v, conn._layers, tr.block_ids[i], _v.HEADER_BYTES, after)
            self.x.synchronize()
            commits = [(rs[i].token, _v._crc.crc32c(views[i])) for i in ok]
        except BaseException:
            self.x.synchronize()
            try:
                c.abort([rs[i].token for i in ok])
            except Exception:  # noqa: BLE001
                pass
            raise
        if not commits:
            return
        codes = c.commit(commits)
        good = [tr.keys[i] for i, code in zip(ok, codes) if code in (OK, _v.ErrorCode.EXISTS)]
        n = sum(1 for code in codes if code == OK)
        _v._count("saved_blocks", n)
        _v._count("saved_bytes", n * size)
        if good:
            parent = tr.keys[ok[0] - 1] if ok[0] > 0 else None
            with conn._lock:
                conn._stored.append((good, parent, conn._block_size))

    def close(self):
        self.x.synchronize()
        self.x.close()
        for mv in self._rw.values():
            mv.release()
        self._rw.clear()
