#!/usr/bin/env python3
"""The Python client's GPU calls (gpu_register, gpu_save, gpu_load,
gpu_unregister) against a real `tidepool serve` whose CUDA driver is the
TEST-ONLY stand-in cache/gpu/testdata/fakecuda (built here with cc): this
process is the engine, allocates "device memory" through the stand-in and
checks the bytes through its own mapping of it.

    TIDEPOOL_BIN=bin/tidepool python3 clients/python/tests/test_gpu.py
"""

import ctypes
import mmap
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import tidepool  # noqa: E402
from tidepool.client import FEATURE_GPU, ErrorCode  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.environ.get("TIDEPOOL_BIN", os.path.join(ROOT, "bin", "tidepool"))
PIECE, BLOCKS = 4096, 8
HEADER = b"py-gpu-header"


def build_fake(d):
    out = os.path.join(d, "libfakecuda.so")
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-pthread", "-o", out,
                    os.path.join(ROOT, "cache", "gpu", "testdata", "fakecuda", "fakecuda.c")], check=True)
    return out


class Engine:
    """Device memory through the stand-in, as an engine gets it from CUDA."""

    def __init__(self, lib):
        self.cu = ctypes.CDLL(lib)
        self._ok(self.cu.cuInit(0))
        ctx = ctypes.c_void_p()
        self._ok(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0))
        self._ok(self.cu.cuCtxSetCurrent(ctx))

    @staticmethod
    def _ok(r):
        if r != 0:
            raise RuntimeError("CUDA error %d" % r)

    def alloc(self, size):
        p = ctypes.c_ulonglong()
        self._ok(self.cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size)))
        h = ctypes.create_string_buffer(64)
        self._ok(self.cu.cuIpcGetMemHandle(h, p))
        handle = h.raw
        _, pid, fd, n = struct.unpack_from("<8siiQ", handle)
        f = os.open("/proc/%d/fd/%d" % (pid, fd), os.O_RDWR)
        try:
            m = mmap.mmap(f, n)
        finally:
            os.close(f)
        return handle, m


class GPUTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.exists(BIN):
            raise unittest.SkipTest("no tidepool binary at %s (set TIDEPOOL_BIN)" % BIN)
        cls.tmp = tempfile.mkdtemp(prefix="tp-gpu-")
        cls.lib = build_fake(cls.tmp)
        cls.sock = os.path.join(cls.tmp, "tp.sock")
        cls.proc = subprocess.Popen([BIN, "serve", "--socket", cls.sock, "--data-dir", os.path.join(cls.tmp, "data"),
                                     "--arena-dir", os.path.join(cls.tmp, "arenas"), "--dram-capacity", "64MiB",
                                     "--metrics-addr", "", "--log-level", "warn", "--gpu-library", cls.lib],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not os.path.exists(cls.sock):
            if time.monotonic() > deadline or cls.proc.poll() is not None:
                raise RuntimeError("tidepool serve did not start")
            time.sleep(0.02)
        cls.engine = Engine(cls.lib)

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        cls.proc.wait(timeout=30)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_save_load(self):
        c = tidepool.Client(self.sock)
        self.addCleanup(c.close)
        self.assertIn(FEATURE_GPU, c.hello().features)
        handle, mem = self.engine.alloc(PIECE * BLOCKS)
        for i in range(len(mem)):
            mem[i] = (i * 31 + i // PIECE) & 0xFF
        rid, block_bytes = c.gpu_register([(0, b"", handle, 0, PIECE * BLOCKS)], [(0, 0, PIECE, PIECE)], BLOCKS, HEADER)
        self.assertEqual(block_bytes, len(HEADER) + PIECE)
        ns = "py-gpu"
        codes = c.gpu_save(rid, ns, [(s, b"k%d" % s, s) for s in range(4)])
        self.assertEqual(codes, [ErrorCode.OK] * 4)
        for s in range(4):
            self.assertEqual(c.get(ns, b"k%d" % s), HEADER + mem[s * PIECE:(s + 1) * PIECE])
        mem[4 * PIECE:] = bytes(4 * PIECE)
        codes = c.gpu_load(rid, ns, [(4 + s, b"k%d" % s) for s in range(4)] + [(0, b"missing")])
        self.assertEqual(codes, [ErrorCode.OK] * 4 + [ErrorCode.NOT_FOUND])
        self.assertEqual(mem[4 * PIECE:], mem[:4 * PIECE])
        # Hostile: a slot out of range, a registration never made.
        self.assertEqual(c.gpu_save(rid, ns, [(BLOCKS, b"x", 0)]), [ErrorCode.INVALID_ARGUMENT])
        with self.assertRaises(tidepool.Error) as e:
            c.gpu_load(rid + 1000, ns, [(0, b"k0")])
        self.assertEqual(e.exception.code, ErrorCode.INVALID_ARGUMENT)
        c.gpu_unregister(rid)
        with self.assertRaises(tidepool.Error):
            c.gpu_unregister(rid)

    def test_lying_sizes(self):
        c = tidepool.Client(self.sock)
        self.addCleanup(c.close)
        handle, _ = self.engine.alloc(PIECE)
        for buffers, segments in (
                ([(0, b"", handle, 0, PIECE + 1)], [(0, 0, 0, 1)]),   # past the allocation
                ([(0, b"", handle, 0, PIECE)], [(0, 0, PIECE, PIECE)]),  # 2 blocks of a 1-block buffer
                ([(0, b"", handle[:32], 0, PIECE)], [(0, 0, 0, 1)])):  # a short handle
            with self.assertRaises(tidepool.Error) as e:
                c.gpu_register(buffers, segments, 2 if segments[0][2] else 1)
            self.assertEqual(e.exception.code, ErrorCode.INVALID_ARGUMENT)


if __name__ == "__main__":
    unittest.main()
