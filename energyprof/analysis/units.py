"""Units of work: the windows a program did not mark (web requests, engine tasks, tests), as tables. Pure.

A window is a unit of kind K when its facts (`Window.loop`) hold `K = 1` (agent/requests.py writes
`request = 1` and the response's `status`; another kind adds its fact to `FACT_KINDS` and its label to
`LABELS`), or when
its name starts with an engine's unit prefix (`[ray task ...]`, `[dask task ...]`: kind `task`).

`unit_table(runs, program_j, kind)` is the one table every kind shares: per name (a route, a task, a
test), how many ran and the joules of each (median, p95, max), the total and its share of the
program's energy; and the costliest runs with their start and status. Each run's joules are the
program's part of its window (the same kind of figure as the run's headline, under the profile's idle
policy): measured where the sources are, +- its edges' partly overlapped sensor intervals. Runs that
overlap share the program's energy over the overlap, so a request's totals and share are its route's
node's in the tree (its samples: a sample goes to the request whose thread or task ran it, and waiting
costs nothing), which add up to at most the program's.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from ..agent.units import REQUEST_PREFIX
from ..agent.window_facts import REQUEST_FACT, STATUS_FACT
from ..facts.profile import Window
from ..record import asdict, field, record
from .training import window_program_j

FACT_KINDS: tuple[str, ...] = (REQUEST_FACT,)  # a window whose facts hold one of these at 1 is a unit of that kind
PREFIX_KINDS: tuple[tuple[str, str], ...] = (("[ray task ", "task"), ("[ray actor ", "task"), ("[dask task ", "task"))
LABELS: dict[str, str] = {REQUEST_FACT: "requests", "task": "tasks"}
COSTLIEST = 5  # runs listed under each table, most joules first


@record
class UnitRun:
    """One run of a unit of work: its window's name, start (s from the run's start), time and joules."""

    kind: str
    name: str
    index: int | None
    start_s: float
    time_s: float
    joules: float
    status: int | None = None  # a request's response status
    pid: int | None = None


@record
class UnitGroup:
    """One name's runs (a route, a task, a test): count, joules per run and their total."""

    name: str
    count: int
    median_j: float
    p95_j: float
    max_j: float
    total_j: float
    share: float | None  # of the program's energy; None where the program has none
    median_time_s: float
    edge_j: float = 0.0  # +- on a run's joules (the median run's): its edges' partly overlapped sensor intervals
    span_total_j: float | None = None  # the runs' span-based joules summed, where total_j is the samples'


@record
class UnitTable:
    """A kind's table: its groups, most energy first, and its costliest runs."""

    kind: str
    label: str
    groups: list[UnitGroup]
    costliest: list[UnitRun]
    count: int
    total_j: float
    program_j: float
    notes: list[str] = field(default_factory=list)
    method: str = "measured"  # the sources' (estimated where any is)
    totals_from: str = "spans"  # "samples": each name's total is its node's in the tree, so the totals add up

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (`derived.units` of a saved profile)."""
        return {"kind": self.kind, "label": self.label, "count": self.count, "total_j": self.total_j,
                "program_j": self.program_j, "method": self.method, "totals_from": self.totals_from,
                "groups": [asdict(g) for g in self.groups], "costliest": [asdict(r) for r in self.costliest],
                "notes": list(self.notes)}


def unit_kind(w: Window) -> str | None:
    """The kind of unit a window is, or None for a window the program marked itself."""
    loop = w.loop or {}
    for fact in FACT_KINDS:
        if loop.get(fact) == 1.0:
            return fact
    for prefix, kind in PREFIX_KINDS:
        if w.name.startswith(prefix):
            return kind
    return None


def unit_runs(windows: Iterable[Window]) -> list[UnitRun]:
    """Every unit-of-work window as a run, in the order the windows began."""
    out = []
    for w in windows:
        kind = unit_kind(w)
        if kind is None:
            continue
        status = (w.loop or {}).get(STATUS_FACT)
        out.append(UnitRun(kind=kind, name=w.name, index=w.index, start_s=w.start_s, time_s=w.time_s,
                           joules=window_program_j(w), status=int(status) if status else None, pid=w.pid))
    return out


def quantile(values: list[float], q: float) -> float:
    """The nearest-rank quantile (a value some run had: p95 of 20 runs is the 19th smallest)."""
    s = sorted(values)
    if not s:
        return 0.0
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    if not n:
        return 0.0
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def unit_table(runs: Iterable[UnitRun], program_j: float, kind: str, label: str | None = None,
               costliest: int = COSTLIEST, route_j: dict[str, float] | None = None, method: str = "measured",
               sensor_interval_s: float = 0.0) -> UnitTable:
    """The table of one kind's runs (those of other kinds are left out): per name, the count, joules per
    run (median, p95, max, each +- its edges' error), total and share of `program_j`, most energy first;
    and the `costliest` runs. A run's joules hold the program's energy over its own span, so runs that
    overlap (concurrent requests) share it: with `route_j` (each name's energy from the samples rooted
    at its node in the tree, which add up), the totals and shares are those, and the span-based sum is
    kept beside them."""
    mine = [r for r in runs if r.kind == kind]
    by_name: dict[str, list[UnitRun]] = {}
    for r in mine:
        by_name.setdefault(r.name, []).append(r)
    groups = []
    for name, rs in by_name.items():
        js = [r.joules for r in rs]
        span_total = sum(js)
        total = route_j.get(name, 0.0) if route_j is not None else span_total
        mid = sorted(rs, key=lambda r: r.joules)[len(rs) // 2]
        groups.append(UnitGroup(name=name, count=len(rs), median_j=median(js), p95_j=quantile(js, 0.95), max_j=max(js),
                                total_j=total, share=total / program_j if program_j else None,
                                median_time_s=median([r.time_s for r in rs]), edge_j=edge_error(mid, sensor_interval_s),
                                span_total_j=span_total if route_j is not None else None))
    groups.sort(key=lambda g: (-g.total_j, g.name))
    top = sorted(mine, key=lambda r: (-r.joules, r.start_s))[:max(0, costliest)]
    notes = []
    if _overlapping(mine):
        notes.append("some runs overlapped in time: each run's joules hold the program's energy over its own span, "
                     "shared with the runs beside it" + ("; the totals and shares are the samples' at each "
                                                         "route's node, which add up" if route_j is not None else
                                                         ", so the total counts an overlap once per run"))
    return UnitTable(kind=kind, label=label or LABELS.get(kind, kind), groups=groups,
                     costliest=top, count=len(mine), total_j=sum(g.total_j for g in groups), program_j=program_j,
                     notes=notes, method=method, totals_from="samples" if route_j is not None else "spans")


def edge_error(run: UnitRun, sensor_interval_s: float) -> float:
    """The +- on a run's joules: its two edges each fall inside a sensor interval charged by overlap, so up
    to one interval's program energy at each (at the run's own mean power) is in doubt; never over the run's."""
    if run.time_s <= 0 or sensor_interval_s <= 0:
        return 0.0
    return min(run.joules, 2 * sensor_interval_s * run.joules / run.time_s)


def route_energy(root: Any, prefix: str) -> dict[str, float]:
    """Each name's energy from the samples rooted at its `[PREFIXname]` nodes (the outermost on a path:
    a node inside another's is in that one's total already)."""
    out: dict[str, float] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        fn = node.function
        if fn.startswith(prefix) and fn.endswith("]"):
            name = fn[len(prefix):-1]
            out[name] = out.get(name, 0.0) + node.total_energy
            continue
        stack.extend(node.children)
    return out


def _overlapping(runs: list[UnitRun]) -> bool:
    by_pid: dict[int | None, list[UnitRun]] = {}
    for r in runs:
        by_pid.setdefault(r.pid, []).append(r)
    for rs in by_pid.values():
        rs = sorted(rs, key=lambda r: r.start_s)
        end = -math.inf
        for r in rs:
            if r.start_s < end - 1e-9:
                return True
            end = max(end, r.start_s + r.time_s)
    return False


def unit_tables(windows: Iterable[Window], program_j: float, costliest: int = COSTLIEST,
                profile: Any = None) -> list[UnitTable]:
    """A table per kind of unit the windows hold (requests first, then the rest by name). With `profile`
    (the windows'), the requests' totals are their routes' nodes' (sample-based), and each table says
    its sources' method and its runs' edge error."""
    runs = unit_runs(windows)
    kinds = sorted({r.kind for r in runs}, key=lambda k: (k != REQUEST_FACT, k))
    extra: dict[str, Any] = {}
    routes = None
    if profile is not None:
        estimated = any(getattr(src, "method", "measured") == "estimated" for src in profile.sources)
        extra = {"method": "estimated" if estimated else "measured",
                 "sensor_interval_s": float(profile.meta.get("sensor_interval_s") or 0.0)}
        routes = route_energy(profile.root, REQUEST_PREFIX)
    return [unit_table(runs, program_j, k, costliest=costliest, route_j=routes if k == REQUEST_FACT else None, **extra)
            for k in kinds]


@record
class UnitChange:
    """One unit name (a route) across compared runs: its count and median joules per run in each, and the
    head's median against the base's (the means of each side's runs' medians)."""

    kind: str
    name: str
    count: list[int]
    median_j: list[float | None]  # per run; None: the run had no such unit
    pct: float | None  # head against base, in percent; None where a side has none


def unit_changes(runs_windows: list[list[Window]], base: list[int], head: list[int]) -> list[UnitChange]:
    """Per unit name, each compared run's count and median joules per run, and head against base
    (`base`, `head`: the runs' positions on each side). Names in the order the runs first show them."""
    per_run = [unit_runs(ws) for ws in runs_windows]
    names: list[tuple[str, str]] = []
    for rs in per_run:
        for r in rs:
            if (r.kind, r.name) not in names:
                names.append((r.kind, r.name))
    out = []
    for kind, name in names:
        js = [[r.joules for r in rs if r.kind == kind and r.name == name] for rs in per_run]
        medians = [median(j) if j else None for j in js]
        b = [medians[i] for i in base if medians[i] is not None]
        h = [medians[i] for i in head if medians[i] is not None]
        before = sum(b) / len(b) if b else None  # type: ignore[arg-type]
        after = sum(h) / len(h) if h else None  # type: ignore[arg-type]
        pct = 100.0 * (after - before) / before if before and after is not None else None
        out.append(UnitChange(kind=kind, name=name, count=[len(j) for j in js], median_j=medians, pct=pct))
    return out
