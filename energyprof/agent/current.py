"""The profile running in this process, found among the modules already loaded: nothing is imported to look.

An in-process profile has imported energyprof's driver (`drive/profiler.py`); a program run by
`python -m energyprof` holds its agent (`supervised.py`). The code that marks windows from inside the
program (the pytest plugin, a batched `generate`) asks here, so a supervised program loads no driver.
"""

from __future__ import annotations

import sys

# Annotations only: the program's imports are its own, so the agent adds no `typing` to them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def running() -> Any:
    """The running profile (it has `begin_window`, `end_window`, `window`), or None."""
    profiler = sys.modules.get("energyprof.drive.profiler")
    if profiler is not None:
        return profiler.active_profiler()
    supervised = sys.modules.get("energyprof.agent.supervised")
    return supervised.current() if supervised is not None else None
