"""Call-heavy: naive recursive Fibonacci, about 2.5 million Python calls per second of work.

The worst case for a profile hook (it runs on every call and return); a sampling thread
should not notice the difference between this and a loop.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import size_arg, timed  # noqa: E402


def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def work(reps: int) -> int:
    total = 0
    for _ in range(reps):
        total += fib(25)
    return total


if __name__ == "__main__":
    reps = max(1, round(200 * size_arg()))
    timed(lambda: work(reps))
