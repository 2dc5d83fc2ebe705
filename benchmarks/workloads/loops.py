"""Tight loops, few calls: arithmetic in a handful of long-running Python loops."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import size_arg, timed  # noqa: E402


def work(n: int) -> int:
    acc = 0
    for i in range(n):
        acc = (acc + i * i) % 1_000_003
    j = 0
    while j < n:
        acc ^= j
        j += 3
    return acc


if __name__ == "__main__":
    n = max(1000, int(22_000_000 * size_arg()))
    timed(lambda: work(n))
