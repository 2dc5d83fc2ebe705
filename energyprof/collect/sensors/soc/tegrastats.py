"""NVIDIA Jetson power through `tegrastats --interval MS`, one child per run.

Every generation's line is read (rails.py): each rail's instantaneous value integrated by
trapezoids, the input rail split into its measured parts plus `other`.
"""

from __future__ import annotations

from typing import IO, Iterator


from ..base import Discovery
from ..presence import TOOL_STEPS, tool_absent
from . import on_jetson, rails  # noqa: F401 - on_jetson is also this backend's
from .stream import Reading, find_tool, from_tool, lines

INTERVAL_MS = 100
ENABLE = TOOL_STEPS["tegrastats"]


def parse(stream: IO[bytes]) -> Iterator[Reading]:
    for line in lines(stream):
        found = rails.parse_line(line)
        if found:
            yield Reading(rails.sources_watts(found))


def discover(explicit: bool = False, interval_ms: int = INTERVAL_MS) -> Discovery:
    exe = find_tool("tegrastats")
    if exe is None:
        return tool_absent("tegrastats", explicit)
    return from_tool("tegrastats", [exe, "--interval", str(interval_ms)], parse, interval_ms / 1000.0,
                     {"interval_ms": interval_ms, "reading": "instantaneous rail power (cur), integrated by trapezoids; "
                      "the running average is never used"}, rails.component,
                     step="run `tegrastats` to see why (some releases print the rails only to root: try sudo)")
