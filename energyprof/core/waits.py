"""Waits: a sample whose innermost frame is a standard-library wait was blocked, not running; the CPU
its thread was seen with there is moved, at the run's end, to the same thread's running stacks. Pure."""

from __future__ import annotations

from typing import Callable

from ..facts.profile import CHILDREN_NODE, THREAD_PREFIX
from .recording import StackTable
from .tallies import StackTally

CHILD_FRAME = (CHILDREN_NODE, "", 0)


# Standard-library functions a thread blocks in, by module file: a sample whose innermost
# Python frame is one of these was waiting (time.sleep and other C waits show their caller,
# and are told by the thread's CPU clock instead).
WAIT_FUNCTIONS = {
    "selectors.py": {"select"},
    "socket.py": {"accept", "recv", "recv_into"},
    "threading.py": {"wait", "_wait_for_tstate_lock", "join", "acquire"},
    "queue.py": {"get", "put"},
    "connection.py": {"wait", "poll", "_poll", "recv", "recv_bytes", "_recv", "_recv_bytes", "accept"},
    "queues.py": {"get", "put"},
    "synchronize.py": {"wait", "acquire", "__enter__"},
    "subprocess.py": {"wait", "_wait", "_try_wait", "communicate"},
    "popen_fork.py": {"wait", "poll"},
    "pool.py": {"wait", "get"},
    "_base.py": {"wait", "result"},
}


def is_wait(frame: tuple[str, str, int]) -> bool:
    """A frame (function, file, line) in which a thread blocks waiting for something."""
    func, file, _ = frame
    base = file.replace("\\", "/").rsplit("/", 1)[-1]
    names = WAIT_FUNCTIONS.get(base)
    return names is not None and func.rsplit(".", 1)[-1] in names


def move_wait_cpu(stats: dict[int, StackTally], table: StackTable, sid_proc: dict[int, int], n: int,
                  waiting_at: Callable[[int], bool]) -> int:
    """CPU a thread was seen with while sampled in a wait goes to the stacks it was seen running.

    A sampler knows a thread's stack only at the sample's end, so the CPU a short task burnt
    before its thread blocked again (a DataLoader worker's fetch, then `select` for the next
    index) arrives on the wait. A blocked thread burns none: that CPU, and the energy charged
    by it, belong to the same thread's running stacks, in proportion to the CPU they were
    seen with. A thread seen only waiting keeps it: there is nowhere better to put it.
    Idempotent (a wait left with nothing moves nothing), so finishing twice is harmless. Returns the
    CPU ns moved.
    """
    stacks, frames = table.stacks, table.frames
    groups: dict[tuple[int, int], tuple[list[StackTally], list[StackTally]]] = {}
    moved_ns = 0
    for sid, st in stats.items():
        fids = stacks[sid]
        if not fids or st.cpu_ns <= 0 or frames[fids[-1]] == CHILD_FRAME:
            continue
        thread = -1  # the stack's innermost thread node; -1: its process's main thread
        for fid in fids:
            if frames[fid][0].startswith(THREAD_PREFIX):
                thread = fid
        waiting, running = groups.setdefault((sid_proc.get(sid, -1), thread), ([], []))
        (waiting if waiting_at(sid) else running).append(st)
    for waiting, running in groups.values():
        total = sum(r.cpu_ns for r in running)
        if not waiting or total <= 0:
            continue
        fractions = [r.cpu_ns / total for r in running]
        for w in waiting:
            moved = 0
            for k, (r, f) in enumerate(zip(running, fractions)):
                for i in range(n):
                    r.share[i] += w.share[i] * f
                    r.all[i] += w.all[i] * f
                part = w.cpu_ns - moved if k == len(running) - 1 else int(w.cpu_ns * f)
                r.cpu_ns += part
                moved += part
            moved_ns += w.cpu_ns
            w.cpu_ns = 0
            w.share = [0.0] * n
            w.all = [0.0] * n
    return moved_ns
