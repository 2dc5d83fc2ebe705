"""What a window is charged of the interval being charged, where it is not the program's part by overlap. Pure.

A window of the whole program gets the program's part of each interval it overlaps, by overlap. Two kinds
get less:

* a window marked by one process of several (a rank) gets what that process and the processes it started
  were charged (`subtree_part`), by overlap;
* a unit of work's window (a web request's) gets what its own samples were charged (`unit_part`), whole:
  a sample goes to the request whose task or thread ran it (agent/units.py), so requests that overlap (a
  concurrent server) share nothing, and a request that waits is charged nothing while it waits.
"""

from __future__ import annotations

from typing import Any

from .tallies import WindowTally

Rows = tuple[list[float], list[float]]  # per source: under `share`, under `all`
# (process, unit) -> the interval's share and all per source that its samples were charged, and of those that
# ended in the interval, how many and their CPU ns
UnitRows = dict[tuple[int, int], tuple[list[float], list[float], list[int]]]


def unit_row(rows: UnitRows, n: int, proc: int, unit: int) -> tuple[list[float], list[float], list[int]]:
    """The unit's row of the interval being charged, made on first use."""
    row = rows.get((proc, unit))
    if row is None:
        row = rows[(proc, unit)] = ([0.0] * n, [0.0] * n, [0, 0])
    return row


def unit_part(rows: UnitRows, n: int, w: WindowTally) -> Rows:
    """What a unit's samples were charged in the interval (its window's process's, or any process's where the
    window names none); their count and CPU are added to the window's."""
    share, all_ = [0.0] * n, [0.0] * n
    if w.pid is not None:
        row = rows.get((w.pid, w.unit))  # type: ignore[arg-type]
        mine = [row] if row is not None else []
    else:
        mine = [row for (_, unit), row in rows.items() if unit == w.unit]
    for s_row, a_row, count in mine:
        w.samples += count[0]
        w.cpu_ns += count[1]
        for i in range(n):
            share[i] += s_row[i]
            all_[i] += a_row[i]
    return share, all_


def subtree_part(iv: dict[int | None, Rows], info: dict[int, dict[str, Any]], n: int, pid: int | None) -> Rows | None:
    """What `pid` and its descendants were charged in the interval (`iv`: per process); None (the whole
    program's part) for a window with no process, or one marked by the job's top process."""
    if pid is None or pid not in info or info[pid].get("parent_pid") not in info:
        return None
    share, all_ = [0.0] * n, [0.0] * n
    for proc, (s_row, a_row) in iv.items():
        q, hops = proc, 0
        while q is not None and q != pid and hops < 64:
            q = info.get(q, {}).get("parent_pid")
            q = q if q in info else None
            hops += 1
        if q == pid:
            for i in range(n):
                share[i] += s_row[i]
                all_[i] += a_row[i]
    return share, all_
