"""Stack samplers: each turns 'what is running now' into `Sample`s on the shared clock.

`threads` (default): a daemon thread reading sys._current_frames(); every Python thread,
no per-call cost. `pyinstrument`: pyinstrument's C profile hook on the main thread; precise
and async-aware, but it runs on every call.
"""

from __future__ import annotations

from typing import Callable, Protocol

from ..probes import OwnClocks
from ..recording import Sample, StackTable

SAMPLERS = ("threads", "pyinstrument")


class Sampler(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


def make_sampler(kind: str, table: StackTable, emit: Callable[[Sample], None], interval_s: float,
                 own: OwnClocks, anchor: int = 0) -> Sampler:
    if kind == "threads":
        from .threads import ThreadSampler

        return ThreadSampler(table, emit, interval_s, own, anchor)
    if kind == "pyinstrument":
        from .pyinstrument_hook import PyinstrumentSampler

        return PyinstrumentSampler(table, emit, interval_s, anchor)
    raise ValueError(f"unknown sampler {kind!r}; choose one of {', '.join(SAMPLERS)}")
