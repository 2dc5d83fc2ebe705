"""How the agent names a stack: which frames belong to the profile, and under which node.

A frame is the program's (kept), a runner's or a wrapper's (skipped: the stack goes on), or
energyprof's own machinery (the stack stops there, so its time belongs to the user frame that
called it). `View` puts a followed child's stacks under its process node and a thread's under
its group. Standard library and the agent's siblings only (the bootstrap loads it by path).
"""

from __future__ import annotations

import os
from types import CodeType, FrameType

from .modules import is_wrapper as _is_wrapper
from .qualnames import qualname
from .units import units
from .wire import PROCESS_MARKER, THREAD_FRAME_PREFIX

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_RUNNER_FILES = {"<frozen runpy>", "<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>"}
# energyprof files whose frames stand between user frames (wrappers): skipped, the stack goes on.
_TRANSPARENT = tuple(PACKAGE_DIR + p for p in (os.path.join("drive", "api.py"), "cli" + os.sep,
                                               "__main__.py", "torch.py", "integrations" + os.sep,
                                               os.path.join("agent", "in_request.py")))

KEEP, SKIP, STOP = 0, 1, 2

Frame = tuple[str, str, int]
_MP_BOOTSTRAP_FILES = tuple(os.sep + os.path.join("multiprocessing", f) for f in ("spawn.py", "forkserver.py"))


def thread_group(name: str) -> str:
    """What a thread runs, from its name: threads of one target or one numbered role share a node."""
    # "Thread-7 (burn_in_thread)": the name `threading` gives a thread started with a target.
    if name.startswith("Thread-") and name.endswith(")") and " (" in name:
        number, _, target = name[7:-1].partition(" (")
        if number.isdigit() and target:
            return target
    # "worker-3", "ThreadPoolExecutor-0_3", "Thread-4": one role's threads, numbered.
    base = name.rstrip("0123456789-_ .#")
    return base if base and base != name and name[len(base):].lstrip("-_ .#")[:1].isdigit() else name


def frame_kind(filename: str) -> int:
    """KEEP a user frame; SKIP a runner or wrapper frame; STOP at energyprof's internals.

    Time inside the profiler's own machinery (stopping, a window boundary) belongs to the
    user frame that called it, so the stack is cut there rather than showing threading
    joins and collector code as the program's functions.
    """
    if filename.startswith(PACKAGE_DIR):
        return SKIP if filename.startswith(_TRANSPARENT) else STOP
    if filename in _RUNNER_FILES or os.path.basename(filename) == "runpy.py":
        return SKIP
    return KEEP


def marker(pid: int) -> Frame:
    return (PROCESS_MARKER, "", pid)


def filtered(codes: list[CodeType], names: list[str | None] | None = None) -> list[Frame]:
    """The frames of a stack (outermost first) that belong to the profile; `names`: a module's name for
    its `forward` frame (agent/modules.py), None elsewhere. torch's module-call wrappers go."""
    out: list[Frame] = []
    for i, c in enumerate(codes):
        kind = frame_kind(c.co_filename)
        if kind == STOP:
            break
        if kind == SKIP or _is_wrapper(c):
            continue
        given = names[i] if names is not None else None
        out.append((given or qualname(c), c.co_filename, c.co_firstlineno))
    return units(out)


def codes_of(frame: FrameType | None) -> list[CodeType]:
    codes: list[CodeType] = []
    while frame is not None:
        codes.append(frame.f_code)
        frame = frame.f_back
    codes.reverse()
    return codes


class View:
    """How a process names its stacks: cut at the anchor, or put under its process node.

    The main process of a run (or an in-process profile) reports its frames as they are. A
    followed child reports them with its marker: a forked child after the frames it shares
    with its parent (the stack that forked it, as the parent names it), a spawned child at
    the root (the supervisor places it under the stack that started it).
    """

    def __init__(self, anchor: int = 0, pid: int | None = None, fork_frames: list[Frame] | None = None,
                 parent: View | None = None) -> None:
        self.anchor = anchor
        self.pid = pid  # None: no process node (the main process)
        self.fork_frames = fork_frames
        self.parent = parent
        # A multiprocessing spawn or forkserver child: the frames that bring it to its target (`-c`'s
        # <module>, spawn_main, _serve_one) are left out, so its stacks read as a forked child's.
        self.mp_bootstrap = False

    def main(self, frames: list[Frame]) -> list[Frame]:
        if self.pid is None:
            return frames
        if self.fork_frames is None or self.parent is None:
            return [marker(self.pid), *self._own(frames)]
        fork = self.fork_frames
        if not frames:  # nothing of the program's running (shutting down): the process itself
            return [*self.parent.main(fork), marker(self.pid)]
        c = 0
        n = min(len(fork), len(frames))
        while c < n and fork[c] == frames[c]:
            c += 1
        return [*self.parent.main(frames[:c]), marker(self.pid), *self._own(frames[c:])]

    def _own(self, frames: list[Frame]) -> list[Frame]:
        k = 0
        if self.mp_bootstrap:
            while k < len(frames) and (frames[k][1] == "<string>" or frames[k][1].endswith(_MP_BOOTSTRAP_FILES)):
                k += 1
        return frames[k:]

    def thread(self, name: str, frames: list[Frame]) -> list[Frame]:
        head = [(f"{THREAD_FRAME_PREFIX}{thread_group(name)}]", "", 0)]
        if self.pid is None:
            return [*head, *frames]
        if self.fork_frames is None or self.parent is None:
            return [marker(self.pid), *head, *frames]
        return [*self.parent.main(self.fork_frames), marker(self.pid), *head, *frames]
