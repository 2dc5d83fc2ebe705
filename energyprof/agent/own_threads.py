"""energyprof's own threads inside the program's process: started one way, kept out of its sight.

Each one blocks the program's signals (a signal goes to any thread that does not block it) and is
counted while it runs. The count answers one question: at `os.fork()`, Python 3.12+ warns "This
process is multi-threaded, use of fork() may lead to deadlocks in the child" when the process
has more than one OS thread. A single-threaded program would see that warning only because of
energyprof's threads, so for a fork where the program's own threads are one it is muted: the
program prints what it prints under plain python. A program with threads of its own still gets
it, from its own line, as under plain python. Stdlib-only: it runs inside the program.
"""

from __future__ import annotations

import _thread
import os
import sys

# Annotations only: the program's imports are its own, so the agent adds no `typing` to them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

__all__ = ["start", "Thread", "leave_signals_to_the_program"]

# Raised by the thread's own fault, they cannot wait in a mask (blocked, the kernel kills the process).
_FAULTS = ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS", "SIGABRT")
# A token per energyprof thread running, with the pid that started it: a forked child inherits the
# set, not the threads.
_alive: dict[object, int] = {}
_guarded = False


def start(target: Callable[..., Any], *args: Any) -> int:
    """Run `target(*args)` on a new `_thread` thread (invisible to `threading`, never joined at exit).

    The thread is born with the program's signals blocked: the starting thread blocks them for the
    moment of the start (one arriving then waits, pending, for a moment), and a new thread takes its
    starter's mask. Blocked only from its own first line, a thread started as a forked worker began
    and a signal came (Pool.terminate's SIGTERM) could take the signal: the program's handler then
    waited for its main thread, asleep on a lock for good, and the worker never ended."""
    _guard_forks()
    token = object()
    _alive[token] = os.getpid()  # counted from before it exists: a fork at once must not miss it
    before = leave_signals_to_the_program()
    try:
        return _thread.start_new_thread(_run, (token, target, args))
    except BaseException:
        _alive.pop(token, None)
        raise
    finally:
        if before is not None:
            _restore(before)


def _run(token: object, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        target(*args)
    finally:
        _alive.pop(token, None)


class Thread:
    """A `_thread` thread with a join: invisible to `threading`, never joined at exit."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self._target, self._args = target, args
        start(self._run)

    def _run(self) -> None:
        try:
            self._target(*self._args)
        finally:
            self._done.release()

    def join(self, timeout: float = -1) -> None:
        if self._done.acquire(timeout=timeout):
            self._done.release()

    def is_alive(self) -> bool:
        return self._done.locked()


def leave_signals_to_the_program() -> Any:
    """Block every signal but faults in the calling thread; the mask it had (None: none to steer).

    A signal sent to the process goes to any of its threads that does not block it. Plain python
    has only the program's: a handler runs, and a blocking read on the main thread is interrupted.
    Delivered to an energyprof thread instead, the handler would wait until the main thread next
    ran Python code (after its read returned). `_signal`, not `signal`: no enum import in the program.
    """
    try:
        import _signal

        faults = {getattr(_signal, n) for n in _FAULTS if hasattr(_signal, n)}
        return _signal.pthread_sigmask(_signal.SIG_BLOCK, set(_signal.valid_signals()) - faults)
    except (ImportError, AttributeError, OSError, ValueError):
        return None  # no pthread_sigmask (Windows): nothing to steer


def _restore(mask: Any) -> None:
    import _signal

    _signal.pthread_sigmask(_signal.SIG_SETMASK, mask)


# -- the fork warning ------------------------------------------------------------------------------
class _ForkWarning:
    """Matches the text of CPython's warning (a filter's message needs only `.match`: no `re` import)."""

    @staticmethod
    def match(text: str) -> bool:
        return text.startswith("This process (pid=") and "is multi-threaded, use of " in text


_MUTE = ("ignore", _ForkWarning(), DeprecationWarning, None, 0)


def _guard_forks() -> None:
    global _guarded
    if _guarded or sys.version_info < (3, 12) or not hasattr(os, "register_at_fork"):
        return
    _guarded = True
    os.register_at_fork(before=_before_fork)


def _os_threads() -> int | None:
    """The process's OS threads, as CPython counts them for its warning (/proc/self/stat's 20th field)."""
    try:
        fd = os.open("/proc/self/stat", os.O_RDONLY)
        try:
            stat = os.read(fd, 4096)
        finally:
            os.close(fd)
        return int(stat[stat.rindex(b")") + 2:].split()[17])
    except (OSError, ValueError, IndexError):
        return None


def _before_fork() -> None:
    """Mute the warning for this fork when the program's own threads are one; unmute it otherwise.

    The mute stays until the next fork decides again: 3.13 warns after the `after_in_parent`
    hooks have run, so it cannot be taken off there. It matches nothing but this warning.
    """
    import _warnings

    total = _os_threads()
    pid = os.getpid()
    own = sum(1 for p in list(_alive.values()) if p == pid)
    mute = own > 0 and total is not None and total - own <= 1
    module = sys.modules.get("warnings", _warnings)  # the list the warning machinery reads
    filters = getattr(module, "filters", None)
    mutated = getattr(_warnings, "_filters_mutated", None)
    if not isinstance(filters, list) or mutated is None:
        return
    present = any(entry is _MUTE for entry in filters)
    if mute and not present:
        filters.insert(0, _MUTE)
    elif present and not mute:
        filters[:] = [entry for entry in filters if entry is not _MUTE]
    else:
        return
    mutated()
