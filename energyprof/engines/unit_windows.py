"""A window per run of a unit of work (a Ray task, an actor call, a Dask task), from the samples that saw it.

The engines run a worker's tasks one after another on its threads, and the agent roots each sampled
stack at its unit (agent/units.py). Per process and thread, the supervisor opens a window named for
the unit when a sample first shows it and closes it when a sample shows something else, so each run
of a task gets its span, its worker (the window's process) and the program's energy over it, like
any window the program marks itself. Its edges are the samples': a run's start and end are known to
one sample interval (`interval_s`, stated with the windows), and two runs of the same task back to
back on one thread, with no sample between them, are one window.
"""

from __future__ import annotations

from typing import Any


from ..agent.wire import THREAD_FRAME_PREFIX
from ..agent.units import UNIT_PREFIXES


class UnitWindows:
    def __init__(self, ledger: Any, table: Any) -> None:
        self.ledger, self.table = ledger, table
        self._of_stack: dict[int, tuple[int | None, str | None]] = {}  # stack id -> (thread frame, unit)
        self._open: dict[tuple[int, int | None], str] = {}  # (pid, thread frame) -> the unit running there
        self._runs: dict[str, int] = {}  # each unit's runs so far: the window's index

    def _unit(self, sid: int) -> tuple[int | None, str | None]:
        found = self._of_stack.get(sid)
        if found is None:
            thread: int | None = None
            unit: str | None = None
            for fid in self.table.stacks[sid]:
                name = self.table.frames[fid][0]
                if thread is None and name.startswith(THREAD_FRAME_PREFIX):
                    thread = fid
                elif name.startswith(UNIT_PREFIXES):
                    unit = name
                    break
            found = self._of_stack[sid] = (thread, unit)
        return found

    def sample(self, pid: int, sid: int, t0: int) -> None:
        """A sample of `pid` that began at `t0` showed stack `sid`."""
        thread, unit = self._unit(sid)
        key = (pid, thread)
        running = self._open.get(key)
        if unit == running:
            return
        if running is not None:
            self.ledger.end_window(t0, running, pid=pid)
            del self._open[key]
        if unit is not None:
            index = self._runs.get(unit, 0)
            self._runs[unit] = index + 1
            self.ledger.begin_window(t0, unit, index, pid=pid)
            self._open[key] = unit

    def close(self, pid: int, t_ns: int) -> None:
        """The process ended (or the run did): its units' windows end with its last sample."""
        for key in [k for k in self._open if k[0] == pid]:
            self.ledger.end_window(t_ns, self._open.pop(key), pid=pid)
