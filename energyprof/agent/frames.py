"""Which frames belong to the profile: the region's own code, not energyprof or runpy.

The classification itself lives in `stacks` (which must stand alone in every process);
this module adds what only an in-process profile needs.
"""

from __future__ import annotations

import sys
from types import FrameType

from .stacks import KEEP, PACKAGE_DIR, SKIP, STOP, frame_kind

__all__ = ["KEEP", "SKIP", "STOP", "PACKAGE_DIR", "frame_kind", "anchor_depth"]


def anchor_depth(frame: FrameType | None = None) -> int:
    """How many outer frames to cut from main-thread stacks so the profiled region is the root.

    The frames outside the region are those that called into energyprof: for a decorator,
    the decorated function's callers; for a `with` block, the function holding the block.
    They are the frames outside the first energyprof frame.
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
