"""Units of work: the windows a program did not mark (web requests, engine tasks, tests), as tables. Pure.

A window is a unit of kind K when its facts (`Window.loop`) hold `K = 1` (agent/requests.py writes
`request = 1` and the response's `status`; another kind adds its fact to `FACT_KINDS` and its label to
`LABELS`), or when its name starts with an engine's unit prefix (`[ray task ...]`, `[dask task ...]`:
kind `task`).

`unit_table(runs, program_j, kind)` is the one table every kind shares: per name (a route, a task, a
test), how many ran and the joules of each (mean, median, p95, max), the total and its share of the
program's energy; and the costliest runs with their start and status. A run's joules are its window's
program part (measured or estimated as the sources are), of one of two kinds:

* sample-based (a web request: its window's facts count its `samples`): the energy of the samples that
  ran it, a sample going to the request whose task or thread ran it (core/window_parts.py), so requests
  that overlap share nothing, waiting costs nothing, and a route's total is its requests' sum. Each
  run's figure is known to one sample at each edge (+- 2 x joules / samples); a run shorter than the
  sampling interval is caught by a sample or not, so the mean over many runs is the figure to read;
* span-based (engine tasks, old profiles): the program's energy over the run's span, +- its edges' partly
  overlapped sensor intervals; runs that overlap share the program's energy over the overlap. A profile
  written before requests counted their samples has span-based requests: their routes' totals are then
  the tree's, the samples rooted at each route's node (`route_energy`), which add up.

A long run keeps a bounded set of each name's runs (core/unit_book.py): a uniform sample of them and the
costliest, the others folded into one window per name (`runs` of them). Counts, totals, means and the
max stay exact; the median and p95 are then the sample's, and the table says so.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from ..agent.units import REQUEST_PREFIX
from ..agent.window_facts import (
    COSTLIEST_ONLY, END_NAMES, ENDED_BY, REQUEST_FACT, RUNS_FACT, RUNS_TIME_FACT, SAMPLES_FACT, STATUS_FACT
)
from ..facts.profile import Window
from ..record import asdict, field, record
from .training import window_program_j

FACT_KINDS: tuple[str, ...] = (REQUEST_FACT,)  # a window whose facts hold one of these at 1 is a unit of that kind
PREFIX_KINDS: tuple[tuple[str, str], ...] = (("[ray task ", "task"), ("[ray actor ", "task"), ("[dask task ", "task"))
LABELS: dict[str, str] = {REQUEST_FACT: "requests", "task": "tasks"}
COSTLIEST = 5  # runs listed under each table, most joules first


@record
class UnitRun:
    """One run of a unit of work (its window's name, start (s from the run's start), time and joules), or,
    with `fold`, the runs a long run folded into one window (`runs` of them, one or more; their time and
    joules summed). A fold is in no uniform sample: its runs are those the sample left out."""

    kind: str
    name: str
    index: int | None
    start_s: float
    time_s: float
    joules: float
    status: int | None = None  # a request's response status
    pid: int | None = None
    samples: int | None = None  # sample-based: how many samples ran it; None: span-based
    ended_by: float | None = None  # no hook saw its end: what ended it (agent/window_facts.END_*)
    runs: int = 1
    sampled: bool = True  # in the uniform sample of its name's runs (False: kept as one of the costliest only, or a fold)
    fold: bool = False  # the window stands for the runs folded into it (RUNS_FACT), however many


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
    edge_j: float = 0.0  # +- on a run's joules (the median run's): its edge samples', or its edges' sensor intervals
    mean_j: float = 0.0  # total / count: exact however many runs were kept
    sampled: int | None = None  # the quantiles come from this many of the runs (a uniform sample); None: all


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
    totals_from: str = "spans"  # "samples": each run's joules are its samples', so the totals add up; "routes": the
    # runs' are their spans', the totals the tree's route nodes' (an older profile's requests)

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
    """Every unit-of-work window as a run (or a fold of runs), in the order the windows began."""
    out = []
    for w in windows:
        kind = unit_kind(w)
        if kind is None:
            continue
        loop = w.loop or {}
        status, samples = loop.get(STATUS_FACT), loop.get(SAMPLES_FACT)
        fold = RUNS_FACT in loop  # a fold's window spans nothing (its end is its start): its runs' time is summed apart
        out.append(UnitRun(kind=kind, name=w.name, index=w.index, start_s=w.start_s,
                           time_s=loop.get(RUNS_TIME_FACT, 0.0) if fold else w.time_s,
                           joules=window_program_j(w), status=int(status) if status else None, pid=w.pid,
                           samples=None if samples is None else int(samples), ended_by=loop.get(ENDED_BY),
                           runs=int(loop[RUNS_FACT]) if fold else 1, sampled=not fold and not loop.get(COSTLIEST_ONLY),
                           fold=fold))
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


def _group(name: str, rs: list[UnitRun], program_j: float, sensor_interval_s: float,
           total: float | None = None) -> UnitGroup:
    """One name's row: count, total and mean over every run (folded ones too), the max over those kept one by
    one (the costliest always are), the median and p95 over the uniform sample. `total`: the name's from
    elsewhere (its route's node in the tree), the mean staying its runs'."""
    count = sum(r.runs for r in rs)
    runs_total = sum(r.joules for r in rs)
    if total is None:
        total = runs_total
    single = [r for r in rs if not r.fold]
    sample = [r for r in single if r.sampled]
    js = [r.joules for r in sample]
    mid = sorted(sample, key=lambda r: r.joules)[len(sample) // 2] if sample else None
    return UnitGroup(name=name, count=count, median_j=median(js), p95_j=quantile(js, 0.95),
                     max_j=max((r.joules for r in single), default=0.0), total_j=total,
                     share=total / program_j if program_j else None, median_time_s=median([r.time_s for r in sample]),
                     edge_j=edge_error(mid, sensor_interval_s) if mid is not None else 0.0,
                     mean_j=runs_total / count if count else 0.0, sampled=len(sample) if len(sample) < count else None)


def unit_table(runs: Iterable[UnitRun], program_j: float, kind: str, label: str | None = None,
               costliest: int = COSTLIEST, method: str = "measured", sensor_interval_s: float = 0.0,
               route_j: dict[str, float] | None = None) -> UnitTable:
    """The table of one kind's runs (those of other kinds are left out): per name, the count, joules per
    run (mean, median, p95, max, the median run's +- its edges' error), total and share of `program_j`,
    most energy first; and the `costliest` runs. With `route_j` (each name's energy from the tree's route
    nodes) and span-based runs, the totals and shares are those, which add up where the spans overlap."""
    mine = [r for r in runs if r.kind == kind]
    by_name: dict[str, list[UnitRun]] = {}
    for r in mine:
        by_name.setdefault(r.name, []).append(r)
    by_samples = bool(mine) and all(r.samples is not None for r in mine)
    routes = route_j if route_j is not None and not any(r.samples is not None for r in mine) else None
    groups = [_group(name, rs, program_j, sensor_interval_s, routes.get(name, 0.0) if routes is not None else None)
              for name, rs in by_name.items()]
    groups.sort(key=lambda g: (-g.total_j, g.name))
    top = sorted((r for r in mine if not r.fold), key=lambda r: (-r.joules, r.start_s))[:max(0, costliest)]
    return UnitTable(kind=kind, label=label or LABELS.get(kind, kind), groups=groups, costliest=top,
                     count=sum(g.count for g in groups), total_j=sum(g.total_j for g in groups), program_j=program_j,
                     notes=_notes(mine, groups, by_samples, routes is not None), method=method,
                     totals_from="samples" if by_samples else "routes" if routes is not None else "spans")


def _notes(runs: list[UnitRun], groups: list[UnitGroup], by_samples: bool, by_routes: bool = False) -> list[str]:
    notes = []
    if by_routes:
        notes.append("a profile from before each request counted its samples: each run's joules (mean, median, p95, "
                     "max) hold the program's energy over its span; the totals and shares are the samples rooted at "
                     "each route's node in the tree (its handler's), which add up")
    if not by_samples and _overlapping(runs):
        notes.append("some runs overlapped in time: each run's joules hold the program's energy over its own span, "
                     "shared with the runs beside it" + ("" if by_routes else ", so the total counts an overlap once per run"))
    ended: dict[float, int] = {}
    for r in runs:
        if r.ended_by:
            ended[r.ended_by] = ended.get(r.ended_by, 0) + 1
    if ended:
        said = ", ".join(f"{n} at {END_NAMES.get(k, 'an end no hook saw')}" for k, n in sorted(ended.items()))
        notes.append(f"{sum(ended.values())} ended with no response seen ({said}): each is charged up to there")
    sampled = [g for g in groups if g.sampled is not None]
    if sampled:
        which = ", ".join(f"{g.name}: {g.sampled} of {g.count}" for g in sampled[:3]) + (", ..." if len(sampled) > 3 else "")
        notes.append(f"{len(sampled)} name(s) ran more runs than are kept one by one: their median, p95 and median "
                     f"time come from a uniform sample of their runs ({which}); counts, totals, means and the max are exact")
    return notes


def edge_error(run: UnitRun, sensor_interval_s: float) -> float:
    """The +- on a run's joules, never over them. Sample-based: each edge may hold up to one sample's worth
    of CPU that ran something else, or miss one that ran the run (a sample sees a stack at its end), one
    sample's mean each, 2 x joules / samples. Span-based: its two edges each fall inside a sensor interval
    charged by overlap, up to one interval's program energy at each (at the run's own mean power)."""
    if run.samples is not None:
        return min(run.joules, 2 * run.joules / run.samples) if run.samples else 0.0
    if run.time_s <= 0 or sensor_interval_s <= 0:
        return 0.0
    return min(run.joules, 2 * sensor_interval_s * run.joules / run.time_s)


def route_energy(root: Any, prefix: str) -> dict[str, float]:
    """Each name's energy in the tree, from the samples rooted at its `[PREFIXname]` nodes (the outermost on a
    path: a node inside another's is in that one's total already). A route's node holds its requests' samples,
    and also CPU that its threads were seen with in a wait, moved there at the run's end (core/waits.py)."""
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
        if not r.fold:
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
    (the windows'), each table says its sources' method and its runs' edge error; an older profile's requests
    (no samples counted) take their totals from the tree's route nodes."""
    runs = unit_runs(windows)
    kinds = sorted({r.kind for r in runs}, key=lambda k: (k != REQUEST_FACT, k))
    extra: dict[str, Any] = {}
    routes = None
    if profile is not None:
        estimated = any(getattr(src, "method", "measured") == "estimated" for src in profile.sources)
        extra = {"method": "estimated" if estimated else "measured",
                 "sensor_interval_s": float(profile.meta.get("sensor_interval_s") or 0.0)}
        root = getattr(profile, "root", None)
        if root is not None and not any(r.samples is not None for r in runs if r.kind == REQUEST_FACT):
            routes = route_energy(root, REQUEST_PREFIX)
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
        mine = [[r for r in rs if r.kind == kind and r.name == name] for rs in per_run]
        js = [[r.joules for r in rs if r.sampled] for rs in mine]
        medians = [median(j) if j else None for j in js]
        b = [medians[i] for i in base if medians[i] is not None]
        h = [medians[i] for i in head if medians[i] is not None]
        before = sum(b) / len(b) if b else None  # type: ignore[arg-type]
        after = sum(h) / len(h) if h else None  # type: ignore[arg-type]
        pct = 100.0 * (after - before) / before if before and after is not None else None
        out.append(UnitChange(kind=kind, name=name, count=[sum(r.runs for r in rs) for rs in mine], median_j=medians,
                              pct=pct))
    return out
