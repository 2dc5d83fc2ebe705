"""The raw events a run produces, all stamped on `time.perf_counter_ns`.

A `Tick` is one collector reading (cumulative joules per source, CPU clocks, RSS); a `Sample`
is one stack observation covering [t0, t1]. `StackTable` interns frames and stacks so each
distinct stack is stored once. A `Recording` is a plain list of these events: tests and
offline replays build one by hand; a live run never materialises it, it folds the events
into a `Ledger` (core/ledger.py) as they arrive, so memory follows distinct stacks, not time.
"""

# No `from __future__ import annotations`: NamedTuple turns each string annotation into a ForwardRef, compiling
# it (a millisecond of every run's start for this module's fields and the ledger's); they are evaluated as written.

import threading
from typing import Any, NamedTuple

from ..record import field, record

Frame = tuple[str, str, int]  # (function, file, first line)


class Tick(NamedTuple):
    """One sensor reading. Under the supervisor the clocks are the whole job's: every
    followed process (energyprof's samplers included) plus the supervisor itself."""

    t_ns: int
    energy_j: tuple[float | None, ...]  # cumulative joules per source index; None: not read
    process_cpu_ns: int  # the program (every followed process), energyprof's own CPU included
    own_cpu_ns: int  # energyprof's own: its threads in the program, and the supervisor
    busy_cpu_ns: int  # whole machine, all cores
    rss_bytes: int = 0  # the job's resident memory (the sum over its processes)
    children_cpu_ns: int = 0  # in-process profiles only: child processes (live and reaped)
    gpu_share: dict[str, float] | None = None  # source id -> the program's share, when shared
    peers_cpu_ns: int = 0  # one rank of several on the node: the other ranks' CPU (theirs and their energyprof's)


class Sample(NamedTuple):
    t0_ns: int
    t1_ns: int
    stack_id: int
    cpu_ns: int  # CPU time of the sampled thread over [t0, t1]
    main: bool = True  # sampled on its process's main thread (wall-time charging and memory go there)
    rss_bytes: int = 0  # its process's RSS, read with the stack at t1 (0: not read)
    proc: int = 0  # its process (the pid; 0: the only one)
    unit: int = -1  # the unit of work it ran (a web request's window, by the index it began under); -1: none


class StackTable:
    """Interned frames and stacks. Stacks are tuples of frame ids, outermost first."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.stacks: list[tuple[int, ...]] = []
        self._frame_ids: dict[Frame, int] = {}
        self._stack_ids: dict[tuple[int, ...], int] = {}
        # Lookups are lock-free; only a miss (a new entry) takes the lock, so the sampler and
        # the collector can both intern without handing out one id twice.
        self._lock = threading.Lock()

    def frame_id(self, frame: Frame) -> int:
        fid = self._frame_ids.get(frame)
        if fid is None:
            with self._lock:
                fid = self._frame_ids.get(frame)
                if fid is None:
                    self.frames.append(frame)
                    fid = self._frame_ids[frame] = len(self.frames) - 1
        return fid

    def stack_id(self, frames: tuple[int, ...]) -> int:
        sid = self._stack_ids.get(frames)
        if sid is None:
            with self._lock:
                sid = self._stack_ids.get(frames)
                if sid is None:
                    self.stacks.append(frames)
                    sid = self._stack_ids[frames] = len(self.stacks) - 1
        return sid

    def intern(self, frames: list[Frame] | tuple[Frame, ...]) -> int:
        return self.stack_id(tuple(self.frame_id(f) for f in frames))

    def extend(self, stack_id: int, frame: Frame) -> int:
        """The stack `stack_id` with one more frame on top."""
        return self.stack_id(self.stacks[stack_id] + (self.frame_id(frame),))

    def to_state(self) -> dict[str, Any]:
        return {"frames": [list(f) for f in self.frames], "stacks": [list(s) for s in self.stacks]}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "StackTable":
        table = cls()
        for f in state["frames"]:
            table.frame_id((str(f[0]), str(f[1]), int(f[2])))
        for s in state["stacks"]:
            table.stack_id(tuple(int(x) for x in s))
        return table


@record
class WindowEvent:
    t_ns: int
    kind: str  # "begin" | "end"
    name: str = ""
    index: int | None = None


@record
class Recording:
    """Everything a run observed, as plain events. `sources` are dicts as in the profile."""

    sources: list[dict[str, Any]]
    stacks: StackTable = field(default_factory=StackTable)
    ticks: list[Tick] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    windows: list[WindowEvent] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
