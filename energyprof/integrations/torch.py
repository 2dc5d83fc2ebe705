"""PyTorch: CUDA synchronisation, named windows, and a training-loop breakdown per step.

    import energyprof.torch as ept

    for epoch in range(epochs):
        with ept.window("epoch", epoch):
            for x, y in ept.track(loader):      # each step split into data fetch and compute
                ...

Everything here works without a running profile (the loop just runs, and `track` still
times each step) and without CUDA. torch itself is never imported by energyprof: these
functions look for it in `sys.modules`, because a program that has not imported torch has
no CUDA work to wait for, and importing it would cost seconds.

The breakdown. `track(loader)` times, per step, the wait in the loader's `next()` (*fetch*)
and the time from that batch's arrival until the loop asks for the next one (*compute*),
minus any part the loop marked as `preprocess`. The two are contiguous, so
fetch + preprocess + compute is the step's wall time. Each phase is also a profiler window
(`<name>.fetch`, `<name>.preprocess`, `<name>.compute`, index = step number counted across
epochs), so each has its own energy. The *fetch stall* of a step is the figure the
edge-device training studies report: max(fetch + preprocess - compute, 0), the part of the
data pipeline that running it alongside compute would not hide; summed per epoch.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Iterator

from ..analysis.training import breakdown
from ..profiler import Profiler, active_profiler
from .cuda import cuda_sync, gpu_memory

__all__ = ["cuda_sync", "gpu_memory", "window", "track", "TrackedLoader", "StepRecord", "breakdown"]


# -- windows ------------------------------------------------------------------------------
@contextlib.contextmanager
def window(name: str, index: int | None = None, profiler: Profiler | None = None) -> Iterator[None]:
    """`profiler.window(name, index)` on the given or running profiler; a no-op when none runs.

    Lets a training script mark epochs unconditionally and still run without energyprof.
    """
    prof = profiler if profiler is not None else active_profiler()
    if prof is None:
        yield
        return
    with prof.window(name, index):
        yield


# -- the training-loop breakdown -------------------------------------------------------------
@dataclass
class StepRecord:
    """One step as `track` timed it (perf_counter seconds; phases are contiguous)."""

    step: int
    epoch: int  # which pass over the loader (0-based)
    fetch_s: float
    preprocess_s: float
    compute_s: float
    gpu_allocated_bytes: int | None = None
    gpu_peak_bytes: int | None = None  # the allocator's peak during this step

    @property
    def time_s(self) -> float:
        return self.fetch_s + self.preprocess_s + self.compute_s

    @property
    def stall_s(self) -> float:
        return max(self.fetch_s + self.preprocess_s - self.compute_s, 0.0)


class TrackedLoader:
    """An iterable over `loader` that times each step and marks its phases as windows."""

    def __init__(self, loader: Iterable[Any], profiler: Profiler | None = None, name: str = "step",
                 gpu_memory: bool = True) -> None:
        self.loader = loader
        self.name = name
        self._profiler = profiler
        self.gpu_memory = gpu_memory
        self.steps: list[StepRecord] = []
        self.end_waits_s: list[float] = []  # per pass: the final next() that found no more data
        self.passes = 0
        self._next_step = 0
        self._pre_ns = 0
        self._pre_open: int | None = None
        self._current: int | None = None

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, attr: str) -> Any:  # dataset, batch_size, sampler, ... pass through
        if attr == "loader":
            raise AttributeError(attr)
        return getattr(self.loader, attr)

    def _prof(self) -> Profiler | None:
        return self._profiler if self._profiler is not None else active_profiler()

    def __iter__(self) -> Iterator[Any]:
        name, prof = self.name, self._prof()
        epoch = self.passes
        self.passes += 1
        it = iter(self.loader)
        fetch_w, compute_w = f"{name}.fetch", f"{name}.compute"
        t_batch: int | None = None  # when the current batch arrived
        fetch_ns = 0
        step = -1
        try:
            while True:
                t = time.perf_counter_ns()
                if t_batch is not None:
                    arrived, t_batch = t_batch, None
                    self._finish_step(prof, compute_w, step, epoch, fetch_ns, t - arrived)
                step = self._next_step
                if prof is not None:
                    prof.begin_window(fetch_w, step)
                try:
                    batch = next(it)
                except StopIteration:
                    t_end = time.perf_counter_ns()
                    if prof is not None:
                        prof.end_window(fetch_w)
                    self.end_waits_s.append((t_end - t) / 1e9)
                    return
                t_batch = time.perf_counter_ns()
                fetch_ns = t_batch - t
                self._next_step += 1
                self._current, self._pre_ns = step, 0
                if prof is not None:
                    prof.end_window(fetch_w)
                    prof.begin_window(compute_w, step)
                yield batch
        finally:
            # the loop broke out, raised, or the generator was closed: end the open step
            if t_batch is not None:
                self._finish_step(prof, compute_w, step, epoch, fetch_ns, time.perf_counter_ns() - t_batch)
            self._current = None

    def _finish_step(self, prof: Profiler | None, compute_w: str, step: int, epoch: int, fetch_ns: int,
                     since_batch_ns: int) -> None:
        if self._pre_open is not None:  # a preprocess block left open: close it now
            self._pre_ns += time.perf_counter_ns() - self._pre_open
            self._pre_open = None
        if prof is not None:
            prof.end_window(compute_w)
        mem = gpu_memory() if self.gpu_memory else None
        if mem is not None:
            with contextlib.suppress(Exception):
                sys.modules["torch"].cuda.reset_peak_memory_stats()
        pre_ns = min(self._pre_ns, since_batch_ns)
        self.steps.append(StepRecord(
            step=step, epoch=epoch, fetch_s=fetch_ns / 1e9, preprocess_s=pre_ns / 1e9,
            compute_s=(since_batch_ns - pre_ns) / 1e9,
            gpu_allocated_bytes=mem["allocated_bytes"] if mem else None,
            gpu_peak_bytes=mem["peak_bytes"] if mem else None,
        ))
        self._current = None

    @contextlib.contextmanager
    def preprocess(self) -> Iterator[None]:
        """Mark the part of a step that prepares the batch (augmentation, `.to(device)`).

        It is taken out of the step's compute time and counted with fetch in the stall.
        """
        step = self._current
        prof = self._prof()
        if step is None:
            yield
            return
        if prof is not None:
            prof.begin_window(f"{self.name}.preprocess", step)
        t = self._pre_open = time.perf_counter_ns()
        try:
            yield
        finally:
            if self._pre_open is not None:
                self._pre_ns += time.perf_counter_ns() - t
                self._pre_open = None
            if prof is not None:
                prof.end_window(f"{self.name}.preprocess")

    def summary(self) -> dict[str, Any]:
        """Per-pass totals of the timed phases and stall (no energy: see `breakdown`)."""
        by_epoch: dict[int, list[StepRecord]] = {}
        for s in self.steps:
            by_epoch.setdefault(s.epoch, []).append(s)
        epochs = []
        for e, steps in sorted(by_epoch.items()):
            epochs.append({
                "epoch": e, "steps": len(steps),
                "fetch_s": sum(s.fetch_s for s in steps), "preprocess_s": sum(s.preprocess_s for s in steps),
                "compute_s": sum(s.compute_s for s in steps), "stall_s": sum(s.stall_s for s in steps),
                "time_s": sum(s.time_s for s in steps),
            })
        return {"name": self.name, "epochs": epochs,
                "steps": [dict(asdict(s), time_s=s.time_s, stall_s=s.stall_s) for s in self.steps]}


def track(loader: Iterable[Any], profiler: Profiler | None = None, name: str = "step",
          gpu_memory: bool = True) -> TrackedLoader:
    """Wrap a DataLoader (any iterable) so each step is split into fetch and compute.

    `profiler` defaults to the one running when the loop starts (none: timing only).
    With `gpu_memory` and CUDA in use, each step records the allocator's current and peak
    bytes, and resets the peak (`torch.cuda.reset_peak_memory_stats`) so the next step's
    peak is its own.
    """
    return TrackedLoader(loader, profiler, name, gpu_memory)
