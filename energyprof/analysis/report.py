"""The report model: Profile (facts) + RenderOptions -> everything every renderer shows. Pure.

Console, HTML, CSV, folded and speedscope all read a ReportModel, so they cannot disagree, and a
saved profile re-renders with another idle policy or carbon setting without being edited.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

from ..record import field, record
from ..facts.profile import SPECIAL_NODES
from ..facts.profile import Note
from ..facts.profile import Process
from ..facts.profile import Profile
from ..facts.profile import Source
from ..facts.profile import Totals
from .carbon import CarbonFigures, CarbonSettings, carbon, window_carbon
from .chart import MAX_CHART_NODES, ChartNode, grouped_tree, prune
from .functions import FunctionRow, function_rows
from .kinds import has_backward_node, is_batch_window, is_cache_fact, may_be_unit, names_of_tests, sweep_names
from .own import Group, own_first
from .io import io_in_span, io_of
from ..facts.forecast import is_forecast
from .windows import (WindowGroup, WindowRow, resolution_s, short_for, training_breakdowns, training_by_rank,
                      window_groups)

if TYPE_CHECKING:  # the roles' modules (units, sweeps, modules) load only for a profile that has some (kinds.py)
    from .pareto import WindowPoint
    from .units import UnitTable


@record(frozen=True)
class RenderOptions:
    """How to look at a profile. `idle` None keeps the run's policy; `carbon` None leaves carbon out."""

    idle: str | None = None
    carbon: CarbonSettings | None = field(default_factory=CarbonSettings)
    max_chart_nodes: int = MAX_CHART_NODES
    top_functions: int = 8


@record
class MemoryFigures:
    baseline_rss_bytes: int | None
    peak_rss_bytes: int | None  # sampled
    peak_rss_exact_bytes: int | None  # the kernel's VmHWM, when its mark could be reset

    @property
    def peak(self) -> int | None:
        """The best peak known: the exact one when present (sampling can miss a short spike)."""
        return self.peak_rss_exact_bytes if self.peak_rss_exact_bytes is not None else self.peak_rss_bytes


@record
class ReportModel:
    """What the renderers show. `profile` is the run seen under `policy` (facts, untouched)."""

    profile: Profile
    policy: str
    sources: list[Source]
    totals: Totals
    rows: list[FunctionRow]
    top: list[FunctionRow]  # the user's own functions (the program's folder) by total energy (analysis/own.py)
    top_by_self: bool  # no function of the program's own: `top` is every frame by self energy instead
    chart: ChartNode  # the grouped tree: library and import frames under [library: x] / [import] boxes
    windows: list[WindowRow]
    window_groups: list[WindowGroup]
    training: dict[str, dict[str, Any]]
    carbon: CarbonFigures | None
    notes: list[Note]
    processes: list[Process]
    memory: MemoryFigures
    resolution_s: float | None
    peak_power_w: float | None
    duration_s: float
    meta: dict[str, Any]
    # every other frame's self energy, by the library or import it ran in (largest first)
    groups: list[Group] = field(default_factory=list)
    own: list[FunctionRow] = field(default_factory=list)  # every one of the user's function rows (`top` is its head)
    # loader -> rank -> breakdown, when several ranks tracked loaders (then `training` is empty)
    training_ranks: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    # tracked loop -> its forecasts of its own total beside the outcome (analysis/forecast.forecast_views)
    forecasts: dict[str, dict[str, Any]] = field(default_factory=dict)
    # sweeps inside the run (windows NAME:LABEL): name -> its points of energy against time, and
    # whether their energy is the program's
    sweeps: dict[str, tuple[list[WindowPoint], bool]] = field(default_factory=dict)
    # window name -> its windows' disk MB read (summed) and read IOPS (over their summed time), measured
    window_io: dict[str, dict[str, float]] = field(default_factory=dict)
    io_method: str | None = None  # how the I/O figures were counted, for Methodology (None without I/O)
    # the tree has a `[backward]` frame: each row holds its backward part (FunctionRow.backward_j)
    backward_split: bool = False
    # the model's modules (analysis/phases.module_keys), heaviest first, each with its forward and backward
    modules: list[FunctionRow] = field(default_factory=list)

    @property
    def total_energy_j(self) -> float:
        return sum(self.totals.energy_j.values())

    @property
    def attributed_j(self) -> float:
        return sum(self.totals.attributed_j.values())

    @property
    def program_j(self) -> float:
        """The program's energy: what every percentage in the report is a share of."""
        return self.attributed_j

    def is_root(self, row: FunctionRow) -> bool:
        root = self.profile.root
        return (row.function, row.file, row.line) == (root.function, root.file, root.line)

    def row_energy(self, row: FunctionRow) -> float:
        """A row's inclusive energy as every view shows it: the root's row is the program as a whole,
        whose idle part and energyprof's own are rows of their own, so it holds the program's energy."""
        return self.program_j if self.is_root(row) else row.total_energy

    def row_phases(self, row: FunctionRow) -> tuple[float, float] | None:
        """A row's (forward, backward) joules, adding up to `row_energy` (None: the profile does not tell them
        apart). The one home of that sum: the table, the console, the CSV and the JSON read it."""
        if not self.backward_split or row.backward_j is None:
            return None
        backward = min(row.backward_j, self.row_energy(row))
        return self.row_energy(row) - backward, backward

    def share(self, joules: float) -> float | None:
        """A figure as a share of the program's energy, from unrounded values (None: no program energy)."""
        return joules / self.program_j if self.program_j else None

    def unit_tables(self) -> list[UnitTable]:
        """The units of work the windows hold (requests, engine tasks), a table per kind (analysis/units.py)."""
        if not any(may_be_unit(w) for w in self.profile.windows):
            return []
        from .units import unit_tables

        return unit_tables(self.profile.windows, self.program_j, profile=self.profile)

    def derived(self) -> dict[str, Any]:
        """Figures computed from the facts with these settings, saved beside the facts for other tools
        (`derived` in the JSON; readers ignore it). carbon_g is the program's, machine_carbon_g the machine's."""
        out: dict[str, Any] = {"idle_policy": self.policy}
        if self.carbon is not None:
            c = self.carbon
            out["totals"] = {"carbon_g": c.program_g, "machine_carbon_g": c.machine_g}
            if c.program_cost is not None:
                out["totals"].update(cost=c.program_cost, machine_cost=c.machine_cost)
            out["carbon"] = c.to_dict()
        if self.training:  # the tracked loops' breakdown (wait, pipeline, compute, stall), as the report shows it
            out["training"] = self.training
        io = io_of(self.profile)
        if io is not None:  # each window's MB read and IOPS, measured (collect/io.py), in window order
            out["windows_io"] = [{"name": w.name, "index": w.index, **(io_in_span(io, w.start_s, w.end_s) or {})}
                                 for w in self.profile.windows]
            out["io"] = io_in_span(io, float("-inf"), float("inf"))
        elif self.profile.io is not None and self.profile.io.absent:
            out["io"] = {"absent": self.profile.io.absent}
        units = self.unit_tables()
        if units:  # per route (task, test): runs, joules per run, total, share; the costliest runs
            out["units"] = [t.to_dict() for t in units]
        if self.forecasts:  # predicted during the run against what the passes measured
            out["forecasts"] = self.forecasts
        if self.backward_split:  # each function's forward and backward, as the table shows them
            out["phases"] = {"modules": [phase_row(r, self) for r in self.modules],
                             "functions": [phase_row(r, self) for r in self.rows if r.backward_j]}
        if self.training_ranks:
            out["training_by_rank"] = {name: {str(r): b for r, b in ranks.items()}
                                       for name, ranks in self.training_ranks.items()}
        return out


def build(profile: Profile, options: RenderOptions | None = None) -> ReportModel:
    """The one analysis step (pure: same profile and options, same model)."""
    # A 50,000-function profile makes a few hundred thousand small objects that all live until the
    # model is dropped; the cyclic GC rescanning them cost a third of the time.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _build(profile, options or RenderOptions())
    finally:
        if enabled:
            gc.enable()


def _build(profile: Profile, options: RenderOptions) -> ReportModel:
    view = profile.with_policy(options.idle or profile.idle_policy)
    split = has_backward_node(view.root)
    rows = [r for r in function_rows(view, backward=split)  # the idle node under `all` holds nothing
            if not (r.function in SPECIAL_NODES and r.total_energy <= 0 and r.time_s <= 0)]
    root_key = (view.root.function, view.root.file, view.root.line)
    # The root's row is the program as a whole (no file), not one of its functions.
    mine, groups = own_first(view, [r for r in rows if (r.function, r.file, r.line) != root_key])
    top = [r for r in mine if r.total_energy > 0][:options.top_functions]
    top_by_self = not top  # no function of the program's folder (a saved GPU trace, a command): the heaviest frames
    if top_by_self:
        top = sorted((r for r in rows if (r.function, r.file, r.line) != root_key and r.function not in SPECIAL_NODES
                      and r.self_total_energy > 0),
                     key=lambda r: -r.self_total_energy)[:options.top_functions]
    figures = carbon(view, options.carbon) if options.carbon is not None else None
    # the tracked loops' page-cache readings and forecasts are facts of the training table, not spans: left out here;
    # so are the tests (and their call phases) and the batched steps, each a row of its own table, not of this one
    tests = names_of_tests(view)
    window_rows = [WindowRow(w, short_for(w, view.sources)) for w in view.windows
                   if not is_cache_fact(w) and not is_forecast(w) and w.name not in tests and not is_batch_window(w)]
    if figures is not None and options.carbon is not None:
        # window_carbon has one figure per window of the profile: each row takes its own window's
        grams = dict(zip(map(id, view.windows), window_carbon(view, figures, options.carbon)))
        for r in window_rows:
            r.carbon_g, r.cost = grams[id(r.window)], figures.cost(r.window.energy_j)
    notes = list(view.notes) + [Note("carbon", m) for m in (figures.notes if figures else [])]
    io = view.io
    absent = io.absent if io is not None else None
    if absent:  # collect/io.py found no /proc here (macOS): said, not left blank
        notes.append(Note("io", f"{absent}: no MB read, IOPS or disk busy time in this report"))
    counted = io.counted if io is not None else None
    # which block devices the disk figures add up, and where a window's bytes come from (Methodology only)
    io_method = (f"disk I/O (/proc/diskstats) counts the {counted}; a window's bytes are the counters read at its own"
                 " edges, in the program") if counted else None
    chart = prune(grouped_tree(view), options.max_chart_nodes)
    t = view.totals
    rss = [r for r in view.timeline.rss_bytes if r]
    sampled = t.peak_rss_bytes or (max(rss) if rss else None)
    # The kernel's mark reads its per-thread RSS counters, which lag by up to 64 pages a thread,
    # so it can come out below a sampled value; the exact peak is at least what was seen.
    exact = max(t.peak_rss_exact_bytes, sampled or 0) if t.peak_rss_exact_bytes is not None else None
    memory = MemoryFigures(t.baseline_rss_bytes or (rss[0] if rss else None), sampled, exact)
    return ReportModel(
        profile=view, policy=view.idle_policy, sources=view.sources, totals=t, rows=rows, top=top, top_by_self=top_by_self,
        chart=chart, windows=window_rows, window_groups=window_groups(window_rows), forecasts=_forecasts(profile),
        training=training_breakdowns(view), carbon=figures, notes=notes, processes=processes_of(view),
        groups=groups, own=mine, memory=memory, resolution_s=resolution_s(view.sources), peak_power_w=peak_power_w(view),
        duration_s=float(t.duration_s or view.meta.get("duration_s") or 0.0), meta=view.meta,
        training_ranks=training_by_rank(view),
        window_io=_window_io(view), io_method=io_method, backward_split=split,
        modules=modules_of(view, rows) if split else [],
        sweeps=_sweeps(view))


def _sweeps(profile: Profile) -> dict[str, tuple[list[WindowPoint], bool]]:
    names = sweep_names(profile.windows)
    if not names:
        return {}
    from .pareto import window_points

    return {name: window_points([profile.windows], name) for name in names}


def modules_of(profile: Profile, rows: list[FunctionRow]) -> list[FunctionRow]:
    """The model's modules' rows, heaviest first (forward and backward together)."""
    from .phases import module_keys

    by_key = {(r.function, r.file, r.line): r for r in rows}
    keys = module_keys(profile.root, {k: r.total_energy for k, r in by_key.items()})
    return [by_key[k] for k in keys if k in by_key]


def phase_row(row: FunctionRow, model: ReportModel) -> dict[str, Any]:
    """A row's forward, backward and total joules with their ± (1/sqrt(samples)), as every view gives them."""
    forward, backward = model.row_phases(row) or (None, None)
    return {"function": row.function, "file": row.file, "line": row.line, "energy_j": model.row_energy(row),
            "forward_j": forward, "backward_j": backward, "relative_error": row.relative_error,
            "backward_relative_error": row.backward_relative_error}


def _forecasts(profile: Profile) -> dict[str, dict[str, Any]]:
    """The tracked loops' forecasts beside their outcome; the maths' module (and `statistics`) only for a
    profile that has some."""
    if not any(is_forecast(w) for w in profile.windows):
        return {}
    from .forecast import forecast_views

    return forecast_views(profile)


def _window_io(profile: Profile) -> dict[str, dict[str, float]]:
    io = io_of(profile)
    if io is None:
        return {}
    out: dict[str, dict[str, float]] = {}
    for w in profile.windows:
        span = io_in_span(io, w.start_s, w.end_s)
        if span is None:
            continue
        g = out.setdefault(w.name, {"read_mb": 0.0, "reads": 0.0, "time_s": 0.0, "process_read_mb": 0.0})
        g["read_mb"] += span["disk_read_mb"]
        g["process_read_mb"] += span["process_read_mb"]
        g["reads"] += span["disk_reads"]
        g["time_s"] += w.end_s - w.start_s
    for g in out.values():
        g["read_iops"] = g["reads"] / g["time_s"] if g["time_s"] > 0 else 0.0
    return out


def processes_of(profile: Profile) -> list[Process]:
    """The job's processes in the profile's order (the program first, each process after its parent:
    pids wrap, so not by pid); older profiles listed children under `child_processes`."""
    if profile.processes:
        return list(profile.processes)
    legacy = profile.extra.get("child_processes")
    if not isinstance(legacy, list):
        return []
    from ..engines.roles import process_role  # the rule the collector applies as it sees a child

    out = []
    for c in legacy:
        if isinstance(c, dict) and isinstance(c.get("pid"), int):
            cpu = c.get("cpu_time_s")
            command = str(c.get("command", ""))
            out.append(Process(pid=c["pid"], command=command, role=process_role(command) or "child",
                               cpu_time_s=float(cpu) if isinstance(cpu, (int, float)) else 0.0))
    return sorted(out, key=lambda p: p.pid)


def peak_power_w(profile: Profile) -> float | None:
    """The highest total power over the timeline's intervals (all sources stacked)."""
    series = [v for v in profile.timeline.power_w.values() if v]
    if not series:
        return None
    n = min(len(v) for v in series)
    return max((sum(v[i] for v in series) for i in range(n)), default=None)
