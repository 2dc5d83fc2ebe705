"""Shared by every workload: read the size argument, time the work, print one parseable line.

The runner reads `BENCH_SECONDS=<s>` from stdout: the time of the work itself, measured
inside the process, so interpreter and profiler start-up (measured separately) do not blur
the steady-state overhead that the targets are about.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

MARKER = "BENCH_SECONDS="
CPU_MARKER = "BENCH_CPU_SECONDS="


def size_arg(default: float = 1.0) -> float:
    """The scale factor: 1.0 is about 1-2 s on a current x86 core; CI passes 0.05."""
    if len(sys.argv) > 1:
        return float(sys.argv[1])
    return default


def timed(work: Callable[[], object]) -> None:
    t0, c0 = time.perf_counter(), time.process_time()
    work()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"{CPU_MARKER}{cpu:.6f}", flush=True)  # the process's CPU, a profiler's own threads in it included
    print(f"{MARKER}{elapsed:.6f}", flush=True)
