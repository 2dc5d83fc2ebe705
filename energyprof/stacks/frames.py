"""Which frames belong to the profile: the region's own code, not energyprof or runpy."""

from __future__ import annotations

import os
import sys
from types import FrameType

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_RUNNER_FILES = {"<frozen runpy>", "<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>"}


def is_machinery(filename: str) -> bool:
    """Frames that only run the program for us: energyprof itself and runpy."""
    return (filename.startswith(PACKAGE_DIR) or filename in _RUNNER_FILES
            or os.path.basename(filename) == "runpy.py")


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
