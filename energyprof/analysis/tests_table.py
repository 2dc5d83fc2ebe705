"""The tests table: one row per pytest test run, from the windows the pytest plugin marked. Pure.

A test's window (named by its node id) runs from its setup's start to its teardown's end; its
facts say it is a test (`test`), how it ended (`outcome`, a code into OUTCOMES) and its budget
(`budget_j`) if it had one. A budgeted test also has a window around its call phase, named
`<node id> [call]`: the figure its budget was checked against.

A row's energy is the program's part of the window, under the profile's idle policy (the same
kind of figure as the run's headline). Its bar (`error_j`) is where its edges fall: the ledger
spreads each sensor interval's energy evenly over the interval, so the energy of the work done
between an edge and the interval's own edge can land on the wrong side of it. At most the
program's energy of the interval each edge cuts: its power there (the timeline's) times one sensor
interval, at each edge, the two added; where the timeline does not say, the window's mean power.
The bar is not capped by the figure: a test shorter than an interval can be all in question.
"""

from __future__ import annotations

import bisect

from ..record import record
from ..facts.profile import Profile, Window
from ..agent.unit_names import CALL_SUFFIX, OUTCOMES, outcome_code
from .kinds import is_test, names_of_tests, window_program_j

__all__ = ["CALL_SUFFIX", "OUTCOMES", "TestRow", "edge_error_j", "is_test", "names_of_tests", "outcome_code",
           "rows_of_tests"]


@record
class TestRow:
    """One run of one test: its node id, the program's energy over setup, call and teardown, its bar, its outcome."""

    __test__ = False  # a record, not a test class

    nodeid: str
    energy_j: float
    error_j: float
    time_s: float
    outcome: str
    estimated: bool
    budget_j: float | None = None
    call_j: float | None = None  # the call phase's energy, for a budgeted test: what the budget judged
    pid: int | None = None

    @property
    def over_budget(self) -> bool:
        return self.budget_j is not None and self.call_j is not None and self.call_j > self.budget_j


def edge_error_j(energy_j: float, time_s: float, sensor_interval_s: float,
                 edge_power_w: tuple[float | None, float | None] = (None, None)) -> float:
    """The bar of a window's figure from where its edges fall (module docstring): the program's energy in the
    sensor interval each edge cuts, its power there (`edge_power_w`, start and end) times one interval; an edge
    whose power is not known takes the window's mean power. Never capped: a short test's bar can exceed its
    figure, and then it does."""
    mean = abs(energy_j) / time_s if time_s > 0 else None
    bar = 0.0
    for power in edge_power_w:
        if power is None:
            if mean is None:
                return abs(energy_j)  # no span and no power: all of it is in question
            power = mean
        bar += abs(power) * sensor_interval_s
    return bar


def program_power_at(profile: Profile, t_s: float) -> float | None:
    """The program's power (all sources, the profile's idle policy) in the timeline's bucket holding `t_s`;
    None without a timeline there. The ledger spreads each sensor interval evenly, so a bucket inside an
    interval holds that interval's power; a coarser one, the mean of those it spans."""
    tl = profile.timeline
    program = tl.program_w.get(profile.idle_policy) or []
    i = bisect.bisect_right(tl.start_s, t_s) - 1
    if 0 <= i < len(program) and i < len(tl.end_s) and tl.start_s[i] <= t_s <= tl.end_s[i]:
        return float(program[i])
    return None


def window_edge_error_j(profile: Profile, w: Window, energy_j: float, sensor_interval_s: float) -> float:
    return edge_error_j(energy_j, w.time_s, sensor_interval_s,
                        (program_power_at(profile, w.start_s), program_power_at(profile, w.end_s)))


def _estimated(profile: Profile) -> bool:
    return any(s.method != "measured" for s in profile.sources)


def rows_of_tests(profile: Profile) -> list[TestRow]:
    """Every test window of the profile, in the order the tests ran."""
    interval = float(profile.meta.get("sensor_interval_s") or 0.05)
    estimated = _estimated(profile)
    calls: dict[tuple[str, int | None], list[Window]] = {}
    for w in profile.windows:
        if w.name.endswith(CALL_SUFFIX):
            calls.setdefault((w.name[: -len(CALL_SUFFIX)], w.pid), []).append(w)
    rows = []
    for w in sorted((w for w in profile.windows if is_test(w)), key=lambda w: w.start_s):
        energy = window_program_j(w)
        code = int(w.loop.get("outcome", 0))
        call = _call_inside(calls.get((w.name, w.pid), []), w)
        rows.append(TestRow(w.name, energy, window_edge_error_j(profile, w, energy, interval), w.time_s,
                            OUTCOMES[code] if 0 <= code < len(OUTCOMES) else "unknown", estimated,
                            w.loop.get("budget_j"), None if call is None else window_program_j(call), w.pid))
    return rows


def _call_inside(calls: list[Window], test: Window) -> Window | None:
    for c in calls:
        if test.start_s <= c.start_s and c.end_s <= test.end_s:
            return c
    return None
