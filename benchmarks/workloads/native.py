"""Native work that releases the GIL: zlib and sha256 over multi-megabyte buffers.

The main thread spends almost all its time in C with the GIL released, so a sampling
thread gets the GIL at once; a profile hook sees only a few long calls.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import size_arg, timed  # noqa: E402

CHUNK = 4 * 1024 * 1024


def make_buffer() -> bytes:
    """Half random, half repetitive: zlib has real work to do on both kinds of data."""
    rng = random.Random(7)
    words = [bytes(rng.choices(b"abcdefghij", k=8)) for _ in range(512)]
    text = b" ".join(rng.choices(words, k=CHUNK // 18))
    return (rng.randbytes(CHUNK // 2) + text)[:CHUNK]


def work(rounds: int, buf: bytes) -> int:
    n = 0
    for _ in range(rounds):
        n += len(zlib.compress(buf, 6))
        n += hashlib.sha256(buf).digest()[0]
    return n


if __name__ == "__main__":
    rounds = max(1, round(12 * size_arg()))
    data = make_buffer()
    timed(lambda: work(rounds, data))
