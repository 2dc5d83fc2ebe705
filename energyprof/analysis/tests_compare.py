"""Which tests got costlier between two sides of a comparison, with the gate's interval. Pure.

Each side's figure for a test is the mean over that side's runs of the test's energy in the run
(analysis/tests_table.py: its windows' program energy, summed where it ran more than once). The
interval of the change follows the compare gate's rule (analysis/compare.py): with two runs or more
per side, Welch's t over the repeats, never narrower than the tests' own bars; with one run on a
side, the bars alone (the two sides' added in quadrature), which cannot see run-to-run noise. A
test is costlier when the whole interval lies above zero.
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

from ..record import record
from ..facts.profile import Profile
from .stats import CONFIDENCE, Interval, welch
from .tests_table import rows_of_tests


@record
class TestChange:
    """One test, base against head: the means and the change's interval at `CONFIDENCE`."""

    __test__ = False

    nodeid: str
    base_j: float
    head_j: float
    interval: Interval

    @property
    def costlier(self) -> bool:
        return self.interval.low > 0

    @property
    def cheaper(self) -> bool:
        return self.interval.high < 0

    @property
    def pct(self) -> float | None:
        return self.interval.diff / self.base_j * 100 if self.base_j else None


def _per_run(profile: Profile) -> dict[str, tuple[float, float]]:
    """Node id -> (energy, bar) in one run, a test run twice counted as both runs together."""
    out: dict[str, tuple[float, float]] = {}
    for r in rows_of_tests(profile):
        e, b = out.get(r.nodeid, (0.0, 0.0))
        out[r.nodeid] = (e + r.energy_j, b + r.error_j)
    return out


def changes_of_tests(base: Sequence[Profile], head: Sequence[Profile], confidence: float = CONFIDENCE) -> list[TestChange]:
    """Every test that ran on both sides, costliest change first."""
    sides = [[_per_run(p) for p in base], [_per_run(p) for p in head]]
    names = [n for n in sides[0][0] if all(n in run for side in sides for run in side)] if base and head else []
    out = []
    for name in names:
        a = [run[name][0] for run in sides[0]]
        b = [run[name][0] for run in sides[1]]
        bars = math.hypot(statistics.fmean(run[name][1] for run in sides[0]),
                          statistics.fmean(run[name][1] for run in sides[1]))
        diff = statistics.fmean(b) - statistics.fmean(a)
        interval = Interval(diff, diff - bars, diff + bars, confidence, None, (len(a), len(b)))
        if len(a) > 1 and len(b) > 1:
            spread = welch(a, b, confidence)
            if spread.half_width >= bars:
                interval = spread
            else:
                interval = Interval(diff, diff - bars, diff + bars, confidence, spread.df, spread.n)
        out.append(TestChange(name, statistics.fmean(a), statistics.fmean(b), interval))
    return sorted(out, key=lambda c: -c.interval.diff)
