"""Comparing runs: totals per source, windows and functions of several profiles. Pure.

Two sides are compared: the base's runs and the head's (a pull request's base and head, each run
one or more times). Given a plain list, the first run is the base and the last the head (the last
point of a sweep against the first). Every run appears in the totals, the windows and the
energy-against-time scatter, whose Pareto front is marked.

A change is judged against noise at `stats.CONFIDENCE`:
- with two or more runs per side, Welch's t interval over the repeats (their own spread);
- with one run per side, a sampled figure's sampling error (about figure / sqrt(samples) each, added
  in quadrature), which cannot see run-to-run noise: the text says so.
A function's change is *significant* when it lies outside that interval's half-width, which is
never narrower than the sampling error alone.

The program's total is not a sampled figure: it is the machine's energy shared by the program's CPU
clocks, which stack sampling does not touch (sampling only splits it among functions). Its interval
therefore comes from the repeats' spread alone; with one run per side there is no spread, and the
gate takes the change as measured, saying that run-to-run noise is unseen.

The gate's figure is the program's *CPU-capacity share of the machine's energy*: the machine's CPU-class
energy, idle included, times the program's CPU time over the run's span x the machine's logical CPUs, plus
its share of each GPU. It is not Kepler's active energy (idle is not taken out: under a flat 50 W it is
50 W x the program's CPU over the CPUs, where an active figure would be 0). It is taken because no
neighbour moves it under constant power: under `share` the program's figure holds a part of idle power
that shrinks when neighbours arrive (identical code read +20.5% when only the load changed).

Neighbours can still move it through the machine's power (a busier machine draws more per CPU-second), by
at most the ratio of the two sides' machine usage, and never more than the sides' measured power ratio.
So when the sides' loads (other processes' CPU share, `MachineLoad`) differ beyond what the repeats
separate, the limit is not widened: a figure within the limit passes, with the loads said; one above it
fails only when the load's most could not explain it (its lower end, divided by that ratio, still above
the limit), and is otherwise *inconclusive*, an outcome of its own. A profile without its load (an older
file, a merged one) is gated on its program energy under the view's policy, as before.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

from ..record import field, record, replace
from ..facts.profile import Node, group_role
from ..facts.profile import Profile
from ..facts.load import MachineLoad
from ..core.ledger import is_gpu
from .chart import frame_kind
from .functions import FunctionRow, relative_error
from .own import program_folder
from .pareto import WindowPoint, front, window_points
from .report import RenderOptions, ReportModel, build
from .stats import CONFIDENCE, Interval, known_error, welch
from .training import hold_program
from .units import UnitChange, unit_changes
from .windows import WindowRow

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
@record
class Run:
    label: str
    path: str
    duration_s: float
    machine_j: dict[str, float]
    program_j: dict[str, float]
    methods: dict[str, str]
    pareto: bool = False
    carbon_g: float | None = None  # the program's carbon, when the comparison was asked for carbon
    samples: int = 0  # the program's stack samples: its figure's sampling error is about 1/sqrt(samples)
    side: str = ""  # "base", "head", or "" for a run shown between them
    capacity_j: float | None = None  # the gate's figure: the program's CPU-capacity share of the machine's energy
    cpu_power_w: float | None = None  # the machine's mean CPU-class power over the load's span (None: no load)
    load: MachineLoad | None = None  # how busy the machine was

    @property
    def machine_total(self) -> float:
        return sum(self.machine_j.values())

    @property
    def program_total(self) -> float:
        return sum(self.program_j.values())

    @property
    def estimated(self) -> bool:
        return any(m != "measured" for m in self.methods.values())


@record
class Change:
    """One figure in the base and in the head (means over each side's runs), and the half-width
    of the change's interval: the larger of the repeats' spread and the sampling error."""

    before: float
    after: float
    error: float

    @property
    def delta(self) -> float:
        return self.after - self.before

    @property
    def pct(self) -> float | None:
        return self.delta / self.before * 100 if self.before else None

    @property
    def significant(self) -> bool:
        return abs(self.delta) > self.error


@record
class FunctionChange:
    function: str
    file: str
    line: int
    self_energy: Change
    energy: Change
    self_time: Change
    time: Change
    samples: tuple[int, int]
    user: bool = True  # the program's own code (not a library, an import, or a bracketed node)


@record
class WindowChange:
    """One window name across the runs (as FunctionChange is one function): each run's count and mean,
    from the report's rows of its windows (analysis/windows.WindowRow)."""

    name: str
    count: list[int]
    mean_j: list[float | None]  # per run (None: the run has no such window)
    mean_time_s: list[float | None]
    # the energy is the program's part of each window, as the sweep plot shows it; False: the machine's,
    # for files written before windows held the program's part
    program: bool = True
    side: list[str] = field(default_factory=list)  # per run: "base", "head" or "" (Run.side)

    @property
    def compared(self) -> bool:
        """Both sides have the window: its change can be given."""
        a, b = side_means(self.mean_j, self.side)
        return a is not None and b is not None

    @property
    def pct(self) -> float | None:
        """The head's mean against the base's, as the verdict takes them (every run of each side)."""
        a, b = side_means(self.mean_j, self.side)
        return (b - a) / a * 100 if a and b is not None else None


def side_means(values: Sequence[float | None], sides: Sequence[str]) -> tuple[float | None, float | None]:
    """The mean over the base's runs and over the head's of one figure per run (a run without it left out),
    the means the verdict compares; without sides, the first run against the last."""
    if not sides:
        return (values[0] if values else None), (values[-1] if values else None)

    def mean(side: str) -> float | None:
        got = [v for v, s in zip(values, sides) if s == side and v is not None]
        return statistics.fmean(got) if got else None

    return mean("base"), mean("head")


@record
class TreeNode:
    """A call path in either run: the differential icicle's box."""

    id: str
    parent: str
    function: str
    file: str
    self_j: tuple[float, float]
    energy_j: tuple[float, float]


@record(frozen=True)
class LoadDifference:
    """The machine's load differed between the sides beyond what the repeats separate: other processes'
    mean CPU share on each side (0 to 1), and the most the load alone can have raised the gate's figure, in
    percent: the base's machine usage with the head's neighbours over its own, less one (power grows with
    usage, at most in proportion); 0 when the head's neighbours were quieter, None when the base's machine
    showed no busy CPU at all (nothing bounds the ratio)."""

    base_others: float
    head_others: float
    reach_pct: float | None


PASS, FAIL, INCONCLUSIVE = "ok", "FAIL", "inconclusive"


@record(frozen=True)
class Verdict:
    """The gate's figure: the head's mean against the base's, with its interval (in the figure's unit).

    `repeats` False: one run per side, so the interval is the sampling error's (a sampled figure) or
    the point itself (`sampled` False: the program's total), and run-to-run noise of any size can hide
    inside it."""

    what: str
    base: float
    head: float
    interval: Interval
    sampled: bool = True  # the figure is built from stack samples (a function's), not the program's total
    load: LoadDifference | None = None  # set when the sides' machine loads differ

    @property
    def repeats(self) -> bool:
        return self.interval.df is not None

    def _pct(self, value: float) -> float | None:
        return value / self.base * 100 if self.base else None

    @property
    def pct(self) -> float | None:
        return self._pct(self.interval.diff)

    @property
    def low_pct(self) -> float | None:
        return self._pct(self.interval.low)

    @property
    def high_pct(self) -> float | None:
        return self._pct(self.interval.high)

    @property
    def hidden_pct(self) -> float | None:
        """The smallest change this noise cannot hide: the interval's half-width, in percent (with repeats,
        the smallest change they can detect)."""
        return self._pct(self.interval.half_width)

    def outcome(self, limit_pct: float) -> str:
        """PASS, FAIL or INCONCLUSIVE against `limit_pct`. Above the limit with confidence (the interval's
        lower end more than `limit_pct` above the base; a figure that appeared from nothing) is a FAIL, unless
        the sides' loads differed and their most could explain it: then INCONCLUSIVE. The limit itself is
        never widened, and less energy never fails."""
        if not self.base:
            return FAIL if self.head > 0 else PASS
        low = self.low_pct
        if low is None or low <= limit_pct:
            return PASS
        if self.load is None:
            return FAIL
        if self.load.reach_pct is None:
            return INCONCLUSIVE
        worst = ((1 + low / 100) / (1 + self.load.reach_pct / 100) - 1) * 100  # the load's most taken out
        return FAIL if worst > limit_pct else INCONCLUSIVE

    def fails(self, limit_pct: float) -> bool:
        return self.outcome(limit_pct) == FAIL


@record
class Comparison:
    runs: list[Run]
    sources: list[str]
    windows: list[WindowChange]
    functions: list[FunctionChange]
    tree: list[TreeNode] = field(default_factory=list)
    verdict: Verdict | None = None  # program energy, head against base
    sweep: str | None = None  # --windows NAME: that name's windows as points of energy against time
    sweep_points: list[WindowPoint] = field(default_factory=list)
    sweep_program: bool = True  # the points' energy is the program's (else the machine's: an older file)
    folder: str | None = None  # the base's program folder: files are shown relative to it
    settings_differ: list[str] = field(default_factory=list)  # the machine's settings, base against head
    units: list[UnitChange] = field(default_factory=list)  # requests by route, tasks: per run (analysis/units.py)

    @property
    def base_runs(self) -> list[Run]:
        return [r for r in self.runs if r.side == "base"]

    @property
    def head_runs(self) -> list[Run]:
        return [r for r in self.runs if r.side == "head"]

    @property
    def base(self) -> Run:
        return self.base_runs[0]

    @property
    def last(self) -> Run:
        return self.head_runs[-1]

    @property
    def repeats(self) -> bool:
        return len(self.base_runs) > 1 and len(self.head_runs) > 1


def compare(profiles: Sequence[Profile], paths: Sequence[str] | None = None,
            labels: Sequence[str] | None = None, options: RenderOptions | None = None,
            base_count: int | None = None, windows: str | None = None) -> Comparison:
    """Compare two or more profiles.

    `base_count` None: the first is the base and the last the head (a sweep; those between are
    shown only). Otherwise the first `base_count` profiles are the base's repeats and the rest the
    head's. Each run is seen through its report model under `options` (idle None: each run's own
    policy; carbon None, the default here: no carbon figures). `windows` NAME places every window of
    that name (`NAME` or `NAME:LABEL`) in every run as a point of energy against time."""
    if len(profiles) < 2:
        raise ValueError("compare needs at least two profiles")
    n = len(profiles)
    if base_count is not None and not 0 < base_count < n:
        raise ValueError("each side needs at least one profile")
    base_ix = list(range(base_count)) if base_count is not None else [0]
    head_ix = list(range(base_count, n)) if base_count is not None else [n - 1]
    paths = list(paths) if paths is not None else [""] * n
    names = list(labels) if labels else [_label(p) for p in profiles]
    models = [_model(p, options) for p in profiles]
    runs = [Run(names[i], paths[i], m.duration_s, dict(m.totals.energy_j), dict(m.totals.attributed_j), _methods(m),
                carbon_g=_carbon_g(m), samples=m.profile.root.samples,
                side="base" if i in base_ix else "head" if i in head_ix else "", capacity_j=capacity_share_energy(profiles[i]),
                cpu_power_w=cpu_power(profiles[i]),
                load=profiles[i].load) for i, m in enumerate(models)]
    _mark_pareto(runs)
    sources: list[str] = []
    for r in runs:
        for sid in (*r.machine_j, *r.program_j):
            if sid not in sources:
                sources.append(sid)
    base_models, head_models = [models[i] for i in base_ix], [models[i] for i in head_ix]
    # an idle policy asked for by name gates on the program's energy under it; else the capacity share
    verdict = run_gate([runs[i] for i in base_ix], [runs[i] for i in head_ix],
                       capacity=options is None or options.idle is None)
    points, program = window_points([m.profile.windows for m in models], windows) if windows else ([], True)
    return Comparison(runs, sources, _window_rows(models, [r.side for r in runs]),
                      _function_changes(base_models, head_models),
                      _diff_tree(base_models[0].profile.root, head_models[-1].profile.root), verdict,
                      windows, points, program, program_folder(profiles[base_ix[0]]),
                      _settings_differ(base_models, head_models),
                      unit_changes([m.profile.windows for m in models], base_ix, head_ix))


def _settings_differ(base: Sequence[ReportModel], head: Sequence[ReportModel]) -> list[str]:
    """Each setting (governor, power limits, power mode...) that differs between any base run and any
    head run, once: a difference there can explain an energy change that no code change made."""
    from .settings import differences

    lines: list[str] = []
    for a in base:
        for b in head:
            for line in differences(a.profile.known_meta.settings, b.profile.known_meta.settings):
                if line not in lines:
                    lines.append(line)
    return lines


def gate(base: Sequence[float], head: Sequence[float], base_samples: Sequence[int], head_samples: Sequence[int],
         what: str, confidence: float = CONFIDENCE) -> Verdict:
    """Head against base for one figure given per run: Welch's interval over repeats when each side has
    two or more, never narrower than the sampling error of the means; else the sampling error's."""
    ma, mb = statistics.fmean(base), statistics.fmean(head)
    sampled = known_error(ma, _mean_error(base, base_samples), mb, _mean_error(head, head_samples), confidence)
    if len(base) < 2 or len(head) < 2:  # a side without repeats has no spread to judge by
        return Verdict(what, ma, mb, Interval(sampled.diff, sampled.low, sampled.high, confidence, None,
                                              (len(base), len(head))))
    spread = welch(base, head, confidence)
    if spread.half_width >= sampled.half_width:
        return Verdict(what, ma, mb, spread)
    return Verdict(what, ma, mb, Interval(spread.diff, sampled.low, sampled.high, confidence, spread.df, spread.n))


CAPACITY_SHARE = "program's CPU-capacity share of the machine's energy"
LOAD_STEP = 0.05  # one run per side: loads this far apart (of the machine's CPU) are said to differ
LOAD_FLOOR = 0.01  # with repeats, a difference below 1% of the machine's CPU is /proc/stat's 10 ms ticks


def _cpu_energy(p: Profile) -> float:
    gpus = {s.id for s in p.sources if is_gpu(s.component)}
    return sum(j for sid, j in p.totals.energy_j.items() if sid not in gpus)


def cpu_power(p: Profile) -> float | None:
    """The machine's mean CPU-class power over the run's load span: what neighbours move the gate's figure by."""
    return _cpu_energy(p) / p.load.span_s if p.load is not None and p.load.span_s > 0 else None


def capacity_share_energy(p: Profile) -> float | None:
    """The program's CPU-capacity share of the machine's energy (module docstring): the machine's CPU-class
    energy, idle included, times the program's CPU over span x CPUs, plus the program's part of each GPU
    under `share`. None without the run's load, or with GPU figures held under `all` only."""
    load = p.load
    if load is None or load.capacity_s <= 0:
        return None
    gpus = {s.id for s in p.sources if is_gpu(s.component)}
    cpu = _cpu_energy(p) * load.program_share
    if not gpus:
        return cpu
    if "share" not in p.policies():
        return None
    shared = p.with_policy("share")
    return cpu + sum(shared.totals.attributed_j.get(sid, 0.0) for sid in gpus)


def run_gate(base: Sequence[Run], head: Sequence[Run], confidence: float = CONFIDENCE,
             capacity: bool = True) -> Verdict:
    """The gate on the program's CPU-capacity share of the machine's energy when every run holds its load,
    with the loads compared; else (`capacity` False: a policy asked for by name; or an older file) on its
    energy under the view's policy."""
    if capacity and all(r.capacity_j is not None for r in (*base, *head)):
        verdict = program_gate([r.capacity_j or 0.0 for r in base], [r.capacity_j or 0.0 for r in head], confidence,
                               CAPACITY_SHARE)
        loads = load_difference([r.load for r in base if r.load], [r.load for r in head if r.load], confidence,
                                ([r.cpu_power_w or 0.0 for r in base], [r.cpu_power_w or 0.0 for r in head]))
        return replace(verdict, load=loads) if loads is not None else verdict
    return program_gate([r.program_total for r in base], [r.program_total for r in head], confidence)


def load_difference(base: Sequence[MachineLoad], head: Sequence[MachineLoad], confidence: float = CONFIDENCE,
                    power: tuple[Sequence[float], Sequence[float]] = ((), ())) -> LoadDifference | None:
    """The sides' loads, when they differ beyond what the repeats separate (Welch's interval of other
    processes' CPU share excludes no difference, and by LOAD_FLOOR or more), or, with a side of one run, by
    LOAD_STEP or more; with the most the load can have raised the gate's figure (`LoadDifference`)."""
    if not base or not head:
        return None
    a, b = [x.others_share for x in base], [x.others_share for x in head]
    step = abs(statistics.fmean(b) - statistics.fmean(a))
    if len(a) >= 2 and len(b) >= 2:
        spread = welch(a, b, confidence)
        differ = (spread.low > 0 or spread.high < 0) and step >= LOAD_FLOOR
    else:
        differ = step >= LOAD_STEP
    if not differ:
        return None
    return LoadDifference(statistics.fmean(a), statistics.fmean(b), _reach(base, b, power))


def _reach(base: Sequence[MachineLoad], head_others: Sequence[float],
           power: tuple[Sequence[float], Sequence[float]]) -> float | None:
    """The most the head's neighbours can have raised the figure, in percent: neighbours move it only
    through the machine's power, so by no more than the base's machine usage with the head's neighbours
    over its own (power grows with usage, at most in proportion; the program's own part is the base's, so a
    program that itself uses more CPU is not excused), nor than the head's measured power over the base's.
    None when neither bounds it (no busy CPU, no power on the base's side)."""
    bounds = []
    usage = statistics.fmean(x.usage for x in base)
    if usage > 0:
        own = max(0.0, usage - statistics.fmean(x.others_share for x in base))
        bounds.append(max(0.0, (min(1.0, own + statistics.fmean(head_others)) / usage - 1) * 100))
    pa, pb = power
    if pa and pb and statistics.fmean(pa) > 0:
        bounds.append(max(0.0, (statistics.fmean(pb) / statistics.fmean(pa) - 1) * 100))
    return min(bounds) if bounds else None


def program_gate(base: Sequence[float], head: Sequence[float], confidence: float = CONFIDENCE,
                 what: str = "program energy") -> Verdict:
    """The gate on the program's total: its noise is run to run, never sampling (module docstring), so
    the interval is Welch's over the repeats, or with a side of one run the change itself."""
    ma, mb = statistics.fmean(base), statistics.fmean(head)
    if len(base) < 2 or len(head) < 2:
        diff = mb - ma
        return Verdict(what, ma, mb, Interval(diff, diff, diff, confidence, None, (len(base), len(head))),
                       sampled=False)
    return Verdict(what, ma, mb, welch(base, head, confidence), sampled=False)


def _mean_error(values: Sequence[float], samples: Sequence[int]) -> float:
    """The sampling error of the mean of figures each built from its own samples."""
    return math.sqrt(sum(_error(v, n) ** 2 for v, n in zip(values, samples))) / len(values)


def _mark_pareto(runs: list[Run]) -> None:
    """A run is on the front when no other run is at least as fast and as frugal, and better in one."""
    for r, on in zip(runs, front([(r.duration_s, r.program_total) for r in runs])):
        r.pareto = on


def _window_rows(models: Sequence[ReportModel], sides: Sequence[str] = ()) -> list[WindowChange]:
    names: list[str] = []
    per_run: list[dict[str, list[WindowRow]]] = []
    for m in models:
        groups: dict[str, list[WindowRow]] = {}
        for row in m.windows:
            groups.setdefault(row.window.name, []).append(row)
            if row.window.name not in names:
                names.append(row.window.name)
        per_run.append(groups)
    rows = []
    for name in names:
        rs = [g.get(name, []) for g in per_run]
        # the program's part where every run's windows hold it, else the machine's for all, alike
        program = hold_program(r.window for x in rs for r in x)
        rows.append(WindowChange(
            name, [len(x) for x in rs],
            [statistics.fmean(r.program if program else r.energy for r in x) if x else None for x in rs],
            [statistics.fmean(r.window.time_s for r in x) if x else None for x in rs], program, list(sides)))
    return rows


def _error(value: float, samples: int) -> float:
    """A figure's sampling error: the figure times its row's relative error (about 1/sqrt(n))."""
    return abs(value) * (relative_error(samples) or 0.0)


def _change(a: Sequence[float], na: Sequence[int], b: Sequence[float], nb: Sequence[int]) -> Change:
    """One figure per run on each side (sample counts beside them) -> the change of the means.

    A figure that no sample carried ([energyprof]'s own clocks, the idle node) has no sampling
    error; with one run per side there is no spread either, so nothing can judge its change: it
    gets an unbounded interval and is never called significant (a +80% swing of energyprof's own
    CPU between two identical runs was once flagged)."""
    if (len(a) < 2 or len(b) < 2) and any(v and not n for v, n in zip((*a, *b), (*na, *nb))):
        return Change(statistics.fmean(a), statistics.fmean(b), math.inf)
    v = gate(a, b, na, nb, "")
    return Change(v.base, v.head, v.interval.half_width)


def user_functions(profile: Profile) -> set[tuple[str, str]]:
    """(function, file) of the frames that are the program's own code somewhere in its tree."""
    out: set[tuple[str, str]] = set()
    files: list[str] = []
    for node, depth in profile.walk():
        del files[depth:]
        parent = files[-1] if files else ""
        if depth and not node.function.startswith("[") and frame_kind(node.function, node.file, parent) == "user":
            out.add((node.function, node.file))
        files.append(node.file)
    return out


def _function_changes(base: Sequence[ReportModel], head: Sequence[ReportModel]) -> list[FunctionChange]:
    """The report models' function rows, matched by name and file (a line number moves with any edit
    above it; a thread or process group's count with the run); the program's own functions first, each
    group by its largest self-energy change."""
    def index(rows: list[FunctionRow]) -> dict[tuple[str, str], FunctionRow]:
        out: dict[tuple[str, str], FunctionRow] = {}
        for row in rows:
            out.setdefault((group_role(row.function), row.file), row)
        return out

    a, b = [index(m.rows) for m in base], [index(m.rows) for m in head]
    user = set().union(*(user_functions(m.profile) for m in (*base, *head)))
    empty = FunctionRow("", "", 0)
    keys: dict[tuple[str, str], None] = {}
    for side in (*a, *b):
        keys.update(dict.fromkeys(side))
    out = []
    for key in keys:
        ra, rb = [x.get(key, empty) for x in a], [x.get(key, empty) for x in b]
        line = next((r.line for r in reversed([*ra, *rb]) if r is not empty), 0)

        def change(value: str, count: str) -> Change:
            return _change([getattr(r, value) for r in ra], [getattr(r, count) for r in ra],
                           [getattr(r, value) for r in rb], [getattr(r, count) for r in rb])

        out.append(FunctionChange(
            key[0], key[1], line,
            change("self_total_energy", "self_samples"), change("total_energy", "samples"),
            change("self_time_s", "self_samples"), change("time_s", "samples"),
            (sum(r.samples for r in ra), sum(r.samples for r in rb)), key in user))
    out.sort(key=lambda f: (not f.user, -abs(f.self_energy.delta)))
    return out


def function_gate(base: Sequence[Profile], head: Sequence[Profile], function: str,
                  options: RenderOptions | None = None) -> Verdict | None:
    """The gate on one function's inclusive energy (0 in a run without it); None when no run has it."""
    rows = [[*_function_rows(p, function, options)] for p in (*base, *head)]
    if not any(rows):
        return None
    energy = [sum(r.total_energy for r in x) for x in rows]
    samples = [sum(r.samples for r in x) for x in rows]
    k = len(base)
    return gate(energy[:k], energy[k:], samples[:k], samples[k:], f"function {function}")


def _function_rows(profile: Profile, function: str, options: RenderOptions | None) -> list[FunctionRow]:
    return [r for r in _model(profile, options).rows if r.function == function]


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
