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
from ..analysis.own import home_groups
from ..analysis.report import ReportModel
from ..facts.profile import CHILDREN_NODE
from ..facts.profile import IDLE_NODE
from ..facts.profile import SELF_NODE
from ..facts.profile import SPECIAL_NODES
from ..facts.profile import Source
from .format import format_spec

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
        "timeline": packed_timeline(timeline_figure(model)),
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

    Nothing is sent twice: a label that is its table row's function name is "", colours and the
    sources' split are indices into short lists, and the page builds each tooltip from these
    arrays and the table (`hover` in report.js); only what it cannot derive travels in `head`.
    """
    colours = dict(zip((s.id for s in model.sources), source_colours(model.sources)))
    out: dict[str, Any] = {k: [] for k in ("parents", "labels", "value_e", "value_t", "colour_file",
                                           "colour_mix", "kind", "group", "row", "self_e", "samples", "split")}
    head: dict[str, list[str]] = {}  # box -> its tooltip's first lines, where the table does not give them
    through_of: dict[str, str] = {}  # box -> the wrappers that share it, " › "-joined and escaped
    folded: dict[str, int] = {}  # box -> how many smaller call paths it stands for
    palette: dict[str, int] = {}
    splits: dict[str, int] = {}
    self_e: list[float] = []
    row_of = {(r.function, r.file, r.line): i for i, r in enumerate(model.rows)}
    boxes, index = chart_boxes(root)
    for i, (n, parent, through) in enumerate(boxes):
        out["parents"].append(parent)
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
        row = -1 if n.folded or n.kind == "group" else row_of.get((n.function, n.file, n.line), -1)
        key = str(i)
        own_label = _escape(label)
        out["labels"].append("" if row >= 0 and own_label == _escape(model.rows[row].function) else own_label)
        if n.folded:  # the page writes "other: N smaller call paths"
            lines = derived = []
        elif n.kind == "group":  # the page names it by its label, which may be cut short
            click = ["click to show its frames"] if n.children else []
            lines, derived = [_escape(n.function)] + click, [own_label] + click
        else:
            lines, derived = _hover_head(n), (_hover_head(model.rows[row]) if row >= 0 else None)
        if lines != derived:
            head[key] = lines
        if n.folded:
            folded[key] = n.folded
        if through:
            through_of[key] = " \u203a ".join(_escape(w.function) for w in through)
        out["value_e"].append(n.value_e)
        out["value_t"].append(n.value_t)
        out["colour_file"].append(palette.setdefault(_file_colour(n), len(palette)))
        out["colour_mix"].append(palette.setdefault(_mix_colour(n, colours), len(palette)))
        out["kind"].append(KIND_CODES.get(n.kind, 0))
        out["group"].append(index.get(id(n.group), -1) if n.group is not None else -1)
        out["row"].append(row)
        self_e.append(sum(n.self_e.values()))
        out["samples"].append(n.samples)
        split = _split(n)
        out["split"].append(splits.setdefault(split, len(splits)) if split else -1)
    out["self_e"] = scaled_column(self_e)
    # Six digits, as integers: the page lifts a parent that rounding left below its children's sum (plotly
    # draws nothing then), and a box's sampling error (1/sqrt(samples)) is never finer than that.
    out["value_e"] = scaled_column(out["value_e"], 6)
    out["value_t"] = scaled_column(out["value_t"], 6)
    out.update(palette=list(palette), splits=list(splits), head=head, through=through_of, folded=folded)
    return out


def chart_boxes(root: ChartNode) -> tuple[list[tuple[ChartNode, int, list[ChartNode]]], dict[int, int]]:
    """The chart's boxes in pre-order: (node, parent box, the wrappers that share the node's box), and each
    node's box by id(node). A wrapper that only calls one function (`<module>` -> main) shares its box with it."""
    boxes: list[tuple[ChartNode, int, list[ChartNode]]] = []
    index: dict[int, int] = {}
    stack: list[tuple[ChartNode, int]] = [(root, -1)]
    while stack:
        n, parent = stack.pop()
        i = index[id(n)] = len(boxes)
        chain = [n]
        while parent >= 0 and _wraps(chain[-1]):
            chain.append(chain[-1].children[0])
            index[id(chain[-1])] = i
        boxes.append((chain[-1], parent, chain[:-1]))
        stack.extend((c, i) for c in reversed(chain[-1].children))
    return boxes, index


def _hover_head(n: Any) -> list[str]:
    """A tooltip's first lines for a function (a chart node or a table row): its name, and file:line when it has one."""
    return [_escape(n.function)] + ([_escape(f"{n.file}:{n.line}")] if n.file else [])


def _split(n: ChartNode) -> str:
    """How a box's energy divides between the sources ("cpu 87%, ram 13%"), or "" for one source."""
    if len(n.energy) > 1 and n.value_e > 0:
        return ", ".join(f"{_escape(k)} {v / n.value_e * 100:.0f}%" for k, v in n.energy.items())
    return ""


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
    gpu = model.profile.gpu_kernels
    for d, dev in sorted(gpu.devices.items() if gpu is not None else ()):
        lane = dev.busy_lane
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
    from ..analysis.kinds import is_cache_fact  # a tracked loop's page-cache readings: no span to shade

    windows = sorted((w for w in model.profile.windows if not is_cache_fact(w)), key=lambda w: (w.depth, w.start_s))
    for i, w in enumerate(windows[:MAX_WINDOW_SHADES]):
        layout["shapes"].append({"type": "rect", "xref": "x", "yref": "paper", "x0": _round(w.start_s, 6),
                                 "x1": _round(w.end_s, 6), "y0": 0, "y1": 1, "line": {"width": 0},
                                 "fillcolor": palette[i % 2], "layer": "below"})
        if w.depth == 0 and len(windows) <= 40:
            layout["annotations"].append({"x": _round(w.start_s, 6), "y": 1, "xref": "x", "yref": "paper",
                                          "text": _escape(w.name),
                                          "showarrow": False, "xanchor": "left", "yanchor": "top",
                                          "font": {"size": 10, "color": "#555"}})


def function_spans(model: ReportModel) -> dict[str, Any]:
    """When each function table row's function was on a stack, as `packed_spans`.

    From the timeline's per-bucket record of the stacks that ran (the heaviest few per bucket),
    adjacent buckets merged; the timeline draws them when a table row is clicked.
    """
    tl = model.profile.timeline
    functions, active, starts, ends = tl.functions, tl.active, tl.start_s, tl.end_s
    if not functions or not active:
        return packed_spans({})
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
    return packed_spans(spans)


def packed_spans(spans: dict[int, list[list[float]]]) -> dict[str, Any]:
    """Spans as small integers: every start and end once in `edges` (sorted); a row's spans as the steps between
    consecutive edge indices (start - previous end, end - start, ...), which the page adds back up; and each
    list of steps once in `lists` (a function and the callers it always ran under share one), `rows` naming it."""
    edges = sorted({x for lst in spans.values() for span in lst for x in span})
    at = {x: k for k, x in enumerate(edges)}
    lists: dict[tuple[int, ...], int] = {}
    rows: dict[str, int] = {}
    for row, lst in spans.items():
        steps, last = [], 0
        for a, b in lst:
            steps += [at[a] - last, at[b] - at[a]]
            last = at[b]
        rows[str(row)] = lists.setdefault(tuple(steps), len(lists))
    return {"edges": edges, "lists": [list(steps) for steps in lists], "rows": rows}


def packed_timeline(fig: dict[str, Any] | None) -> dict[str, Any] | None:
    """The timeline figure without repeats, for the page: traces on the same time axis share one `x`
    (in `xs`, a trace's `x` its index there), and shapes and annotations are `packed_dicts`."""
    if fig is None:
        return None
    xs: list[list[float]] = []
    data = []
    for trace in fig["data"]:
        trace = dict(trace)
        if "x" in trace:
            x = trace["x"]
            trace["x"] = next((k for k, seen in enumerate(xs) if seen == x), len(xs))
            if trace["x"] == len(xs):
                xs.append(x)
        data.append(trace)
    layout = dict(fig["layout"])
    for key in ("shapes", "annotations"):
        if key in layout:
            layout[key] = packed_dicts(layout[key])
    return {"data": data, "layout": layout, "xs": xs}


def packed_dicts(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Dicts that mostly agree (200 window shades): what all share once in `common`, the rest as one row of
    values per dict under `keys`, and a string key with few values (the shades' two colours) as an index into
    `choices`; the page rebuilds each dict as common plus its row."""
    keys = sorted({k for d in items for k in d})
    common = {k: items[0][k] for k in keys if all(k in d and d[k] == items[0][k] for d in items)} if items else {}
    varying = [k for k in keys if k not in common]
    if any(k not in d for d in items for k in varying):  # a key some lack: not packable as rows
        return {"common": {}, "keys": [], "rows": [], "choices": {}, "whole": items}
    choices: dict[str, list[str]] = {}
    for k in varying:
        values = list(dict.fromkeys(d[k] for d in items))
        if all(isinstance(v, str) for v in values) and len(values) <= 16:
            choices[k] = values
    index = {k: {v: j for j, v in enumerate(vs)} for k, vs in choices.items()}
    rows = [[index[k][d[k]] if k in index else d[k] for k in varying] for d in items]
    return {"common": common, "keys": varying, "rows": rows, "choices": choices}


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
    home = home_groups(model.groups)

    def pct(joules: float) -> float:
        share = model.share(joules)
        return round(share * 100, 4) if share is not None else 0.0

    table: dict[str, Any] = {
        "fn": [r.function for r in rows],
        "file": [files[r.file] for r in rows],
        "line": [r.line for r in rows],
        **_file_names(list(files), short),
        "special": [special.get(r.function, 0) for r in rows],
        "own": [1 if id(r) in own else 0 for r in rows],  # the user's functions, which the table opens on
        # every other function folded under the library or import it spent the most self energy in (`groups`)
        "group": [-1 if id(r) in own else home.get((r.function, r.file, r.line), -1) for r in rows],
        "groups": {"label": [g.label for g in model.groups], "e": [_round(g.total, 3) for g in model.groups],
                   "p": [pct(g.total) for g in model.groups], "count": [g.count for g in model.groups],
                   "samples": [g.self_samples for g in model.groups]},
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
    if model.backward_split:  # each row's forward and backward (ReportModel.row_phases), and backward's samples
        split = [model.row_phases(r) or (0.0, 0.0) for r in rows]
        table["fwd_e"] = scaled_column([f for f, _ in split])
        table["bwd_e"] = scaled_column([b for _, b in split])
        table["bwd_n"] = [r.backward_samples for r in rows]
    if len(sources) > 1:
        table["src_self"] = [scaled_column([r.self_energy_j.get(s, 0.0) for r in rows]) for s in sources]
        table["src_tot"] = [scaled_column([r.energy_j.get(s, 0.0) for r in rows]) for s in sources]
    return table


def _file_names(files: list[str], short) -> dict[str, Any]:
    """Each file once, as the table shows it (`short`) and whole (the tooltip): the whole path is a folder
    from `dirs` (shared by hundreds of installed files) followed by the short name; a path that does not
    end with its short name (a Windows path) goes whole in `full`."""
    dirs: dict[str, int] = {}
    shorts, where, full = [], [], {}
    for k, f in enumerate(files):
        s = short(f) if f else ""
        shorts.append(s)
        if f.endswith(s):
            where.append(dirs.setdefault(f[:len(f) - len(s)], len(dirs)))
        else:
            where.append(-1)
            full[str(k)] = f
    return {"short": shorts, "dir": where, "dirs": list(dirs), "full": full}


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
