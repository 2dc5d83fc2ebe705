"""The tests table: one row per pytest test run, from the windows the pytest plugin marked. Pure.

A test's window (named by its node id) runs from its setup's start to its teardown's end; its
facts say it is a test (`test`), how it ended (`outcome`, a code into OUTCOMES) and its budget
(`budget_j`) if it had one. A budgeted test also has a window around its call phase, named
`<node id> [call]`: the figure its budget was checked against.

A row's energy is the program's part of the window, under the profile's idle policy (the same
kind of figure as the run's headline). Its bar (`error_j`) is where its edges fall: the ledger
spreads each sensor interval's energy evenly over the interval, so the energy of the work done
between an edge and the interval's own edge can land on the wrong side of it. At most one
interval's worth at each edge: the window's mean power times one sensor interval, twice.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..record import record
from ..facts.profile import Profile, Window
from .training import window_program_j

CALL_SUFFIX = " [call]"
OUTCOMES = ("passed", "failed", "skipped", "error", "xfailed", "xpassed")


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


def outcome_code(reports: Iterable[Any]) -> int:
    """How a test ended, from its phases' reports (pytest's TestReport: `when`, `outcome`, `wasxfail`),
    as pytest's own summary counts it: an error in setup or teardown is an error, unless the call failed."""
    by_phase = {r.when: r for r in reports}
    setup, call, teardown = by_phase.get("setup"), by_phase.get("call"), by_phase.get("teardown")
    name = "passed"
    if setup is not None and setup.outcome != "passed":
        name = "error" if setup.outcome == "failed" else ("xfailed" if hasattr(setup, "wasxfail") else "skipped")
    elif call is not None:
        if hasattr(call, "wasxfail"):
            name = "xfailed" if call.outcome == "skipped" else "xpassed"
        elif call.outcome != "passed":
            name = call.outcome
    if name == "passed" and teardown is not None and teardown.outcome == "failed":
        name = "error"
    return OUTCOMES.index(name)


def edge_error_j(energy_j: float, time_s: float, sensor_interval_s: float) -> float:
    """The bar of a window's figure from where its edges fall (module docstring), never more than the figure."""
    if time_s <= 0:
        return abs(energy_j)
    return min(abs(energy_j), 2.0 * abs(energy_j) / time_s * sensor_interval_s)


def is_test(w: Window) -> bool:
    return w.loop.get("test") == 1.0


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
        rows.append(TestRow(w.name, energy, edge_error_j(energy, w.time_s, interval), w.time_s,
                            OUTCOMES[code] if 0 <= code < len(OUTCOMES) else "unknown", estimated,
                            w.loop.get("budget_j"), None if call is None else window_program_j(call), w.pid))
    return rows


def _call_inside(calls: list[Window], test: Window) -> Window | None:
    for c in calls:
        if test.start_s <= c.start_s and c.end_s <= test.end_s:
            return c
    return None


def names_of_tests(profile: Profile) -> set[str]:
    """The names of the windows that belong to tests (a test's, and its call phase's): views of the
    other windows can leave them out."""
    names = {w.name for w in profile.windows if is_test(w)}
    return names | {n + CALL_SUFFIX for n in names}
