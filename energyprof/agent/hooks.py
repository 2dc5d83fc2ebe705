"""The two ways a process leaves without `atexit`, hooked as coverage.py hooks them.

A forked child gets its own agent from `os.register_at_fork` (threads do not survive a
fork). Fork-started workers (a multiprocessing fork Pool, DataLoader workers) then leave
through `os._exit`, which runs no `atexit` handler: `os._exit` is wrapped so the agent
writes its tail (last samples, `--memory exact` records, the end record) first. The wrapper
calls the original with the same status; nothing else about `_exit` changes.
"""

from __future__ import annotations

import os

# Annotations only: the program's imports are its own, so the agent adds no `typing` to them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

_original_exit = os._exit
_on_exit: list[Callable[[], None]] = []
_installed = False


def _exit(status: int, /) -> None:  # noqa: D401 - stands in for os._exit
    for fn in _on_exit:
        try:
            fn()
        except BaseException:  # noqa: BLE001, S110 - leaving is the program's, whatever happens here
            pass
    _original_exit(status)


_exit.__name__ = _exit.__qualname__ = "_exit"
_exit.__doc__ = _original_exit.__doc__


def install(on_exit: Callable[[], None], after_fork_child: Callable[[], None] | None) -> None:
    """Run `on_exit` before `os._exit` and, when given, `after_fork_child` in each forked child
    (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    _on_exit.append(on_exit)
    if after_fork_child is not None and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=after_fork_child)
    os._exit = _exit
