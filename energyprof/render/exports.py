"""Exports: the same attribution for other tools (speedscope, flamegraph.pl/inferno, spreadsheets).

Each exporter reads a `Profile` and nothing else. Energy leaves as integer microjoules because
neither speedscope nor the folded format has a joule unit, and integers keep their tools exact.
`function_rows` is the flat per-function view shared with the HTML report's table, so the CSV and
the table can never disagree.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from ..profile import EnergyFigures, Node, Profile, write_atomic

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"
MICRO = 1_000_000

FunctionKey = tuple[str, str, int]


@dataclass
class FunctionRow(EnergyFigures):
    """One function merged over every call path it appears on.

    Self figures add up over paths; inclusive ones count a recursive function once (a path that
    already has the function on it adds nothing more), so a row never exceeds the run's total.
    """

    function: str
    file: str
    line: int
    self_energy_j: dict[str, float] = field(default_factory=dict)
    energy_j: dict[str, float] = field(default_factory=dict)
    self_time_s: float = 0.0
    time_s: float = 0.0
    self_cpu_time_s: float = 0.0
    cpu_time_s: float = 0.0
    self_samples: int = 0
    samples: int = 0
    paths: int = 0


def node_key(node: Node) -> FunctionKey:
    return (node.function, node.file, node.line)


def function_rows(profile: Profile, include_root: bool = True) -> list[FunctionRow]:
    """Every function of the profile once, in first-seen (pre-order) order.

    The root node (the program as a whole) is a row too: its self energy is the start-up and
    tear-down outside any Python frame, and without it the rows would not add up to the total.
    """
    rows: dict[FunctionKey, FunctionRow] = {}
    on_path: dict[FunctionKey, int] = {}
    # Iterative DFS with explicit exit markers: trees can be deeper than Python's stack, and the
    # "already on this path" count must be undone when a subtree is left.
    stack: list[tuple[Node, bool, bool]] = [(profile.root, False, True)]
    while stack:
        node, leaving, is_root = stack.pop()
        key = node_key(node)
        if leaving:
            on_path[key] -= 1
            continue
        if not is_root or include_root:
            row = rows.get(key)
            if row is None:
                row = rows[key] = FunctionRow(node.function, node.file, node.line)
            _add_self(row, node)
            if not on_path.get(key):
                _add_inclusive(row, node)
        on_path[key] = on_path.get(key, 0) + 1
        stack.append((node, True, is_root))
        stack.extend((c, False, False) for c in reversed(node.children))
    return list(rows.values())


def _add_self(row: FunctionRow, node: Node) -> None:
    for src, j in node.self_energy_j.items():
        row.self_energy_j[src] = row.self_energy_j.get(src, 0.0) + j
    row.self_time_s += node.self_time_s
    row.self_cpu_time_s += node.self_cpu_time_s
    row.self_samples += node.self_samples
    row.paths += 1


def _add_inclusive(row: FunctionRow, node: Node) -> None:
    for src, j in node.energy_j.items():
        row.energy_j[src] = row.energy_j.get(src, 0.0) + j
    row.time_s += node.time_s
    row.cpu_time_s += node.cpu_time_s
    row.samples += node.samples


def integer_weights(values: Iterable[float], scale: float) -> list[int]:
    """Round a series to integers whose sum is the rounded sum of the series.

    Rounding the running total (not each value) keeps every weight >= 0 and stops thousands of
    small functions from each losing half a microjoule.
    """
    out: list[int] = []
    cumulative = 0.0
    previous = 0
    for value in values:
        cumulative += max(value, 0.0) * scale
        current = round(cumulative)
        out.append(current - previous)
        previous = current
    return out


def _paths(profile: Profile) -> Iterator[tuple[Node, list[Node]]]:
    """Every node with its call path (root first), pre-order, without recursion."""
    stack: list[tuple[Node, list[Node]]] = [(profile.root, [profile.root])]
    while stack:
        node, path = stack.pop()
        yield node, path
        stack.extend((c, path + [c]) for c in reversed(node.children))


# ---------------------------------------------------------------- speedscope


def speedscope_document(profile: Profile) -> dict:
    """speedscope's file format: one sampled profile by energy (uJ), one by time (us).

    speedscope has no energy unit, so the energy profile uses unit "none" with integer
    microjoules and says so in its name. With several sources, one more profile per source.
    """
    frames: list[dict] = []
    index: dict[FunctionKey, int] = {}
    samples: list[list[int]] = []
    energy: list[float] = []
    time: list[float] = []
    per_source: dict[str, list[float]] = {s["id"]: [] for s in profile.sources}
    for node, path in _paths(profile):
        if node.self_total_energy <= 0 and node.self_time_s <= 0:
            continue
        stack = []
        for n in path:
            key = node_key(n)
            if key not in index:
                index[key] = len(frames)
                frame: dict = {"name": n.function}
                if n.file:
                    frame["file"] = n.file
                    frame["line"] = n.line
                frames.append(frame)
            stack.append(index[key])
        samples.append(stack)
        energy.append(node.self_total_energy)
        time.append(node.self_time_s)
        for sid, series in per_source.items():
            series.append(node.self_energy_j.get(sid, 0.0))
    profiles = [_sampled("energy (uJ)", "none", samples, integer_weights(energy, MICRO)),
                _sampled("time (us)", "microseconds", samples, integer_weights(time, MICRO))]
    if len(per_source) > 1:
        for sid, series in per_source.items():
            profiles.append(_sampled(f"energy {sid} (uJ)", "none", samples, integer_weights(series, MICRO)))
    version = profile.meta.get("energyprof_version", "")
    return {
        "$schema": SPEEDSCOPE_SCHEMA,
        "name": f"energyprof: {profile.meta.get('target', '')}",
        "exporter": f"energyprof {version}".strip(),
        "activeProfileIndex": 0,
        "shared": {"frames": frames},
        "profiles": profiles,
    }


def _sampled(name: str, unit: str, samples: list[list[int]], weights: list[int]) -> dict:
    return {"type": "sampled", "name": name, "unit": unit, "startValue": 0,
            "endValue": sum(weights), "samples": samples, "weights": weights}


def write_speedscope(profile: Profile, path: str) -> None:
    write_atomic(Path(path), json.dumps(speedscope_document(profile), separators=(",", ":")))


# ---------------------------------------------------------------- folded stacks


def _folded_frame(node: Node) -> str:
    """py-spy's style, `function (file:line)`; ';' and line breaks would corrupt the format."""
    name = node.function if not node.file else f"{node.function} ({node.file}:{node.line})"
    return name.replace(";", ":").replace("\r", " ").replace("\n", " ")


def folded_lines(profile: Profile) -> list[str]:
    """`a;b;c <microjoules>` per call path with self energy, for flamegraph.pl and inferno."""
    stacks: list[str] = []
    values: list[float] = []
    names: dict[int, str] = {}
    for node, path in _paths(profile):
        if node.self_total_energy <= 0:
            continue
        parts = []
        for n in path:
            if id(n) not in names:
                names[id(n)] = _folded_frame(n)
            parts.append(names[id(n)])
        stacks.append(";".join(parts))
        values.append(node.self_total_energy)
    weights = integer_weights(values, MICRO)
    return [f"{s} {w}" for s, w in zip(stacks, weights) if w > 0]


def write_folded(profile: Profile, path: str) -> None:
    text = "\n".join(folded_lines(profile))
    write_atomic(Path(path), text + "\n" if text else "")


# ---------------------------------------------------------------- CSV


def csv_text(profile: Profile) -> str:
    """One row per function (merged over call paths), per-source columns, the same as the table."""
    sources = [s["id"] for s in profile.sources]
    total = profile.total_energy_j
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    header = ["function", "file", "line", "self_energy_j", "energy_j"]
    for sid in sources:
        header += [f"self_energy_j[{sid}]", f"energy_j[{sid}]"]
    header += ["share", "self_time_s", "time_s", "self_cpu_time_s", "cpu_time_s",
               "self_samples", "samples", "relative_error", "call_paths"]
    writer.writerow(header)
    for row in function_rows(profile):
        cells: list = [spreadsheet_safe(row.function), spreadsheet_safe(row.file), row.line,
                       row.self_total_energy, row.total_energy]
        for sid in sources:
            cells += [row.self_energy_j.get(sid, 0.0), row.energy_j.get(sid, 0.0)]
        err = row.relative_error
        cells += [row.total_energy / total if total else 0.0, row.self_time_s, row.time_s,
                  row.self_cpu_time_s, row.cpu_time_s, row.self_samples, row.samples,
                  "" if err is None else err, row.paths]
        writer.writerow(cells)
    return out.getvalue()


def spreadsheet_safe(text: str) -> str:
    """Names from the profiled program are data: a cell a spreadsheet would run as a formula
    (leading =, +, -, @, tab or CR) gets a leading apostrophe (OWASP's CSV-injection advice)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def write_csv(profile: Profile, path: str) -> None:
    write_atomic(Path(path), csv_text(profile))
