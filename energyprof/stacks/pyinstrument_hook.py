"""pyinstrument's C stack sampler as a subscriber (its profile hook, as its Profiler uses it).

Precise and async-aware, but the hook runs on every Python call and only sees the thread
that started it: energy of other threads is charged to the main thread's stack.
`subscribe` is not documented API; pyinstrument is pinned to 5.x and tests cover it.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ..recording import Frame, Sample, StackTable
from .frames import SKIP, STOP, frame_kind


class PyinstrumentSampler:
    def __init__(self, table: StackTable, emit: Callable[[Sample], None], interval_s: float, anchor: int = 0) -> None:
        from pyinstrument.stack_sampler import get_stack_sampler

        self.table = table
        self.emit = emit
        self.interval_s = interval_s
        self.anchor = anchor
        self._sampler = get_stack_sampler()
        self._cache: dict[tuple[str, ...], int] = {}
        self._last_t = 0
        self._last_cpu = 0

    def start(self) -> None:
        self._last_t = time.perf_counter_ns()
        self._last_cpu = time.process_time_ns()
        self._sampler.subscribe(self._on_sample, desired_interval=self.interval_s, use_async_context=False)

    def stop(self) -> None:
        try:
            self._sampler.unsubscribe(self._on_sample)
        except Exception:  # already gone (an exception tore the hook down): nothing to undo
            pass

    def _on_sample(self, call_stack: list[str], time_since_last_sample: float, async_state: Any) -> None:
        now = time.perf_counter_ns()
        cpu = time.process_time_ns()
        key = tuple(call_stack)
        sid = self._cache.get(key)
        if sid is None:
            sid = self._cache[key] = self._intern(call_stack)
        self.emit(Sample(self._last_t, now, sid, cpu - self._last_cpu, True))
        self._last_t, self._last_cpu = now, cpu

    def _intern(self, call_stack: list[str]) -> int:
        frames: list[Frame] = []
        for ident in call_stack[1 + self.anchor:]:  # [0] is pyinstrument's <thread> pseudo-frame
            parts = ident.split("\x01")[0].split("\x00")
            function = parts[0] if parts else "?"
            file = parts[1] if len(parts) > 1 else ""
            line = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 0
            kind = frame_kind(file)
            if kind == STOP:
                break
            if kind == SKIP:
                continue
            frames.append((function, file, line))
        return self.table.intern(frames)
