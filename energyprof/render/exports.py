"""Exports for other tools (speedscope, flamegraph.pl/inferno, spreadsheets), from the report model.

Energy leaves as integer microjoules because neither speedscope nor the folded format has a joule
unit, and integers keep their tools exact. The CSV is the model's function rows, the same as the
HTML table, so the two cannot disagree. Each returns text; outputs.py writes it.
"""

from __future__ import annotations

import io
import json
from typing import Iterable, Iterator

from ..analysis.functions import FunctionKey, node_key
from ..analysis.report import ReportModel
from ..facts.profile import IDLE_NODE
from ..facts.profile import SELF_NODE
from ..facts.profile import Node

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"
MICRO = 1_000_000
NOT_THE_PROGRAM = (IDLE_NODE, SELF_NODE)

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


def _paths(model: ReportModel) -> Iterator[tuple[Node, list[Node]]]:
    """The program's nodes with their call paths (root first), pre-order (the path is shared: copy to
    keep it). The idle node and energyprof's own are left out, so each export's total is the
    program's energy, as in every other view."""
    path: list[Node] = []
    skip: int | None = None
    for node, depth in model.profile.walk():
        if skip is not None:
            if depth > skip:
                continue
            skip = None
        if depth and node.function in NOT_THE_PROGRAM:
            skip = depth
            continue
        del path[depth:]
        path.append(node)
        yield node, path


# ---------------------------------------------------------------- speedscope


def speedscope_document(model: ReportModel) -> dict:
    """speedscope's file format: one sampled profile by energy (uJ), one by time (us).

    speedscope has no energy unit, so the energy profile uses unit "none" with integer
    microjoules and says so in its name. With several sources, one more profile per source.
    """
    frames: list[dict] = []
    index: dict[FunctionKey, int] = {}
    samples: list[list[int]] = []
    energy: list[float] = []
    time: list[float] = []
    per_source: dict[str, list[float]] = {s.id: [] for s in model.sources}
    for node, path in _paths(model):
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
    version = model.meta.get("energyprof_version", "")
    return {
        "$schema": SPEEDSCOPE_SCHEMA,
        "name": f"energyprof: {model.meta.get('target', '')}",
        "exporter": f"energyprof {version}".strip(),
        "activeProfileIndex": 0,
        "shared": {"frames": frames},
        "profiles": profiles,
    }


def _sampled(name: str, unit: str, samples: list[list[int]], weights: list[int]) -> dict:
    return {"type": "sampled", "name": name, "unit": unit, "startValue": 0,
            "endValue": sum(weights), "samples": samples, "weights": weights}


def speedscope_text(model: ReportModel) -> str:
    return json.dumps(speedscope_document(model), separators=(",", ":"))


# ---------------------------------------------------------------- folded stacks


def _folded_frame(node: Node) -> str:
    """py-spy's style, `function (file:line)`; ';' and line breaks would corrupt the format."""
    name = node.function if not node.file else f"{node.function} ({node.file}:{node.line})"
    return name.replace(";", ":").replace("\r", " ").replace("\n", " ")


def folded_lines(model: ReportModel) -> list[str]:
    """`a;b;c <microjoules>` per call path with self energy, for flamegraph.pl and inferno."""
    stacks: list[str] = []
    values: list[float] = []
    names: dict[int, str] = {}
    for node, path in _paths(model):
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


def folded_text(model: ReportModel) -> str:
    text = "\n".join(folded_lines(model))
    return text + "\n" if text else ""


# ---------------------------------------------------------------- CSV


def csv_text(model: ReportModel) -> str:
    """One row per function (merged over call paths), per-source columns, the same as the table.

    `share` is of the program's energy, as in the report; the root's row is the program, as in the HTML
    table: its energy (inclusive and per source, and its carbon) is the program's under the profile's idle
    policy, never the machine's (the idle and energyprof's own are rows of their own), so its share is 1
    and its `machine_share` the program's part of everything measured. Times are summed over threads and processes, so they
    can exceed the run's wall time. `self_relative_error` belongs beside self energy (from the
    function's own samples), `relative_error` beside inclusive energy; carbon and cost columns
    appear when carbon is on; forward and backward ones when the profile tells them apart (a `[backward]`
    frame): they add up to `energy_j`."""
    sources = [s.id for s in model.sources]
    total = model.total_energy_j
    import csv  # here: every report imports this module, few write CSV

    c = model.carbon
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    header = ["function", "file", "line", "self_energy_j", "energy_j"]
    for sid in sources:
        header += [f"self_energy_j[{sid}]", f"energy_j[{sid}]"]
    header += ["share", "machine_share", "self_time_s", "time_summed_s", "self_cpu_time_s", "cpu_time_s",
               "self_samples", "samples", "self_relative_error", "relative_error", "call_paths"]
    if c is not None:
        header += ["carbon_g"] + (["cost"] if c.price_per_kwh is not None else [])
    if model.backward_split:  # the part of energy_j in backward and the rest (analysis/phases.py)
        header += ["forward_energy_j", "backward_energy_j", "backward_relative_error"]
    writer.writerow(header)
    program = model.totals.attributed_j  # the program_j that every share is of, per source
    for row in model.rows:
        energy = model.row_energy(row)
        by_source = program if model.is_root(row) else row.energy_j
        cells: list = [spreadsheet_safe(row.function), spreadsheet_safe(row.file), row.line,
                       row.self_total_energy, energy]
        for sid in sources:
            cells += [row.self_energy_j.get(sid, 0.0), by_source.get(sid, 0.0)]
        self_err, err = row.self_relative_error, row.relative_error
        share = model.share(energy)
        cells += ["" if share is None else share, energy / total if total else "", row.self_time_s, row.time_s,
                  row.self_cpu_time_s, row.cpu_time_s, row.self_samples, row.samples,
                  "" if self_err is None else self_err, "" if err is None else err, row.paths]
        if c is not None:
            cells.append(c.grams(by_source))
            if c.price_per_kwh is not None:
                cells.append(c.cost(by_source))
        if model.backward_split:
            forward, backward = model.row_phases(row) or ("", "")
            berr = row.backward_relative_error
            cells += [forward, backward, "" if berr is None else berr]
        writer.writerow(cells)
    return out.getvalue()


def spreadsheet_safe(text: str) -> str:
    """Names from the profiled program are data: a cell a spreadsheet would run as a formula
    (leading =, +, -, @, tab or CR) gets a leading apostrophe (OWASP's CSV-injection advice)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text
