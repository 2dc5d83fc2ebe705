"""pytest: each test a unit of work, and `@pytest.mark.energy_budget(joules=J)`.

Loaded by `pytest -p energyprof` (or `-p energyprof.pytest_plugin`), or by itself in a program run
by `python -m energyprof` (the agent asks pytest to load it, as `-p` would: agent/autoload.py).
It is never loaded otherwise, so no other pytest run sees it.

Each test is a window named by its node id, from the start of its setup to the end of its
teardown, its outcome kept with it (`analysis/tests_table.py` reads them back). A test marked
`energy_budget(joules=J)` also gets a window around its call phase, named `<node id> [call]`:
its figures are read back when the call ends (in process from the ledger, under the supervisor
from its reply) and the call's report fails when the program's energy in it exceeded J. The budget
is the call phase's, not setup's or teardown's: a session fixture's setup runs in whichever test
comes first, and no test should pay for it. pytest's output and exit status are otherwise its own.

In process (`pytest -p energyprof`), the session is one profile (`--energyprof-json`,
`--energyprof-output`, `--energyprof-opt KEY=VALUE` for any of `energy_profile`'s options);
under `python -m energyprof`, the run's own profile holds the windows.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from .analysis.tests_table import CALL_SUFFIX, edge_error_j, outcome_code

MARK = "energy_budget"


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("energyprof", "energy per test (energyprof)")
    group.addoption("--energyprof-json", default=None, metavar="PATH",
                    help="in process: write the session's profile as JSON here")
    group.addoption("--energyprof-output", default=None, metavar="PATH",
                    help="in process: write the session's HTML report here")
    group.addoption("--energyprof-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="in process: any other energy_profile() option, e.g. power_trace=trace.csv")


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", f"{MARK}(joules): fail the test when its call phase spends more than"
                            " `joules` of the program's energy (energyprof)")
    if config.pluginmanager.has_plugin("energyprof-tests"):
        return
    config.pluginmanager.register(TestUnits(config), "energyprof-tests")


def _session_options(config: Any) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    for item in config.getoption("energyprof_opt") or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise pytest.UsageError(f"--energyprof-opt takes KEY=VALUE, not {item!r}")
        opts[key.strip().replace("-", "_")] = _value(value.strip())
    for key in ("json", "output"):
        if config.getoption(f"energyprof_{key}"):
            opts[key] = config.getoption(f"energyprof_{key}")
    return opts


def _value(text: str) -> object:
    """A command line's text as the option's value: true/false, a number, or the text itself (a path, a name)."""
    flags = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
    if text.lower() in flags:
        return flags[text.lower()]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


class TestUnits:
    """The windows of one pytest session: a test's, and a budgeted test's call phase."""

    __test__ = False  # not a test class, whatever pytest collects

    def __init__(self, config: Any) -> None:
        self.config = config
        self.session: Any = None  # the in-process profile this plugin started, if any
        self.outcomes: dict[str, list[Any]] = {}  # node id -> its reports so far
        self.calls: dict[str, Any] = {}  # node id -> the Measurement of its call phase (budgeted tests)
        self.open: set[str] = set()
        self.exitstatus: int | None = None

    # -- the profile -------------------------------------------------------------------------
    def _profiler(self) -> Any:
        from .drive.profiler import active_profiler

        return active_profiler()

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: Any) -> None:
        if self._profiler() is not None or hasattr(self.config, "workerinput"):
            return  # under `python -m energyprof`, or an xdist worker of an in-process run: not ours to start
        from .drive.api import _Session
        from .drive.preflight import preflight
        from .drive.profiler import expand_output_paths
        from .setup.options import Options, OptionError

        try:
            options = Options.from_kwargs(_session_options(self.config))
            preflight(expand_output_paths(options), keep_checkpoint=False)
        except (OptionError, OSError, ValueError) as exc:
            raise pytest.UsageError(f"energyprof: {exc}") from None
        self.session = _Session(options, "pytest")
        self.session.start(0)

    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        self.exitstatus = int(exitstatus)

    @pytest.hookimpl(tryfirst=True)
    def pytest_unconfigure(self, config: Any) -> None:
        session, self.session = self.session, None
        if session is not None:  # the profile ends as pytest does: with its exit status
            session.finish(None if self.exitstatus is None else SystemExit(self.exitstatus))

    # -- each test -----------------------------------------------------------------------------
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: Any, nextitem: Any) -> Iterator[None]:
        prof = self._profiler()
        if prof is None:
            yield
            return
        nodeid = item.nodeid
        self.outcomes[nodeid] = []
        prof.begin_window(nodeid)
        self.open.add(nodeid)
        try:
            yield
        finally:
            if nodeid in self.open:  # a test interrupted before its teardown's report
                self._end(prof, item)
            self.outcomes.pop(nodeid, None)
            self.calls.pop(nodeid, None)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: Any) -> Iterator[None]:
        prof = self._profiler()
        if prof is None or item.get_closest_marker(MARK) is None:
            yield
            return
        with prof.window(item.nodeid + CALL_SUFFIX) as m:
            yield
        self.calls[item.nodeid] = m

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: Any, call: Any) -> Iterator[None]:
        outcome = yield
        report = outcome.get_result()
        nodeid = item.nodeid
        if nodeid not in self.open:
            return
        if call.when == "call":
            self._check_budget(item, report)
        self.outcomes[nodeid].append(report)
        if call.when == "teardown":
            self._end(self._profiler(), item)

    def _budget(self, item: Any) -> float | str | None:
        """The test's budget in joules; a line saying what is wrong with its mark; None without one."""
        mark = item.get_closest_marker(MARK)
        if mark is None:
            return None
        value = mark.kwargs.get("joules", mark.args[0] if mark.args else None)
        try:
            joules = float(value)
        except (TypeError, ValueError):
            joules = float("nan")
        if not joules >= 0:
            return f"{MARK} takes joules=<a number of joules, 0 or more>, not {value!r}"
        return joules

    def _check_budget(self, item: Any, report: Any) -> None:
        budget = self._budget(item)
        m = self.calls.get(item.nodeid)
        if budget is None or m is None or not report.passed or hasattr(report, "wasxfail"):
            return
        if isinstance(budget, str):
            report.outcome, report.longrepr = "failed", f"{item.nodeid}: {budget}"
            return
        spent = m.program_total_j  # the first read waits for the window's last interval to be charged
        if spent is None:
            report.sections.append(("energyprof", f"energy budget not checked: {m.note or 'no figure'}"))
            return
        if spent > budget:
            error = edge_error_j(spent, m.time_s, self._sensor_interval())
            report.outcome = "failed"
            report.longrepr = budget_message(item.nodeid, spent, budget, error, m.estimated, m.complete)

    def _sensor_interval(self) -> float:
        prof = self._profiler()
        options = getattr(prof, "options", None)
        value = getattr(options, "sensor_interval", None)
        if value is None:
            value = getattr(prof, "config", {}).get("sensor_interval")
        try:
            return float(value)
        except (TypeError, ValueError):
            return 0.05

    def _end(self, prof: Any, item: Any) -> None:
        nodeid = item.nodeid
        self.open.discard(nodeid)
        if prof is None:
            return
        facts = {"test": 1.0, "outcome": float(outcome_code(self.outcomes.get(nodeid, [])))}
        budget = self._budget(item)
        if isinstance(budget, float):
            facts["budget_j"] = budget
        prof.end_window(nodeid, facts=facts)


def budget_message(nodeid: str, spent_j: float, budget_j: float, error_j: float, estimated: bool,
                   complete: bool) -> str:
    """The failure's one line: the figure, measured or estimated, its bar, and the budget."""
    from .render.format import fmt_energy

    how = "estimated" if estimated else "measured"
    partial = "; figures so far: not every interval of the call was charged yet" if not complete else ""
    return (f"energy budget exceeded: the call spent {fmt_energy(spent_j)} \u00b1 {fmt_energy(error_j)}"
            f" ({how}, the program's energy), over its budget of {fmt_energy(budget_j)}{partial}")
