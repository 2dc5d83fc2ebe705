"""The data pipeline's work, timed inside each DataLoader worker of a tracked loop.

A tracked pass hands the loader a timed collate_fn and worker_init_fn (its own, wrapped): each worker
ships its batch with the time it spent on it, and the loop reads that time and the workers' start-up
off each batch as it arrives. The program's loader and dataset objects are never changed.

A worker's time on a batch is the wall time of its dataset read and collate, plus what it spent since it
shipped its previous batch (putting that batch on the queue, taking the next index): its CPU time there and,
on Linux, the time it was ready to run but kept off the CPU. Only the time it was blocked is left out: waiting
for an index is the loop's pace, not the pipeline's work. On a busy machine the OS holds a worker off between
its batches as well as inside them, and left out, that time showed as a wait the pipeline did not explain.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Callable, NamedTuple


class _TimedBatch(NamedTuple):
    """A batch as a worker ships it to a tracked loop: the batch, the worker's time on it, its id.

    A named tuple, so the loader's pin-memory thread rebuilds it with the batch pinned."""

    batch: Any
    work_s: float | None
    worker: int


_batch_started: list[int] = []  # in a worker: when the current batch's dataset read began
_shipped: list[int] = []  # in a worker: its `_running_ns` as it shipped its last batch
_between: list[int] = []  # in a worker: its `_running_ns` from then until the current batch's read began


def _running_ns() -> int:
    """This thread's CPU time plus, on Linux, the time it was runnable but waiting for a CPU (schedstat's
    run delay): a clock that stands still only while the thread is blocked."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            delay = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        delay = 0
    return time.thread_time_ns() + delay


class _TimedInit:
    """The loader's worker_init_fn, then a timer on the worker's copy of a map-style dataset.

    DataLoader's fetcher reads a batch through `dataset.__getitems__` when the dataset has one
    (an instance attribute counts), so setting it on the worker's own copy times the read
    without touching the program's dataset object."""

    def __init__(self, inner: Callable[[int], Any] | None) -> None:
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        if self.inner is not None:
            self.inner(worker_id)
        info = sys.modules["torch"].utils.data.get_worker_info()
        dataset = getattr(info, "dataset", None)
        if dataset is None or not hasattr(type(dataset), "__getitem__"):
            return  # an iterable-style dataset: its read is not timed (the collate still is)
        original = getattr(dataset, "__getitems__", None)

        def timed_read(indices: Any) -> Any:
            _between[:] = [_running_ns() - _shipped[0]] if _shipped else []
            _batch_started[:] = [time.perf_counter_ns()]
            return original(indices) if original else [dataset[i] for i in indices]

        with contextlib.suppress(AttributeError, TypeError):  # __slots__ or a read-only type
            dataset.__getitems__ = timed_read


class _TimedCollate:
    """The loader's collate_fn, returning the batch with the worker's time on it."""

    def __init__(self, inner: Callable[[Any], Any]) -> None:
        self.inner = inner

    def __call__(self, data: Any) -> Any:
        started = _batch_started.pop() if _batch_started else None
        batch = self.inner(data)
        info = sys.modules["torch"].utils.data.get_worker_info()
        if info is None:  # the main process: nothing to ship
            return batch
        work = (time.perf_counter_ns() - started + sum(_between)) / 1e9 if started is not None else None
        _between.clear()
        _shipped[:] = [_running_ns()]
        return _TimedBatch(batch, work, int(info.id))


def _workers(loader: Any) -> int:
    """The loader's worker count when it is a torch DataLoader, else 0 (the loop loads)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(loader, torch.utils.data.DataLoader):
        return 0
    return int(loader.num_workers or 0)


def _arrival(batch: Any, wait_ns: int, workers: int, started: bool, first: bool, startup_ns: int,
             booted: set[int]) -> tuple[Any, dict[str, Any]]:
    """A batch as it arrives: the program's batch (a timed worker's wrapping taken off) and the step's loading
    facts: workers, start-up (the pass's first batch where it started its workers, or a worker's first batch),
    and the pipeline's time."""
    meta: dict[str, Any] = {"workers": workers, "startup": bool(first and started and workers),
                            "startup_s": startup_ns / 1e9 if first and started and workers else 0.0}
    if type(batch) is _TimedBatch:
        batch, meta["pipeline_s"], meta["worker"] = batch
        # each new worker's first batch waits for that worker to boot: start-up too
        meta["startup"] = started and meta["worker"] not in booted
        booted.add(meta["worker"])
    elif not workers:
        meta["pipeline_s"] = wait_ns / 1e9  # loading happens inside next()
    return batch, meta
