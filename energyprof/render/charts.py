"""The report's figures as plotly data: the icicle, the timeline, and the function table's columns.

Built from the report model; labels and hover texts are HTML-escaped because plotly reads a subset
of HTML in them. Numbers are rounded so a 50,000-function page stays under 8 MB.
"""

from __future__ import annotations

import functools
import math
import re
import zlib
from typing import Any

from ..analysis.chart import ChartNode, module_name
from ..analysis.functions import is_library
from ..analysis.report import ReportModel
from ..facts.profile import CHILDREN_NODE
from ..facts.profile import IDLE_NODE
from ..facts.profile import SELF_NODE
from ..facts.profile import SPECIAL_NODES
from ..facts.profile import Source
from .format import fmt_energy, fmt_percent, fmt_seconds, format_spec

MAX_TIMELINE_POINTS = 3000
MAX_WINDOW_SHADES = 200
LABEL_CHARS = 60

SOURCE_COLOURS = {"cpu": "#e8743b", "dram": "#3b7de8", "ram": "#3b7de8", "psys": "#8e5bd6", "gpu": "#2ca25f"}
EXTRA_SOURCE_COLOURS = ["#d6a21e", "#c2185b", "#00897b", "#6d4c41", "#5c6bc0", "#7cb342"]
FILE_PALETTE = [
    "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f",
    "#79706e", "#86bcb6", "#d37295", "#a0cbe8", "#ffbe7d", "#8cd17d", "#b6992d", "#499894",
    "#e15759", "#d4a6c8", "#fabfd2", "#bab0ac",
]
SPECIAL_COLOURS = {IDLE_NODE: "#d9d9d9", SELF_NODE: "#bdbdbd", CHILDREN_NODE: "#c7b9e0"}
OTHER_COLOUR = "#eeeeee"
ROOT_COLOUR = "#f6d2bf"
LIBRARY_COLOUR = "#cfd8dc"
IMPORT_COLOUR = "#e0d6c2"
PROGRAM_LINE = "#111111"
KIND_CODES = {"user": 0, "library": 1, "import": 2, "group": 3}


def _escape(text: str) -> str:
    """html.escape(text, quote=False), without importing html (and its entity table) at every report."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def report_data(model: ReportModel) -> dict[str, Any]:
    """Everything the page's scripts read: the charts and the function table."""
    chart = icicle_trace(model, model.chart)
    return {
        "format": format_spec(),
        "sources": [{"id": s.id, "method": s.method, "colour": c}
                    for s, c in zip(model.sources, source_colours(model.sources))],
        "total_j": model.total_energy_j,
        "program_j": model.program_j,
        "chart": {"full": chart, "legend": chart_legend(model, chart)},
        "timeline": timeline_figure(model),
        "table": function_table(model),
        "spans": function_spans(model),
        "resolution_s": model.resolution_s,
        "sweeps": sweep_figures(model),
    }


def pareto_figure(points: list[tuple[str, str, float, float, bool]], y_title: str) -> dict[str, Any]:
    """Energy against time with the Pareto front joined: points are (text, hover, time, energy, on front).
    Text and hover are program strings: plotly reads a subset of HTML in them, so they are escaped."""
    on = sorted((p for p in points if p[4]), key=lambda p: p[2])
    return {
        "data": [
            {"type": "scatter", "mode": "markers+text", "name": "points", "x": [p[2] for p in points],
             "y": [p[3] for p in points], "text": [_escape(p[0]) for p in points], "textposition": "top center",
             "hovertext": [_escape(p[1]) for p in points], "hoverinfo": "text+x+y",
             "marker": {"size": 10, "color": "#4e79a7"}},
            {"type": "scatter", "mode": "lines+markers", "name": "Pareto front", "x": [p[2] for p in on],
             "y": [p[3] for p in on], "hoverinfo": "skip",
             "marker": {"size": 14, "symbol": "circle-open", "color": "#e8743b"}, "line": {"dash": "dot"}},
        ],
        "layout": {"xaxis": {"title": {"text": "time (s)"}}, "yaxis": {"title": {"text": y_title}},
                   "margin": {"t": 10}},
    }


def sweep_figures(model: ReportModel) -> list[dict[str, Any]]:
    """One energy-against-time figure per sweep in the run (windows named NAME:LABEL)."""
    return [{"name": name, "program": program,
             "figure": pareto_figure([(p.label, p.label, p.time_s, p.energy_j, p.pareto) for p in points],
                                     "program energy (J)" if program else "machine energy (J)")}
            for name, (points, program) in model.sweeps.items()]


def _round(x: float, digits: int = 4) -> float:
    """Fewer digits for the table and timeline keep a 50,000-function report under 8 MB."""
    return float(f"{x:.{digits}g}") if x else 0.0


def source_colours(sources: list[Source]) -> list[str]:
    """A stable colour per source: by component where known, then a fixed list."""
    out, extra = [], 0
    for s in sources:
        comp = (s.component or s.id).split(":")[0]
        colour = SOURCE_COLOURS.get(comp)
        if colour is None or colour in out:
            colour = EXTRA_SOURCE_COLOURS[extra % len(EXTRA_SOURCE_COLOURS)]
            extra += 1
        out.append(colour)
    return out


def icicle_trace(model: ReportModel, root: ChartNode) -> dict[str, Any]:
    """The pruned, grouped chart tree as parallel arrays in pre-order for a plotly icicle.

    `kind` (0 user, 1 library, 2 import, 3 group box) and `group` (the index of the group box a
    library or import frame folds into, -1 for none) let the page fold groups until clicked;
    `row` is the node's function in the table (-1 for none), so a click selects it there.
    """
    colours = dict(zip((s.id for s in model.sources), source_colours(model.sources)))
    out: dict[str, list] = {k: [] for k in ("parents", "labels", "names", "hovertext", "value_e",
                                            "value_t", "colour_file", "colour_mix", "kind", "group", "row")}
    row_of = {(r.function, r.file, r.line): i for i, r in enumerate(model.rows)}
    program = model.program_j
    total_t = root.value_t or 1.0
    index: dict[int, int] = {}
    stack: list[tuple[ChartNode, int]] = [(root, -1)]
    while stack:
        n, parent = stack.pop()
        i = index[id(n)] = len(out["parents"])
        out["parents"].append(parent)
        chain = [n]  # a wrapper that only calls one function (`<module>` -> main) shares its box with it
        while parent >= 0 and _wraps(chain[-1]):
            chain.append(chain[-1].children[0])
            index[id(chain[-1])] = i
        through, n = chain[:-1], chain[-1]
        name = n.function
        if n.kind == "import" and name == "<module>" and n.file:  # a module body run by an import: which one
            name = f"import {module_name(n.file)}"
        if parent < 0:  # the program as a whole: its script's name, not its full path
            name = (name.replace("\\", "/").rsplit("/", 1)[-1] or "program")
        if through:
            name = " \u203a ".join([w.function for w in through] + [name])
        if len(name) <= LABEL_CHARS:
            label = name
        else:  # a chain keeps its callee in view, one function its start
            label = "\u2026" + name[-(LABEL_CHARS - 1):] if through else name[:LABEL_CHARS - 1] + "\u2026"
        out["labels"].append(_escape(label))
        out["names"].append(n.function if n.function in SPECIAL_NODES else "")  # for the page's idle switch
        hover = _hover(n, program, total_t, model.total_energy_j if parent < 0 else None)
        if through:
            hover += "<br>called through " + " \u203a ".join(_escape(w.function) for w in through)
        out["hovertext"].append(hover)
        out["value_e"].append(n.value_e)  # unrounded: plotly draws nothing if a parent is below its children
        out["value_t"].append(n.value_t)
        out["colour_file"].append(_file_colour(n))
        out["colour_mix"].append(_mix_colour(n, colours))
        out["kind"].append(KIND_CODES.get(n.kind, 0))
        out["group"].append(index.get(id(n.group), -1) if n.group is not None else -1)
        out["row"].append(-1 if n.folded or n.kind == "group" else row_of.get((n.function, n.file, n.line), -1))
        stack.extend((c, i) for c in reversed(n.children))
    return out


def _wraps(n: ChartNode) -> bool:
    """A user function whose one child is a user function holding all of its energy and time (its own
    self is nothing): two rows of the chart that say one thing."""
    if len(n.children) != 1 or n.kind != "user" or n.folded or n.function in SPECIAL_NODES:
        return False
    c = n.children[0]
    return (c.kind == "user" and not c.folded and c.function not in SPECIAL_NODES
            and c.value_e >= n.value_e * (1 - 1e-9) and c.value_t >= n.value_t * (1 - 1e-9))


def chart_legend(model: ReportModel, chart: dict[str, Any]) -> list[dict[str, str]]:
    """What the file colours mean: the program's files (the largest first), then the fixed ones."""
    by_file: dict[str, float] = {}
    stack = [model.chart]
    while stack:
        n = stack.pop()
        if n.kind == "user" and n.file and not n.folded and n.function not in SPECIAL_NODES:
            by_file[n.file] = by_file.get(n.file, 0.0) + sum(n.self_e.values())
        stack.extend(n.children)
    short = path_shortener(model)
    out = [{"label": short(f), "title": f, "colour": _file_colour(ChartNode("", f, 0, {}, 0.0, 0))}
           for f in sorted(by_file, key=lambda f: -by_file[f])[:8]]
    fixed = [("the program (start-up, outside any function)", ROOT_COLOUR), ("library code", LIBRARY_COLOUR),
             ("imports", IMPORT_COLOUR), ("energyprof itself", SPECIAL_COLOURS[SELF_NODE]),
             ("other processes and idle", SPECIAL_COLOURS[IDLE_NODE]), ("smaller call paths (other)", OTHER_COLOUR)]
    return out + [{"label": label, "title": "", "colour": c} for label, c in fixed]


def _hover(n: ChartNode, program: float, total_t: float, machine: float | None = None) -> str:
    """A box's tooltip. The root's box (`machine` given) is as wide as the machine's energy, since the
    idle node and energyprof's own hang under it, but its tooltip names the program, as every view does."""
    if n.folded:
        head = [f"other: {n.folded} smaller call paths"]
    elif n.kind == "group":
        head = [_escape(n.function), "click to show its frames" if n.children else ""]
    else:
        head = [_escape(n.function)] + ([_escape(f"{n.file}:{n.line}")] if n.file else [])
    energy = (f"the program's energy {fmt_energy(program)} (100%); the machine measured {fmt_energy(machine)}"
              if machine is not None else
              f"energy {fmt_energy(n.value_e)} ({fmt_percent(n.value_e, program)} of the program's),"
              f" self {fmt_energy(sum(n.self_e.values()))}")
    parts = head + [
        energy,
        f"time (summed over threads) {fmt_seconds(n.value_t)} ({fmt_percent(n.value_t, total_t)}), samples {n.samples}"
        + (f" \u00b1{100 / math.sqrt(n.samples):.0f}%" if n.samples else ""),
    ]
    if len(n.energy) > 1 and n.value_e > 0:
        parts.append(", ".join(f"{_escape(k)} {v / n.value_e * 100:.0f}%" for k, v in n.energy.items()))
    return "<br>".join(p for p in parts if p)


def _file_colour(n: ChartNode) -> str:
    if n.function in SPECIAL_COLOURS:
        return SPECIAL_COLOURS[n.function]
    if n.folded:
        return OTHER_COLOUR
    if n.kind == "group":
        return IMPORT_COLOUR if n.function == "[import]" else LIBRARY_COLOUR
    if n.kind == "import":
        return IMPORT_COLOUR
    if not n.file:
        return ROOT_COLOUR
    if is_library(n.file):
        return LIBRARY_COLOUR
    # crc32, not hash(): Python salts str hashes per process and the page must be reproducible.
    return FILE_PALETTE[zlib.crc32(n.file.encode("utf-8", "replace")) % len(FILE_PALETTE)]


def _mix_colour(n: ChartNode, colours: dict[str, str]) -> str:
    """The sources' colours averaged by their share of this node's energy."""
    if n.function in SPECIAL_COLOURS:
        return SPECIAL_COLOURS[n.function]
    total = n.value_e
    if total <= 0:
        return OTHER_COLOUR
    rgb = [0.0, 0.0, 0.0]
    for sid, j in n.energy.items():
        hexc = colours.get(sid, "#999999")
        for i in range(3):
            rgb[i] += int(hexc[1 + 2 * i:3 + 2 * i], 16) * j / total
    return "#" + "".join(f"{min(255, round(c)):02x}" for c in rgb)


def timeline_figure(model: ReportModel) -> dict[str, Any] | None:
    """Stacked power per source as steps, an RSS lane when recorded, windows shaded."""
    tl = model.profile.timeline
    starts, ends = tl.start_s, tl.end_s
    power = tl.power_w
    n = min([len(starts), len(ends)] + [len(v) for v in power.values()]) if power else 0
    if n == 0:
        return None
    buckets = _buckets(starts[:n], ends[:n])
    xs = [starts[a] for a, _ in buckets] + [ends[buckets[-1][1] - 1]]
    colours = dict(zip((s.id for s in model.sources), source_colours(model.sources)))
    data: list[dict[str, Any]] = []
    for sid, series in power.items():
        ys = [_round(_mean_power(series, starts, ends, a, b)) for a, b in buckets]
        data.append({"type": "scatter", "mode": "lines", "name": f"{sid} (W)", "x": [_round(x, 6) for x in xs],
                     "y": ys + ys[-1:], "stackgroup": "power", "line": {"shape": "hv", "width": 0.5,
                     "color": colours.get(sid, "#999999")},
                     "hovertemplate": "%{y:.3g} W<extra>" + _escape(sid) + "</extra>"})
    layout: dict[str, Any] = {
        "margin": {"l": 60, "r": 20, "t": 30, "b": 45}, "height": 320, "hovermode": "x unified",
        "xaxis": {"title": {"text": "time (s)"}, "zeroline": False},
        "yaxis": {"title": {"text": "power (W)"}, "rangemode": "tozero"},
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0}, "shapes": [], "annotations": [],
    }
    program = tl.program_w.get(model.policy) or []
    if len(program) >= n:
        ys = [_round(_mean_power(program, starts, ends, a, b)) for a, b in buckets]
        data.append({"type": "scatter", "mode": "lines", "name": "the program (W)", "x": [_round(x, 6) for x in xs],
                     "y": ys + ys[-1:], "line": {"shape": "hv", "width": 1.6, "color": PROGRAM_LINE},
                     "hovertemplate": "%{y:.3g} W<extra>the program</extra>"})
    rss = tl.rss_bytes
    if len(rss) >= n:
        ys = [_round(max(rss[a:b]) / 2**20) for a, b in buckets]
        data.append({"type": "scatter", "mode": "lines", "name": "RSS (MiB)", "x": [_round(x, 6) for x in xs],
                     "y": ys + ys[-1:], "xaxis": "x", "yaxis": "y2", "line": {"shape": "hv", "color": "#555"},
                     "hovertemplate": "%{y:.4g} MiB<extra>RSS</extra>", "showlegend": False})
        # Two lanes: power above, RSS below; the time axis sits under the RSS lane (anchored to it)
        # so its title has a lane of its own, and each lane's title is beside its own lane.
        layout["yaxis"]["domain"] = [0.36, 1.0]
        layout["yaxis2"] = {"domain": [0.0, 0.24], "title": {"text": "RSS (MiB)"}, "rangemode": "tozero"}
        layout["xaxis"]["anchor"] = "y2"
        layout["height"] = 400
    _gpu_busy(model, data, layout)
    _disk_reads(model, data, layout)
    _shade_windows(model, layout)
    return {"data": data, "layout": layout}


def _gpu_busy(model: ReportModel, data: list[dict[str, Any]], layout: dict[str, Any]) -> None:
    """--gpu-kernels: each device's busy share of time (any kernel running), on a right-hand axis."""
    devices = (model.profile.extra.get("gpu_kernels") or {}).get("devices") or {}
    for d, dev in sorted(devices.items()):
        lane = dev.get("busy_lane") or []
        if not lane:
            continue
        step = max(1, math.ceil(len(lane) / MAX_TIMELINE_POINTS))
        xs, ys = [], []
        for a in range(0, len(lane), step):
            part = [c for c in lane[a:a + step] if c[2] is not None]  # None: outside a scheduled window
            span = sum(c[1] - c[0] for c in part)
            xs.append(_round(lane[a][0], 6))
            ys.append(_round(100 * sum(c[2] for c in part) / span, 2) if span > 0 else None)
        data.append({"type": "scatter", "mode": "lines", "name": f"gpu:{d} busy (%)", "x": xs + [_round(lane[-1][1], 6)],
                     "y": ys + ys[-1:], "yaxis": "y3", "line": {"shape": "hv", "width": 1, "dash": "dot"},
                     "hovertemplate": "%{y:.3g}% busy (measured, kernel trace)<extra>gpu:" + _escape(d) + "</extra>"})
        layout["yaxis3"] = {"title": {"text": "GPU busy (%)"}, "overlaying": "y", "side": "right", "range": [0, 100],
                            "showgrid": False}
        layout["margin"]["r"] = 60


def _disk_reads(model: ReportModel, data: list[dict[str, Any]], layout: dict[str, Any]) -> None:
    """The disks' read MB/s per reading interval (IOPS in its hover), measured from /proc/diskstats, on a right axis."""
    from ..analysis.io import io_of, read_rates

    rates = read_rates(io_of(model.profile), MAX_TIMELINE_POINTS)
    if rates is None:
        return
    iops = [_round(x, 1) for x in rates["iops"]]
    ys = [_round(x) for x in rates["mb_s"]]
    data.append({"type": "scatter", "mode": "lines", "name": "disk read (MB/s)", "x": [_round(x, 6) for x in rates["t_s"]],
                 "y": ys + ys[-1:], "customdata": iops + iops[-1:], "yaxis": "y4",
                 "line": {"shape": "hv", "width": 1, "color": "#8c564b", "dash": "dash"},
                 "hovertemplate": "%{y:.3g} MB/s, %{customdata:.0f} IOPS (measured, /proc/diskstats)<extra>disk read</extra>"})
    layout["yaxis4"] = {"title": {"text": "disk read (MB/s)"}, "overlaying": "y", "side": "right", "rangemode": "tozero",
                        "showgrid": False}
    if "yaxis3" in layout:  # beside the GPU busy axis, not over it
        layout["xaxis"]["domain"] = [0.0, 0.9]
        layout["yaxis4"].update(anchor="free", position=1.0)
    layout["margin"]["r"] = 60


def _buckets(starts: list[float], ends: list[float]) -> list[tuple[int, int]]:
    """Consecutive index ranges, at most MAX_TIMELINE_POINTS of them (long runs have many readings)."""
    n = len(starts)
    step = max(1, math.ceil(n / MAX_TIMELINE_POINTS))
    return [(a, min(n, a + step)) for a in range(0, n, step)]


def _mean_power(series: list[float], starts: list[float], ends: list[float], a: int, b: int) -> float:
    """Energy over a bucket divided by its length: downsampling keeps the area (the joules)."""
    span = sum(ends[i] - starts[i] for i in range(a, b))
    if span <= 0:
        return sum(series[a:b]) / (b - a)
    return sum(series[i] * (ends[i] - starts[i]) for i in range(a, b)) / span


def _shade_windows(model: ReportModel, layout: dict[str, Any]) -> None:
    palette = ["rgba(78,121,167,0.12)", "rgba(242,142,43,0.12)"]
    from ..analysis.training import is_cache_fact  # a tracked loop's page-cache readings: no span to shade

    windows = sorted((w for w in model.profile.windows if not is_cache_fact(w)), key=lambda w: (w.depth, w.start_s))
    for i, w in enumerate(windows[:MAX_WINDOW_SHADES]):
        layout["shapes"].append({"type": "rect", "xref": "x", "yref": "paper", "x0": w.start_s,
                                 "x1": w.end_s, "y0": 0, "y1": 1, "line": {"width": 0},
                                 "fillcolor": palette[i % 2], "layer": "below"})
        if w.depth == 0 and len(windows) <= 40:
            layout["annotations"].append({"x": w.start_s, "y": 1, "xref": "x", "yref": "paper",
                                          "text": _escape(w.name),
                                          "showarrow": False, "xanchor": "left", "yanchor": "top",
                                          "font": {"size": 10, "color": "#555"}})


def function_spans(model: ReportModel) -> dict[str, list[list[float]]]:
    """{function table row: [[start_s, end_s], ...]}: when the function was on a stack.

    From the timeline's per-bucket record of the stacks that ran (the heaviest few per bucket),
    adjacent buckets merged; the timeline draws them when a table row is clicked.
    """
    tl = model.profile.timeline
    functions, active, starts, ends = tl.functions, tl.active, tl.start_s, tl.end_s
    if not functions or not active:
        return {}
    row_of = {(r.function, r.file, r.line): i for i, r in enumerate(model.rows)}
    fn_row = [row_of.get((f[0], f[1], f[2])) for f in functions]
    spans: dict[int, list[list[float]]] = {}
    for b, members in enumerate(active[: min(len(starts), len(ends))]):
        s, e = _round(starts[b], 6), _round(ends[b], 6)
        for k in members:
            row = fn_row[k] if k < len(fn_row) else None
            if row is None:
                continue
            lst = spans.setdefault(row, [])
            if lst and abs(lst[-1][1] - s) < 1e-6 * max(1.0, e):
                lst[-1][1] = e
            else:
                lst.append([s, e])
    return {str(k): v for k, v in spans.items()}


def program_folder(model: ReportModel) -> str | None:
    """The folder of the program's script: its path when absolute, else found from a frame's file
    that ends with the target as given (the profile keeps absolute file paths)."""
    target = str(model.meta.get("target") or "").replace("\\", "/")
    if not target.endswith(".py"):
        return None
    if target.startswith("/"):
        return target.rsplit("/", 1)[0] + "/"
    for r in model.rows:
        f = r.file.replace("\\", "/")
        if f.endswith("/" + target.lstrip("./")):
            return f.rsplit("/", 1)[0] + "/"
    return None


def path_shortener(model: ReportModel):
    """A file as a reader wants it: relative to the program's folder; `package/module.py` for
    installed code and the standard library; otherwise the last two parts. The full path goes in
    a tooltip."""
    folder = program_folder(model)

    @functools.lru_cache(maxsize=None)
    def short(path: str) -> str:
        p = path.replace("\\", "/")
        if folder and p.startswith(folder):
            return p[len(folder):]
        for marker in ("/site-packages/", "/dist-packages/"):
            if marker in p:
                return p.rsplit(marker, 1)[1]
        m = _STDLIB.search(p)
        if m:
            return m.group(1)
        parts = p.split("/")
        return "/".join(parts[-2:]) if len(parts) > 2 else p
    return short


_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?t?/(.+)$")


def function_table(model: ReportModel) -> dict[str, Any]:
    """Every function as columns (compact for 50,000 rows); files are interned once.

    Numeric columns are scaled (see `scaled_column`) because a 50,000-function table is most of
    the page once plotly.js is in it. The root row (the program as a whole) has the program's
    energy as its total, not the machine's: idle and energyprof are rows of their own.
    """
    rows = model.rows
    sources = [s.id for s in model.sources]
    files: dict[str, int] = {}
    for r in rows:
        files.setdefault(r.file, len(files))
    short = path_shortener(model)
    special = {IDLE_NODE: 1, SELF_NODE: 2}  # not the program's: listed after its functions ([child processes] is its)
    own = {id(r) for r in model.own}

    def pct(joules: float) -> float:
        share = model.share(joules)
        return round(share * 100, 4) if share is not None else 0.0

    table: dict[str, Any] = {
        "fn": [r.function for r in rows],
        "file": [files[r.file] for r in rows],
        "line": [r.line for r in rows],
        "files": list(files),
        "short": [short(f) if f else "" for f in files],
        "special": [special.get(r.function, 0) for r in rows],
        "own": [1 if id(r) in own else 0 for r in rows],  # the user's functions, which the table opens on
        "self_n": [r.self_samples for r in rows],
        "n": [r.samples for r in rows],
        "self_e": scaled_column([r.self_total_energy for r in rows]),
        "tot_e": scaled_column([model.row_energy(r) for r in rows]),
        # percentages from the unrounded energies (the columns above keep three digits)
        "self_p": [pct(r.self_total_energy) for r in rows],
        "tot_p": [pct(model.row_energy(r)) for r in rows],
        "self_t": scaled_column([r.self_time_s for r in rows]),
        "t": scaled_column([r.time_s for r in rows]),
        "cpu": scaled_column([r.cpu_time_s for r in rows]),
        "src_self": [], "src_tot": [],
    }
    if len(sources) > 1:
        table["src_self"] = [scaled_column([r.self_energy_j.get(s, 0.0) for r in rows]) for s in sources]
        table["src_tot"] = [scaled_column([r.energy_j.get(s, 0.0) for r in rows]) for s in sources]
    return table


def scaled_column(values: list[float], digits: int = 3) -> dict[str, Any]:
    """Values as `v * 10**exp` with `digits` significant digits, exp putting the median near 100.

    Around the median the numbers then print as short integers ("523", not "0.00523"); the table
    shows three significant digits, so nothing visible is lost.
    """
    nonzero = sorted(abs(v) for v in values if v)
    exp = math.floor(math.log10(nonzero[len(nonzero) // 2])) - (digits - 1) if nonzero else 0
    scale = 10.0 ** -exp
    return {"exp": exp, "v": [_compact(v * scale, digits) for v in values]}


def _compact(x: float, digits: int) -> float | int:
    if not x:
        return 0
    r = float(f"{x:.{digits}g}")
    return int(r) if r.is_integer() and abs(r) < 2**53 else r
