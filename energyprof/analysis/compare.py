"""Comparing runs: totals per source, windows and functions of several profiles. Pure.

The first run is the baseline and the last is the one compared with it (a pull request's head
against its base; the last point of a sweep against the first). Every run appears in the
totals, the windows and the energy-against-time scatter, whose Pareto front is marked.

A function's change is *significant* only when it exceeds the combined sampling error of the
two figures: each side's figure built from n samples is uncertain by about figure / sqrt(n),
and the two errors add in quadrature.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..profile import Node, Profile, Window
from .functions import FunctionRow, relative_error
from .report import RenderOptions, ReportModel, build

MAX_TREE_NODES = 1500  # the differential icicle: plotly draws one SVG element per box


# -- what this module reads: the report model of each run (one place) --------------------------------
def _model(p: Profile, options: RenderOptions | None) -> ReportModel:
    """Program energy under the policy, function rows and their sampling error come from the model."""
    return build(p, options if options is not None else RenderOptions(carbon=None))


def _methods(m: ReportModel) -> dict[str, str]:
    return {s.id: s.method for s in m.sources}


def _label(p: Profile) -> str:
    argv = p.meta.get("argv") or []
    return " ".join(str(a) for a in argv) if argv else str(p.meta.get("target", "<program>"))


def _carbon_g(m: ReportModel) -> float | None:
    return m.carbon.program_g if m.carbon is not None else None


# -- the comparison ------------------------------------------------------------------------------
@dataclass
class Run:
    label: str
    path: str
    duration_s: float
    machine_j: dict[str, float]
    program_j: dict[str, float]
    methods: dict[str, str]
    pareto: bool = False
    carbon_g: float | None = None  # the program's carbon, when the comparison was asked for carbon

    @property
    def machine_total(self) -> float:
        return sum(self.machine_j.values())

    @property
    def program_total(self) -> float:
        return sum(self.program_j.values())

    @property
    def estimated(self) -> bool:
        return any(m != "measured" for m in self.methods.values())


@dataclass
class Change:
    """One figure in the baseline and in the compared run, with the sampling error of the change."""

    before: float
    after: float
    error: float  # combined sampling error of after - before (same unit)

    @property
    def delta(self) -> float:
        return self.after - self.before

    @property
    def pct(self) -> float | None:
        return self.delta / self.before * 100 if self.before else None

    @property
    def significant(self) -> bool:
        return abs(self.delta) > self.error


@dataclass
class FunctionChange:
    function: str
    file: str
    line: int
    self_energy: Change
    energy: Change
    self_time: Change
    time: Change
    samples: tuple[int, int]


@dataclass
class WindowRow:
    name: str
    count: list[int]
    mean_j: list[float | None]  # per run (None: the run has no such window)
    mean_time_s: list[float | None]

    @property
    def pct(self) -> float | None:
        a, b = self.mean_j[0], self.mean_j[-1]
        return (b - a) / a * 100 if a and b is not None else None


@dataclass
class TreeNode:
    """A call path in either run: the differential icicle's box."""

    id: str
    parent: str
    function: str
    file: str
    self_j: tuple[float, float]
    energy_j: tuple[float, float]


@dataclass
class Comparison:
    runs: list[Run]
    sources: list[str]
    windows: list[WindowRow]
    functions: list[FunctionChange]
    tree: list[TreeNode] = field(default_factory=list)

    @property
    def base(self) -> Run:
        return self.runs[0]

    @property
    def last(self) -> Run:
        return self.runs[-1]


def compare(profiles: Sequence[Profile], paths: Sequence[str] | None = None,
            labels: Sequence[str] | None = None, options: RenderOptions | None = None) -> Comparison:
    """Compare two or more profiles; the first is the baseline, the last the compared run.

    Each run is seen through its report model under `options` (idle None: each run's own policy;
    carbon None, the default here: no carbon figures)."""
    if len(profiles) < 2:
        raise ValueError("compare needs at least two profiles")
    paths = list(paths) if paths is not None else [""] * len(profiles)
    names = list(labels) if labels else [_label(p) for p in profiles]
    models = [_model(p, options) for p in profiles]
    runs = [Run(names[i], paths[i], m.duration_s, dict(m.totals.energy_j), dict(m.totals.attributed_j), _methods(m),
                carbon_g=_carbon_g(m)) for i, m in enumerate(models)]
    _mark_pareto(runs)
    sources: list[str] = []
    for r in runs:
        for sid in (*r.machine_j, *r.program_j):
            if sid not in sources:
                sources.append(sid)
    return Comparison(runs, sources, _window_rows(models), _function_changes(models[0].rows, models[-1].rows),
                      _diff_tree(models[0].profile.root, models[-1].profile.root))


def _mark_pareto(runs: list[Run]) -> None:
    """A run is on the front when no other run is at least as fast and as frugal, and better in one."""
    for r in runs:
        r.pareto = not any(
            o is not r and o.duration_s <= r.duration_s and o.program_total <= r.program_total
            and (o.duration_s < r.duration_s or o.program_total < r.program_total)
            for o in runs)


def _window_rows(models: Sequence[ReportModel]) -> list[WindowRow]:
    names: list[str] = []
    per_run: list[dict[str, list[Window]]] = []
    for m in models:
        groups: dict[str, list[Window]] = {}
        for row in m.windows:
            groups.setdefault(row.window.name, []).append(row.window)
            if row.window.name not in names:
                names.append(row.window.name)
        per_run.append(groups)
    rows = []
    for name in names:
        ws = [g.get(name, []) for g in per_run]
        rows.append(WindowRow(
            name, [len(x) for x in ws],
            [statistics.fmean(sum(w.energy_j.values()) for w in x) if x else None for x in ws],
            [statistics.fmean(w.time_s for w in x) if x else None for x in ws]))
    return rows


def _error(value: float, samples: int) -> float:
    """A figure's sampling error: the figure times its row's relative error (about 1/sqrt(n))."""
    return abs(value) * (relative_error(samples) or 0.0)


def _change(a: float, na: int, b: float, nb: int) -> Change:
    return Change(a, b, math.hypot(_error(a, na), _error(b, nb)))


def _function_changes(base: list[FunctionRow], last: list[FunctionRow]) -> list[FunctionChange]:
    """The report model's function rows, matched by name and file (a line number moves with any edit above it)."""
    def index(rows: list[FunctionRow]) -> dict[tuple[str, str], FunctionRow]:
        out: dict[tuple[str, str], FunctionRow] = {}
        for row in rows:
            out.setdefault((row.function, row.file), row)
        return out

    a, b = index(base), index(last)
    empty = FunctionRow("", "", 0)
    out = []
    for key in [*a, *(k for k in b if k not in a)]:
        ra, rb = a.get(key, empty), b.get(key, empty)
        out.append(FunctionChange(
            key[0], key[1], (b.get(key) or ra).line,
            _change(ra.self_total_energy, ra.self_samples, rb.self_total_energy, rb.self_samples),
            _change(ra.total_energy, ra.samples, rb.total_energy, rb.samples),
            _change(ra.self_time_s, ra.self_samples, rb.self_time_s, rb.self_samples),
            _change(ra.time_s, ra.samples, rb.time_s, rb.samples),
            (ra.samples, rb.samples)))
    out.sort(key=lambda f: -abs(f.self_energy.delta))
    return out


def function_energy(profile: Profile, function: str, options: RenderOptions | None = None) -> float | None:
    """A function's inclusive energy over all its call paths (recursion counted once); None if absent."""
    rows = [r for r in _model(profile, options).rows if r.function == function]
    return sum(r.total_energy for r in rows) if rows else None


def _diff_tree(root_a: Node, root_b: Node) -> list[TreeNode]:
    """Both trees merged by call path (function and file at each level), breadth first, pruned."""
    nodes: list[TreeNode] = []
    queue: list[tuple[str, str, Node | None, Node | None]] = [("0", "", root_a, root_b)]
    total = max(root_a.total_energy, root_b.total_energy) or 1.0
    while queue and len(nodes) < MAX_TREE_NODES:
        nid, parent, a, b = queue.pop(0)
        ref = b if b is not None else a
        nodes.append(TreeNode(nid, parent, ref.function, ref.file,
                              (a.self_total_energy if a is not None else 0.0, b.self_total_energy if b is not None else 0.0),
                              (a.total_energy if a is not None else 0.0, b.total_energy if b is not None else 0.0)))
        kids: dict[tuple[str, str], list[Any]] = {}
        for side, node in ((0, a), (1, b)):
            for c in (node.children if node is not None else []):
                kids.setdefault((c.function, c.file), [None, None])[side] = c
        for i, (ca, cb) in enumerate(sorted(kids.values(), key=lambda pair: -max(
                x.total_energy if x is not None else 0.0 for x in pair))):
            size = max(x.total_energy if x is not None else 0.0 for x in (ca, cb))
            if size >= 1e-4 * total:  # smaller paths stay in their parent's box
                queue.append((f"{nid}.{i}", nid, ca, cb))
    return nodes


def over_limit(pct: float, base: float | None, last: float | None) -> bool:
    """True when `last` is more than `pct` percent above `base` (a figure that appeared counts as above)."""
    if last is None or last <= 0:
        return False
    if not base:
        return True
    return (last - base) / base * 100 > pct
