"""The names the program's windows are marked with and the analysis reads back: tests and batched steps.

A leaf of the agent (standard library only), so the code that marks windows inside the profiled program
(the pytest plugin, a batched `generate`: agent/generate.py) imports no analysis to name them, and the
analysis that reads them back names them from the same place.
"""

from __future__ import annotations


# Annotations only: the program's imports are its own, so the agent adds no `typing` to them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable

# -- tests (energyprof/pytest_plugin.py marks, analysis/tests_table.py reads) -------------------------
CALL_SUFFIX = " [call]"  # a budgeted test's call phase: `<node id> [call]`
OUTCOMES = ("passed", "failed", "skipped", "error", "xfailed", "xpassed")

# -- batched steps (energyprof/batches.py marks, analysis/tokens.py reads) ----------------------------
WINDOWS = {"[batch prefill]": "prefill", "[batch decode]": "decode"}
REQUEST_PREFIX = "req:"
# A batched `generate`'s steps carry only their call's number; its rows' tokens come after it returns,
# in one zero-length window: `req:<row>` the row's prompt tokens, `decodes:<row>` how many of the call's
# decode steps (the first ones) it took part in.
ROWS_WINDOW = "[batch rows]"
CALL_FACT = "call"
DECODES_PREFIX = "decodes:"


def request_key(request: object) -> str:
    """A request's id as a window fact's name: the separators of the facts' encoding are left out."""
    text = str(request)
    for bad in (";", "=", "\t", "\n", "\r"):
        text = text.replace(bad, "_")
    return REQUEST_PREFIX + text


def outcome_code(reports: Iterable[Any]) -> int:
    """How a test ended, from its phases' reports (pytest's TestReport: `when`, `outcome`, `wasxfail`),
    as pytest's own summary counts it: an error in setup or teardown is an error, unless the call failed.
    A phase reported more than once (a rerun) counts as its last report."""
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
