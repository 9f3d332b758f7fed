#!/usr/bin/env python3
"""One measurement of tidepool or Mooncake Store, driven from Python.

scripts/bench-vs-mooncake.sh runs this once per (system, workload, round)
and prints the table; the same driver and the same loop drive both systems,
so the client-side overhead compares fairly. It prints one JSON object:
{"value": ..., "unit": ..., "better": "higher"|"lower", ...}.

Both systems are used the way an engine uses them: tidepool's Python
client (clients/python/tidepool) over the sidecar's Unix socket; Mooncake
either through a sidecar process too (--mc-mode dummy, "standalone": the
dummy client, MooncakeDistributedStore.setup_dummy, over its RPC and shared
memory to a `mooncake_client` process, the "real client", which owns the
segment and the transfer engine) or embedded (--mc-mode embedded: setup()
in this process, which then owns the segment and the transfer engine; N
callers are N threads sharing that one store, and a remote get's values
sit in a second such process, RemoteWriter). Per workload:

  put-zc / get-zc      tidepool put_from / get_into (reserve + write into the
                       shared arena + commit; acquire + copy out + release);
                       Mooncake put_from / get_into from / into a buffer
                       allocated in the dummy client's shared memory pool and
                       registered (register_buffer).
  put / get            tidepool put / get (value inside the Thrift message);
                       Mooncake put / get (value through the dummy client's
                       local buffer).
  remote-get           NKEYS fresh 1 MiB values written through node 1, each
                       read once through node 2 with get_into (tidepool:
                       node 2 is not their owner and fetches them from node 1
                       over its TCP transport; Mooncake: node 2's real client
                       reads them from node 1's segment over its TCP
                       transport). --passes P repeats that P times, each
                       pass on fresh keys, and reports their bytes over the
                       sum of their read times (a pass alone reads for a
                       tenth of a second or two).
  batch-put / batch-get  64 x 64 KiB per call: tidepool batch_put_from /
                       batch_get_into; Mooncake batch_put_from /
                       batch_get_into (registered buffers).
  lookup               prefix of 256 present keys: tidepool lookup;
                       Mooncake batch_is_exist and the leading run counted in
                       Python. Unit: p50 microseconds of one call.
  replay               the conversation trace (Mooncake side only; tidepool
                       uses `tidepool replay`): see replay().

Where the clients differ: tidepool's client, on its defaults (which the
driver keeps), sends the CRC-32C of every zero-copy put (the `crc32c` C
module, hardware CRC) for the sidecar to check at Commit; it does not check
zero-copy reads (the sidecar checks bytes where they enter and scrubs
resident blocks; verify=True would). Mooncake's client checks nothing.
TP_VERIFY=0 passes verify=False to tidepool's zero-copy calls; TP_VERIFY=1
passes verify=True (reads checked too). Mooncake registers its buffers
(register_buffer); so does the driver's tidepool adapter when the sidecar
offers the buffer socket (Hello feature buffer_socket) and the client being
measured has register_buffer: get_into (get-zc, remote-get) then has the
sidecar write each block straight into the registered buffer over that
socket, one round trip with no lease and no copy by the client (remote-get:
the block lands there from the network). batch_get_into and the puts work
the same either way. TP_REGISTER=0 keeps plain page-aligned mmap buffers
(acquire, copy out of the arena, release).
"""

import argparse
import ctypes
import json
import mmap
import multiprocessing as mp
import os
import queue
import sys
import threading
import time

MIB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
# TP_CLIENT: another copy of clients/python to measure (say, main's, for a
# before/after comparison in one run); default: this tree's.
sys.path.insert(0, os.environ.get("TP_CLIENT") or os.path.join(HERE, "..", "..", "clients", "python"))

# TP_VERIFY=0: verify=False on every tidepool zero-copy call, 1: verify=True;
# unset: the client's own default (None), whatever that is in the client
# being measured.
_VERIFY_ARG = {"0": False, "1": True}.get(os.environ.get("TP_VERIFY", ""))

# The local put rows write keys that node 1 owns, so that tidepool stores one
# copy on node 1 as Mooncake does with preferred_segment (a key owned by
# node 2 is stored on node 1 and pushed to node 2 as well: a TCP transfer
# and a second write, on the same two cores). TP_OWNED_KEYS=0 writes fresh
# keys whatever their owner (the pushes included).
_OWNED = os.environ.get("TP_OWNED_KEYS", "1") != "0"

# TP_REGISTER=0: tidepool's buffers are not registered (see the module
# docstring), even where the sidecar offers the buffer socket.
_REGISTER = os.environ.get("TP_REGISTER", "1") != "0"


# ---------------------------------------------------------------- adapters --

class Tidepool:
    """tidepool through its Python client. One connection per process."""

    def __init__(self, node, args):
        import tidepool

        self.tp = tidepool
        self.c = tidepool.Client(node)
        self.ns = args.ns
        self.bufs = {}  # name -> RegisteredBuffer, or mmap when not registering
        # An older client (TP_CLIENT) has no register_buffer.
        self.register = _REGISTER and hasattr(self.c, "register_buffer") and \
            "buffer_socket" in (self.c.hello().features or ())

    def buffer(self, name, size, fill=False):
        # Page-aligned either way (a registered buffer is a mapping too), as
        # Mooncake's pool buffers and an engine's pinned host memory are: a
        # bytearray's bytes start wherever malloc put them, and on this
        # VM's CPU (AMD EPYC, FSRM) a copy between a page-aligned slot and a
        # buffer 16 bytes past a 64-byte boundary runs at a tenth of memcpy
        # speed (docs/PERFORMANCE.md §7, run 7). The client's close()
        # unregisters and unmaps the registered ones.
        if self.register:
            b = self.c.register_buffer(max(size, 1))
            v = b.view
        else:
            b = mmap.mmap(-1, max(size, 1))
            v = memoryview(b)
        if fill:
            v[:size] = os.urandom(size)
        self.bufs[name] = b
        return v

    def view(self, name, off=0, size=None):
        b = self.bufs[name]
        v = b.view if self.register else memoryview(b)
        return v[off:off + size if size else None]

    def clear(self):
        self.c.clear(self.ns)

    def candidates(self, want):
        # About half of node 1's puts are owned by node 2 and pushed there.
        return want * 5 // 2 + 16

    def put_zc(self, key, name, size):
        self.c.put_from(self.ns, key.encode(), self.view(name, 0, size), verify=_VERIFY_ARG)
        return True

    def get_zc(self, key, name, size):
        return self.c.get_into(self.ns, key.encode(), self.view(name, 0, size), verify=_VERIFY_ARG) == size

    def put(self, key, value):
        self.c.put(self.ns, key.encode(), value)
        return True

    def get(self, key, size):
        v = self.c.get(self.ns, key.encode())
        return v is not None and len(v) == size

    def batch_put_zc(self, keys, name, size):
        items = [(k.encode(), self.view(name, i * size, size)) for i, k in enumerate(keys)]
        codes = self.c.batch_put_from(self.ns, items, verify=_VERIFY_ARG)
        return sum(1 for c in codes if c in (self.tp.OK, self.tp.ErrorCode.EXISTS))

    def batch_get_zc(self, keys, name, size):
        bufs = [self.view(name, i * size, size) for i in range(len(keys))]
        return sum(1 for n in self.c.batch_get_into(self.ns, [k.encode() for k in keys], bufs, verify=_VERIFY_ARG)
                   if n == size)

    def prefix(self, keys):
        return self.c.lookup(self.ns, [k.encode() for k in keys])

    def not_local(self, keys):
        """The keys this node does not hold itself (it would fetch them)."""
        ps = self.c.batch_exists(self.ns, [k.encode() for k in keys], scope=self.tp.Scope.LOCAL)
        return [k for k, p in zip(keys, ps) if not p.present]

    def close(self):
        self.c.close()


# Mooncake's ErrorCode::OBJECT_ALREADY_EXISTS (mooncake-store/include/types.h):
# a put of a key the store already holds; counted as a success, as tidepool's
# EXISTS is.
MC_OBJECT_ALREADY_EXISTS = -705


class Mooncake:
    """Mooncake Store through a dummy client attached to a real client
    (--mc-mode dummy: the standalone store, the sidecar shape)."""

    def __init__(self, node, args):
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig

        self.s = MooncakeDistributedStore()
        pool = args.mc_pool_mib * MIB
        rc = self.s.setup_dummy(pool, args.mc_local_buffer_mib * MIB, node)
        if rc != 0:
            raise RuntimeError("mooncake setup_dummy(%s) = %d" % (node, rc))
        self.cfg = ReplicateConfig()
        self.cfg.replica_num = 1
        if args.mc_segment and args.placement == "own":
            # Write into this node's own segment, as tidepool stores a put
            # on the node it came through.
            self.cfg.preferred_segment = args.mc_segment
        self.pool_used = 0
        self.pool = pool
        self.ptrs = {}

    def buffer(self, name, size, fill=False):
        ptr = self.s.alloc_from_mem_pool(size)
        if not ptr:
            raise RuntimeError("mooncake alloc_from_mem_pool(%d) failed" % size)
        rc = self.s.register_buffer(ptr, size)
        if rc != 0:
            raise RuntimeError("mooncake register_buffer = %d" % rc)
        if fill:
            ctypes.memmove(ptr, os.urandom(size), size)
        self.ptrs[name] = ptr
        return ptr

    def clear(self):
        self.s.remove_all(True)

    def candidates(self, want):
        return want

    def put_zc(self, key, name, size):
        return self.s.put_from(key, self.ptrs[name], size, self.cfg) in (0, MC_OBJECT_ALREADY_EXISTS)

    def get_zc(self, key, name, size):
        return self.s.get_into(key, self.ptrs[name], size) == size

    def put(self, key, value):
        return self.s.put(key, value, self.cfg) in (0, MC_OBJECT_ALREADY_EXISTS)

    def get(self, key, size):
        return len(self.s.get(key)) == size

    def batch_put_zc(self, keys, name, size):
        base = self.ptrs[name]
        rs = self.s.batch_put_from(keys, [base + i * size for i in range(len(keys))], [size] * len(keys), self.cfg)
        return sum(1 for r in rs if r in (0, MC_OBJECT_ALREADY_EXISTS))

    def batch_get_zc(self, keys, name, size):
        base = self.ptrs[name]
        rs = self.s.batch_get_into(keys, [base + i * size for i in range(len(keys))], [size] * len(keys))
        return sum(1 for r in rs if r == size)

    def prefix(self, keys):
        n = 0
        for e in self.s.batch_is_exist(keys):
            if e != 1:
                break
            n += 1
        return n

    def not_local(self, keys):
        return list(keys)  # written into node 1's segment (preferred_segment)

    def close(self):
        self.s.close()


# One embedded store per process (--mc-mode embedded), shared by the
# threads of a run as an engine's workers share it.
_EMBEDDED = None
_EMBEDDED_LOCK = threading.RLock()  # warm_segment re-enters through MooncakeEmbedded


def embedded_store(args, segment_bytes):
    """This process's Mooncake Store, set up on first use the way vLLM's
    Mooncake store connector sets it up by default: setup() in the engine
    process, which mounts its own segment (global_segment_size) and runs the
    transfer engine in-process. Before it is used, the whole segment is
    written once and emptied (warm): the segment is allocated without
    pre-faulting, and tidepool's arenas are reserved and faulted in before
    its timing starts."""
    global _EMBEDDED
    with _EMBEDDED_LOCK:
        if _EMBEDDED is None:
            from mooncake.store import MooncakeDistributedStore

            s = MooncakeDistributedStore()
            rc = s.setup("127.0.0.1", args.mc_metadata, segment_bytes, args.mc_local_buffer_mib * MIB,
                         "tcp", "", args.mc_master)
            if rc != 0:
                raise RuntimeError("mooncake setup(master %s) = %d" % (args.mc_master, rc))
            _EMBEDDED = s
            w = MooncakeEmbedded(args)
            warm_segment(w, segment_bytes)
            w.close()
        return _EMBEDDED


def warm_segment(c, segment_bytes):
    """Writes 1 MiB values into c's own segment until it is full (or a put
    fails), then removes them all: every page of the segment faulted in
    before the first timed round. Returns the MiB written."""
    c.buffer("warm-fill", MIB, fill=True)
    keys = []
    for i in range(max(segment_bytes // MIB, 1)):
        k = "warm-fill-%d-%d" % (os.getpid(), i)
        if not c.put_zc(k, "warm-fill", MIB):
            break
        keys.append(k)
    # Its own keys only: another process's values may be in the store.
    for k in keys:
        c.s.remove(k)
    return len(keys)


class MooncakeEmbedded(Mooncake):
    """Mooncake Store embedded in this process (--mc-mode embedded, setup()).
    Every adapter of a process shares its one store; buffers are page-aligned
    mappings registered with it (register_buffer), as an engine registers
    its KV cache memory."""

    def __init__(self, args, segment_bytes=None):
        from mooncake.store import ReplicateConfig

        self.s = embedded_store(args, segment_bytes or args.mc_segment_mib * MIB)
        self.cfg = ReplicateConfig()
        self.cfg.replica_num = 1
        if args.placement == "own":
            self.cfg.preferred_segment = self.s.get_hostname()
        self.ptrs, self.maps = {}, {}

    def buffer(self, name, size, fill=False):
        m = mmap.mmap(-1, max(size, 1))
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        rc = self.s.register_buffer(ptr, max(size, 1))
        if rc != 0:
            raise RuntimeError("mooncake register_buffer = %d" % rc)
        if fill:
            m[:size] = os.urandom(size)
        self.ptrs[name], self.maps[name] = ptr, m
        return ptr

    def close(self):
        # The store is the process's; this adapter's buffers are its own.
        # Unregistered before its mapping goes: the transfer engine refuses
        # a registration that overlaps one it still has.
        for name, ptr in self.ptrs.items():
            self.s.unregister_buffer(ptr)
        self.ptrs = {}


def embedded(args):
    return args.system == "mooncake" and args.mc_mode == "embedded"


def connect(args, node, segment=None):
    """A client of one node, warmed up: one miss read before any timing
    (tidepool's client maps the arena files on its first zero-copy call, or
    with registered buffers has opened its buffer socket in buffer();
    Mooncake's dummy client set up its shared memory in setup_dummy), and
    for tidepool's zero-copy puts prepare_writes()."""
    if args.system == "tidepool":
        c = Tidepool(node, args)
    elif embedded(args):
        c = MooncakeEmbedded(args)
    else:
        args.mc_segment = segment
        c = Mooncake(node, args)
    c.buffer("warm", 4096)
    c.get_zc("warm-up-miss-%d" % os.getpid(), "warm", 4096)
    if args.system == "tidepool" and args.workload in ("put-zc", "batch-put") and hasattr(c.c, "prepare_writes"):
        # What an engine does once at start: fault in the arenas' keyed
        # mappings, rather than at this process's first write to each page
        # (the sidecar's own pages, as Mooncake's segment is its client's).
        c.c.prepare_writes()
    return c


# --------------------------------------------------------------- workloads --

def w_put_get(args, wid, ready, q, keys=None):
    """put-zc, get-zc, put, get: a loop of one op for args.duration."""
    size, wl = args.size, args.workload
    c = connect(args, args.node1, args.seg1)
    c.buffer("b", size, fill=True)
    value = os.urandom(size)
    nget = args.keys
    mine = keys[wid::args.conc] if keys else []
    exhausted = 0
    if wl.startswith("get") and wid == 0:
        for i in range(nget):
            c.put_zc("%s-g%d" % (args.prefix, i), "b", size)
    ready.wait()
    ok = fail = i = 0
    lat = []
    t0 = time.perf_counter()
    end = t0 + args.duration
    while True:
        s = time.perf_counter()
        if s >= end:
            break
        if wl in ("put-zc", "put"):
            if i < len(mine):
                k = mine[i]
            else:
                k = "%s-p%d-%d" % (args.prefix, wid, i)
                exhausted += 1 if keys else 0
            r = c.put_zc(k, "b", size) if wl == "put-zc" else c.put(k, value)
        elif wl == "get-zc":
            r = c.get_zc("%s-g%d" % (args.prefix, (wid * 7 + i) % nget), "b", size)
        else:
            r = c.get("%s-g%d" % (args.prefix, (wid * 7 + i) % nget), size)
        lat.append(time.perf_counter() - s)
        i += 1
        if r:
            ok += 1
        else:
            fail += 1
    t1 = time.perf_counter()
    c.close()
    q.put({"ok": ok, "fail": fail, "bytes": ok * size, "t0": t0, "t1": t1, "lat": lat, "exhausted": exhausted})


def w_remote(args, wid, ready, q, keys):
    """remote-get: each worker reads its share of keys once via node 2."""
    size = args.size
    c = connect(args, args.node2, args.seg2)
    c.buffer("b", size)
    mine = keys[wid::args.conc]
    ready.wait()
    ok = fail = 0
    lat = []
    t0 = time.perf_counter()
    for k in mine:
        s = time.perf_counter()
        if c.get_zc(k, "b", size):
            ok += 1
        else:
            fail += 1
        lat.append(time.perf_counter() - s)
    t1 = time.perf_counter()
    c.close()
    q.put({"ok": ok, "fail": fail, "bytes": ok * size, "t0": t0, "t1": t1, "lat": lat})


def w_batch(args, wid, ready, q, keys=None):
    """batch-put / batch-get: 64 x 64 KiB per call."""
    n, size, wl = args.batch, args.size, args.workload
    c = connect(args, args.node1, args.seg1)
    c.buffer("b", n * size, fill=True)
    gkeys = ["%s-bg%d" % (args.prefix, i) for i in range(n)]
    mine = keys[wid::args.conc] if keys else []
    exhausted = 0
    if wl == "batch-get" and wid == 0:
        c.batch_put_zc(gkeys, "b", size)
    ready.wait()
    ok = fail = i = 0
    lat = []
    t0 = time.perf_counter()
    end = t0 + args.duration
    while True:
        s = time.perf_counter()
        if s >= end:
            break
        if wl == "batch-put":
            ks = mine[i * n:(i + 1) * n]
            if len(ks) < n:
                ks = ["%s-bp%d-%d-%d" % (args.prefix, wid, i, j) for j in range(n)]
                exhausted += n if keys else 0
            got = c.batch_put_zc(ks, "b", size)
        else:
            got = c.batch_get_zc(gkeys, "b", size)
        lat.append(time.perf_counter() - s)
        i += 1
        ok += got
        fail += n - got
    t1 = time.perf_counter()
    c.close()
    q.put({"ok": ok, "fail": fail, "bytes": ok * size, "t0": t0, "t1": t1, "lat": lat, "exhausted": exhausted})


def w_lookup(args, wid, ready, q, keys=None):
    """lookup: the prefix of 256 present keys, one call at a time."""
    n = args.batch
    c = connect(args, args.node1, args.seg1)
    c.buffer("b", n * args.size, fill=True)
    ks = ["%s-l%d" % (args.prefix, i) for i in range(n)]
    if wid == 0:
        # --lookup-via other: the keys are written through node 2 and looked
        # up through node 1 (tidepool: node 1 holds only those it owns;
        # Mooncake: they sit in node 2's segment).
        w = connect(args, args.node2, args.seg2) if args.lookup_via == "other" else c
        if w is not c:
            w.buffer("b", n * args.size, fill=True)
        for j in range(0, n, 64):
            w.batch_put_zc(ks[j:j + 64], "b", args.size)
        if w is not c:
            w.close()
        deadline = time.time() + 10  # tidepool pushes to owners (milliseconds)
        while c.prefix(ks) < n and time.time() < deadline:
            time.sleep(0.05)
    ready.wait()
    ok = fail = 0
    matched = n
    lat = []
    t0 = time.perf_counter()
    end = t0 + args.duration
    while True:
        s = time.perf_counter()
        if s >= end:
            break
        m = c.prefix(ks)
        lat.append(time.perf_counter() - s)
        matched = min(matched, m)
        if m == n:
            ok += 1
        else:
            fail += 1
    t1 = time.perf_counter()
    c.close()
    q.put({"ok": ok, "fail": fail, "bytes": 0, "t0": t0, "t1": t1, "lat": lat, "matched": matched})


def prepare_remote(args):
    """Writes fresh values through node 1 and returns the keys node 2 must
    fetch from elsewhere (for tidepool: node 2 neither owns nor holds them)."""
    if embedded(args):
        return _REMOTE_WRITER.write(args.prefix, args.keys)
    size = args.size
    w = connect(args, args.node1, args.seg1)
    w.buffer("b", size, fill=True)
    want = args.keys
    cand = ["%s-r%d" % (args.prefix, i) for i in range(w.candidates(want))]
    for k in cand:
        w.put_zc(k, "b", size)
    w.close()
    r = connect(args, args.node2, args.seg2)
    # tidepool pushes a put to its owner (milliseconds); wait until what
    # node 2 holds stops changing, then keep the keys it does not hold.
    deadline, last, stable = time.time() + 10, None, 0
    while time.time() < deadline:
        nl = r.not_local(cand)
        if nl == last:
            stable += 1
            if stable >= 2:
                break
        else:
            stable = 0
        last = nl
        time.sleep(0.2)
    r.close()
    keys = last[:want]
    if len(keys) < want:
        raise RuntimeError("only %d of %d keys are remote from node 2" % (len(keys), want))
    return keys


def owned_keys(args):
    """tidepool: fresh keys that node 1 owns (the local put rows write
    these; see _OWNED). Candidates are put through node 1 as 1-byte values;
    node 1 pushes those node 2 owns to node 2; once what node 2 holds stops
    changing, the keys it does not hold are node 1's. Then both are
    cleared. Enough for well above the fastest rates seen here (3 GiB/s,
    at most 16000 keys a second) for the whole run; a worker that runs out
    writes fresh keys and says so (exhausted in the output)."""
    per_s = min(3 * 1024 * MIB // args.size, 16000)
    want = int(per_s * args.duration) + 256
    cand = ["%s-o%d" % (args.prefix, i) for i in range(2 * want)]
    w = connect(args, args.node1, args.seg1)
    for j in range(0, len(cand), 256):
        w.c.batch_put(w.ns, [(k.encode(), b"x") for k in cand[j:j + 256]])
    r = connect(args, args.node2, args.seg2)
    deadline, last, stable = time.time() + 20, None, 0
    while time.time() < deadline:
        held = set()
        for j in range(0, len(cand), 256):
            part = cand[j:j + 256]
            held.update(k for k, p in zip(part, r.c.batch_exists(r.ns, [k.encode() for k in part],
                                                                  scope=r.tp.Scope.LOCAL)) if p.present)
        if held == last:
            stable += 1
            if stable >= 2:
                break
        else:
            stable = 0
        last = held
        time.sleep(0.2)
    r.close()
    w.clear()
    w.close()
    return [k for k in cand if k not in last]


WORKERS = {"put-zc": w_put_get, "get-zc": w_put_get, "put": w_put_get, "get": w_put_get,
           "remote-get": w_remote, "batch-put": w_batch, "batch-get": w_batch, "lookup": w_lookup}


def warm(args):
    """--workload warm: fills node 1's segment (a real client's) once and
    empties it, untimed (see warm_segment); the script runs it for each real
    client before the first round."""
    c = connect(args, args.node1, args.seg1)
    n = warm_segment(c, args.mc_segment_mib * MIB)
    c.close()
    return {"system": args.system, "workload": "warm", "mib_written": n}


def _clear(args):
    c = connect(args, args.node1, args.seg1)
    c.clear()
    c.close()


class _Threads:
    """measure_once's context for the embedded mode: threads of this
    process in place of forked processes."""
    Barrier = threading.Barrier
    Queue = queue.Queue

    def Process(self, target, args):
        return threading.Thread(target=target, args=args)


def _in_child(ctx, fn, args):
    """Runs fn(args) in a forked process and returns its result: the parent
    never opens a client itself (Mooncake's dummy client does not survive a
    fork of a process that has one). Embedded mode: in this process."""
    if isinstance(ctx, _Threads):
        return fn(args)
    q = ctx.Queue()

    def body():
        try:
            q.put(("ok", fn(args)))
        except BaseException as e:  # reported by the parent
            q.put(("error", "%s: %s" % (type(e).__name__, e)))

    p = ctx.Process(target=body)
    p.start()
    kind, val = q.get(timeout=600)
    p.join()
    if kind == "error":
        raise RuntimeError(val)
    return val


def _worker(fn, args, wid, ready, q, keys):
    try:
        fn(args, wid, ready, q, keys)
    except BaseException as e:
        ready.abort()
        q.put({"error": "worker %d: %s: %s" % (wid, type(e).__name__, e)})


class RemoteWriter:
    """Embedded remote-get: node 1 is a second process with its own embedded
    store (its segment holds the values, NODE_CAPACITY); this process's
    store is node 2 and reads them from that segment over Mooncake's TCP
    transport. Forked before this process sets up its own store."""

    def __init__(self, args):
        ctx = mp.get_context("fork")
        self.conn, theirs = ctx.Pipe()
        self.p = ctx.Process(target=self._serve, args=(args, theirs))
        self.p.start()
        kind, val = self.conn.recv()
        if kind != "ok":
            raise RuntimeError("remote writer: %s" % val)

    @staticmethod
    def _serve(args, conn):
        try:
            w = MooncakeEmbedded(args, args.mc_segment_mib * MIB)
            w.buffer("b", args.size, fill=True)
            conn.send(("ok", None))
            while True:
                cmd = conn.recv()
                if cmd is None:
                    break
                prefix, n = cmd
                w.s.remove_all(True)
                keys = ["%s-r%d" % (prefix, i) for i in range(n)]
                bad = sum(1 for k in keys if not w.put_zc(k, "b", args.size))
                conn.send(("ok", keys) if not bad else ("error", "%d of %d puts failed" % (bad, n)))
            w.s.remove_all(True)
            w.s.close()
        except BaseException as e:
            conn.send(("error", "%s: %s" % (type(e).__name__, e)))

    def write(self, prefix, n):
        self.conn.send((prefix, n))
        kind, val = self.conn.recv()
        if kind != "ok":
            raise RuntimeError("remote writer: %s" % val)
        return val

    def close(self):
        self.conn.send(None)
        self.p.join(60)


_REMOTE_WRITER = None


def measure(args):
    global _REMOTE_WRITER
    if embedded(args) and args.workload == "remote-get":
        _REMOTE_WRITER = RemoteWriter(args)
        try:
            # This process reads; its own segment only needs the minimum.
            args.mc_segment_mib, seg = 16, args.mc_segment_mib
            return _measure(args)
        finally:
            args.mc_segment_mib = seg
            _REMOTE_WRITER.close()
    return _measure(args)


def _measure(args):
    if args.workload != "remote-get" or args.passes <= 1:
        return measure_once(args)
    # remote-get reads each fresh key once, so one pass is as long as the
    # keys that fit in node 1 take to read (a tenth of a second or two):
    # several passes, each on freshly written keys, make one figure out of
    # their reads alone (bytes over the sum of the passes' read times).
    base, outs = args.prefix, []
    for i in range(args.passes):
        args.prefix = "%s-x%d" % (base, i)
        outs.append(measure_once(args, keep_lat=True))
    args.prefix = base
    secs = sum(o["seconds"] for o in outs)
    lat = sorted(x for o in outs for x in o.pop("lat"))
    out = dict(outs[0], ok=sum(o["ok"] for o in outs), fail=sum(o["fail"] for o in outs),
               seconds=round(secs, 3), passes=len(outs),
               pass_values=[o["value"] for o in outs],
               p50_us=round(lat[len(lat) // 2] * 1e6, 1) if lat else 0.0)
    out["value"] = round(sum(o["bytes"] for o in outs) / secs / MIB, 1) if secs > 0 else 0.0
    del out["bytes"]
    return out


def measure_once(args, keep_lat=False):
    ctx = mp.get_context("fork")
    keys = None
    if embedded(args):
        # One process, one store, args.conc threads sharing it (the
        # Python calls of Mooncake's store release the GIL).
        ctx = _Threads()
    if args.workload in ("put-zc", "put", "batch-put") or (args.workload == "remote-get" and not embedded(args)):
        _in_child(ctx, _clear, args)  # fresh capacity for every put run
    if args.workload == "remote-get":
        keys = _in_child(ctx, prepare_remote, args)
    elif args.system == "tidepool" and _OWNED and args.placement == "own" and args.node2 and \
            args.workload in ("put-zc", "put", "batch-put"):
        keys = _in_child(ctx, owned_keys, args)
    ready = ctx.Barrier(args.conc + 1)
    q = ctx.Queue()
    ps = [ctx.Process(target=_worker, args=(WORKERS[args.workload], args, w, ready, q, keys))
          for w in range(args.conc)]
    for p in ps:
        p.start()
    try:
        ready.wait(timeout=300)
    except threading.BrokenBarrierError:
        pass
    rs = [q.get(timeout=args.duration + 300) for _ in ps]
    for p in ps:
        p.join()
    errs = [r["error"] for r in rs if "error" in r]
    if errs:
        raise SystemExit("driver: %s %s failed: %s" % (args.system, args.workload, "; ".join(errs)))
    t0, t1 = min(r["t0"] for r in rs), max(r["t1"] for r in rs)
    ok, fail = sum(r["ok"] for r in rs), sum(r["fail"] for r in rs)
    lat = sorted(x for r in rs for x in r["lat"])
    p50 = lat[len(lat) // 2] * 1e6 if lat else 0.0
    p99 = lat[min(len(lat) - 1, len(lat) * 99 // 100)] * 1e6 if lat else 0.0
    out = {"system": args.system, "workload": args.workload, "conc": args.conc, "ok": ok, "fail": fail,
           "seconds": t1 - t0, "p50_us": round(p50, 1), "p99_us": round(p99, 1), "calls": len(lat)}
    if keep_lat:
        out.update(lat=lat, bytes=sum(r["bytes"] for r in rs))
    if keys is not None and args.workload != "remote-get":
        out.update(owned_keys=len(keys), exhausted=sum(r.get("exhausted", 0) for r in rs))
    if args.workload == "lookup":
        # The shortest prefix answered (a failed lookup answered less than all).
        out.update(value=round(p50, 1), unit="us p50", better="lower", matched_min=min(r["matched"] for r in rs))
    else:
        out.update(value=round(sum(r["bytes"] for r in rs) / (t1 - t0) / MIB, 1), unit="MiB/s", better="higher")
    if args.workload in ("put-zc", "put", "batch-put"):
        _in_child(ctx, _clear, args)
    if not keep_lat:
        out["seconds"] = round(out["seconds"], 3)
    return out


# ------------------------------------------------------------------ replay --

def replay(args):
    """The conversation trace through two Mooncake nodes the way a
    connector uses the store, as `tidepool replay` does (internal/replay):
    requests in order, round-robin over the nodes; per request batch_is_exist
    of the request's chained block keys, the leading present run counts as
    hits and is read (batch_get_into), the rest is put (batch_put_from).
    Hit rate = hit blocks / all blocks."""
    from tidepool.keys import block_key

    size = args.size
    nodes = []
    for addr in (args.node1, args.node2):
        args.mc_segment = None  # Mooncake's own placement, as a connector leaves it
        m = Mooncake(addr, args)
        m.buffer("b", 256 * size, fill=True)
        nodes.append(m)
    reqs = []
    with open(args.trace) as f:
        for line in f:
            if line.strip():
                reqs.append(json.loads(line)["hash_ids"])
            if args.requests and len(reqs) >= args.requests:
                break
    blocks = hits = looked = failed = 0
    t0 = time.time()
    for i, ids in enumerate(reqs):
        keys, parent = [], None
        for h in ids:
            parent = block_key(parent, [h & 0xFFFFFFFF] + ([h >> 32] if h >> 32 else []))
            keys.append(parent.hex())
        n = nodes[i % len(nodes)]
        hit = n.prefix(keys)
        blocks += len(keys)
        looked += hit
        # A hit is a block read back whole (a block evicted between the
        # lookup and the read is no hit), as for tidepool's figure.
        for j in range(0, hit, 256):
            hits += n.batch_get_zc(keys[j:min(hit, j + 256)], "b", size)
        for j in range(hit, len(keys), 256):
            part = keys[j:j + 256]
            failed += len(part) - n.batch_put_zc(part, "b", size)
    for n in nodes:
        n.close()
    return {"system": "mooncake", "workload": "replay", "requests": len(reqs), "blocks": blocks,
            "hit_blocks": hits, "looked_up_hits": looked, "failed_puts": failed, "seconds": round(time.time() - t0, 2),
            "value": round(hits / blocks, 4) if blocks else 0.0, "unit": "hit rate", "better": "higher"}


def main():
    global _VERIFY_ARG
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--system", choices=("tidepool", "mooncake"), required=True)
    ap.add_argument("--workload", choices=sorted(WORKERS) + ["replay", "warm"], required=True)
    ap.add_argument("--node1", required=True, help="tidepool: socket; mooncake: real client host:port")
    ap.add_argument("--node2", default="")
    ap.add_argument("--seg1", default="", help="mooncake: node 1's segment name")
    ap.add_argument("--seg2", default="")
    ap.add_argument("--conc", type=int, default=1)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--size", type=int, default=MIB)
    ap.add_argument("--keys", type=int, default=64, help="get: prefilled keys; remote-get: keys read per pass")
    ap.add_argument("--passes", type=int, default=1,
                    help="remote-get: passes, each on freshly written keys; the figure is their bytes over their read time")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prefix", default="k%d" % os.getpid())
    ap.add_argument("--ns", default="vsmooncake")
    ap.add_argument("--trace", default="")
    ap.add_argument("--requests", type=int, default=0)
    ap.add_argument("--mc-pool-mib", type=int, default=8)
    ap.add_argument("--mc-local-buffer-mib", type=int, default=64,
                    help="mooncake: local buffer of the dummy client or the embedded store")
    ap.add_argument("--mc-mode", choices=("dummy", "embedded"), default="dummy",
                    help="mooncake: dummy client of a real client (setup_dummy), or the store in this process (setup)")
    ap.add_argument("--mc-master", default="", help="mooncake embedded: the master's host:port")
    ap.add_argument("--mc-metadata", default="", help="mooncake embedded: the metadata server's URL")
    ap.add_argument("--mc-segment-mib", type=int, default=1024,
                    help="mooncake: the segment to warm (warm), or the embedded store's segment")
    ap.add_argument("--placement", choices=("own", "default"), default="own",
                    help="own: puts stay on the node they came through (tidepool: keys it owns; Mooncake: "
                         "preferred_segment); default: each system's own placement")
    ap.add_argument("--lookup-via", choices=("same", "other"), default="same",
                    help="lookup: keys written through the node looked up (same) or through node 2 (other)")
    ap.add_argument("--integrity", action="store_true",
                    help="tidepool: verify=True on zero-copy calls; Mooncake: MOONCAKE_STORE_CHECKSUM=1")
    args = ap.parse_args()
    args.mc_segment = None
    if args.integrity:
        _VERIFY_ARG = True
        os.environ["MOONCAKE_STORE_CHECKSUM"] = "1"  # before any store is created
    if args.workload == "replay":
        out = replay(args)
    elif args.workload == "warm":
        out = warm(args)
    else:
        out = measure(args)
    if _EMBEDDED is not None:
        _EMBEDDED.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
