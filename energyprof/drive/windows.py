"""The one window protocol every driver implements, as Zeus's Monitor does (`begin_window`/`end_window`):
the in-process Profiler (its windows go into the profile) and the Monitor (no sampling; a window's
Measurement). Callers such as the power-limit optimizer hold either and call it one way: no signature is
probed, no exception read by its text."""

from __future__ import annotations

from typing import Any, Protocol


class Windows(Protocol):
    def begin_window(self, name: str, index: int | None = None, t_ns: int | None = None) -> None:
        """Open a window; `t_ns`: its start as the caller read it (perf_counter_ns), else now."""

    def end_window(self, name: str | None = None, facts: dict[str, float] | None = None,
                   t_ns: int | None = None) -> Any:
        """End the last window opened under `name` (any, when None); `facts`: numbers measured about the
        span, kept where the driver keeps facts; `t_ns`: its end as the caller read it."""


class AlreadyRunning(RuntimeError):
    """A profile already runs in this process: the decorator and the with-block treat the call as part of it."""
