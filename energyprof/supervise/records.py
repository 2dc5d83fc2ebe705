"""The spool's records as types: each line of a process's stream parsed here, once, from `agent/wire.py`'s format.

The agent writes the lines (it is stdlib-only and loaded by path inside the program, so the types live on the
reader's side); the job feed reads named fields. A line that a failed write cut short, or that is damaged, parses
to None and costs that line only. The records only some runs write (windows, allocations, GPU kernels...) are
made in extra_records.py, loaded by the first such line.
"""

# No `from __future__ import annotations`: NamedTuple turns each string annotation into a ForwardRef, compiling
# it (~60 fields here, half a millisecond of every run's start); the fields' types are evaluated as written instead.
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Union

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


class ExceptionRecord(NamedTuple):
    text: str  # the program's uncaught exception


class NoteRecord(NamedTuple):
    text: str


class RoleRecord(NamedTuple):
    """What a multiprocessing spawn child runs, said once it knows (its header said LABEL_PENDING)."""
    label: str | None  # None: no role it knows of


class EndRecord(NamedTuple):
    """The process ended its stream."""


if TYPE_CHECKING:  # for annotations alone: nothing at run time reads it
    from .extra_records import (AllocRecord, GpuRecord, IoEdgeRecord, KernelBusy, KernelCounts, KernelCycle, KernelNames,
                                KernelPath, LostRecord, ThreadsRecord, WindowBegins, WindowEnds)

    Record = Union[wire.Header, TickRecord, SampleRecord, FrameRecord, StackRecord, WindowBegins, WindowEnds, AllocRecord,
                   ExceptionRecord, NoteRecord, LostRecord, GpuRecord, ThreadsRecord, RoleRecord, IoEdgeRecord, EndRecord,
                   KernelCycle, KernelPath, KernelBusy, KernelNames, KernelCounts]


_new = tuple.__new__  # a record built without NamedTuple's argument handling: the supervisor parses every sample so


_PARSERS: "dict[str, Callable[[list[str]], Record | None]]" = {
    wire.HEADER: wire.parse_header,
    wire.TICK: lambda r: _new(TickRecord, (int(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]))),
    wire.SAMPLE: lambda r: _new(SampleRecord, (int(r[1]), int(r[2]), r[3] == "1", -1)),
    wire.UNIT_SAMPLE: lambda r: _new(SampleRecord, (int(r[1]), int(r[2]), r[3] == "1", int(r[4]))),
    wire.FRAME: lambda r: _new(FrameRecord, (int(r[1]), wire.unesc(r[2]), wire.unesc(r[3]), int(r[4]))),
    wire.STACK: lambda r: _new(StackRecord, (int(r[1]), tuple(int(f) for f in r[2].split(",")) if r[2] else ())),
    wire.EXCEPTION: lambda r: _new(ExceptionRecord, (wire.unesc(r[2]),)),
    wire.NOTE: lambda r: _new(NoteRecord, (wire.unesc(r[1]),)),
    wire.ROLE: lambda r: RoleRecord(wire.unesc(r[1]) if len(r) > 1 else None),
    wire.END: lambda r: EndRecord(),
}
# The kinds only some runs write: their records are made in extra_records.py, imported by the first such line.
_EXTRA_KINDS = frozenset((wire.WINDOW, wire.ALLOC, wire.LOST, wire.GPU, wire.THREADS, wire.IO, wire.KCYCLE, wire.KPATH,
                          wire.KBUSY, wire.KNAMES, wire.KCOUNTS))
EXTRA_NAMES = frozenset(("WindowBegins", "WindowEnds", "AllocRecord", "LostRecord", "GpuRecord", "ThreadsRecord",
                         "IoEdgeRecord", "KernelCycle", "KernelPath", "KernelBusy", "KernelNames", "KernelCounts"))


def __getattr__(name: str) -> Any:
    """The records of extra_records.py, by their names here too (made at the first reading of one)."""
    if name in EXTRA_NAMES:
        from . import extra_records

        return getattr(extra_records, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def parse(r: list[str]) -> "Record | None":
    """One line of a stream (its tab-separated fields) as its record; None for a line cut short by a failed
    write, a damaged one, a header this reader does not understand, or a kind it does not know."""
    if not wire.complete(r):
        return None
    try:
        if r[0] == wire.SAMPLE:  # most lines are: not through the table
            return _new(SampleRecord, (int(r[1]), int(r[2]), r[3] == "1", -1))
        parser = _PARSERS.get(r[0])
        if parser is None and r[0] in _EXTRA_KINDS:
            from .extra_records import PARSERS

            _PARSERS.update(PARSERS)  # the next line of these kinds goes straight to its parser
            parser = _PARSERS[r[0]]
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
