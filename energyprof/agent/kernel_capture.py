"""`--gpu-kernels` inside the program: the PyTorch profiler (Kineto) in this process, its trace
handed to the supervisor (collect/kernels/capture.py reads it).

Loaded only with the flag, in the program's main process, or by the in-process Profiler; torch is
imported when the profiler starts, never at import. The profiler records CPU operators, the
CUDA/ROCm runtime calls and the device records, with Python stacks, from the program's start to
its exit (the whole run: Kineto keeps its records in memory, so a long run pays for them; the
report says so), or over a schedule of steps. At exit each trace is written into the run's spool
folder with the clock pair that ties it to energyprof's clock (perf_counter_ns).
"""

from __future__ import annotations

import atexit
import json
import os
import time
from typing import Any, Callable

TRACE_SUFFIX = ".kineto.json"
CLOCK_SUFFIX = ".kineto-clock.json"


def clock_offset(rounds: int = 64, clock: Callable[[], int] = time.time_ns,
                 reference: Callable[[], int] = time.perf_counter_ns) -> tuple[int, int]:
    """(offset_ns, error_ns) with `clock() ~= reference() + offset_ns`, the error the half-width of
    the narrowest bracket seen: read `reference`, `clock`, `reference`, keep the tightest pair.

    The profiler stamps host events on the system (Unix) clock; energyprof stamps everything on
    perf_counter_ns. Reading both in a bracket bounds the offset by the bracket's width, typically
    well under a microsecond; the GPU's own timestamps are brought to the host clock by CUPTI /
    roctracer, whose error is theirs and is not added here."""
    best: tuple[int, int] | None = None
    for _ in range(max(1, rounds)):
        a = reference()
        c = clock()
        b = reference()
        half = (b - a) // 2
        if best is None or half < best[1]:
            best = (c - (a + half), half)
    assert best is not None
    return best


def _schedule(steps: str) -> tuple[int, int, int]:
    """EVERY:ACTIVE[:WINDOWS] as (every, active, windows; 0 = no limit). The options checked the
    spec before the run (setup/options.py parse_kernel_steps says what is allowed)."""
    nums = [int(p) for p in steps.split(":")]
    return nums[0], nums[1], nums[2] if len(nums) > 2 else 0


class KernelCapture:
    """torch.profiler in this process, its trace written to `folder`: over the process's life, or,
    with `steps` (EVERY:ACTIVE[:WINDOWS]), only over ACTIVE steps of every EVERY, each window its own
    trace with its span on energyprof's clock. The profiler is per thread: it is started and stopped
    where the steps are marked (`step`, called by energyprof.torch.track in the training loop)."""

    def __init__(self, folder: str, activities: Any = None, steps: str | None = None) -> None:
        self.folder = folder
        self.activities = activities
        self.schedule = _schedule(steps) if steps else None
        self.prof: Any = None
        self.path = os.path.join(folder, f"{os.getpid()}{TRACE_SUFFIX}")
        self.steps = 0  # steps marked so far
        self.windows = 0  # windows begun
        self.t_start = 0
        self.live = False

    def _begin(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        acts = self.activities
        if acts is None:
            acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]  # ROCm builds report through the CUDA activity
        self.prof = profile(activities=acts, with_stack=True, record_shapes=False)
        self.t_start = time.perf_counter_ns()
        self.prof.start()

    def start(self) -> None:
        self.live = True
        if self.schedule is None:
            self._begin()
        atexit.register(self.stop)

    def step(self) -> None:
        """A step begins: open or close a window on the schedule (nothing for the whole-run profiler)."""
        if self.schedule is None or not self.live:
            return
        every, active, windows = self.schedule
        n, self.steps = self.steps, self.steps + 1
        if self.prof is not None and n % every == active:
            self._end()
        if self.prof is None and n % every == 0 and (not windows or self.windows < windows):
            self.windows += 1
            self._begin()

    def _end(self) -> str | None:
        prof, self.prof = self.prof, None
        if prof is None:
            return None
        prof.stop()
        t_end = time.perf_counter_ns()
        offset, error = clock_offset()
        path = self.path if self.schedule is None else self.path[: -len(TRACE_SUFFIX)] + f".w{self.windows}{TRACE_SUFFIX}"
        part = path + ".part"
        prof.export_chrome_trace(part)
        os.replace(part, path)
        clock: dict[str, Any] = {"unix_minus_perf_ns": offset, "error_ns": error}
        if self.schedule is not None:
            clock["span_ns"] = [self.t_start, t_end]
        with open(path[: -len(TRACE_SUFFIX)] + CLOCK_SUFFIX, "w", encoding="utf-8") as fh:
            json.dump(clock, fh)
        return path

    def stop(self) -> str | None:
        """Stop and write the (last) trace and its clock pair; the trace's path (None if none was open)."""
        self.live = False
        return self._end()


_capture: KernelCapture | None = None


def start_capture(folder: str, steps: str | None = None) -> KernelCapture:
    """The agent's entry: start the profiler in this process (once)."""
    global _capture
    if _capture is None:
        _capture = KernelCapture(folder, steps=steps)
        _capture.start()
    return _capture


def register(capture: KernelCapture | None) -> None:
    """The in-process Profiler's capture, so that marked steps reach it (None: unset)."""
    global _capture
    _capture = capture


def step() -> None:
    """A training step begins (energyprof.torch.track calls this): the scheduled profiler's cue."""
    if _capture is not None:
        _capture.step()
