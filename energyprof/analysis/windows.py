"""Window views: groups by name (mean and spread), per rank in a distributed job, and spans too short
for a sensor's updates. Pure."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Iterable

from ..profile import Profile, Source, Window
from .training import breakdown

MIN_UPDATES = 3  # a span shorter than this many sensor updates is below the sensor's resolution


@dataclass
class WindowRow:
    """One window as shown: its facts, the sources it is too short for, its carbon and cost."""

    window: Window
    short_for: list[str] = field(default_factory=list)
    carbon_g: float | None = None
    cost: float | None = None

    @property
    def energy(self) -> float:
        return sum(self.window.energy_j.values())


@dataclass
class WindowGroup:
    name: str
    count: int
    total_j: float
    mean_j: float
    stdev_j: float
    min_j: float
    max_j: float
    mean_time_s: float
    short: int
    # In a job whose windows come from several ranks: one group per rank (name "rank R"), and this
    # group is their sum. Empty otherwise, so a single process's groups are as they always were.
    ranks: list[WindowGroup] = field(default_factory=list)


def short_for(window: Window, sources: list[Source]) -> list[str]:
    """Sources whose update period is too coarse for this window (A100/H100 power: ~100 ms)."""
    return [s.id for s in sources if s.update_period_s and window.time_s < MIN_UPDATES * s.update_period_s]


def resolution_s(sources: list[Source]) -> float | None:
    """Below this much time a figure is finer than the slowest sensor updates."""
    periods = [s.update_period_s for s in sources if s.update_period_s]
    return MIN_UPDATES * max(periods) if periods else None


def window_groups(rows: list[WindowRow]) -> list[WindowGroup]:
    """Energy per window name: count, mean and spread (epochs, steps, phases); with windows from
    several ranks, each group also holds one row per rank and is the sum over them."""
    groups: dict[str, list[WindowRow]] = {}
    for r in rows:
        groups.setdefault(r.window.name, []).append(r)
    several = len(window_ranks(r.window for r in rows)) > 1
    out = []
    for name, ws in groups.items():
        group = _group(name, ws)
        if several:
            by_rank: dict[tuple[bool, int], list[WindowRow]] = {}
            for r in ws:
                by_rank.setdefault(_rank_key(r.window), []).append(r)
            group.ranks = [_group(_rank_label(key), rs) for key, rs in sorted(by_rank.items())]
        out.append(group)
    return out


def _group(name: str, ws: list[WindowRow]) -> WindowGroup:
    energies = [r.energy for r in ws]
    return WindowGroup(name, len(ws), sum(energies), statistics.fmean(energies),
                       statistics.stdev(energies) if len(ws) > 1 else 0.0, min(energies), max(energies),
                       statistics.fmean(r.window.time_s for r in ws), sum(1 for r in ws if r.short_for))


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
    if _tracked_ranks(profile) > 1:
        return {}
    return {name: breakdown(profile, name) for name in _loaders(profile.windows)}


def _tracked_ranks(profile: Profile) -> int:
    return len(window_ranks(w for w in profile.windows if w.name.endswith(".compute")))


def training_by_rank(profile: Profile) -> dict[str, dict[int, dict]]:
    """Loader -> rank -> that rank's breakdown, when more than one rank tracked a loader (each rank
    numbers its steps from 0, so fetches and computes are paired within a rank only). Else empty."""
    if _tracked_ranks(profile) <= 1:
        return {}
    computes = [w for w in profile.windows if w.name.endswith(".compute")]
    out: dict[str, dict[int, dict]] = {}
    for name in _loaders(computes):
        ranks = window_ranks(w for w in computes if w.name == f"{name}.compute")
        out[name] = {r: breakdown(profile, name, rank=r) for r in ranks}
    return out
