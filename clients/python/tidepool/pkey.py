"""Writes into arena slots through a mapping only the copying thread can
touch: x86 memory protection keys (PKU), as the Go client's WriteKeyed.

A keyed mapping is a read-write MAP_SHARED mapping of an arena whose pages
carry a protection key that denies every thread access. write_all() allows
the calling thread access for its copies (glibc's pkey_set: the WRPKRU
instruction, no system call), copies with memmove (ctypes releases the GIL:
the copy runs on this thread while other Python threads go on), and denies
it again. A stray store of the process into the mapping, from any thread or
at any other time, faults (SIGSEGV), as one into the read-only mapping does.

The key is allocated once per process, at the first keyed mapping (a process
that never puts takes none of its 15). Where the CPU, the kernel or the C
library has no protection keys, or none is free, key() raises Unsupported
and the client writes with pwrite instead. Only x86-64 Linux is tried.

Copying into a keyed mapping with anything that may run on other threads
(torch's copy_ of a large tensor uses its intra-op thread pool) would fault:
only write_all() copies into one.
"""

import ctypes
import mmap
import os
import platform
import threading

PKEY_DISABLE_ACCESS = 1
MADV_POPULATE_WRITE = 23  # madvise(2), Linux >= 5.14 (Python's mmap names it from 3.12 on)
# A keyed mapping is faulted in by chunks of this many bytes, each at the
# first write into it (KeyedMap.populate_for).
_CHUNK = 2 << 20
_PROT_NONE = 0
_PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
_MAP_FAILED = ctypes.c_void_p(-1).value


class Unsupported(Exception):
    """No protection keys here (CPU, kernel, C library, or none free)."""


class _PyBuffer(ctypes.Structure):
    # CPython's Py_buffer (Include/pybuffer.h), for the address of a
    # caller's buffer without a copy, whatever object exports it.
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
        ("strides", ctypes.POINTER(ctypes.c_ssize_t)),
        ("suboffsets", ctypes.POINTER(ctypes.c_ssize_t)),
        ("internal", ctypes.c_void_p),
    ]


_PyObject_GetBuffer = ctypes.pythonapi.PyObject_GetBuffer
_PyObject_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_PyObject_GetBuffer.restype = ctypes.c_int
_PyBuffer_Release = ctypes.pythonapi.PyBuffer_Release
_PyBuffer_Release.argtypes = [ctypes.POINTER(_PyBuffer)]
_PyBuffer_Release.restype = None
_PyBUF_SIMPLE = 0  # contiguous bytes; BufferError otherwise

_lock = threading.Lock()
_libc = None
_key = None  # the process's key, or the Unsupported that said no


def _load():
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise Unsupported("protection keys are only used on x86-64 Linux")
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        fns = {n: getattr(libc, n) for n in ("pkey_alloc", "pkey_mprotect", "pkey_set", "mmap", "munmap", "madvise")}
    except AttributeError as e:
        raise Unsupported("the C library has no protection keys (%s)" % e) from None
    fns["pkey_alloc"].argtypes = [ctypes.c_uint, ctypes.c_uint]
    fns["pkey_mprotect"].argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    fns["pkey_set"].argtypes = [ctypes.c_int, ctypes.c_uint]
    fns["mmap"].argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    fns["mmap"].restype = ctypes.c_void_p
    fns["munmap"].argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fns["madvise"].argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return fns


def key():
    """The process's protection key, allocated (access disabled for every
    thread) at the first call. Raises Unsupported."""
    global _libc, _key
    with _lock:
        if _key is None:
            try:
                _libc = _load()
                k = _libc["pkey_alloc"](0, PKEY_DISABLE_ACCESS)
                if k < 0:
                    e = ctypes.get_errno()
                    raise Unsupported("pkey_alloc: %s" % os.strerror(e))
                _key = k
            except Unsupported as e:
                _key = e
        if isinstance(_key, Unsupported):
            raise _key
        return _key


class KeyedMap:
    """A keyed read-write mapping of size bytes of the file fd from offset
    0. It is PROT_NONE until tagged with the key, so it is never writable
    untagged. Raises Unsupported, or OSError when the mapping fails."""

    def __init__(self, fd, size):
        self.key = key()
        self.size = size
        self.addr = None
        fn = _libc
        addr = fn["mmap"](None, size, _PROT_NONE, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            e = ctypes.get_errno()
            raise OSError(e, "mmap of an arena for keyed writes: %s" % os.strerror(e))
        if fn["pkey_mprotect"](addr, size, _PROT_RW, self.key) != 0:
            e = ctypes.get_errno()
            fn["munmap"](addr, size)
            raise Unsupported("pkey_mprotect: %s" % os.strerror(e))
        self.addr = addr
        # Chunks faulted in (1) or not yet (0); None once the kernel said
        # it cannot (before Linux 5.14: the writes fault page by page).
        self.chunks = bytearray((size + _CHUNK - 1) // _CHUNK)

    def populate_for(self, off, n):
        """Faults in, writable, the chunks of [off, off+n) not faulted in
        yet, one madvise per run of them: a write fault per 4 KiB page
        costs about twice as much as having the kernel fill the page table
        in one call. Call with this thread allowed access (inside a window):
        the kernel checks the caller's access rights as it faults pages in."""
        if self.chunks is None or n <= 0:
            return
        first, last = off // _CHUNK, (off + n - 1) // _CHUNK
        i = first
        while i <= last:
            if self.chunks[i]:
                i += 1
                continue
            j = i
            while j <= last and not self.chunks[j]:
                j += 1
            start, end = i * _CHUNK, min(j * _CHUNK, self.size)
            if _libc["madvise"](self.addr + start, end - start, MADV_POPULATE_WRITE) != 0:
                self.chunks = None  # EINVAL before 5.14; anything else: fault lazily
                return
            self.chunks[i:j] = b"\x01" * (j - i)
            i = j

    def populate(self):
        """Faults every page of the mapping in, writable, now (one system
        call), instead of at the first write to each page. False where the
        kernel cannot (before Linux 5.14)."""
        if self.addr is None:
            raise ValueError("keyed mapping closed")
        setk = _libc["pkey_set"]
        if setk(self.key, 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, "pkey_set: %s" % os.strerror(e))
        try:
            # The kernel checks this thread's access rights as it faults the
            # pages in on its behalf, so the key allows it for the call.
            if _libc["madvise"](self.addr, self.size, MADV_POPULATE_WRITE) != 0:
                return False
            if self.chunks is not None:
                self.chunks[:] = b"\x01" * len(self.chunks)
            return True
        finally:
            setk(self.key, PKEY_DISABLE_ACCESS)

    def close(self):
        if self.addr is not None:
            _libc["munmap"](self.addr, self.size)
            self.addr = None


def write_all(writes):
    """writes: (KeyedMap, offset, data), data any C-contiguous buffer. Copies
    each into its mapping with this thread allowed access for the copies
    alone (the key is the process's: one window for every mapping). Raises
    ValueError for a write past its mapping's end or a closed mapping (and
    copies nothing), BufferError for a buffer that is not contiguous."""
    bufs = []
    try:
        for m, off, data in writes:
            if m.addr is None:
                raise ValueError("keyed mapping closed")
            b = _PyBuffer()
            if _PyObject_GetBuffer(data, ctypes.byref(b), _PyBUF_SIMPLE) != 0:  # pragma: no cover - raises
                raise BufferError("no buffer")
            bufs.append(b)
            if off < 0 or off + b.len > m.size:
                raise ValueError("write of %d bytes at %d past a mapping of %d" % (b.len, off, m.size))
        if not bufs:
            return
        k = writes[0][0].key
        setk = _libc["pkey_set"]
        if setk(k, 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, "pkey_set: %s" % os.strerror(e))
        try:
            for (m, off, _), b in zip(writes, bufs):
                if b.len:
                    m.populate_for(off, b.len)
                    ctypes.memmove(m.addr + off, b.buf, b.len)
        finally:
            setk(k, PKEY_DISABLE_ACCESS)
    finally:
        for b in bufs:
            _PyBuffer_Release(ctypes.byref(b))
