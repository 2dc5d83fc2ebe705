"""The wrapper around `threading.Thread._bootstrap_inner` that notes what a thread runs as it starts.

In a module of its own because the wrapper's frame stays on the thread's stack for its whole life:
the sampler passes over this file's frames (agent/sampler.py `_TRANSPARENT`), where any other frame
of energyprof's cuts the stack there. Stdlib only, like the rest of the agent.
"""

from __future__ import annotations

from typing import Any, Callable


def wrap_bootstrap(original: Callable[[Any], None], on_start: Callable[[Any], None]) -> Callable[[Any], None]:
    def _bootstrap_inner(self: Any) -> None:
        try:
            on_start(self)
        except Exception:  # noqa: BLE001 - noting a thread must never stop it
            pass
        original(self)

    return _bootstrap_inner
