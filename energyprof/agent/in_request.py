"""A call a thread pool runs for a web request: its thread is the request's for the call's length.

Starlette and FastAPI run a sync handler, a sync dependency, a sync endpoint's response validation and a
sync iterator's steps through anyio's `to_thread.run_sync`, on a worker thread that serves any request
next. agent/request_hooks.py hands such a call over as `InRequest(call, unit)`, with the unit of the
request open where the call was made; on the worker, `running_threads` says the thread runs that request
(agent/units.py) while the call runs, and says what it said before once the call returns or raises.

Its frame sits between the worker's loop and the program's call, so this file's frames are passed over
like a wrapper's (agent/stacks.py), and the stacks read as the program's own.
"""

from __future__ import annotations

import _thread

from .units import running_threads

# Annotations only: the program's imports are its own, so the agent adds no `typing` to them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable


class InRequest:
    """`call`, run with the calling thread marked as running the request `unit`."""

    __slots__ = ("call", "unit")

    def __init__(self, call: Callable[..., Any], unit: int) -> None:
        self.call = call
        self.unit = unit

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ident = _thread.get_ident()
        before = running_threads.get(ident)
        running_threads[ident] = self.unit
        try:
            return self.call(*args, **kwargs)
        finally:
            if running_threads.get(ident) == self.unit:  # gone: the request ended meanwhile (agent/requests.py)
                if before is None:
                    running_threads.pop(ident, None)
                else:
                    running_threads[ident] = before
