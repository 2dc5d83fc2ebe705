"""Window views: groups by name (mean and spread), and spans too short for a sensor's updates. Pure."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

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


def short_for(window: Window, sources: list[Source]) -> list[str]:
    """Sources whose update period is too coarse for this window (A100/H100 power: ~100 ms)."""
    return [s.id for s in sources if s.update_period_s and window.time_s < MIN_UPDATES * s.update_period_s]


def resolution_s(sources: list[Source]) -> float | None:
    """Below this much time a figure is finer than the slowest sensor updates."""
    periods = [s.update_period_s for s in sources if s.update_period_s]
    return MIN_UPDATES * max(periods) if periods else None


def window_groups(rows: list[WindowRow]) -> list[WindowGroup]:
    """Energy per window name: count, mean and spread (epochs, steps, phases)."""
    groups: dict[str, list[WindowRow]] = {}
    for r in rows:
        groups.setdefault(r.window.name, []).append(r)
    out = []
    for name, ws in groups.items():
        energies = [r.energy for r in ws]
        out.append(WindowGroup(name, len(ws), sum(energies), statistics.fmean(energies),
                               statistics.stdev(energies) if len(ws) > 1 else 0.0, min(energies), max(energies),
                               statistics.fmean(r.window.time_s for r in ws), sum(1 for r in ws if r.short_for)))
    return out


def training_breakdowns(profile: Profile) -> dict[str, dict]:
    """The fetch/compute split for every tracked loader (windows named `<loader>.compute`)."""
    names = sorted({w.name[: -len(".compute")] for w in profile.windows if w.name.endswith(".compute")})
    return {name: breakdown(profile, name) for name in names}
