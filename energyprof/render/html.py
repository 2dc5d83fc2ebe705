"""The HTML report: one self-contained file that opens with the network off.

The page is static HTML from a jinja2 template (cards and methodology print without scripts) plus
plotly.js inlined once, and every piece of data the scripts need travels as JSON in
`<script type="application/json">` blocks with `<`, `>` and `&` escaped, so a function called
`</script>` stays text. Everything here is a pure function of the `Profile`: the same saved profile
gives byte-for-byte the same page, whether written by the live run or by `energyprof report`.
"""

from __future__ import annotations

import functools
import gc
import html
import json
import math
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..profile import CHILDREN_NODE, IDLE_NODE, SELF_NODE, SPECIAL_NODES, Node, Profile, write_atomic
from ..processors import MIN_UPDATES, window_groups
from .exports import function_rows
from .format import fmt_bytes, fmt_energy, fmt_seconds

# The icicle builds one SVG element per node (~2.7 s for 5k nodes in headless Chromium), so the chart
# keeps the largest call paths and folds the rest into "other" nodes; the table keeps everything.
MAX_CHART_NODES = 1500
MAX_TIMELINE_POINTS = 3000
MAX_WINDOW_SHADES = 200
MAX_WINDOW_ROWS = 200
LABEL_CHARS = 60

_LIBRARY_RE = re.compile(
    r"(site-packages|dist-packages)[/\\]"          # installed packages
    r"|[/\\]lib[/\\]python\d+(\.\d+)?t?[/\\]"      # a POSIX standard library
    r"|[/\\]Lib[/\\]"                              # a Windows standard library
    r"|^<frozen "                                  # frozen stdlib modules
)

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

IDLE_POLICIES = {
    "share": "The program is charged its share of each source: its CPU time over the machine's busy CPU "
             "time for CPU and DRAM, its share of the device for a GPU. The rest of what the sensors "
             "measured goes to the node [other processes and idle].",
    "all": "The program is charged everything the sensors measured while it ran, as on a dedicated "
           "machine (\u201cwhat did my job cost\u201d); nothing goes to other processes or idle.",
}


# ---------------------------------------------------------------- entry points


def template_dir() -> Path:
    """Templates ship inside the wheel as energyprof/templates; a source checkout has them at the top."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / "report.html.j2").is_file():
            return candidate
    raise FileNotFoundError("energyprof's report templates are missing from this installation")


def render_html(profile: Profile) -> str:
    """The whole page as one string (plotly.js, styles, scripts and data inlined)."""
    # A 50,000-function profile makes a few hundred thousand small objects that live until the
    # page is written; the cyclic GC rescanning them cost a third of the build time.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _render(profile)
    finally:
        if enabled:
            gc.enable()


def _render(profile: Profile) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_dir())),
                             autoescape=True, undefined=jinja2.ChainableUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["energy"] = fmt_energy
    env.filters["seconds"] = fmt_seconds
    env.filters["bytes"] = fmt_bytes
    data = report_data(profile)
    return env.get_template("report.html.j2").render(
        profile=profile,
        meta=profile.meta,
        started=str(profile.meta.get("started_at") or "")[:19].replace("T", " "),
        cards=summary_cards(profile),
        method=methodology(profile),
        has_timeline=data["timeline"] is not None,
        window_groups=window_groups(profile),
        window_rows=sorted(profile.windows, key=lambda w: w.get("start_s", 0.0))[:MAX_WINDOW_ROWS],
        report_json=json_for_script(data),
        plotly_js=_plotly_js(),
        app_js=_inline_script((template_dir() / "report.js").read_text(encoding="utf-8")),
        styles=(template_dir() / "report.css").read_text(encoding="utf-8"),
    )


def write_html(profile: Profile, path: str) -> None:
    write_atomic(Path(path), render_html(profile))


def json_for_script(data: Any) -> str:
    """JSON safe inside <script type="application/json">: no '<', '>' or '&' survive."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _inline_script(code: str) -> str:
    """An inline script ends at the first "</script", wherever it is (even in a comment)."""
    return re.sub(r"</(script)", r"<\\/\1", code, flags=re.IGNORECASE)


@functools.lru_cache(maxsize=1)
def _plotly_js() -> str:
    """plotly.js built with only the traces the report draws (scripts/build-plotly-bundle.sh; the
    version and build are in plotly-custom.json beside it), read once per process."""
    return _inline_script((template_dir() / "plotly-custom.min.js").read_text(encoding="utf-8"))


def report_data(profile: Profile) -> dict[str, Any]:
    """Everything the page's scripts read: the charts and the function table."""
    return {
        "sources": [{"id": s["id"], "method": s.get("method", ""), "colour": c}
                    for s, c in zip(profile.sources, source_colours(profile))],
        "total_j": profile.total_energy_j,
        "chart": {"full": icicle_trace(profile, collapse_libraries=False),
                  "collapsed": icicle_trace(profile, collapse_libraries=True)
                  if _has_library_frames(profile) else None},
        "timeline": timeline_figure(profile),
        "table": function_table(profile),
        "spans": function_spans(profile),
        "resolution_s": resolution_s(profile),
    }


def resolution_s(profile: Profile) -> float | None:
    """Below this much time a function's energy is finer than the slowest sensor updates
    (MIN_UPDATES x its update period, e.g. 0.3 s for a GPU refreshing every 100 ms)."""
    periods = [s["update_period_s"] for s in profile.sources if s.get("update_period_s")]
    return MIN_UPDATES * max(periods) if periods else None


def function_spans(profile: Profile) -> dict[str, list[list[float]]]:
    """{function table row: [[start_s, end_s], ...]}: when the function was on a stack.

    From the timeline's per-bucket record of the stacks that ran (the heaviest few per bucket),
    adjacent buckets merged; the timeline draws them when a table row is clicked.
    """
    tl = profile.timeline or {}
    functions, active = tl.get("functions") or [], tl.get("active") or []
    starts, ends = tl.get("start_s") or [], tl.get("end_s") or []
    if not functions or not active:
        return {}
    row_of = {(r.function, r.file, r.line): i for i, r in enumerate(function_rows(profile))}
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


# ---------------------------------------------------------------- formatting


def _round(x: float, digits: int = 4) -> float:
    """Fewer digits for the table and timeline keep a 50,000-function report under 8 MB."""
    return float(f"{x:.{digits}g}") if x else 0.0


# ---------------------------------------------------------------- summary cards


@dataclass
class Card:
    """One summary figure; `lines` are (text, tag) pairs shown under it, tag '' or a method."""

    title: str
    value: str
    lines: list[tuple[str, str]] = field(default_factory=list)
    kind: str = ""


def summary_cards(profile: Profile) -> list[Card]:
    """The first screen: energy by source with its method, where it went, time, power, then extras."""
    t = profile.totals
    total = profile.total_energy_j
    duration = float(t.get("duration_s") or profile.meta.get("duration_s") or 0.0)
    cards = [Card("Total energy", fmt_energy(total),
                  [(f"{total / 3600:.4g} Wh", "")] + [
                      (f"{s['id']}: {fmt_energy(t.get('energy_j', {}).get(s['id'], 0.0))}"
                       f" ({s.get('sensor', '?')})", s.get("method", "")) for s in profile.sources],
                  "energy")]
    attributed = sum(t.get("attributed_j", {}).values())
    idle = sum(t.get("idle_j", {}).values())
    own = sum(t.get("energyprof_j", {}).values())
    cards.append(Card("Charged to program", fmt_energy(attributed), [
        (f"{_pct(attributed, total)} of the total", ""),
        (f"other processes and idle: {fmt_energy(idle)} ({_pct(idle, total)})", ""),
        (f"energyprof itself: {fmt_energy(own)} ({_pct(own, total)})", ""),
        (f"idle policy: {profile.meta.get('idle_policy', '?')}", ""),
    ], "attributed"))
    cards.append(Card("Duration", fmt_seconds(duration), [
        (f"CPU time: {fmt_seconds(t.get('cpu_time_s'))}", ""),
        (f"energyprof's own CPU: {fmt_seconds(t.get('energyprof_cpu_time_s'))}", ""),
    ], "duration"))
    peak = peak_power_w(profile)
    cards.append(Card("Average power", f"{total / duration:.3g} W" if duration > 0 else "\u2013",
                      [(f"peak: {peak:.3g} W" if peak is not None else "peak: \u2013", "")], "power"))
    carbon = _carbon_card(profile)
    if carbon:
        cards.append(carbon)
    memory = _memory_card(profile)
    if memory:
        cards.append(memory)
    return cards


def _pct(part: float, whole: float) -> str:
    return f"{part / whole * 100:.1f}%" if whole else "\u2013"


def peak_power_w(profile: Profile) -> float | None:
    """The highest total power over the timeline's intervals (all sources stacked)."""
    power = profile.timeline.get("power_w") or {}
    series = [v for v in power.values() if v]
    if not series:
        return None
    n = min(len(v) for v in series)
    return max((sum(v[i] for v in series) for i in range(n)), default=None)


def _carbon_card(profile: Profile) -> Card | None:
    grams = profile.totals.get("carbon_g")
    if grams is None:
        return None
    c = profile.carbon or {}
    lines = []
    if c.get("intensity_g_per_kwh") is not None:
        lines.append((f"at {c['intensity_g_per_kwh']:.4g} gCO\u2082eq/kWh", ""))
    where = " ".join(str(x) for x in (c.get("country"), c.get("region")) if x)
    if c.get("source") or where:
        lines.append((f"{c.get('source', '')} {where}".strip(), ""))
    if c.get("pue") is not None:
        lines.append((f"PUE {c['pue']:g}", ""))
    cost = profile.totals.get("cost")
    if cost is not None:
        currency = c.get("currency") or profile.totals.get("currency") or ""
        lines.append((f"cost: {cost:.4g} {currency}".strip(), ""))
    value = f"{grams:.3g} g" if grams >= 1 or grams == 0 else f"{grams * 1000:.3g} mg"
    return Card("Carbon", value + " CO\u2082eq", lines, "carbon")


def _memory_card(profile: Profile) -> Card | None:
    t = profile.totals
    rss = profile.timeline.get("rss_bytes") or []
    peak = t.get("peak_rss_bytes") or (max(rss) if rss else None)
    if peak is None:
        return None
    lines = []
    base = t.get("baseline_rss_bytes") or (rss[0] if rss else None)
    if base is not None:
        lines.append((f"at start: {fmt_bytes(base)}", ""))
        lines.append((f"growth: {fmt_bytes(peak - base)}", ""))
    return Card("Peak memory (RSS)", fmt_bytes(peak), lines, "memory")


# ---------------------------------------------------------------- methodology


def methodology(profile: Profile) -> dict[str, Any]:
    """The facts a reader needs to trust (or distrust) the figures, in plain words."""
    meta = profile.meta
    policy = meta.get("idle_policy", "")
    estimated = [s for s in profile.sources if s.get("method") == "estimated"]
    gpu = [s for s in profile.sources if str(s.get("component", "")).startswith("gpu")]
    command = meta.get("command") or " ".join(str(a) for a in meta.get("argv", []))
    return {
        "sources": [{**s, "detail_text": _detail_text(s.get("detail"))} for s in profile.sources],
        "sensor_notes": list(meta.get("sensor_notes") or []),
        "policy": policy,
        "policy_text": IDLE_POLICIES.get(policy, "unknown policy"),
        "estimated": estimated,
        "has_gpu": bool(gpu),
        "command": command,
        "child_processes": list(profile.extra.get("child_processes") or []),
        "notes": [n.get("message", str(n)) if isinstance(n, dict) else str(n) for n in profile.notes],
        "host": meta.get("host") or {},
        "exit": meta.get("exit") or {},
    }


def _detail_text(detail: Any) -> str:
    if not detail:
        return ""
    if isinstance(detail, dict):
        return ", ".join(f"{k}: {v}" for k, v in detail.items())
    return str(detail)


def source_colours(profile: Profile) -> list[str]:
    """A stable colour per source: by component where known, then a fixed list."""
    out, extra = [], 0
    for s in profile.sources:
        comp = str(s.get("component", s["id"])).split(":")[0]
        colour = SOURCE_COLOURS.get(comp)
        if colour is None or colour in out:
            colour = EXTRA_SOURCE_COLOURS[extra % len(EXTRA_SOURCE_COLOURS)]
            extra += 1
        out.append(colour)
    return out


# ---------------------------------------------------------------- the icicle


@functools.lru_cache(maxsize=65536)
def is_library(file: str) -> bool:
    """site-packages and standard-library frames, judged from the path alone (the report may be
    rendered on another machine than the one that ran the program)."""
    return bool(file) and bool(_LIBRARY_RE.search(file))


@dataclass(slots=True)
class ChartNode:
    """A node of the chart's tree: own (self) figures, children, and values filled in bottom-up."""

    function: str
    file: str
    line: int
    self_e: dict[str, float]
    self_t: float
    samples: int
    children: list[ChartNode] = field(default_factory=list)
    energy: dict[str, float] = field(default_factory=dict)
    value_e: float = 0.0
    value_t: float = 0.0
    folded: int = 0  # >0 for an "other" node: how many call paths it stands for


def chart_tree(profile: Profile, collapse_libraries: bool) -> ChartNode:
    """The profile's tree as ChartNodes; library frames optionally merged into their caller.

    Collapsing works as pyinstrument's "hide library frames": a library frame's own energy and time
    go to the nearest non-library caller, and the user code it calls back appears under that caller
    (merged with a sibling of the same function, file and line).
    """
    root = _chart_node(profile.root)
    todo: list[tuple[Node, ChartNode]] = [(profile.root, root)]
    while todo:
        node, target = todo.pop()
        index = {(c.function, c.file, c.line): c for c in target.children}
        pending = list(reversed(node.children))  # a stack: popping from the end keeps call order
        while pending:
            child = pending.pop()
            if collapse_libraries and is_library(child.file):
                _add_self(target, child)
                pending.extend(reversed(child.children))
                continue
            key = (child.function, child.file, child.line)
            existing = index.get(key)
            if existing is None:
                existing = index[key] = _chart_node(child)
                target.children.append(existing)
            else:
                _add_self(existing, child)
                existing.samples += child.samples
            todo.append((child, existing))
    _fill_values(root)
    return root


def _chart_node(node: Node) -> ChartNode:
    return ChartNode(node.function, node.file, node.line,
                     {k: max(v, 0.0) for k, v in node.self_energy_j.items()},
                     max(node.self_time_s, 0.0), node.samples)


def _add_self(target: ChartNode, node: Node) -> None:
    for k, v in node.self_energy_j.items():
        target.self_e[k] = target.self_e.get(k, 0.0) + max(v, 0.0)
    target.self_t += max(node.self_time_s, 0.0)


def _fill_values(root: ChartNode) -> None:
    """Values = self + children, bottom-up: plotly's branchvalues "total" draws nothing when a
    parent is below the sum of its children, which rounding in the profile could cause."""
    for n in reversed(_preorder(root)):
        n.energy = dict(n.self_e)
        n.value_t = n.self_t
        for c in n.children:
            for k, v in c.energy.items():
                n.energy[k] = n.energy.get(k, 0.0) + v
            n.value_t += c.value_t
        n.value_e = sum(n.energy.values())


def prune(root: ChartNode, limit: int = MAX_CHART_NODES) -> ChartNode:
    """Keep the `limit` largest call paths (by the larger of energy and time share); fold each
    node's dropped children into one "other" child so the values still add up."""
    total_e = root.value_e or 1.0
    total_t = root.value_t or 1.0
    everything = _preorder(root)
    if len(everything) <= limit:
        return root

    def weight(n: ChartNode) -> float:
        return max(n.value_e / total_e, n.value_t / total_t)

    threshold = sorted((weight(n) for n in everything), reverse=True)[limit - 1]
    stack = [root]
    while stack:
        n = stack.pop()
        keep = [c for c in n.children if weight(c) > threshold]
        drop = [c for c in n.children if weight(c) <= threshold]
        if drop:
            other = ChartNode("other", "", 0, {}, 0.0, sum(c.samples for c in drop))
            other.folded = sum(_count(c) for c in drop)
            for c in drop:
                for k, v in c.energy.items():
                    other.self_e[k] = other.self_e.get(k, 0.0) + v
                other.self_t += c.value_t
            keep.append(other)
        n.children = keep
        stack.extend(c for c in keep if not c.folded)
    _fill_values(root)
    return root


def _preorder(root: ChartNode) -> list[ChartNode]:
    """Every node, parents before children, without recursion (trees can be very deep)."""
    out, stack = [], [root]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children)
    return out


def _count(n: ChartNode) -> int:
    return len(_preorder(n))


def _has_library_frames(profile: Profile) -> bool:
    return any(is_library(n.file) for n, _ in profile.nodes())


def icicle_trace(profile: Profile, collapse_libraries: bool) -> dict[str, Any]:
    """The pruned tree as parallel arrays for a plotly icicle, with both metrics and both colourings.

    Labels and hover texts are HTML-escaped because plotly reads a subset of HTML in them.
    """
    root = prune(chart_tree(profile, collapse_libraries))
    colours = dict(zip((s["id"] for s in profile.sources), source_colours(profile)))
    out: dict[str, list] = {k: [] for k in ("ids", "parents", "labels", "names", "hovertext", "value_e",
                                            "value_t", "colour_file", "colour_mix")}
    total_e = root.value_e or 1.0
    total_t = root.value_t or 1.0
    stack: list[tuple[ChartNode, str]] = [(root, "")]
    while stack:
        n, parent = stack.pop()
        nid = f"n{len(out['ids'])}"
        out["ids"].append(nid)
        out["parents"].append(parent)
        label = n.function if len(n.function) <= LABEL_CHARS else n.function[:LABEL_CHARS - 1] + "\u2026"
        out["labels"].append(html.escape(label, quote=False))
        out["names"].append(n.function if n.function in SPECIAL_NODES else "")  # for the page's idle switch
        out["hovertext"].append(_hover(n, total_e, total_t))
        out["value_e"].append(n.value_e)
        out["value_t"].append(n.value_t)
        out["colour_file"].append(_file_colour(n))
        out["colour_mix"].append(_mix_colour(n, colours))
        stack.extend((c, nid) for c in reversed(n.children))
    return out


def _hover(n: ChartNode, total_e: float, total_t: float) -> str:
    esc = functools.partial(html.escape, quote=False)
    if n.folded:
        head = [f"other: {n.folded} smaller call paths"]
    else:
        head = [esc(n.function)] + ([esc(f"{n.file}:{n.line}")] if n.file else [])
    parts = head + [
        f"energy {fmt_energy(n.value_e)} ({_pct(n.value_e, total_e)}), self {fmt_energy(sum(n.self_e.values()))}",
        f"time {fmt_seconds(n.value_t)} ({_pct(n.value_t, total_t)}), samples {n.samples}"
        + (f" \u00b1{100 / math.sqrt(n.samples):.0f}%" if n.samples else ""),
    ]
    if len(n.energy) > 1 and n.value_e > 0:
        parts.append(", ".join(f"{esc(k)} {v / n.value_e * 100:.0f}%" for k, v in n.energy.items()))
    return "<br>".join(parts)


def _file_colour(n: ChartNode) -> str:
    if n.function in SPECIAL_COLOURS:
        return SPECIAL_COLOURS[n.function]
    if n.folded:
        return OTHER_COLOUR
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


# ---------------------------------------------------------------- the timeline


def timeline_figure(profile: Profile) -> dict[str, Any] | None:
    """Stacked power per source as steps, an RSS lane when recorded, windows shaded."""
    tl = profile.timeline or {}
    starts, ends = tl.get("start_s") or [], tl.get("end_s") or []
    power = tl.get("power_w") or {}
    n = min([len(starts), len(ends)] + [len(v) for v in power.values()]) if power else 0
    if n == 0:
        return None
    buckets = _buckets(starts[:n], ends[:n])
    xs = [starts[a] for a, _ in buckets] + [ends[buckets[-1][1] - 1]]
    colours = dict(zip((s["id"] for s in profile.sources), source_colours(profile)))
    data: list[dict[str, Any]] = []
    for sid, series in power.items():
        ys = [_round(_mean_power(series, starts, ends, a, b)) for a, b in buckets]
        data.append({"type": "scatter", "mode": "lines", "name": f"{sid} (W)", "x": [_round(x, 6) for x in xs],
                     "y": ys + ys[-1:], "stackgroup": "power", "line": {"shape": "hv", "width": 0.5,
                     "color": colours.get(sid, "#999999")},
                     "hovertemplate": "%{y:.3g} W<extra>" + html.escape(sid, quote=False) + "</extra>"})
    layout: dict[str, Any] = {
        "margin": {"l": 55, "r": 20, "t": 10, "b": 40}, "height": 300, "hovermode": "x unified",
        "xaxis": {"title": {"text": "time (s)"}, "zeroline": False},
        "yaxis": {"title": {"text": "power (W)"}, "rangemode": "tozero"},
        "legend": {"orientation": "h", "y": 1.12, "x": 0}, "shapes": [], "annotations": [],
    }
    rss = tl.get("rss_bytes") or []
    if len(rss) >= n:
        ys = [_round(max(rss[a:b]) / 2**20) for a, b in buckets]
        data.append({"type": "scatter", "mode": "lines", "name": "RSS (MiB)", "x": [_round(x, 6) for x in xs],
                     "y": ys + ys[-1:], "yaxis": "y2", "line": {"shape": "hv", "color": "#555"},
                     "hovertemplate": "%{y:.4g} MiB<extra>RSS</extra>"})
        layout["yaxis"]["domain"] = [0.32, 1.0]
        layout["yaxis2"] = {"domain": [0.0, 0.22], "title": {"text": "RSS (MiB)"}, "rangemode": "tozero"}
        layout["height"] = 380
    _shade_windows(profile, layout)
    return {"data": data, "layout": layout}


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


def _shade_windows(profile: Profile, layout: dict[str, Any]) -> None:
    palette = ["rgba(78,121,167,0.12)", "rgba(242,142,43,0.12)"]
    windows = sorted(profile.windows, key=lambda w: (w.get("depth", 0), w.get("start_s", 0)))
    for i, w in enumerate(windows[:MAX_WINDOW_SHADES]):
        if w.get("start_s") is None or w.get("end_s") is None:
            continue
        layout["shapes"].append({"type": "rect", "xref": "x", "yref": "paper", "x0": w["start_s"],
                                 "x1": w["end_s"], "y0": 0, "y1": 1, "line": {"width": 0},
                                 "fillcolor": palette[i % 2], "layer": "below"})
        if w.get("depth", 0) == 0 and len(windows) <= 40:
            layout["annotations"].append({"x": w["start_s"], "y": 1, "xref": "x", "yref": "paper",
                                          "text": html.escape(str(w.get("name", "")), quote=False),
                                          "showarrow": False, "xanchor": "left", "yanchor": "top",
                                          "font": {"size": 10, "color": "#555"}})


# ---------------------------------------------------------------- the table


def function_table(profile: Profile) -> dict[str, Any]:
    """Every function as columns (compact for 50,000 rows); files are interned once.

    Numeric columns are scaled (see `scaled_column`) because a 50,000-function table is most of
    the page once plotly.js is in it, and the page must stay under 8 MB.
    """
    rows = function_rows(profile)
    sources = [s["id"] for s in profile.sources]
    files: dict[str, int] = {}
    for r in rows:
        files.setdefault(r.file, len(files))
    table: dict[str, Any] = {
        "fn": [r.function for r in rows],
        "file": [files[r.file] for r in rows],
        "line": [r.line for r in rows],
        "files": list(files),
        "self_n": [r.self_samples for r in rows],
        "n": [r.samples for r in rows],
        "self_e": scaled_column([r.self_total_energy for r in rows]),
        "tot_e": scaled_column([r.total_energy for r in rows]),
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


__all__ = ["render_html", "write_html", "template_dir", "report_data", "summary_cards", "chart_tree",
           "prune", "icicle_trace", "timeline_figure", "function_table", "is_library", "json_for_script",
           "SPECIAL_NODES"]
