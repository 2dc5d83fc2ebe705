"""Four Python threads doing pure-Python work at once (GIL-bound, like a thread pool)."""

from __future__ import annotations

import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import size_arg, timed  # noqa: E402


def spin(n: int, out: list[int], slot: int) -> None:
    acc = 0
    for i in range(n):
        acc += (i * 7) % 13
    out[slot] = acc


def work(n: int) -> list[int]:
    out = [0] * 4
    threads = [threading.Thread(target=spin, args=(n, out, k), name=f"worker-{k}") for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


if __name__ == "__main__":
    n = max(1000, int(8_000_000 * size_arg()))
    timed(lambda: work(n))
