"""Which frames belong to the profile: the region's own code, not energyprof or runpy."""

from __future__ import annotations

import os
import sys
from types import FrameType

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_RUNNER_FILES = {"<frozen runpy>", "<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>"}


# energyprof files whose frames stand between user frames (wrappers): skipped, the stack goes on.
_TRANSPARENT = tuple(PACKAGE_DIR + p for p in ("api.py", "cli.py", "__main__.py", "torch.py", "integrations" + os.sep))

KEEP, SKIP, STOP = 0, 1, 2


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


def is_machinery(filename: str) -> bool:
    """Frames that only run the program for us: energyprof itself and runpy."""
    return frame_kind(filename) != KEEP


def anchor_depth(frame: FrameType | None = None) -> int:
    """How many outer frames to cut from main-thread stacks so the profiled region is the root.

    The frames outside the region are those that called into energyprof: for a decorator,
    the decorated function's callers; for a `with` block, the function holding the block; for
    the CLI, the interpreter's runner. They are the frames outside the first energyprof frame.
    """
    f = frame if frame is not None else sys._getframe(1)
    chain: list[FrameType] = []
    while f is not None:
        chain.append(f)
        f = f.f_back
    chain.reverse()  # outermost first
    for i, fr in enumerate(chain):
        if fr.f_code.co_filename.startswith(PACKAGE_DIR):
            return i
    return len(chain)
