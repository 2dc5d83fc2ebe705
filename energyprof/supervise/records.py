"""The spool's records as types: each line of a process's stream parsed here, once, from `agent/wire.py`'s format.

The agent writes the lines (it is stdlib-only and loaded by path inside the program, so the types live on the
reader's side); the job feed reads named fields. A line that a failed write cut short, or that is damaged, parses
to None and costs that line only.
"""

# No `from __future__ import annotations`: NamedTuple turns each string annotation into a ForwardRef, compiling
# it (~60 fields here, half a millisecond of every run's start); the fields' types are evaluated as written instead.
from typing import TYPE_CHECKING, Callable, NamedTuple, Union

from ..agent import wire


class TickRecord(NamedTuple):
    """One sampler tick: the span it covers and the process's clocks at its end."""
    t0: int
    t1: int
    cpu_ns: int  # the process's CPU (user + system) since it began
    own_ns: int  # the part of it that was energyprof's sampler
    rss: int


class SampleRecord(NamedTuple):
    """One thread's stack over the tick before it."""
    sid: int  # the stream's local stack id
    cpu_ns: int
    main: bool  # the main thread
    unit: int = -1  # the unit of work it ran (a web request's index as it began: agent/units.py); -1: none


class FrameRecord(NamedTuple):
    fid: int  # the stream's local frame id
    function: str
    file: str
    line: int


class StackRecord(NamedTuple):
    sid: int
    fids: tuple[int, ...]  # local frame ids, outermost first


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


class ExceptionRecord(NamedTuple):
    text: str  # the program's uncaught exception


class NoteRecord(NamedTuple):
    text: str


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


class RoleRecord(NamedTuple):
    """What a multiprocessing spawn child runs, said once it knows (its header said LABEL_PENDING)."""
    label: str | None  # None: no role it knows of


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


class EndRecord(NamedTuple):
    """The process ended its stream."""


if TYPE_CHECKING:  # for annotations alone: nothing at run time reads it
    Record = Union[wire.Header, TickRecord, SampleRecord, FrameRecord, StackRecord, WindowBegins, WindowEnds, AllocRecord,
                   ExceptionRecord, NoteRecord, LostRecord, GpuRecord, ThreadsRecord, RoleRecord, IoEdgeRecord, EndRecord,
                   KernelCycle, KernelPath, KernelBusy, KernelNames, KernelCounts]


_new = tuple.__new__  # a record built without NamedTuple's argument handling: the supervisor parses every sample so


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


_PARSERS: "dict[str, Callable[[list[str]], Record | None]]" = {
    wire.HEADER: wire.parse_header,
    wire.TICK: lambda r: _new(TickRecord, (int(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]))),
    wire.SAMPLE: lambda r: _new(SampleRecord, (int(r[1]), int(r[2]), r[3] == "1", -1)),
    wire.UNIT_SAMPLE: lambda r: _new(SampleRecord, (int(r[1]), int(r[2]), r[3] == "1", int(r[4]))),
    wire.FRAME: lambda r: _new(FrameRecord, (int(r[1]), wire.unesc(r[2]), wire.unesc(r[3]), int(r[4]))),
    wire.STACK: lambda r: _new(StackRecord, (int(r[1]), tuple(int(f) for f in r[2].split(",")) if r[2] else ())),
    wire.WINDOW: _window,
    wire.ALLOC: lambda r: _new(AllocRecord, (wire.unesc(r[1]), wire.unesc(r[2]), int(r[3]), int(r[4]))),
    wire.EXCEPTION: lambda r: _new(ExceptionRecord, (wire.unesc(r[2]),)),
    wire.NOTE: lambda r: _new(NoteRecord, (wire.unesc(r[1]),)),
    wire.LOST: lambda r: _new(LostRecord, (int(r[1]), int(r[2]), int(r[3]))),
    wire.GPU: lambda r: GpuRecord(),
    wire.THREADS: lambda r: _new(ThreadsRecord, (int(r[1]), int(r[2]))),
    wire.ROLE: lambda r: RoleRecord(wire.unesc(r[1]) if len(r) > 1 else None),
    wire.IO: lambda r: IoEdgeRecord(*wire.parse_io_edge(r)),
    wire.END: lambda r: EndRecord(),
    wire.KCYCLE: lambda r: KernelCycle(int(r[1]), int(r[2]), int(r[3]), int(r[4])),
    wire.KPATH: _kernel_path,
    wire.KBUSY: _kernel_busy,
    wire.KNAMES: _kernel_names,
    wire.KCOUNTS: _kernel_counts,
}


def parse(r: list[str]) -> "Record | None":
    """One line of a stream (its tab-separated fields) as its record; None for a line cut short by a failed
    write, a damaged one, a header this reader does not understand, or a kind it does not know."""
    if not wire.complete(r):
        return None
    try:
        if r[0] == wire.SAMPLE:  # most lines are: not through the table
            return _new(SampleRecord, (int(r[1]), int(r[2]), r[3] == "1", -1))
        parser = _PARSERS.get(r[0])
        return parser(r) if parser is not None else None
    except (IndexError, ValueError):
        return None


def parse_all(lines: list[list[str]]) -> "list[Record]":
    """A stream's lines as records, the lines that parse to nothing left out."""
    return [rec for rec in map(parse, lines) if rec is not None]


def spool_started(name: str) -> int | None:
    """When a spool file's process began (`<pid>-<t_ns>.spool`, the agent's name for it); None for another name."""
    if not name.endswith(wire.SPOOL_SUFFIX):
        return None
    try:
        return int(name.split("-")[1].split(".")[0])
    except (IndexError, ValueError):
        return None
