"""Memory figures that need more than the RSS timeline: exact peaks and tracemalloc.

The exact peak of a profiled call comes from the kernel's VmHWM (probes.reset_peak and
probes.read_peak); this module maps tracemalloc's allocations onto the tree.
"""

from __future__ import annotations

import ast
import functools
import sysconfig
import tracemalloc
from pathlib import Path
from typing import Any

from .profile import Node, Profile

TRACEMALLOC_FRAMES = 1


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
        """[(file, line, bytes still allocated)] for the program's allocations in the region."""
        from .stacks.frames import PACKAGE_DIR

        snap = tracemalloc.take_snapshot().filter_traces([
            tracemalloc.Filter(False, PACKAGE_DIR + "*"),  # energyprof's own bookkeeping
            tracemalloc.Filter(False, tracemalloc.__file__),
        ])
        if self._started_here:
            tracemalloc.stop()
        out = []
        for stat in snap.statistics("lineno"):
            frame = stat.traceback[0]
            out.append((frame.filename, frame.lineno, stat.size))
        return out


def apply_allocations(profile: Profile, allocations: list[tuple[str, int, int]]) -> int:
    """Put each allocation on the function whose body holds its line; returns unplaced bytes.

    The function is found from the source (tracemalloc keeps one frame here, to stay cheap),
    so a function too quick to be sampled still gets its bytes, on a node of its own under
    the root. A function seen on several call paths gets them on the path where it spent the
    most self time.
    """
    best: dict[tuple[str, str, int], Node] = {}
    for node, depth in profile.nodes():
        if depth == 0 or not node.file:
            continue
        key = (node.function, node.file, node.line)
        cur = best.get(key)
        if cur is None or node.self_time_s > cur.self_time_s:
            best[key] = node
    self_alloc: dict[int, int] = {}
    unplaced = 0
    for file, line, size in allocations:
        key = function_at(file, line)
        if key is None:
            unplaced += size
            continue
        owner = best.get(key)
        if owner is None:
            if _is_library(file):  # the interpreter's own bits (codecs, threading): the root's
                unplaced += size
                continue
            owner = best[key] = Node(function=key[0], file=key[1], line=key[2])
            profile.root.children.append(owner)
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


_LIBRARY_ROOTS = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})


def _is_library(file: str) -> bool:
    return file.startswith(_LIBRARY_ROOTS)


@functools.lru_cache(maxsize=256)
def _functions_in(file: str) -> tuple[tuple[int, int, str, int], ...]:
    """(start, end, qualname, first line as code objects report it) for every def in a file."""
    try:
        tree = ast.parse(Path(file).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return ()
    out: list[tuple[int, int, str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                qual = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out.append((first, child.end_lineno or child.lineno, qual, first))
                    visit(child, f"{qual}.<locals>.")
                else:
                    visit(child, f"{qual}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return tuple(out)


def function_at(file: str, line: int) -> tuple[str, str, int] | None:
    """The innermost function whose source holds `line`, as (qualname, file, first line)."""
    if not file or file.startswith("<"):
        return None
    inner = None
    for start, end, qual, first in _functions_in(file):
        if start <= line <= end and (inner is None or start >= inner[0]):
            inner = (start, qual, first)
    if inner is None:
        return ("<module>", file, 1)
    return (inner[1], file, inner[2])


def summary(profile: Profile, first_tick: Any) -> dict[str, Any]:
    """Baseline (RSS when profiling began) and sampled peak, for 'above baseline' figures."""
    rss = [r for r in profile.timeline.get("rss_bytes") or [] if r]
    baseline = first_tick.rss_bytes if first_tick is not None and first_tick.rss_bytes else None
    return {"baseline_rss_bytes": baseline, "peak_rss_bytes": max(rss) if rss else baseline}
