"""A comparison of runs as text (the console), markdown (a pull-request comment) and one HTML page.

The page reuses the report's stylesheet and its inlined plotly.js, and carries its figures as
JSON in `<script type="application/json">` blocks, so it opens with the network off and a
function called `</script>` stays text.
"""

from __future__ import annotations

import html
import statistics
from typing import Any

from .units import compare_lines as unit_compare_lines
from ..analysis.compare import CAPACITY_SHARE, INCONCLUSIVE, Change, Comparison, FunctionChange, Run, Verdict, side_means
from ..analysis.own import short_path
from ..analysis.pareto import front as pareto_front
from ..store.files import write_text
from ..facts.profile import SPECIAL_NODES
from .charts import pareto_figure
from .format import fmt_energy, fmt_seconds

MAX_ROWS_TEXT = 15
MAX_ROWS_HTML = 500
_FRONT = ' <span class="tag measured">Pareto front</span>'
_SIG = ' class="sig"'


def _pct(p: float | None) -> str:
    return "new" if p is None else f"{p:+.1f}%"


def _change_pct(c: Change) -> str:
    return "" if not c.before and not c.after else _pct(c.pct)


def _change_text(c: Change, fmt: Any = fmt_energy) -> str:
    mark = " *" if c.significant else ""
    pct = _change_pct(c)
    sign = "+" if c.delta >= 0 else "-"
    return f"{fmt(c.before)} -> {fmt(c.after)} ({sign}{fmt(abs(c.delta))}{', ' + pct if pct else ''}){mark}"


def _method(run: Any) -> str:
    return "estimated" if run.estimated else "measured"


def _figure_text(v: Verdict) -> str:
    """The gate's figure with its interval, or why one run per side cannot give one."""
    if v.pct is None:
        return f"{v.what}: appeared ({fmt_energy(v.base)} -> {fmt_energy(v.head)})"
    conf = f"{v.interval.confidence * 100:g}%"
    if v.repeats:
        n_base, n_head = v.interval.n
        return (f"{v.what} {v.pct:+.1f}% ({conf} interval {v.low_pct:+.1f}% to {v.high_pct:+.1f}%,"
                f" Welch's t over {n_base} and {n_head} runs; the smallest change these repeats can detect:"
                f" \u00b1{v.hidden_pct:.1f}%)")
    runs = "one run per side" if v.interval.n == (1, 1) else "a side with one run"
    if not v.sampled:
        return (f"{v.what} {v.pct:+.1f}% ({runs}: the verdict cannot separate run-to-run noise, so it takes the"
                f" change as measured; the smallest change it can detect is unknown; repeat each side, interleaved,"
                f" with --base/--head)")
    return (f"{v.what} {v.pct:+.1f}% ({runs}: the verdict cannot separate run-to-run noise; the sampling"
            f" error alone hides changes within \u00b1{v.hidden_pct:.1f}% at {conf}; repeat each side with --base/--head)")


def verdict_text(v: Verdict) -> str:
    """The gate's figure with its interval, what it is, and the sides' loads when they differ."""
    text = _figure_text(v)
    if v.what == CAPACITY_SHARE:
        text += ("; that is the machine's CPU energy, idle included, times the program's CPU time over the run's"
                 " span x CPUs: no neighbour moves it under constant power")
    if v.load is not None:
        reach = v.load.reach_pct
        text += (f"; the machine's load differed: other processes used {_share(v.load.base_others)} of its CPU in"
                 f" the base's runs and {_share(v.load.head_others)} in the head's, more than the repeats separate; "
                 + ("the base's machine showed no busy CPU, so nothing bounds what the load did to this figure"
                    if reach is None else f"the load alone can have raised this figure by up to +{reach:.1f}%"
                    if reach > 0 else "the load can only have lowered the head's figure"))
    return text


def verdict_line(v: Verdict, limit_pct: float) -> str:
    """The verdict, its limit and its outcome: ok, FAIL, or inconclusive with the loads that made it so."""
    outcome = v.outcome(limit_pct)
    if outcome == INCONCLUSIVE and v.load is not None:
        outcome += (f": the machine's load differed (base {_share(v.load.base_others)},"
                    f" head {_share(v.load.head_others)}); rerun both sides at one load")
    return f"{verdict_text(v)}; limit +{limit_pct:g}%: {outcome}"


def _side(cmp: Comparison, i: int) -> str:
    r = cmp.runs[i]
    return {"base": "  base", "head": "  head"}.get(r.side, "")


def _on_front(cmp: Comparison, run: Run) -> bool:
    """A run is tagged on the Pareto front only among single runs: repeats are one configuration's
    spread, not points of a front."""
    return run.pareto and len(cmp.runs) > 2 and not _repeated(cmp)


def render_text(cmp: Comparison) -> str:
    head = ("the base's runs against the head's" if len(cmp.base_runs) > 1 or len(cmp.head_runs) > 1
            else "the first run is the baseline, the last is compared with it")
    lines = [f"energyprof compare: {head}", ""]
    for i, r in enumerate(cmp.runs):
        front = "  (Pareto front)" if _on_front(cmp, r) else ""
        lines.append(f"  [{i}] {r.label}  {r.path}{_side(cmp, i)}{front}")
    if cmp.verdict is not None:
        lines += ["", verdict_text(cmp.verdict)]
    if cmp.settings_differ:
        lines += ["", "Warning: the machine's settings differ between base and head (the energy may differ for that):"]
        lines += [f"  {line}" for line in cmp.settings_differ]
    lines += ["", "Totals per source (program = the run's attributed share; machine = everything measured;"
              " capacity = the gate's figure, the program's CPU-capacity share of the machine's energy;"
              " change = the head's mean against the base's):"]
    rows: list[tuple[str, str, list[float | None]]] = [
        (sid, kind, [getattr(r, attr).get(sid) for r in cmp.runs])
        for sid in cmp.sources for kind, attr in (("program", "program_j"), ("machine", "machine_j"))]
    rows += [("total", "program", [r.program_total for r in cmp.runs]),
             ("total", "machine", [r.machine_total for r in cmp.runs])]
    if all(r.capacity_j is not None for r in cmp.runs):
        rows.append(("total", "capacity", [r.capacity_j for r in cmp.runs]))
    for sid, kind, vals in rows:
        lines.append(f"  {sid:<8} {kind:<8} " + "  ".join(f"{fmt_energy(v):>10}" for v in vals) + f"  {_delta(cmp, vals)}")
    if all(r.load is not None for r in cmp.runs):
        lines.append(f"  {'others':<17} " + "  ".join(f"{_share(r.load.others_share):>10}" for r in cmp.runs if r.load)
                     + "  (other processes' share of the machine's CPU)")
    lines.append(f"  {'duration':<17} " + "  ".join(f"{fmt_seconds(r.duration_s):>10}" for r in cmp.runs))
    lines.append(f"  {'method':<17} " + "  ".join(f"{_method(r):>10}" for r in cmp.runs))
    if cmp.windows:
        lines += ["", f"Windows (mean {_window_whose(cmp)} energy per window, all sources):"]
        for w in cmp.windows:
            lines.append(f"  {w.name:<24} " + "  ".join(f"{fmt_energy(v):>10}" for v in w.mean_j)
                         + f"  {_pct(w.pct) if w.compared else ''}")
    lines += unit_compare_lines(cmp.units)
    if cmp.sweep:
        lines += ["", f"Windows {cmp.sweep} as points ({_sweep_axis(cmp)[:-4]} against time; * on the Pareto front):"]
        for pt in sorted(cmp.sweep_points, key=lambda pt: pt.time_s):
            lines.append(f"  {pt.label:<28} {fmt_seconds(pt.time_s):>10} {fmt_energy(pt.energy_j):>10}"
                         f"{'  *' if pt.pareto else ''}")
    changed = [f for f in cmp.functions if f.self_energy.significant or f.energy.significant]
    lines += ["", f"Functions, head against base, the program's own first ({len(changed)} of {len(cmp.functions)}"
              f" changed beyond {_noise(cmp)}, marked *; self energy, then inclusive):"]
    for f in cmp.functions[:MAX_ROWS_TEXT]:
        lines.append(f"  {_name(f, cmp.folder)}  {_where(f, cmp.folder)}")
        lines.append(f"      self      {_change_text(f.self_energy)}   time {_change_text(f.self_time, fmt_seconds)}")
        lines.append(f"      inclusive {_change_text(f.energy)}   time {_change_text(f.time, fmt_seconds)}")
    if len(cmp.functions) > MAX_ROWS_TEXT:
        lines.append(f"  ... {len(cmp.functions) - MAX_ROWS_TEXT} more (-o compare.html has them all)")
    return "\n".join(lines) + "\n"


def _noise(cmp: Comparison) -> str:
    return "the repeats' spread" if cmp.repeats else "their sampling error"


def _delta(cmp: Comparison, vals: list[float | None]) -> str:
    """The head's mean against the base's, the means the verdict takes."""
    a, b = side_means(vals, [r.side for r in cmp.runs])
    if a is None or b is None:
        return ""
    return _pct((b - a) / a * 100 if a else None) if (a or b) else "+0.0%"


def _share(x: float) -> str:
    return f"{x * 100:.0f}%"


def _where(f: FunctionChange, folder: str | None = None) -> str:
    return f"({short_path(f.file, folder)}:{f.line})" if f.file else ""


def _name(f: FunctionChange, folder: str | None) -> str:
    """A function's name; the program's own row is named by its script's path, shown relative too."""
    return short_path(f.function, folder) if f.function.startswith("/") else f.function


def _md(text: str) -> str:
    """Program strings in a markdown table: no cell breaks, no markup, no HTML."""
    return html.escape(text, quote=False).replace("|", "\\|").replace("`", "\\`").replace("*", "\\*").replace("_", "\\_") \
        .replace("[", "\\[").replace("\n", " ")


MAX_ROWS_MARKDOWN = 10


def render_markdown(cmp: Comparison) -> str:
    """A pull-request comment: the verdict first, one table of runs, at most ten functions."""
    v = cmp.verdict
    out = [f"### energyprof: {_pct(v.pct) if v is not None else ''} {v.what if v is not None else 'program energy'}", ""]
    if v is not None:
        out += [_md(verdict_text(v)), ""]
    capacity = all(r.capacity_j is not None for r in cmp.runs)  # the gate's figure, beside the policy's
    out += ["| run | side | program energy | machine energy |" + (" CPU-capacity share | others' CPU |" if capacity
                                                                   else "")
            + " duration | method |", "|---|---|---:|---:|" + ("---:|---:|" if capacity else "") + "---:|---|"]
    for r in cmp.runs:
        gate = f" {fmt_energy(r.capacity_j)} | {_share(r.load.others_share) if r.load else ''} |" if capacity else ""
        out.append(f"| {_md(r.label)}{' (front)' if _on_front(cmp, r) else ''} | {r.side}"
                   f" | {fmt_energy(r.program_total)} | {fmt_energy(r.machine_total)} |{gate} {fmt_seconds(r.duration_s)}"
                   f" | {_method(r)} |")
    if cmp.sweep:
        on = sorted((pt for pt in cmp.sweep_points if pt.pareto), key=lambda pt: pt.time_s)
        out += ["", f"Pareto front of windows {_md(cmp.sweep)} ({len(on)} of {len(cmp.sweep_points)}):", "",
                "| window | time | energy |", "|---|---:|---:|"]
        out += [f"| {_md(pt.label)} | {fmt_seconds(pt.time_s)} | {fmt_energy(pt.energy_j)} |" for pt in on]
    changed = [f for f in cmp.functions if f.self_energy.significant][:MAX_ROWS_MARKDOWN]
    if changed:
        out += ["", f"Functions whose self energy changed beyond {_noise(cmp)} (the program's own first):", "",
                "| function | before | after | change |", "|---|---:|---:|---:|"]
        for f in changed:
            out.append(f"| {_md(_name(f, cmp.folder))} | {fmt_energy(f.self_energy.before)} | {fmt_energy(f.self_energy.after)}"
                       f" | {_pct(f.self_energy.pct)} |")
    else:
        out += ["", f"No function's energy changed beyond {_noise(cmp)}."]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- HTML

# less energy blue, no change grey, more energy red: named stops, since plotly's own "RdBu" runs
# blue to red and `reversescale` had turned increases blue
INCREASE_RED = [[0.0, "#2166ac"], [0.5, "#f0f0f0"], [1.0, "#b2182b"]]

def _plotly_text(text: str) -> str:
    return html.escape(text, quote=False)


def figures(cmp: Comparison) -> dict[str, Any]:
    """The page's two charts as plotly figure dicts: the differential icicle and the scatter.

    The icicle leaves other processes, idle and energyprof out (`icicle`): they are not the
    program's, and idle alone can be as wide as the program; `icicle_all` has them (a toggle)."""
    outside: set[str] = set()
    for n in cmp.tree:  # parents come before their children
        if n.function in SPECIAL_NODES or n.parent in outside:
            outside.add(n.id)
    out = {"icicle": _icicle([n for n in cmp.tree if n.id not in outside]), "icicle_all": _icicle(cmp.tree),
           "scatter": _scatter(cmp)}
    if cmp.sweep:
        out["sweep"] = pareto_figure([(p.label, p.label, p.time_s, p.energy_j, p.pareto) for p in cmp.sweep_points],
                                     _sweep_axis(cmp))
    return out


def _repeated(cmp: Comparison) -> bool:
    """A side with repeats: its runs are one configuration, drawn as one point with its spread."""
    return len(cmp.base_runs) > 1 or len(cmp.head_runs) > 1


def _scatter(cmp: Comparison) -> dict[str, Any]:
    if not _repeated(cmp):
        return pareto_figure([(str(i), r.label, r.duration_s, r.program_total, r.pareto)
                              for i, r in enumerate(cmp.runs)], "program energy (J)")
    sides = [(name, runs) for name, runs in (("base", cmp.base_runs), ("head", cmp.head_runs)) if runs]
    means = [(statistics.fmean(r.duration_s for r in runs), statistics.fmean(r.program_total for r in runs))
             for _, runs in sides]
    on = pareto_front(means)
    fig = pareto_figure([(f"{name} ({len(runs)} runs)", f"{name}: mean of {len(runs)} runs, \u00b1 their standard deviation",
                          t, e, p) for (name, runs), (t, e), p in zip(sides, means, on)], "program energy (J)")

    def sd(values: list[float]) -> float:
        return statistics.stdev(values) if len(values) > 1 else 0.0

    fig["data"][0]["error_x"] = {"type": "data", "array": [sd([r.duration_s for r in runs]) for _, runs in sides]}
    fig["data"][0]["error_y"] = {"type": "data", "array": [sd([r.program_total for r in runs]) for _, runs in sides]}
    return fig


def _icicle(tree: list[Any]) -> dict[str, Any]:
    ids = [n.id for n in tree]
    kids: dict[str, float] = {}
    for n in tree:
        if n.parent:
            kids[n.parent] = kids.get(n.parent, 0.0) + max(n.energy_j)
    # "remainder": each box is its own value plus its children's, so give each path its larger
    # run's inclusive energy less what its drawn children hold (never below zero)
    values = [max(max(n.energy_j) - kids.get(n.id, 0.0), 0.0) for n in tree]
    deltas = [n.energy_j[1] - n.energy_j[0] for n in tree]
    span = max((abs(d) for d in deltas), default=0.0) or 1.0
    esc = _plotly_text  # plotly reads a subset of HTML in labels and hover texts
    hover = [f"{esc(n.function)}<br>{fmt_energy(n.energy_j[0])} -> {fmt_energy(n.energy_j[1])}"
             f" ({'+' if d >= 0 else '-'}{fmt_energy(abs(d))})" for n, d in zip(tree, deltas)]
    return {
        "data": [{"type": "icicle", "ids": ids, "parents": [n.parent for n in tree],
                  "labels": [esc(n.function) for n in tree], "values": values, "branchvalues": "remainder",
                  "text": hover, "hoverinfo": "text", "textinfo": "label",
                  "marker": {"colors": deltas, "colorscale": INCREASE_RED, "cmin": -span, "cmax": span,
                             "showscale": True, "colorbar": {"title": {"text": "change (J)"}}}}],
        "layout": {"margin": {"t": 10, "l": 10, "r": 10, "b": 10}},
    }


def _window_whose(cmp: Comparison) -> str:
    """Whose energy the windows table holds: the program's, as the plots, unless a file predates it."""
    return "program" if all(w.program for w in cmp.windows) else "machine"


def _sweep_axis(cmp: Comparison) -> str:
    return "program energy (J)" if cmp.sweep_program else "machine energy (J)"


_SCRIPT = """
(function () {
  var figs = JSON.parse(document.getElementById('compare-data').textContent);
  var cfg = {displaylogo: false, responsive: true};
  Plotly.newPlot('diff-icicle', figs.icicle.data, figs.icicle.layout, cfg);
  var all = document.getElementById('diff-outside');
  if (all) all.addEventListener('change', function () {
    var f = all.checked ? figs.icicle_all : figs.icicle;
    Plotly.react('diff-icicle', f.data, f.layout, cfg);
  });
  Plotly.newPlot('pareto', figs.scatter.data, figs.scatter.layout, cfg);
  if (figs.sweep) Plotly.newPlot('sweep', figs.sweep.data, figs.sweep.layout, cfg);
})();
"""


def render_html(cmp: Comparison) -> str:
    from .html import _inline_script, _plotly_js, json_for_script, template_text

    e = html.escape
    capacity = all(r.capacity_j is not None for r in cmp.runs)  # the gate's figure and the neighbours' CPU, per run
    gate_heads = "<th>CPU-capacity share</th><th>others' CPU</th>" if capacity else ""
    runs_rows = "".join(
        f"<tr><td>{i}</td><td>{r.side}</td><td class='fn'>{e(r.label)}{_FRONT if _on_front(cmp, r) else ''}"
        f"</td><td>{fmt_energy(r.program_total)}</td><td>{fmt_energy(r.machine_total)}</td>"
        + (f"<td>{fmt_energy(r.capacity_j)}</td><td>{_share(r.load.others_share) if r.load else ''}</td>" if capacity
           else "")
        + f"<td>{fmt_seconds(r.duration_s)}</td>"
        f"<td><span class='tag {_method(r)}'>{_method(r)}</span></td></tr>" for i, r in enumerate(cmp.runs))
    win_rows = "".join(
        f"<tr><td class='fn'>{e(w.name)}</td>" + "".join(f"<td>{fmt_energy(v)}</td>" for v in w.mean_j)
        + f"<td>{_pct(w.pct) if w.compared else ''}</td></tr>"
        for w in cmp.windows)
    fn_rows = "".join(
        f"<tr><td class='fn'><span class='name'>{e(_name(f, cmp.folder))}</span>"
        f"<span class='where'>{e(_where(f, cmp.folder))}</span></td>"
        + "".join(f"<td{_SIG if c.significant else ''}>{e(_cell(c, fmt))}</td>"
                  for c, fmt in ((f.self_energy, fmt_energy), (f.energy, fmt_energy),
                                 (f.self_time, fmt_seconds), (f.time, fmt_seconds)))
        + f"<td>{f.samples[0]} / {f.samples[1]}</td></tr>" for f in cmp.functions[:MAX_ROWS_HTML])
    run_heads = "".join(f"<th>[{i}]</th>" for i in range(len(cmp.runs)))
    windows = (f"<section class='panel'><h2>Windows</h2><p class='hint'>Mean {_window_whose(cmp)} energy per window,"
               " all sources.</p>"
               "<div class='table-wrap'><table class='windows'><thead><tr><th>window</th>"
               f"{run_heads}<th>change</th></tr></thead><tbody>{win_rows}</tbody></table></div></section>"
               if cmp.windows else "")
    styles = template_text("report.css")
    noise = f"{cmp.verdict.interval.confidence * 100:g}%" if cmp.verdict is not None else ""
    verdict = f"<p class='verdict'>{e(verdict_text(cmp.verdict))}</p>" if cmp.verdict is not None else ""
    sub = (f"base: runs {', '.join(f'[{i}]' for i, r in enumerate(cmp.runs) if r.side == 'base')}; head: runs"
           f" {', '.join(f'[{i}]' for i, r in enumerate(cmp.runs) if r.side == 'head')}")
    sweep = (f"<section class='panel'><h2>Windows {e(cmp.sweep)}: energy against time</h2><p class='hint'>Each"
             f" window named {e(cmp.sweep)} (or {e(cmp.sweep)}:LABEL) in every run, its {_sweep_axis(cmp)[:-4]} against"
             " its time, labelled by its LABEL; the Pareto front is joined.</p><div id='sweep' class='plot'></div></section>"
             if cmp.sweep else "")
    title = f"energyprof compare: {e(cmp.base.label)} \u2192 {e(cmp.last.label)}"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
{styles}
td.sig {{ font-weight: 650; background: #fff6d6; }}
#diff-icicle {{ height: 470px; }} #pareto, #sweep {{ height: 380px; }}
</style></head>
<body>
<header class="top"><h1><span class="brand">energyprof</span> compare</h1>
<p class="sub">{e(sub)}</p>{verdict}</header>
<section class="panel"><h2>Runs</h2><div class="table-wrap"><table class="windows">
<thead><tr><th>#</th><th>side</th><th>run</th><th>program energy</th>
<th>machine energy</th>{gate_heads}<th>duration</th><th>method</th></tr></thead>
<tbody>{runs_rows}</tbody></table></div></section>
<section class="panel"><h2>Energy against time</h2>
<p class="hint">Each run's program energy against its duration; the Pareto front (no other run both faster and
cheaper) is joined.</p><div id="pareto" class="plot"></div></section>
{sweep}
<section class="panel"><h2>Where the energy changed</h2>
<p class="hint">Each box is a call path in either run, as wide as its larger run's energy, coloured by the change
(red: more energy in the last run, blue: less). Other processes, idle and energyprof are left out: they are not
the program's. <label><input type="checkbox" id="diff-outside"> show them</label></p>
<div id="diff-icicle" class="plot"></div></section>
{windows}
<section class="panel"><h2>Functions</h2>
<p class="hint">Before &rarr; after (change), the program's own functions first. Highlighted: the change lies
outside its {e(noise)} interval: {e(_noise(cmp))}, never narrower than the sampling error (each side about
figure/&radic;samples, added in quadrature).</p>
<div class="table-wrap"><table class="fn-table"><thead><tr><th class="fn">function</th><th>self energy</th>
<th>energy</th><th>self time</th><th>time</th><th>samples</th></tr></thead>
<tbody>{fn_rows}</tbody></table></div></section>
<script type="application/json" id="compare-data">{json_for_script(figures(cmp))}</script>
<script>{_plotly_js()}</script>
<script>{_inline_script(_SCRIPT)}</script>
</body></html>
"""


def _cell(c: Change, fmt: Any) -> str:
    return f"{fmt(c.before)} \u2192 {fmt(c.after)}" + (f" ({_change_pct(c)})" if _change_pct(c) else "")


def write_html(cmp: Comparison, path: str) -> None:
    write_text(path, render_html(cmp))


def write_markdown(cmp: Comparison, path: str) -> None:
    write_text(path, render_markdown(cmp))
