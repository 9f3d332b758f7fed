#!/usr/bin/env python3
"""Offline tests: block keys against protocol/testdata/keys.txt (the vectors
the Go code is tested with) and CRC-32C against known values."""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

import tidepool  # noqa: E402
from tidepool import checksum as crcmod  # noqa: E402


def parse_tokens(s):
    if s == "-":
        return []
    if s.startswith("r0-"):
        return list(range(int(s[3:])))
    return [int(x) for x in s.split(",")]


def parse_hex(s):
    return b"" if s == "-" else bytes.fromhex(s)


class KeysTest(unittest.TestCase):
    def test_vectors(self):
        n = 0
        with open(os.path.join(ROOT, "protocol", "testdata", "keys.txt")) as f:
            for line in f:
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                name, parent, tokens, extra, want = line.split()
                got = tidepool.block_key(parse_hex(parent), parse_tokens(tokens), parse_hex(extra))
                self.assertEqual(got.hex(), want, name)
                n += 1
        self.assertGreater(n, 5)

    def test_chain(self):
        tokens = list(range(10))
        keys = tidepool.chain_keys(tokens, 4)
        self.assertEqual(len(keys), 2)  # the partial block gets no key
        self.assertEqual(keys[0], tidepool.block_key(None, [0, 1, 2, 3]))
        self.assertEqual(keys[1], tidepool.block_key(keys[0], [4, 5, 6, 7]))
        self.assertNotEqual(tidepool.chain_keys(tokens, 4, b"lora:7")[0], keys[0])
        self.assertEqual(tidepool.chain_keys(tokens, 4, None), keys)
        with self.assertRaises(ValueError):
            tidepool.chain_keys(tokens, 0)
        with self.assertRaises(ValueError):
            tidepool.block_key(b"short", [1])

    def test_crc32c(self):
        self.assertEqual(tidepool.crc32c(b"123456789"), 0xE3069283)
        self.assertEqual(tidepool.crc32c(b""), 0)
        self.assertEqual(tidepool.crc32c(bytes(32)), 0x8A9136AA)
        self.assertEqual(crcmod.from_i32(crcmod.to_i32(0xE3069283)), 0xE3069283)
        self.assertLess(crcmod.to_i32(0xE3069283), 0)


class FallbackWarningTest(unittest.TestCase):
    """Without a C CRC-32C module the import says, once, that zero-copy
    reads go unchecked unless verify=True (and that verify=True is slow);
    with one it says nothing."""

    def run_import(self, block):
        import subprocess

        code = (
            "import sys, warnings\n"
            "warnings.simplefilter('default')\n"
            + ("sys.modules['crc32c'] = None; sys.modules['google_crc32c'] = None\n" if block else "")
            + "sys.path.insert(0, %r)\n"
            "import tidepool, tidepool.client, tidepool.checksum\n"
            "import importlib\n"
            "print('FAST', tidepool.checksum.FAST)\n"
        ) % os.path.dirname(HERE)
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)

    def test_warns_once_without_c_module(self):
        r = self.run_import(True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("FAST False", r.stdout)
        self.assertEqual(r.stderr.count("unchecked unless verify=True"), 1, r.stderr)

    def test_silent_with_c_module(self):
        if not crcmod.FAST:
            self.skipTest("no C CRC-32C module on this host")
        r = self.run_import(False)
        self.assertNotIn("unchecked unless verify=True", r.stderr)


if __name__ == "__main__":
    unittest.main()
