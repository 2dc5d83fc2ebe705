"""Memory figures that need more than the RSS timeline: exact peaks and tracemalloc.

The kernel keeps a process's peak RSS (VmHWM). Writing 5 to /proc/self/clear_refs resets
it (Linux >= 4.0), so the peak *during* a profiled call can be read exactly rather than
sampled. That reset is process-wide: anything else reading the process's max RSS
(resource.getrusage's ru_maxrss is separate and unaffected; VmHWM is) sees the new mark.
`peak_reset=False` turns it off.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

from .profile import Node, Profile

TRACEMALLOC_FRAMES = 1


def reset_peak() -> bool:
    """Reset VmHWM; False where the platform does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def read_peak() -> int | None:
    """VmHWM in bytes, or None off Linux."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


class ExactAllocations:
    """tracemalloc over the profiled region: net Python allocations per function (slow)."""

    def __init__(self) -> None:
        self._started_here = False

    def start(self) -> None:
        if not tracemalloc.is_tracing():
            tracemalloc.start(TRACEMALLOC_FRAMES)
            self._started_here = True
        tracemalloc.clear_traces()

    def stop(self) -> list[tuple[str, int, int]]:
        """[(file, line, bytes still allocated)] for allocations made during the region."""
        snap = tracemalloc.take_snapshot()
        if self._started_here:
            tracemalloc.stop()
        out = []
        for stat in snap.statistics("lineno"):
            frame = stat.traceback[0]
            out.append((frame.filename, frame.lineno, stat.size))
        return out


def apply_allocations(profile: Profile, allocations: list[tuple[str, int, int]]) -> int:
    """Put each allocation on the function whose body holds its line; returns unplaced bytes.

    A function seen on several call paths gets its bytes on the path where it spent the
    most self time (tracemalloc keeps one frame here to stay cheap, so the path is unknown).
    """
    by_file: dict[str, list[tuple[int, Node]]] = {}
    best: dict[tuple[str, str, int], Node] = {}
    for node, depth in profile.nodes():
        if depth == 0 or not node.file:
            continue
        key = (node.function, node.file, node.line)
        cur = best.get(key)
        if cur is None or node.self_time_s > cur.self_time_s:
            best[key] = node
    for (_fn, file, line), node in best.items():
        by_file.setdefault(file, []).append((line, node))
    for lst in by_file.values():
        lst.sort(key=lambda t: t[0])
    self_alloc: dict[int, int] = {}
    unplaced = 0
    for file, line, size in allocations:
        candidates = by_file.get(file)
        owner = None
        if candidates:
            for first, node in candidates:
                if first <= line:
                    owner = node
                else:
                    break
        if owner is None:
            unplaced += size
            continue
        self_alloc[id(owner)] = self_alloc.get(id(owner), 0) + size
    order = [n for n, _ in profile.nodes()]
    incl: dict[int, int] = {}
    for node in reversed(order):
        total = self_alloc.get(id(node), 0) + sum(incl.get(id(c), 0) for c in node.children)
        incl[id(node)] = total
        if not node.is_special:
            node.alloc_bytes = total
    if profile.root.alloc_bytes is not None:
        profile.root.alloc_bytes += unplaced
    return unplaced


def summary(profile: Profile, first_tick: Any) -> dict[str, Any]:
    """Baseline (RSS when profiling began) and sampled peak, for 'above baseline' figures."""
    rss = [r for r in profile.timeline.get("rss_bytes") or [] if r]
    baseline = first_tick.rss_bytes if first_tick is not None and first_tick.rss_bytes else None
    return {"baseline_rss_bytes": baseline, "peak_rss_bytes": max(rss) if rss else baseline}
