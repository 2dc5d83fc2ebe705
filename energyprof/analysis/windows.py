"""Window views: groups by name (mean and spread), per rank in a distributed job, and spans too short
for a sensor's updates. Pure."""

from __future__ import annotations

from typing import Iterable


from ..record import field, record
from ..facts.profile import Profile
from ..facts.profile import Source
from ..facts.profile import Window
from .kinds import window_program_j

MIN_UPDATES = 3  # a span shorter than this many sensor updates is below the sensor's resolution


@record
class WindowRow:
    """One window as shown: its facts, the sources it is too short for, its carbon and cost."""

    window: Window
    short_for: list[str] = field(default_factory=list)
    carbon_g: float | None = None
    cost: float | None = None

    @property
    def energy(self) -> float:
        """The machine's energy in the span."""
        return self.window.total_j

    @property
    def program(self) -> float:
        """The program's part of it (the machine's in files written before windows held it)."""
        return window_program_j(self.window)


@record
class WindowGroup:
    """A window name's figures. In one process they are the program's energy (its part of each span,
    the same kind of figure as the whole program's total), with the machine's mean in its own field;
    a multi-rank group's own figures are the machine's over the ranks' spans (its rank rows the program's)."""

    name: str
    count: int
    total_j: float
    mean_j: float
    stdev_j: float
    min_j: float
    max_j: float
    mean_time_s: float
    short: int
    # In a job whose windows come from several ranks: one group per rank (name "rank R") holding
    # that rank's program share, and this group holds the machine over the union of the ranks'
    # spans on each node (counted once, summed over nodes), per window index. Empty otherwise, so
    # a single process's groups are as they always were.
    ranks: list[WindowGroup] = field(default_factory=list)
    machine_mean_j: float | None = None  # the machine's energy per window (all of every source in the span)


def short_for(window: Window, sources: list[Source]) -> list[str]:
    """Sources whose update period is too coarse for this window (A100/H100 power: ~100 ms)."""
    return [s.id for s in sources if s.update_period_s and window.time_s < MIN_UPDATES * s.update_period_s]


def resolution_s(sources: list[Source]) -> float | None:
    """Below this much time a figure is finer than the slowest sensor updates."""
    periods = [s.update_period_s for s in sources if s.update_period_s]
    return MIN_UPDATES * max(periods) if periods else None


def window_groups(rows: list[WindowRow]) -> list[WindowGroup]:
    """Energy per window name: count, mean and spread (epochs, steps, phases). With windows from
    several ranks, one row per rank holds that rank's program share, and the group the machine
    over the ranks' spans, each node counted once: a window of the same name and index in every
    rank is one instance, its energy the machine's over the union of their spans; the ranks' shares
    of an instance never add up to more than that (`_fit`)."""
    groups: dict[str, list[WindowRow]] = {}
    for r in rows:
        groups.setdefault(r.window.name, []).append(r)
    several = len(window_ranks(r.window for r in rows)) > 1
    out = []
    for name, ws in groups.items():
        if not several:
            group = _group(name, ws, [r.program for r in ws])
            group.machine_mean_j = sum(r.energy for r in ws) / len(ws)
            out.append(group)
            continue
        instances: dict[int | None, list[Window]] = {}
        for r in ws:
            instances.setdefault(r.window.index, []).append(r.window)
        import statistics  # here: with fractions and decimal, 3 ms of every report, most without windows

        energies = [span_energy(i) for i in instances.values()]
        times = [span_time(i) for i in instances.values()]
        fit = {k: f for i in instances.values() for k, f in _fit(i).items()}
        group = WindowGroup(name, len(energies), span_energy([r.window for r in ws]), statistics.fmean(energies),
                            statistics.stdev(energies) if len(energies) > 1 else 0.0, min(energies), max(energies),
                            statistics.fmean(times), sum(1 for r in ws if r.short_for))
        group.machine_mean_j = group.mean_j
        by_rank: dict[tuple[bool, int], list[WindowRow]] = {}
        for r in ws:
            by_rank.setdefault(_rank_key(r.window), []).append(r)
        group.ranks = [_group(_rank_label(key), rs, [r.program * fit.get((r.window.index, r.window.node), 1.0)
                                                      for r in rs])
                       for key, rs in sorted(by_rank.items())]
        out.append(group)
    return out


def _group(name: str, ws: list[WindowRow], energies: list[float]) -> WindowGroup:
    import statistics

    return WindowGroup(name, len(ws), sum(energies), statistics.fmean(energies),
                       statistics.stdev(energies) if len(ws) > 1 else 0.0, min(energies), max(energies),
                       statistics.fmean(r.window.time_s for r in ws), sum(1 for r in ws if r.short_for))


def _segments(windows: Iterable[Window]) -> Iterable[tuple[float, float, float]]:
    """(start, end, the machine's power) of each stretch of time covered by at least one of the
    windows, per node: where spans overlap, the mean of the power their windows measured (they
    read one machine, so they agree but for where their edges fall between sensor readings)."""
    by_node: dict[str | None, list[Window]] = {}
    for w in windows:
        if w.end_s > w.start_s:
            by_node.setdefault(w.node, []).append(w)
    for ws in by_node.values():
        events = sorted([(w.start_s, 1, w.total_j / (w.end_s - w.start_s)) for w in ws]
                        + [(w.end_s, -1, w.total_j / (w.end_s - w.start_s)) for w in ws])
        open_n, power, last = 0, 0.0, None
        for t, kind, p in events:
            if open_n and last is not None and t > last:
                yield last, t, power / open_n
            open_n += kind
            power = power + p * kind if open_n else 0.0
            last = t


def _fit(instance: list[Window]) -> dict[tuple[int | None, str | None], float]:
    """The factor, per (index, node), that brings the ranks' program shares of one window within the
    machine's energy over its span. Each rank's supervisor takes its share apart from the others',
    by CPU counters that move in steps, so ranks that kept the whole machine busy can be charged a
    little more than it between them (1 % was seen). The machine's figure is the measurement: the
    shares, the estimate, are scaled down to fit it, and are left alone wherever they fit."""
    by_node: dict[str | None, list[Window]] = {}
    for w in instance:
        by_node.setdefault(w.node, []).append(w)
    out = {}
    for node, ws in by_node.items():
        charged = sum(w.program_total_j or 0.0 for w in ws)
        machine = span_energy(ws)
        if charged > machine:
            out[(ws[0].index, node)] = machine / charged
    return out


def span_energy(windows: Iterable[Window]) -> float:
    """The machine's energy over the union of the windows' spans, each node once, summed over nodes."""
    return sum(p * (b - a) for a, b, p in _segments(windows))


def span_time(windows: Iterable[Window]) -> float:
    """The length of the union of the windows' spans (per node, summed over nodes)."""
    return sum(b - a for a, b, _ in _segments(windows))


def _rank_key(w: Window) -> tuple[bool, int]:
    """Ranks first by number; a window from a process with no rank (the launcher) by its pid."""
    return (False, w.rank) if w.rank is not None else (True, w.pid if w.pid is not None else -1)


def _rank_label(key: tuple[bool, int]) -> str:
    no_rank, n = key
    return f"rank {n}" if not no_rank else (f"pid {n}" if n >= 0 else "no rank")


def window_ranks(windows: Iterable[Window]) -> list[int]:
    """The ranks that marked these windows, in order."""
    return sorted({w.rank for w in windows if w.rank is not None})


def _loaders(windows: Iterable[Window]) -> list[str]:
    """Tracked loaders: the names of windows named `<loader>.compute`."""
    return sorted({w.name[: -len(".compute")] for w in windows if w.name.endswith(".compute")})


def training_breakdowns(profile: Profile) -> dict[str, dict]:
    """The fetch/compute split for every tracked loader (windows named `<loader>.compute`).
    Empty when several ranks tracked loaders: their steps are paired per rank (`training_by_rank`)."""
    loaders = _loaders(profile.windows)
    if not loaders or _tracked_ranks(profile) > 1:
        return {}
    from .training import breakdown  # the training table's module only for a run with a tracked loop

    return {name: breakdown(profile, name) for name in loaders}


def _tracked_ranks(profile: Profile) -> int:
    return len(window_ranks(w for w in profile.windows if w.name.endswith(".compute")))


def training_by_rank(profile: Profile) -> dict[str, dict[int, dict]]:
    """Loader -> rank -> that rank's breakdown, when more than one rank tracked a loader (each rank
    numbers its steps from 0, so fetches and computes are paired within a rank only). Else empty."""
    if _tracked_ranks(profile) <= 1:
        return {}
    from .training import breakdown

    computes = [w for w in profile.windows if w.name.endswith(".compute")]
    out: dict[str, dict[int, dict]] = {}
    for name in _loaders(computes):
        ranks = window_ranks(w for w in computes if w.name == f"{name}.compute")
        out[name] = {r: breakdown(profile, name, rank=r) for r in ranks}
    return out
