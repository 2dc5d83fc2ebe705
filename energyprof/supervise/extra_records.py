"""The spool's records that only some runs write, parsed once a stream holds one: windows, allocations
(memory=exact), spans a process could not write, GPU use, thread groups, I/O at windows' edges, and the GPU
kernels' cycles. records.py hands their lines here.

Every run's records (ticks, samples, frames, stacks, the end) stay in records.py: each NamedTuple class costs
about 60-90 us to make, and an empty run's streams hold none of these twelve (1 ms of every run's start).
"""

# No `from __future__ import annotations`, as records.py: the fields' types are evaluated as written.
from typing import Any, Callable, NamedTuple

from ..agent import wire

_new = tuple.__new__  # as records.py builds its records: without NamedTuple's argument handling


class WindowBegins(NamedTuple):
    t_ns: int
    name: str
    index: int | None


class WindowEnds(NamedTuple):
    t_ns: int
    name: str | None  # None: the innermost open window
    reply: bool  # a Measurement in the program waits for the window's figures
    facts: dict[str, float] | None  # numbers the program measured about the span


class AllocRecord(NamedTuple):
    """memory=exact: bytes still allocated at the end, by the frame that allocated them."""
    function: str
    file: str
    line: int
    size: int


class LostRecord(NamedTuple):
    """The spool could not be written over this span."""
    t0: int
    t1: int
    size: int


class GpuRecord(NamedTuple):
    """The process uses CUDA."""


class ThreadsRecord(NamedTuple):
    """How many threads have run one group's target so far (`[threads: T]`)."""
    sid: int  # the stream's local stack id of the group's node
    count: int


class IoEdgeRecord(NamedTuple):
    """I/O counters read at a window's edge, at the window's time (agent/iostat.py)."""
    t_ns: int
    proc: tuple[int, ...] | None  # the process's /proc/self/io (iostat.PROC_FIELDS); None where unreadable
    disks: dict[str, tuple[int, ...]]  # the disks' /proc/diskstats (iostat.DISK_FIELDS)


class KernelCycle(NamedTuple):
    """GPU kernels: a profiler cycle the program reduced, on energyprof's clock."""
    t0: int
    t1: int
    records: int  # device records it held
    cost_ns: int = 0  # the capture's own CPU so far (charged to energyprof in the program)


class KernelPath(NamedTuple):
    """GPU kernels: a launch path, by the stream's local id."""
    kid: int
    frames: tuple[tuple[str, str, int], ...]  # outermost first


class KernelBusy(NamedTuple):
    """GPU kernels: a path's busy ns on a device per bucket of one cycle (instants shared by k records count 1/k)."""
    kid: int
    device: int
    bucket_ns: int
    busy: dict[int, float]  # bucket index (t // bucket_ns) -> ns


class KernelNames(NamedTuple):
    """GPU kernels: a path's top kernel names in one cycle."""
    kid: int
    device: int
    names: dict[str, tuple[int, float]]  # name -> (count, time ns)


class KernelCounts(NamedTuple):
    """GPU kernels: what a cycle could not place or link, by reason."""
    counts: dict[str, int]


def _window(r: list[str]) -> WindowBegins | WindowEnds:
    if r[1] == "b":
        return WindowBegins(int(r[2]), wire.unesc(r[3]), int(r[4]) if r[4] else None)
    return WindowEnds(int(r[2]), wire.unesc(r[3]) or None, len(r) > 4 and r[4] == "r",
                      wire.window_facts(r[5]) if len(r) > 5 else None)


def _kernel_path(r: list[str]) -> KernelPath:
    r = r[:-1]  # the end mark (wire.complete checked it)
    if (len(r) - 2) % 3:
        raise ValueError("a cut path")
    return KernelPath(int(r[1]), tuple((wire.unesc(r[i]), wire.unesc(r[i + 1]), int(r[i + 2])) for i in range(2, len(r), 3)))


def _kernel_busy(r: list[str]) -> KernelBusy:
    busy = {}
    for pair in r[4].split(",") if r[4] else ():
        b, _, ns = pair.partition(":")
        busy[int(b)] = float(ns)
    return KernelBusy(int(r[1]), int(r[2]), int(r[3]), busy)


def _kernel_names(r: list[str]) -> KernelNames:
    r = r[:-1]
    if (len(r) - 3) % 3:
        raise ValueError("cut names")
    return KernelNames(int(r[1]), int(r[2]), {wire.unesc(r[i]): (int(r[i + 1]), float(r[i + 2])) for i in range(3, len(r), 3)})


def _kernel_counts(r: list[str]) -> KernelCounts:
    r = r[:-1]
    if (len(r) - 1) % 2:
        raise ValueError("cut counts")
    return KernelCounts({wire.unesc(r[i]): int(r[i + 1]) for i in range(1, len(r), 2)})


PARSERS: "dict[str, Callable[[list[str]], tuple[Any, ...]]]" = {
    wire.WINDOW: _window,
    wire.ALLOC: lambda r: _new(AllocRecord, (wire.unesc(r[1]), wire.unesc(r[2]), int(r[3]), int(r[4]))),
    wire.LOST: lambda r: _new(LostRecord, (int(r[1]), int(r[2]), int(r[3]))),
    wire.GPU: lambda r: GpuRecord(),
    wire.THREADS: lambda r: _new(ThreadsRecord, (int(r[1]), int(r[2]))),
    wire.IO: lambda r: IoEdgeRecord(*wire.parse_io_edge(r)),
    wire.KCYCLE: lambda r: KernelCycle(int(r[1]), int(r[2]), int(r[3]), int(r[4])),
    wire.KPATH: _kernel_path,
    wire.KBUSY: _kernel_busy,
    wire.KNAMES: _kernel_names,
    wire.KCOUNTS: _kernel_counts,
}
