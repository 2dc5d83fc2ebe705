"""The all-threads sampler: a daemon thread that reads sys._current_frames() at a fixed rate.

No per-call cost in the program. Each thread's stack is weighted by that thread's own CPU
time (Linux per-thread clocks); CPU burnt by native threads that run no Python (BLAS,
OpenMP, ...) goes to the main thread's stack, which is the one waiting for them.
"""

from __future__ import annotations

import sys
import threading
import time
from types import CodeType, FrameType
from typing import Callable

from .. import probes
from ..probes import OwnClocks
from ..recording import Frame, Sample, StackTable
from .frames import SKIP, STOP, frame_kind

THREAD_FRAME_PREFIX = "[thread "


class ThreadSampler:
    def __init__(self, table: StackTable, emit: Callable[[Sample], None], interval_s: float,
                 own: OwnClocks, anchor: int = 0) -> None:
        self.table = table
        self.emit = emit
        self.interval_s = interval_s
        self.own = own
        self.own_threads = own.idents
        self.anchor = anchor
        self.main_ident = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sid_cache: dict[tuple[int, ...], int] = {}
        self._codes: dict[int, CodeType] = {}  # keeps code objects alive so ids stay unique
        self._clocks: dict[int, int | None] = {}
        self._last_cpu: dict[int, int] = {}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="energyprof-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    # -- hot path ----------------------------------------------------------------------
    def _run(self) -> None:
        self.own.register_current()
        prev_t = time.perf_counter_ns()
        prev_proc = time.process_time_ns()
        self._thread_cpu_deltas(sys._current_frames())
        wait = self._stop.wait
        interval = self.interval_s
        while not wait(interval):
            now = time.perf_counter_ns()
            frames = sys._current_frames()
            proc = time.process_time_ns()
            deltas = self._thread_cpu_deltas(frames)
            native = proc - prev_proc - sum(deltas.values())
            main_sample = None
            for ident, frame in frames.items():
                if ident in self.own_threads:
                    continue
                sid = self._stack_id(ident, frame)
                cpu = deltas.get(ident, 0)
                if ident == self.main_ident:
                    main_sample = (sid, cpu)
                    continue
                self.emit(Sample(prev_t, now, sid, cpu, False))
            if main_sample is not None:
                self.emit(Sample(prev_t, now, main_sample[0], main_sample[1] + max(0, native), True))
            prev_t, prev_proc = now, proc

    def _thread_cpu_deltas(self, frames: dict[int, FrameType]) -> dict[int, int]:
        """CPU ns each thread (own threads included) burnt since the last tick."""
        out: dict[int, int] = {}
        clocks = self._clocks
        for ident in frames:
            clk = clocks.get(ident, -1)
            if clk == -1:
                clk = clocks[ident] = self._clock_for(ident)
            if clk is None:
                continue
            try:
                now = time.clock_gettime_ns(clk)
            except OSError:
                clocks[ident] = None
                continue
            last = self._last_cpu.get(ident)
            self._last_cpu[ident] = now
            if last is not None:
                out[ident] = now - last
        return out

    @staticmethod
    def _clock_for(ident: int) -> int | None:
        thread = threading._active.get(ident)  # type: ignore[attr-defined]
        native = getattr(thread, "native_id", None)
        if native is None:
            return None
        return probes.thread_clock_id(native)

    def _stack_id(self, ident: int, frame: FrameType) -> int:
        codes: list[CodeType] = []
        f: FrameType | None = frame
        while f is not None:
            codes.append(f.f_code)
            f = f.f_back
        key = (ident == self.main_ident, *map(id, codes))
        sid = self._sid_cache.get(key)  # type: ignore[arg-type]
        if sid is None:
            for c in codes:
                self._codes[id(c)] = c
            sid = self._intern(ident, codes[::-1])
            self._sid_cache[key] = sid  # type: ignore[index]
        return sid

    def _intern(self, ident: int, codes: list[CodeType]) -> int:
        frames: list[Frame] = []
        if ident == self.main_ident:
            codes = codes[self.anchor:]
        else:
            thread = threading._active.get(ident)  # type: ignore[attr-defined]
            frames.append((f"{THREAD_FRAME_PREFIX}{getattr(thread, 'name', ident)}]", "", 0))
        for c in codes:
            kind = frame_kind(c.co_filename)
            if kind == STOP:
                break
            if kind == SKIP:
                continue
            frames.append((getattr(c, "co_qualname", c.co_name), c.co_filename, c.co_firstlineno))
        return self.table.intern(frames)
