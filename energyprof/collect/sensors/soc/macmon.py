"""Apple silicon power through `macmon pipe` (IOReport, no sudo), one child per run.

macmon prints one JSON object per interval, in watts: `cpu_power`, `gpu_power`, `ane_power`,
`ram_power` (and `gpu_ram_power`), `all_power` (CPU + GPU + ANE) and `sys_power` (the whole
machine, where the Mac reports it). The parts are sources; `other` is the machine's power less
them (from `sys_power`, else nothing beyond the parts).
"""

from __future__ import annotations

import json
import sys
from typing import IO, Iterator

from ..base import Discovery, split_total
from ..presence import TOOL_STEPS, tool_absent
from .powermetrics import component
from .stream import Reading, find_tool, from_tool, lines

INTERVAL_MS = 100
PARTS = {"cpu_power": "cpu", "gpu_power": "gpu:0", "ane_power": "ane", "ram_power": "dram",
         "gpu_ram_power": "gpu-ram"}
INSTALL = TOOL_STEPS["macmon"]


def reading(obj: dict[str, object]) -> Reading | None:
    """One JSON line: the mean power over the interval since macmon's previous line."""
    parts = {sid: float(obj[k]) for k, sid in PARTS.items() if isinstance(obj.get(k), (int, float))}  # type: ignore[arg-type]
    if not parts:
        return None
    sys_w = obj.get("sys_power")
    total = ("sys_power", float(sys_w)) if isinstance(sys_w, (int, float)) and sys_w > 0 else None
    return Reading(split_total(total, parts), mean=True)


def parse(stream: IO[bytes]) -> Iterator[Reading]:
    for line in lines(stream):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = reading(json.loads(line))
        if r is not None:
            yield r


def discover(explicit: bool = False, interval_ms: int = INTERVAL_MS) -> Discovery:
    exe = find_tool("macmon")
    if exe is None:
        return tool_absent("macmon", explicit)
    return from_tool("macmon", [exe, "pipe", "-i", str(interval_ms)], parse, interval_ms / 1000.0,
                     {"interval_ms": interval_ms, "reading": "mean power per interval (W)"}, component, what="figure")

def applies() -> bool:
    return sys.platform == "darwin"
