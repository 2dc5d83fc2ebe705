"""What a profile holds, told cheaply: the predicates that decide which of the analysis' roles a report needs.

A run with no tests, batched steps, units of work, sweeps, tracked loops or linked backward needs none of
the modules that tabulate them (tests_table, tokens, units, pareto, training, phases); the report model
and the renderers ask here first and import a role's module only for a profile that has some of it. A
leaf: it imports only the agent's names, so deciding costs no role's import. Each role's module
re-exports the predicate it used to hold, so its public names stay where they were. Pure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from ..agent.unit_names import CALL_SUFFIX, ROWS_WINDOW, WINDOWS
from ..agent.units import UNIT_PREFIXES
from ..agent.window_facts import REQUEST_FACT

if TYPE_CHECKING:
    from ..facts.profile import Node, Profile, Window

BACKWARD_NODE = "[backward]"  # core/autograd.BACKWARD_FRAME's name (analysis reads facts, not the core)
#: A window whose facts hold one of these at 1 is a unit of work (analysis/units.py's FACT_KINDS among them).
UNIT_FACTS: tuple[str, ...] = (REQUEST_FACT,)


def window_program_j(w: Window) -> float:
    """The program's energy in the window (its part of every source, the same kind of figure as the
    run's headline), read from the window's fact; the machine's in files written before windows held it.
    The one home of that rule: the report's window rows, the breakdown, the forecasts and compare read it."""
    program = w.program_total_j
    return float(program if program is not None else w.total_j)


def is_test(w: Window) -> bool:
    """A test's window (the pytest plugin's: setup's start to teardown's end)."""
    return w.loop.get("test") == 1.0


def names_of_tests(profile: Profile) -> set[str]:
    """The names of the windows that belong to tests (a test's, and its call phase's): views of the
    other windows can leave them out."""
    names = {w.name for w in profile.windows if is_test(w)}
    return names | {n + CALL_SUFFIX for n in names}


def is_batch_window(w: Window) -> bool:
    """A batched step's window, or a `generate` call's rows: rows of the tokens table, not of the Windows table."""
    return w.name in WINDOWS or w.name == ROWS_WINDOW


def has_backward_node(root: Node) -> bool:
    """Whether the capture linked backward's work to the forward ops (the tree has a `[backward]` frame):
    the condition for showing each function's forward and backward apart."""
    return any(n.function == BACKWARD_NODE for n, _ in root.walk())


def is_cache_fact(w: Window) -> bool:
    """A zero-length window that only carries a tracked loop's page-cache residency (`<loop>.cache.start|end`):
    a fact of the training table, not a span of its own."""
    return w.name.endswith((".cache.start", ".cache.end")) and "residency" in w.loop


def may_be_unit(w: Window) -> bool:
    """Whether the window may be a unit of work (a request, an engine's task): every window analysis/units.py
    tabulates is one (tests/test_startup.py checks each of its kinds), so where none is, it is not imported."""
    loop = w.loop or {}
    return any(loop.get(fact) == 1.0 for fact in UNIT_FACTS) or w.name.startswith(UNIT_PREFIXES)


def has_test_or_batch(windows: Iterable[Window]) -> bool:
    """Whether any window is a test's or a batched step's: where none is, the tests' and tokens' tables are empty
    and their modules are not imported."""
    return any(is_test(w) or is_batch_window(w) for w in windows)


def split_name(name: str) -> tuple[str, str]:
    """`config:bs=128,pl=250` -> ("config", "bs=128,pl=250"); a name without a colon has no label."""
    base, _, label = name.partition(":")
    return base, label


def is_discarded(w: Window) -> bool:
    """A window its program cut short and measured again (the power-limit optimizer's, at an epoch's end)."""
    return bool((getattr(w, "loop", None) or {}).get("discarded"))


def sweep_names(windows: Iterable[Window]) -> list[str]:
    """The names whose windows form a sweep in one run: two or more windows labelled `NAME:LABEL`."""
    counts: dict[str, int] = {}
    for w in windows:
        base, label = split_name(w.name)
        if label and not is_discarded(w):
            counts[base] = counts.get(base, 0) + 1
    return [n for n, c in counts.items() if c >= 2]
