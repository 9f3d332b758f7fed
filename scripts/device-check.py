"""Run by scripts/device-check.sh on a GPU machine: layer 2 (the sidecar
copies through CUDA IPC) and layer 1 (the engine copies into pinned arenas
on a side stream), 2 MiB blocks, bytes checked, GB/s against torch's
pinned host <-> device copy of the same bytes. Prints the summary for
docs/PERFORMANCE.md."""
import sys
import time

import torch

from tidepool.client import OK, Client
from tidepool.cuda import EngineCopies, SidecarSlots

sock = sys.argv[1]
dev = torch.device("cuda:0")
name = torch.cuda.get_device_name(0)
# vLLM-shaped (FlashAttention) KV: 32 layers of (2, blocks, 16, 8, 128) bf16:
# one block of all layers = 32 * 2 * 16*8*128*2 = 2 MiB.
L, NB = 32, 256
layers = []
for i in range(L):
    t = torch.randn(2, NB, 16, 8, 128, dtype=torch.bfloat16, device=dev)
    layers.append(("layer%d" % i, t, 1, t.select(1, 0).numel() * t.element_size()))
block = sum(x[3] for x in layers)
header = b"tidepool-device-check".ljust(64, b"\0")
n = 128  # blocks per batch

def gbps(nbytes, s):
    return nbytes / s / 1e9

# The limit: pinned host <-> device, torch, same bytes, one copy per block.
host = torch.empty(n * block, dtype=torch.uint8).pin_memory()
devbuf = torch.empty(n * block, dtype=torch.uint8, device=dev)
torch.cuda.synchronize()
t0 = time.perf_counter(); host.copy_(devbuf, non_blocking=True); torch.cuda.synchronize(); d2h = gbps(n * block, time.perf_counter() - t0)
t0 = time.perf_counter(); devbuf.copy_(host, non_blocking=True); torch.cuda.synchronize(); h2d = gbps(n * block, time.perf_counter() - t0)

c = Client(sock)
slots = SidecarSlots(c, layers, NB, header)
assert slots.block_bytes == block + len(header), (slots.block_bytes, block)
keys = [b"dc-%04d" % i for i in range(n)]
torch.cuda.synchronize()
t0 = time.perf_counter(); codes = slots.save("device-check", list(range(n)), keys, 0); save_s = time.perf_counter() - t0
assert all(x == OK for x in codes), codes
want = [torch.cat([x[1].select(1, b).reshape(-1).view(torch.uint8) for x in layers]).cpu() for b in range(n)]
for x in layers:
    x[1][:, NB - n:].zero_()
t0 = time.perf_counter(); got = slots.load("device-check", list(range(NB - n, NB)), keys); load_s = time.perf_counter() - t0
assert got == set(range(n)), len(got)
for b in range(n):
    back = torch.cat([x[1].select(1, NB - n + b).reshape(-1).view(torch.uint8) for x in layers]).cpu()
    assert torch.equal(back, want[b]), "block %d differs after the layer-2 load" % b
slots.close()

# Layer 1: the same blocks through pinned arena memory on a side stream.
arena = torch.empty(n * block, dtype=torch.uint8)
ec = EngineCopies(dev)
view = memoryview(arena.numpy())
ec.pin(view)
after = torch.cuda.Event(); after.record()
t0 = time.perf_counter()
for b in range(n):
    ec.save_block(view, layers, b, b * block, after)
ec.synchronize(); l1_save = time.perf_counter() - t0
t0 = time.perf_counter()
for b in range(n):
    ec.load_block(view, layers, NB - n + b, b * block)
ec.loads_done(); torch.cuda.synchronize(); l1_load = time.perf_counter() - t0
for b in range(n):
    back = torch.cat([x[1].select(1, NB - n + b).reshape(-1).view(torch.uint8) for x in layers]).cpu()
    assert torch.equal(back, want[b]), "block %d differs after the layer-1 load" % b
ec.close()

# Layer 1 as the connector runs it (tidepool.cuda.EngineSlots: Reserve,
# copies from the KV tensors into the sidecar's pinned arena on the side
# stream, Commit; Acquire, copies back, Release), where vLLM is installed
# (EngineSlots reports through tidepool.vllm's counters).
conn_rows = []
try:
    import vllm  # noqa: F401
except ImportError:
    print("device-check: vLLM not installed: the connector's layer-1 path (EngineSlots) not run")
else:
    import threading
    from types import SimpleNamespace

    from tidepool.cuda import EngineSlots

    class _Link:
        def __init__(self, c):
            self.client = c

        def get(self):
            return self.client

        def failed(self, e):
            raise e

    lc = Client(sock)
    conn = SimpleNamespace(_ns="device-check-l1", _layers=layers, _block_bytes=block, _header=lambda: header,
                           _load_link=_Link(lc), _lease_ms=0, _verify=False, _lock=threading.Lock(),
                           _stored=[], _block_size=16)
    es = EngineSlots(dev)
    keys1 = [b"dc1-%04d" % i for i in range(n)]
    tr = SimpleNamespace(keys=keys1, block_ids=list(range(n)), first_index=0, req_id="dc")
    es.mark_saves([tr])
    t0 = time.perf_counter(); es.save(conn, _Link(Client(sock)), tr); s1 = time.perf_counter() - t0
    for x in layers:
        x[1][:, NB - n:].zero_()
    tr2 = SimpleNamespace(keys=keys1, block_ids=list(range(NB - n, NB)), first_index=0, req_id="dc")
    t0 = time.perf_counter(); done = es.load(conn, tr2); l1 = time.perf_counter() - t0
    assert done == set(range(n)), len(done)
    for b in range(n):
        back = torch.cat([x[1].select(1, NB - n + b).reshape(-1).view(torch.uint8) for x in layers]).cpu()
        assert torch.equal(back, want[b]), "block %d differs after the connector's layer-1 load" % b
    es.close()
    conn_rows.append(("layer 1, connector (EngineSlots: Reserve/Commit, Acquire/Release)", s1, l1))

nb = n * block
print("device-check: %s, %d blocks of %d bytes (32 layers x K/V, FlashAttention layout)" % (name, n, block))
print("| path | save GB/s | load GB/s | save / pinned D2H | load / pinned H2D |")
print("| --- | --- | --- | --- | --- |")
print("| pinned cudaMemcpy limit (torch, one copy) | %.1f | %.1f | 1.00 | 1.00 |" % (d2h, h2d))
for label, s, l in [("layer 2 (sidecar, IPC)", save_s, load_s), ("layer 1, copies only (side stream)", l1_save, l1_load)] + conn_rows:
    print("| %s | %.1f | %.1f | %.2f | %.2f |" % (label, gbps(nb, s), gbps(nb, l), gbps(nb, s) / d2h, gbps(nb, l) / h2d))
