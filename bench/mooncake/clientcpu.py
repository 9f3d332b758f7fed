#!/usr/bin/env python3
"""CPU time of the tidepool Python client per call, against a running
sidecar: what the client itself costs, apart from the sidecar and from the
machine's load (process CPU time, not wall time, so it survives a busy
machine better than MiB/s do).

    bench/mooncake/clientcpu.py SOCKET [CLIENT_DIR]

CLIENT_DIR: the clients/python to import (default: this tree's), to compare
two versions of the client one after the other against one sidecar. Prints
one line: per call, client CPU microseconds and wall MiB/s, for inline put
and get of 1 MiB, put_from/get_into of 1 MiB, and batch_put_from /
batch_get_into of 64 x 64 KiB. Writes and then clears the namespace
"clientcpu".
"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "..", "..", "clients", "python"))

import tidepool  # noqa: E402

MIB = 1 << 20


def main():
    c = tidepool.Client(sys.argv[1])
    ns, pre = "clientcpu", os.getpid()
    v = os.urandom(MIB)
    buf = bytearray(MIB)
    small = [os.urandom(64 << 10) for _ in range(64)]
    bb = bytearray(64 << 16)
    views = [memoryview(bb)[i << 16:(i + 1) << 16] for i in range(64)]
    c.put(ns, b"g", v)
    c.batch_put_from(ns, [(b"bg%d" % i, x) for i, x in enumerate(small)])

    def loop(fn, n):
        t0, w0 = time.process_time(), time.perf_counter()
        for i in range(n):
            fn(i)
        return (time.process_time() - t0) / n * 1e6, n / (time.perf_counter() - w0)

    ops = [
        ("put", 1, 200, lambda i: c.put(ns, b"p%d-%d" % (pre, i), v)),
        ("get", 1, 400, lambda i: c.get(ns, b"g")),
        ("put_from", 1, 200, lambda i: c.put_from(ns, b"z%d-%d" % (pre, i), v)),
        ("get_into", 1, 400, lambda i: c.get_into(ns, b"g", buf)),
        ("batch_put_from", 4, 40, lambda i: c.batch_put_from(ns, [(b"b%d-%d-%d" % (pre, i, j), x)
                                                                  for j, x in enumerate(small)])),
        ("batch_get_into", 4, 150, lambda i: c.batch_get_into(ns, [b"bg%d" % j for j in range(64)], views)),
    ]
    out = []
    for name, mib, n, fn in ops:
        cpu, rate = loop(fn, n)
        out.append("%s %.0f us cpu %.0f MiB/s" % (name, cpu, rate * mib))
    c.clear(ns)
    c.close()
    print(" | ".join(out), flush=True)


if __name__ == "__main__":
    main()
