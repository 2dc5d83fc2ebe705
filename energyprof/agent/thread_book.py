"""The agent's books of the program's threads: their CPU clocks, names, groups, and the ones that end.

`threading` is never imported here (a program that never imports it does not get it): when the
program has it, each of its threads notes what it runs as it starts and reports its CPU as it
ends (hooks on `Thread.start` and `Thread._delete`, or 3.10's `_active`), so a thread that lives
between two ticks is still counted and its CPU kept. `ThreadBook` is the sampler's side: the
per-thread CPU deltas of a tick and the group counts.
"""

from __future__ import annotations

import _thread
import os
import sys
import time
from types import CodeType, FrameType

from .qualnames import learn_function, qualname
from .stacks import View, filtered

# Annotations only: the program's imports are its own, so the agent adds no `typing` to them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

# Taken once, at import: what the program later does to `time` is its own business.
_own_ns = time.thread_time_ns
_clock_ns = getattr(time, "clock_gettime_ns", None)

# Threads that ended since the last tick: (native id, name, CPU ns at the end), appended by
# each ending thread itself (list.append is atomic), taken by the sampler at its next tick.
_departures: list[tuple[int, str, int]] = []
_hooked: list[bool] = []  # [True] once `threading`'s hooks are in (a list: the sampler reads it by name)
# id(Thread) -> the code it runs (its target's, else its class's run), noted by `start` on the
# starting thread: a thread that ends between two ticks was never seen running it, and by its end
# `threading` has dropped the target. Its CPU goes to that function, not to a bare thread node.
_codes: dict[int, CodeType] = {}
# native id -> that code, handed over by an ending thread (`_delete`, on the thread itself)
_targets: dict[int, CodeType] = {}
# ident -> name, for a thread caught just after `threading` dropped it (its last microseconds run
# after `_delete`): it still belongs to its group. An ident is reused as soon as its thread ends.
_names: dict[int, str] = {}
_running: list[Any] = []  # the samplers of this process that take departures (none: nothing is kept)


def _forget_after_fork() -> None:
    """Threads, samplers included, do not survive a fork: neither do their books."""
    _running.clear()
    _departures.clear()
    _targets.clear()
    _codes.clear()
    _names.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _threading_table() -> dict[int, Any]:
    """ident -> Thread, when the program uses `threading` (never imported here)."""
    threading = sys.modules.get("threading")
    return getattr(threading, "_active", None) or {}


class _Active(dict):  # type: ignore[type-arg]
    """3.10's `threading._active`: its `_bootstrap_inner` drops the ending thread from it itself,
    without `_delete`, so the drop is where the thread reports. Never on the program's stacks
    while its threads run (a wrapper of `_bootstrap_inner` would be)."""

    __slots__ = ()

    def __delitem__(self, ident: int) -> None:
        thread = self.get(ident)
        if thread is not None and ident == _thread.get_ident() and _depart_310:
            _depart_310[0](thread)
        dict.__delitem__(self, ident)


# 3.10: the ending thread's report, called by `_Active` (a list: set once, read by name)
_depart_310: list[Callable[[Any], None]] = []


def _keep_active_hooked() -> None:
    """On 3.10, `threading._active` is an `_Active` (again after a fork, which rebuilds it)."""
    threading = sys.modules.get("threading")
    lock = getattr(threading, "_active_limbo_lock", None)
    if lock is None or type(getattr(threading, "_active", None)) is not dict:
        return
    with lock:
        if type(threading._active) is dict:  # type: ignore[union-attr]
            threading._active = _Active(threading._active)  # type: ignore[union-attr]


def _hook_departures() -> None:
    """Have each `threading` thread report its CPU as it ends (`Thread._delete` runs last,
    on the thread itself): a thread shorter than a few intervals may end between two ticks,
    and a dead thread's clock can no longer be read."""
    _hooked[:] = [True]
    thread_cls = getattr(sys.modules.get("threading"), "Thread", None)
    original = getattr(thread_cls, "_delete", None)
    if original is None:
        return

    def _depart(self: Any) -> None:
        nid = getattr(self, "_native_id", None)
        code = _codes.pop(id(self), None)
        if nid is not None and _running:
            if isinstance(self._name, str):
                _names[_thread.get_ident()] = self._name
            if code is not None:
                _targets[nid] = code
            _departures.append((nid, self._name if isinstance(self._name, str) else "", _own_ns()))

    if sys.version_info >= (3, 11):
        def _delete(self: Any) -> None:
            _depart(self)
            original(self)

        thread_cls._delete = _delete  # type: ignore[union-attr]
    else:
        _depart_310[:] = [_depart]
        _keep_active_hooked()
    start = getattr(thread_cls, "start", None)
    if start is None:
        return

    def _start(self: Any) -> None:
        # On the starting (caller's) thread, so no frame of energyprof's is ever on the new
        # thread's stack for the program to see (a stack it prints, faulthandler's dump).
        if _running:
            target = getattr(self, "_target", None)
            func = target if getattr(target, "__code__", None) is not None else getattr(type(self), "run", None)
            code = getattr(func, "__code__", None)
            if isinstance(code, CodeType):
                learn_function(func)  # type: ignore[arg-type]
                _codes[id(self)] = code
        start(self)

    thread_cls.start = _start  # type: ignore[union-attr]


def _code_of(nid: int, thread: Any) -> CodeType | None:
    """The code a thread runs: noted as it started (live), or handed over as it ended."""
    return _targets.get(nid) or (_codes.get(id(thread)) if thread is not None else None)


def _printable(name: str) -> str:
    """Any text may name a thread; the report shows it as Python's repr would (a lone surrogate
    as \\udXXX) so no writer downstream can fail on it."""
    return name if name.isascii() else name.encode("utf-8", "backslashreplace").decode("utf-8")


def _starting(frame: FrameType) -> bool:
    """Whether a thread's stack is only `threading`'s frames and energyprof's hooks in them (it
    has not reached its target yet, or has left it)."""
    f: FrameType | None = frame
    while f is not None:
        name = f.f_code.co_filename
        if os.path.basename(name) != "threading.py" and name != __file__:
            return False
        f = f.f_back
    return True


def _outermost(frame: FrameType) -> CodeType:
    while frame.f_back is not None:
        frame = frame.f_back
    return frame.f_code


def _runs(code: CodeType) -> str:
    """A thread's name for the function it runs, when it has none of its own."""
    return qualname(code)


def main_thread_ident() -> int:
    threading = sys.modules.get("threading")
    return threading.main_thread().ident if threading is not None else _thread.get_ident()


def thread_clock_id(native_id: int) -> int:
    """Linux's CPU clock id for a thread id (MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)).

    Computed from the kernel thread id rather than through pthread_getcpuclockid, which
    would dereference a pthread handle that may already be freed when the thread has ended;
    reading this clock for a finished thread just fails with EINVAL.
    """
    return ((~native_id) << 3) | 6


class ThreadBook:
    """The sampler's books of the program's threads (the attributes are the sampler's, set in its `__init__`)."""

    view: View
    ident: int | None
    main_ident: int
    _last_cpu: dict[int, int]
    _last_sid: dict[int, int]
    _group_sids: dict[str, int]
    _thread_counts: dict[int, int]
    _count_sink: Callable[[int, int], None] | None

    intern: Callable[[list[Any]], int]

    def _thread_cpu_deltas(self, frames: dict[int, FrameType], table: dict[int, Any] | None = None, first: bool = False
                           ) -> tuple[dict[int, int], dict[int, int], list[tuple[int, str, int]]]:
        """CPU ns each thread burnt since the last tick, by ident; each thread's native id; and
        (native id, name, CPU) of the threads that ended meanwhile.

        Neither the main thread's clock nor the sampler's is read (a syscall each, every tick):
        the sampler's CPU is taken off the process's by the caller, and the main thread gets
        what is left. A thread `threading` does not know (started with `_thread`) has no native
        id here: its CPU stays in the process's and goes to the main thread's stack.
        """
        out: dict[int, int] = {}
        nids: dict[int, int] = {}
        departed: list[tuple[int, str, int]] = []
        if _clock_ns is None:
            return out, nids, departed
        if table is None:
            table = _threading_table()
        last = self._last_cpu
        seen: dict[int, int] = {}
        gone = set()
        while _departures:
            nid, name, final = _departures.pop()
            gone.add(nid)
            if not first:
                departed.append((nid, name, max(0, final - last.get(nid, 0))))
            else:  # it ended before this sampler's first reading: its CPU precedes the profile, but it ran in it
                _targets.pop(nid, None)
                self._count_thread(_printable(name))
        skip = (self.ident, self.main_ident)
        for ident in frames:
            if ident in skip:
                continue
            nid = getattr(table.get(ident), "native_id", None)
            if nid is None or nid in gone:
                continue
            try:
                now = _clock_ns(thread_clock_id(nid))
            except OSError:
                continue  # the thread has ended
            seen[nid] = now
            nids[ident] = nid
            if not first:
                out[ident] = now - last.get(nid, 0)
        self._last_cpu = seen  # ended threads drop out: a reused native id starts again from zero
        if len(self._last_sid) > 2 * len(seen) + 64:
            self._last_sid = {n: sid for n, sid in self._last_sid.items() if n in seen}
        return out, nids, departed

    def _target_sid(self, ident: int, code: CodeType, table: dict[int, Any]) -> int:
        name = getattr(table.get(ident), "_name", None) or _names.get(ident) or _runs(code)
        return self.intern(self.view.thread(_printable(name), filtered([code])))

    @staticmethod
    def _thread_name(ident: int, table: dict[int, Any], outermost: CodeType) -> str:
        """A thread's name as its stacks show it. One started with `_thread` (not `threading`) has
        none: it is known by what it runs, its outermost function, as the threads of one target are."""
        thread = table.get(ident)
        name = getattr(thread, "_name", None) if thread is not None else _names.get(ident)
        return _printable(name) if isinstance(name, str) else _runs(outermost)

    def _count_thread(self, name: str) -> int:
        """One more thread in `name`'s group; the group's head stack (its count goes to the sink)."""
        sid = self._group_sids.get(name)
        if sid is None:
            sid = self._group_sids[name] = self.intern(self.view.thread(name, []))
        n = self._thread_counts[sid] = self._thread_counts.get(sid, 0) + 1
        if self._count_sink is not None:
            self._count_sink(sid, n)
        return sid
