"""The report page's HTML, written by plain Python: no template engine to import on every run.

Importing jinja2 (its lexer, parser and compiler come with its runtime) was ~17 ms of an empty
script's ~0.1 s fixed cost, more than rendering the page took. Every program string goes through
`esc` (the same five characters as markupsafe); the JSON, styles and scripts are inserted as they
are (html.py made them safe for a <script> or <style> element).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable


from ..analysis.kinds import has_test_or_batch
from .format import esc, fmt_bytes, fmt_energy, fmt_error, fmt_grams, fmt_money, fmt_seconds

_MISSING = object()


def at(obj: Any, name: str, default: Any = _MISSING) -> Any:
    """obj.name or obj[name], as a template reads either; `default` (else "") when neither."""
    if isinstance(obj, dict):
        if name in obj:
            return obj[name]
    elif obj is not None and hasattr(obj, name):
        return getattr(obj, name)
    return "" if default is _MISSING else default


def truncate(text: str, length: int = 90, end: str = "...", leeway: int = 5) -> str:
    """At a word boundary, as jinja2's `truncate` filter did."""
    if len(text) <= length + leeway:
        return text
    return text[: length - len(end)].rsplit(" ", 1)[0] + end


def _joined(items: Iterable[str]) -> str:
    return "".join(items)


def render_page(ctx: dict[str, Any]) -> str:
    m, meta, method, procs, gpu = ctx["m"], ctx["meta"], ctx["method"], ctx["procs"], ctx["gpu"]
    out: list[str] = []
    w = out.append
    version = esc(meta.get("energyprof_version", ""))
    w('<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
      '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
      f'<meta name="generator" content="energyprof {version}">\n'
      f'<title>energyprof: {esc(ctx["header"]["target"])}</title>\n<style>\n{ctx["styles"]}\n</style>\n</head>\n<body>\n')
    w(_top(ctx, m, meta, method, procs))
    w(_cards(ctx["cards"]))
    if method["notes"]:
        w('<section class="notes">\n' + _joined(f'<p class="note">{esc(n)}</p>' for n in method["notes"]) + "</section>\n\n")
    w(_chart_and_table(m))
    if len(procs["rows"]) > 1:
        w(_processes(procs))
    if gpu:
        w(_gpu(gpu))
    if ctx["has_timeline"]:
        timeline = getattr(m.profile, "timeline", None)
        rss = "; resident memory below" if getattr(timeline, "rss_bytes", None) else ""
        shaded = "; named windows shaded" if m.windows else ""
        w('<section id="timeline" class="panel">\n  <h2>Timeline</h2>\n'
          "  <p class=\"hint\">The machine's power per source, stacked; the program's share as a line over it"
          f"{rss}{shaded}.</p>\n"
          '  <p class="hint">Click a function in the table to shade the spans in which it was on a stack. '
          '<span id="timeline-selection" class="hint"></span></p>\n'
          '  <div id="timeline-plot" class="plot"></div>\n</section>\n\n')
    for i, (name, (points, program)) in enumerate(m.sweeps.items()):
        front = ", ".join(str(p.label) for p in points if p.pareto)
        w(f'<section class="panel">\n  <h2>Sweep <bdi>{esc(name)}</bdi>: energy against time</h2>\n'
          f'  <p class="hint">Each window named <bdi>{esc(name)}</bdi>:LABEL is a point: its '
          f'{"program&#39;s" if program else "machine&#39;s"} energy against its time, labelled by its LABEL. '
          f'The Pareto front (no other point both faster and cheaper) is joined: {esc(front)}.</p>\n'
          f'  <div id="sweep-{i}" class="plot sweep"></div>\n{_sweep_table(name, points, ctx["sweep_choice"](name))}'
          '</section>\n')
    units = m.unit_tables()
    if units:  # the units' tables' module only for a run that has some (analysis/kinds.py decides)
        from .units import page_section as units_section

        w(units_section(units))
    if m.window_groups:
        w(_windows(ctx, m))
    if has_test_or_batch(m.profile.windows):
        from .unit_tables import per_test_section, tokens_section

        w(per_test_section(m.profile) + tokens_section(m.profile))
    w(_methodology(m, meta, method, gpu))
    w(f'<footer class="foot">Written by energyprof {version}. This page works offline: everything it needs is inside this file.'
      '</footer>\n\n'
      f'<script type="application/json" id="report-data" data-encoding="deflate">{ctx["report_json"]}</script>\n'
      f'<script>{ctx["plotly_js"]}</script>\n<script>{ctx["app_js"]}</script>\n</body>\n</html>')
    return "".join(out)


CHOSEN = ' class="chosen"'


def _sweep_table(name: str, points: list[Any], chosen: str | None) -> str:
    """The sweep's points as a table, the program's choice marked (an online optimizer's windows)."""
    rows = _joined(
        f'<tr{CHOSEN if p.label == chosen else ""}><td class="fn">{esc(p.label)}'
        f'{" (chosen)" if p.label == chosen else ""}</td><td>{esc(fmt_seconds(p.time_s))}</td>'
        f'<td>{esc(fmt_energy(p.energy_j))}</td><td>{"yes" if p.pareto else ""}</td></tr>\n    ' for p in points)
    said = f'  <p class="hint">Chosen by the program: <b>{esc(chosen)}</b>.</p>\n' if chosen else ""
    return (f'{said}  <div class="table-wrap"><table class="sweep-table">\n'
            f'    <thead><tr><th>{esc(name)}</th><th>time (measured)</th><th>energy (measured)</th><th>front</th></tr></thead>\n'
            f'    <tbody>\n    {rows}</tbody>\n  </table></div>\n')


def _top(ctx: dict[str, Any], m: Any, meta: dict[str, Any], method: dict[str, Any], procs: dict[str, Any]) -> str:
    started = f"started {esc(ctx['started'])} · " if ctx["started"] else ""
    tags = _joined(f'<span class="tag {esc(s.method)}">{esc(s.id)} {esc(s.method)}</span> ' for s in m.sources)
    status = at(method["exit"], "status")
    exit_tag = f'<span class="tag warn">exit: {esc(status)}</span>' if status and status != "completed" else ""
    jumps = ('<a href="#chart">Where the energy went</a><a href="#functions">Functions</a>'
             + ('<a href="#processes">Processes</a>' if len(procs["rows"]) > 1 else "")
             + ('<a href="#timeline">Timeline</a>' if ctx["has_timeline"] else "") + '<a href="#methodology">Methodology</a>')
    return ('<header class="top">\n'
            f'  <h1><span class="brand">energyprof</span> <bdi>{esc(meta.get("target", "profile"))}</bdi></h1>\n'
            f'  <p class="sub">\n    {started}\n    {esc(fmt_seconds(m.duration_s))} ·\n    {tags}\n    {exit_tag}\n  </p>\n'
            f'  <nav class="jump">{jumps}</nav>\n</header>\n\n')


def _cards(cards: list[Any]) -> str:
    out = ['<section class="cards" aria-label="summary">\n']
    for c in cards:
        out.append(f'  <div class="card card-{esc(c.kind)}">\n    <div class="card-title">{esc(c.title)}</div>\n'
                   f'    <div class="card-value">{esc(c.value)}</div>\n')
        for text, tag in c.lines:
            tagged = f' <span class="tag {esc(tag)}">{esc(tag)}</span>' if tag else ""
            out.append(f'    <div class="card-line">{esc(text)}{tagged}</div>\n')
        out.append("  </div>\n")
    out.append("</section>\n\n")
    return "".join(out)


def _chart_and_table(m: Any) -> str:
    program = esc(fmt_energy(m.program_j))
    return f"""<section id="chart" class="panel">
  <div class="panel-head">
    <h2>Where the energy went</h2>
    <div class="controls" role="group" aria-label="chart options">
      <label>size by
        <select id="chart-metric"><option value="e" selected>energy</option><option value="t">time</option></select></label>
      <label>colour by
        <select id="chart-colour"><option value="file" selected>file</option>\
<option value="mix">source mix</option></select></label>
      <label><input type="checkbox" id="chart-idle"> show other processes, idle and energyprof</label>
      <label title="fold each library's frames into one [library: name] box and import machinery into [import]; \
click a box to open it"><input type="checkbox" id="chart-collapse" checked> group library and import frames</label>
      <label><input type="checkbox" id="chart-flame"> flame (root at bottom)</label>
    </div>
  </div>
  <p class="hint">Boxes are call paths, as wide as their energy, labelled with their share of the program's energy ({program}).
  Calls into a library are folded into a <i>[library: name]</i> box and imports into an <i>[import]</i> box: click one to open it.
  Click a function to select it in the table and on the timeline (and zoom in; the top bar zooms out). \
Small call paths are folded into <i>other</i>.</p>
  <div id="chart-legend" class="legend" aria-label="colours"></div>
  <div id="selection" aria-live="polite"></div>
  <div id="icicle" class="plot"></div>
</section>

<section id="functions" class="panel">
  <div class="panel-head">
    <h2>Functions</h2>
    <div class="controls">
      <input type="search" id="table-search" placeholder="filter by function or file" aria-label="filter functions">
    </div>
  </div>
  <p class="hint">Merged over call paths; inclusive figures count a recursive function once. \
Percentages are of the program's energy ({program});
  your functions come first; every other function is folded under the library or import it ran in \
(its row: their self energy), a click opens one; other processes and idle, and energyprof itself, come last. \
Click a column to sort every function, a row to select it.
  Self ± is the sampling error of the self figures, 1/√(self samples). \
Paths are relative to the program's folder; hover for the full path.</p>
  <div class="table-wrap fn-wrap">
    <table id="fn-table" class="fn-table">
      <thead><tr id="fn-head"></tr></thead>
      <tbody id="fn-body"></tbody>
    </table>
  </div>
  <div class="pager">
    <button type="button" id="page-prev">&larr; previous</button>
    <span id="page-info" aria-live="polite"></span>
    <button type="button" id="page-next">next &rarr;</button>
  </div>
</section>

"""


def _processes(procs: dict[str, Any]) -> str:
    ranks = (" Ranks side by side: <b>slowest</b> is the rank with the most CPU time, <b>most energy</b> the hungriest."
             if procs["ranks"] else "")
    rows = _joined(
        f'<tr><td>{esc(r["pid"])}</td><td>{esc(r["role"])}</td><td><code title="{esc(r["command"])}"><bdi>'
        f'{esc(r["short_command"])}</bdi></code></td><td>{esc(r["energy"])}</td><td>{esc(r["share"])}</td>'
        f'<td>{esc(r["cpu"])}</td><td>{esc(r["rss"])}</td><td>{esc(r["exit"])}</td>'
        f'<td class="mark">{esc(r["marks"])}</td></tr>\n  '
        for r in procs["rows"])
    return ('<section id="processes" class="panel">\n  <h2>Processes</h2>\n'
            '  <p class="hint">Every Python process of the job: its share of the energy, CPU time, peak resident memory and how '
            'it ended. The CPU times add up to the run&#39;s: the program&#39;s row also holds its shutdown after its last '
            f'reading and any child too short-lived to have a row.{ranks}</p>\n'
            '  <div class="scroll-x"><table class="plain procs"><thead><tr><th>pid</th><th>role</th><th>command</th><th>energy'
            '</th><th>share</th><th>CPU time</th><th>peak RSS</th><th>exit</th><th></th></tr></thead><tbody>\n  '
            f'{rows}</tbody></table></div>\n</section>\n\n')


def _schedule(gpu: dict[str, Any]) -> str:
    """When the profiler ran on a schedule (--gpu-kernel-steps): which share of the energy its windows hold."""
    s = gpu.get("schedule") if isinstance(gpu, dict) else at(gpu, "schedule", None)
    if not s:
        return ""
    shares = ", ".join(f'{"%.1f" % at(x, "percent")}% of gpu:{esc(at(x, "device"))}&#39;s measured energy'
                       for x in at(s, "shares"))
    return ('  <p class="hint">The profiler ran on a schedule (<code>--gpu-kernel-steps</code>): '
            f'{esc(at(s, "windows"))} window(s) of steps, {esc(fmt_seconds(at(s, "profiled_s")))} in all, holding {shares}. '
            'Only that energy is split among the kernels below; the rest stays charged by wall time on the sampled stacks '
            '(the notes give the joules).</p>\n')


def _gpu(gpu: dict[str, Any]) -> str:
    e, s = fmt_energy, fmt_seconds
    devices = _joined(
        f'<tr><td>{esc(at(d, "source"))}</td><td>{esc(e(at(d, "energy_j")))}</td><td>{esc(e(at(d, "idle_j")))}</td>'
        f'<td>{esc(s(at(d, "busy_s")))}</td><td>{esc(s(at(d, "update_period_s")))}</td>'
        f'<td>{"%.1f" % (100 * at(d, "short_share"))}%</td></tr>\n  ' for d in gpu["devices"])
    functions = []
    for f in gpu["functions"]:
        where = f'{esc(f["file"])}:{esc(f["line"])}' if f["file"] else ""
        kernels = _joined(
            f'<li><code title="{esc(at(k, "name"))}">{esc(truncate(str(at(k, "name"))))}</code>: {esc(at(k, "count"))}&times;, '
            f'{esc(s(at(k, "time_s")))}, {esc(e(at(k, "joules")))}</li>' for k in f["kernels"])
        functions.append(
            f'<tr><td><code>{esc(f["function"])}</code></td><td>{where}</td><td>{esc(e(f["joules"]))}</td>'
            f'<td>{esc(e(f["error_j"]))}</td><td>{esc(s(f["busy_s"]))}</td>\n'
            f'    <td><details><summary>{len(f["kernels"])} kernel name(s)</summary><ul>{kernels}</ul></details></td></tr>\n  ')
    more = (f'  <p class="hint">{esc(gpu["more"])} more functions with GPU energy are in the profile\'s JSON (gpu_kernels).</p>\n'
            if gpu["more"] else "")
    return ('<section id="gpu" class="panel">\n  <h2>GPU kernels</h2>\n'
            '  <p class="hint">Each power interval\'s GPU energy is split among the kernels, copies and fills busy in it by '
            'their '
            'busy time (an instant with k busy shares its power k ways); time with none busy is <b>[GPU idle]</b>. Each '
            'record\'s joules sit on the Python line (or operator) that launched it. Measured power, estimated split: ± is what '
            'the power samples a line shares with other lines could move between them (power inside a sample between 0 '
            'and the peak), plus the sensor\'s own error (summed, a worst case).</p>\n'
            f'{_schedule(gpu)}'
            '  <div class="scroll-x"><table class="plain"><thead><tr><th>device</th><th>energy</th><th>idle</th><th>busy time'
            '</th><th>sensor update</th><th>from records shorter than an update</th></tr></thead><tbody>\n  '
            f'{devices}</tbody></table></div>\n'
            '  <div class="scroll-x"><table class="plain"><thead><tr><th>function</th><th>where</th><th>GPU energy</th><th>±'
            '</th><th>busy time</th><th>top kernels (count, time, energy)</th></tr></thead><tbody>\n  '
            f'{"".join(functions)}</tbody></table></div>\n{more}</section>\n')


_SHORT_TITLE = "shorter than 3 sensor updates: below the sensor's resolution"


def _group_row(g: Any, first: str, css: str) -> str:
    e = fmt_energy
    short = (f' <span class="tag estimated" title="{_SHORT_TITLE}">{esc(g.short)} too short</span>' if g.short else "")
    machine = "" if g.machine_mean_j is None else esc(e(g.machine_mean_j))
    return (f'<tr{css}><td class="fn">{first}</td><td>{esc(g.count)}</td><td>{esc(e(g.total_j))}</td>'
            f'<td>{esc(e(g.mean_j))}</td>\n'
            f'      <td>{esc(e(g.stdev_j))}</td><td>{esc(e(g.min_j))} &ndash; {esc(e(g.max_j))}</td>'
            f'<td>{esc(fmt_seconds(g.mean_time_s))}{short}</td><td>{machine}</td></tr>\n')


def _epoch_cells(e: dict[str, Any]) -> str:
    s, j = fmt_seconds, fmt_energy
    return (f'<td>{esc(e["steps"])}</td><td>{esc(s(e["fetch_s"]))}</td><td>{esc(s(e["compute_s"]))}</td>\n'
            f'      <td>{esc(s(e["stall_s"]))}</td><td>{esc(j(e["fetch_j"]))}</td><td>{esc(j(e["compute_j"]))}</td></tr>\n')


def _epoch(e: dict[str, Any]) -> str:
    return "" if e["epoch"] is None else esc(e["epoch"])


_TRAINING_HEAD = ("<th>steps</th><th>fetch</th><th>compute</th><th>fetch stall</th><th>fetch energy</th>"
                  "<th>compute energy</th>")


def _epochs_hint(b: Any) -> str:
    """Where the epochs come from when the program marked none: the tracked loop's passes."""
    src = b.get("epochs_from")
    return f" Each epoch is a pass of the tracked loop ({esc(src)} windows)." if src and src.endswith(".pass") else ""


def _per_unit(b: Any) -> str:
    """Energy per sample and per epoch, and the model's size, where the loop recorded them."""
    text = ""
    if b.get("energy_per_sample_j") is not None:
        text += (f' Per sample {esc(fmt_energy(b["energy_per_sample_j"]))}'
                 f'{_machine_beside(b, b.get("machine_energy_per_sample_j"))} ({esc(b.get("sample_count"))} samples)')
    if b.get("energy_per_epoch_j") is not None:
        text += (f'{", per" if text else " Per"} epoch {esc(fmt_energy(b["energy_per_epoch_j"]))}'
                 f'{_machine_beside(b, b.get("machine_energy_per_epoch_j"))}')
    if b.get("parameters"):
        text += f'; the model has {b["parameters"]:,} parameters'
    return text + "." if text else ""


def _machine_beside(b: Any, machine: float | None) -> str:
    """The machine's figure beside the program's (the breakdown's figures are the program's part of each window)."""
    if machine is None or b.get("energy_of", "program") != "program":
        return ""
    return f" (the machine's: {esc(fmt_energy(machine))})"


def _whose(b: Any) -> str:
    return ("the program's, its part of each window like the total above" if b.get("energy_of", "program") == "program"
            else "the machine's: this file's windows hold no program part")


def _whose_ranks(by_rank: dict[int, Any]) -> str:
    """Whose energy the per-rank table's figures are, said as the single-process table says it; per rank
    where the ranks' files differ (a join of files written before and after windows held the program's part)."""
    kinds = {r: b.get("energy_of", "program") for r, b in by_rank.items()}
    if len(set(kinds.values())) <= 1:
        return f"Energy here is {esc(_whose(next(iter(by_rank.values()), {})))}."
    machine = ", ".join(str(r) for r, k in kinds.items() if k != "program")
    return (f"Energy here is the program&#39;s (its part of each window) for every rank but {esc(machine)}, whose "
            "figures are the machine&#39;s: their files&#39; windows hold no program part.")


def _io_cols(b: Any) -> bool:
    return any("read_mb" in e for e in b["epochs"])


def _cache_cols(b: Any) -> bool:
    return any("cache_start" in e for e in b["epochs"])


def _phases_head(b: Any) -> str:
    return ('<th title="each step&#39;s compute energy split in the loop&#39;s shares: estimated">forward</th>'
            "<th>backward</th><th>optimizer</th>" if b.get("phases") else "")


def _phases_hint(b: Any) -> str:
    """The loop's forward, backward and optimizer, with how they were made and their ±."""
    ph = b.get("phases")
    if not ph:
        return ""
    j, pm = fmt_energy, fmt_error
    return (f' Compute: forward {esc(j(ph["forward_j"]))}, backward {esc(j(ph["backward_j"]))}'
            f'{esc(pm(ph["backward_relative_error"]))}, optimizer {esc(j(ph["optimizer_j"]))}'
            f'{esc(pm(ph["optimizer_relative_error"]))} <span class="tag estimated">{esc(ph["method"])}</span>'
            f' ({esc(ph["basis"])}).')


def _epoch_io(e: dict[str, Any], io: bool, cache: bool) -> str:
    """An epoch's cells, with its forward, backward and optimizer, the disk's reads and the dataset's
    page-cache residency beside its stall where the run recorded them."""
    cells = _epoch_cells(e)
    extra = "".join(f"<td>{esc(fmt_energy(e[k]))}</td>" for k in ("forward_j", "backward_j", "optimizer_j") if k in e)
    if io:
        extra += (f'<td>{"%.1f" % e["read_mb"]}</td><td>{"%.0f" % e["read_iops"]}</td>'
                  f'<td>{"%.0f%%" % (e["disk_busy_share"] * 100)}</td>' if "read_mb" in e else "<td></td><td></td><td></td>")
    if cache:
        extra += "".join(f'<td>{"%.0f%%" % (f * 100) if f is not None else ""}</td>'
                         for f in (e.get("cache_start"), e.get("cache_end")))
    return cells.replace("</tr>\n", extra + "</tr>\n", 1) if extra else cells


def _windows(ctx: dict[str, Any], m: Any) -> str:
    out = ['<section id="windows" class="panel">\n  <h2>Windows</h2>\n'
           '  <p class="hint">The program\'s energy in each named span (its share of every source, the same kind of figure as '
           'its total above); the machine\'s, everything the sensors measured in the span, is the last column.'
           + (" A rank row is that rank's share; its group's row is the machine's over the ranks' spans."
              if any(g.ranks for g in m.window_groups) else "") + '</p>\n'
           '  <div class="table-wrap"><table class="windows">\n'
           '    <thead><tr><th>window</th><th>count</th><th>total</th><th>mean per window</th><th>spread (sd)</th>'
           '<th>min &ndash; max</th><th>mean time</th><th>machine per window</th>'
           + ('<th title="measured: /proc/diskstats, all processes">disk read (MB)</th><th>read IOPS</th>'
              if m.window_io else "") + '</tr></thead>\n    <tbody>\n']
    for g in m.window_groups:
        first = esc(g.name)
        if g.ranks:
            n = len(g.ranks)
            first += (f' <span class="hint">the machine over {n} {"rank" if n == 1 else "ranks"}\' spans, each node once'
                      "</span>")
        row = _group_row(g, first, ' class="rank-sum"' if g.ranks else "")
        if m.window_io:
            wio = m.window_io.get(g.name)
            cells = (f'<td>{"%.1f" % wio["read_mb"]}</td><td>{"%.0f" % wio["read_iops"]}</td>' if wio else "<td></td><td></td>")
            row = row.replace("</tr>\n", cells + "</tr>\n", 1)
        out.append("    " + row)
        for r in g.ranks:
            out.append("    " + _group_row(r, "&nbsp;&nbsp;" + esc(r.name) + ' <span class="hint">program\'s share</span>',
                                           ' class="rank-row"'))
    out.append("    </tbody>\n  </table></div>\n")
    for name, b in m.training.items():
        step = b["step_energy_j"]
        out.append(f'  <h3>Training loop: {esc(name)} (fetch stall = {esc(b["stall_definition"])})</h3>\n'
                   f'  <p class="hint">Energy here is {esc(_whose(b))}. Step energy: mean {esc(fmt_energy(step["mean"]))}'
                   f'{_machine_beside(b, (b.get("machine_step_energy_j") or {}).get("mean"))},'
                   f' spread (sd) {esc(fmt_energy(step["stdev"]))} over {esc(step["n"])} steps.{_per_unit(b)}'
                   f'{_epochs_hint(b)}{_phases_hint(b)}</p>\n'
                   '  <div class="table-wrap"><table class="windows">\n'
                   f'    <thead><tr><th>epoch</th>{_TRAINING_HEAD}{_phases_head(b)}'
                   + ("<th>disk read (MB)</th><th>read IOPS</th><th>disk busy</th>" if _io_cols(b) else "")
                   + ('<th title="the dataset&#39;s share in the page cache (mincore), measured">cached at start</th>'
                      "<th>cached at end</th>" if _cache_cols(b) else "")
                   + '</tr></thead>\n    <tbody>\n')
        out.extend(f'    <tr><td>{_epoch(e)}</td>{_epoch_io(e, _io_cols(b), _cache_cols(b))}' for e in b["epochs"])
        out.append("    </tbody>\n  </table></div>\n")
    for name, by_rank in m.training_ranks.items():
        out.append(_training_ranks(ctx, name, by_rank))
    for name, fc in getattr(m, "forecasts", {}).items():
        out.append(_forecast_table(name, fc))
    rows = ctx["window_rows"]
    out.append(f'  <details><summary>Each window (first {len(rows)})</summary>\n'
               '  <div class="table-wrap"><table class="windows">\n'
               '    <thead><tr><th>window</th><th>index</th><th>start</th><th>time</th><th>program energy</th>'
               '<th>machine energy</th>'
               '<th>carbon (machine)</th></tr>'
               '</thead>\n    <tbody>\n')
    for r in rows:
        win = r.window
        rank = f' <span class="hint">rank {esc(win.rank)}</span>' if win.rank is not None else ""
        short = ""
        if r.short_for:
            names = esc(", ".join(r.short_for))
            short = f' <span class="tag estimated" title="shorter than 3 updates of {names}">too short for {names}</span>'
        carbon = esc(fmt_grams(r.carbon_g)) if r.carbon_g is not None else ""
        index = "" if win.index is None else esc(win.index)
        # one line a window, no indent: 200 of them are the page's largest piece of markup
        out.append(f'<tr><td class="fn">{esc(win.name)}{rank}</td><td>{index}</td><td>{esc(fmt_seconds(win.start_s))}</td>'
                   f'<td>{esc(fmt_seconds(win.time_s))}{short}</td>'
                   f'<td>{esc(fmt_energy(r.program))}</td><td>{esc(fmt_energy(r.energy))}</td><td>{carbon}</td></tr>\n')
    out.append("    </tbody>\n  </table></div>\n  </details>\n</section>\n\n")
    return "".join(out)


def _forecast_table(name: str, fc: dict[str, Any]) -> str:
    """A tracked loop's forecasts of its total (made during the run) against what its passes measured."""
    outcome = fc.get("outcome")
    n = fc.get("epochs")
    # the forecast's figures are of the sources it read: a model's estimate stays one, said so
    how = "estimated" if any(r.get("estimated") for r in fc.get("rows", [])) else "measured"
    if outcome:
        told = (f'the {esc(n)} passes {how} {esc(fmt_energy(outcome["energy_j"]))} in '
                f'{esc(fmt_seconds(outcome["time_s"]))}'
                + (' <span class="tag estimated">estimated</span>' if how == "estimated" else ""))
    else:
        told = f'the run made {esc(fc.get("passes", 0))} of the {esc(n)} passes it forecast: no outcome to compare'

    def cell(r: dict[str, Any], name: str, unit: str, fmt: Callable[[Any], str]) -> str:
        v, lo, hi = r.get(f"{name}_{unit}"), r.get(f"{name}_low_{unit}"), r.get(f"{name}_high_{unit}")
        if v is None:
            return "<td></td>"
        span = f' <span class="hint">[{esc(fmt(lo))} &ndash; {esc(fmt(hi))}]</span>' if lo is not None and hi is not None else ""
        return f"<td>{esc(fmt(v))}{span}</td>"

    def error(r: dict[str, Any], name: str) -> str:
        e, inside = r.get(f"{name}_error"), r.get(f"{name}_inside")
        if e is None:
            return "<td></td>"
        mark = "" if inside is None else (" inside" if inside else ' <span class="tag estimated">outside</span>')
        return f"<td>{e * 100:+.1f}%{mark}</td>"

    out = [f'  <h3>Forecast: {esc(name)}</h3>\n'
           '  <p class="hint">Estimated during the run, after each epoch, for all of its passes from the epochs measured'
           ' so far (the program\'s energy; 95% intervals from the epochs\' spread, after one epoch from its steps\');'
           f' {told}.</p>\n'
           '  <div class="table-wrap"><table class="windows forecast">\n'
           '    <thead><tr><th>after epoch</th><th>energy predicted</th><th>error</th><th>time predicted</th>'
           '<th>error</th><th>carbon predicted</th><th>interval from</th></tr></thead>\n    <tbody>\n']
    for r in fc.get("rows", []):
        basis = "steps" if r.get("by_steps") else "epochs"
        out.append(f'<tr><td>{esc(r["epochs_done"])} of {esc(r["epochs"])}</td>{cell(r, "energy", "j", fmt_energy)}'
                   f'{error(r, "energy")}{cell(r, "time", "s", fmt_seconds)}{error(r, "time")}'
                   f'{cell(r, "carbon", "g", fmt_grams)}<td>{basis}</td></tr>\n')
    out.append("    </tbody>\n  </table></div>\n")
    return "".join(out)


def _training_ranks(ctx: dict[str, Any], name: str, by_rank: dict[int, dict[str, Any]]) -> str:
    s, j = fmt_seconds, fmt_energy
    first = next(iter(by_rank.values()), {})
    out = ['  <section class="training-ranks">\n'
           f'  <h3>Training loop per rank: {esc(name)} (fetch stall = {esc(at(first, "stall_definition"))})</h3>\n'
           '  <p class="hint">Each rank\'s own steps; the ranks side by side. A rank that waits longer for data or computes '
           f'longer holds the others back at every synchronisation. {_whose_ranks(by_rank)}</p>\n'
           '  <div class="table-wrap"><table class="windows">\n'
           f'    <thead><tr><th>rank</th>{_TRAINING_HEAD}<th>step energy (mean &plusmn; sd)</th></tr></thead>\n    <tbody>\n']

    def total(ep: list[dict[str, Any]], key: str) -> float:
        return sum(e[key] for e in ep)

    for rank, b in by_rank.items():
        ep = b["epochs"]
        stall = s(total(ep, "stall_s")) if ep and not any(e["stall_s"] is None for e in ep) else None
        step = b["step_energy_j"]
        out.append(f'    <tr><td>rank {esc(rank)}</td><td>{esc(step["n"])}</td><td>{esc(s(total(ep, "fetch_s")))}</td>'
                   f'<td>{esc(s(total(ep, "compute_s")))}</td>\n'
                   f'      <td>{"&ndash;" if stall is None else esc(stall)}</td>\n'
                   f'      <td>{esc(j(total(ep, "fetch_j")))}</td><td>{esc(j(total(ep, "compute_j")))}</td>\n'
                   f'      <td>{esc(j(step["mean"]))} &plusmn; {esc(j(step["stdev"]))}'
                   f'{_machine_beside(b, (b.get("machine_step_energy_j") or {}).get("mean"))}</td></tr>\n')
    out.append('    </tbody>\n  </table></div>\n  <details><summary>Per epoch and rank</summary>\n'
               '  <div class="table-wrap"><table class="windows">\n'
               f'    <thead><tr><th>epoch</th><th>rank</th>{_TRAINING_HEAD}</tr></thead>\n    <tbody>\n')
    rank_epoch_rows: Callable[[Any], list[tuple[int, dict[str, Any]]]] = ctx["rank_epoch_rows"]
    out.extend(f'    <tr><td>{_epoch(e)}</td><td>rank {esc(rank)}</td>{_epoch_cells(e)}' for rank, e in rank_epoch_rows(by_rank))
    out.append("    </tbody>\n  </table></div>\n  </details>\n  </section>\n")
    return "".join(out)


def _methodology(m: Any, meta: dict[str, Any], method: dict[str, Any], gpu: Any) -> str:
    out = ['<section id="methodology" class="panel methodology">\n  <h2>Methodology</h2>\n  <h3>Sensors</h3>\n'
           '  <div class="scroll-x"><table class="plain">\n'
           '    <thead><tr><th>source</th><th>component</th><th>method</th><th>sensor</th><th>how</th><th>detail</th>'
           '<th>update period</th></tr></thead>\n    <tbody>\n']
    for s in method["sources"]:
        period = s.get("update_period_s")
        out.append(f'    <tr><td>{esc(s["id"])}</td><td>{esc(s.get("component", ""))}</td>'
                   f'<td><span class="tag {esc(s["method"])}">{esc(s["method"])}</span></td>\n'
                   f'      <td>{esc(s["sensor_text"])}</td><td>{esc(s["tier_text"])}</td><td>{esc(s["detail_text"])}</td>\n'
                   f'      <td>{"" if period is None else esc(fmt_seconds(period))}</td></tr>\n')
    out.append("    </tbody>\n  </table></div>\n")
    if method["method_notes"]:
        out.append("  <h3>Notes on this run</h3>\n  <ul>" + _joined(f"<li>{esc(n)}</li>" for n in method["method_notes"])
                   + "</ul>\n")
    if method["sensor_notes"]:
        out.append("  <p>What the sensor discovery found (and why other sensors were not used):</p>\n  <ul>"
                   + _joined(f"<li>{esc(n)}</li>" for n in method["sensor_notes"]) + "</ul>\n")
    if method["estimated"]:
        named = "; ".join(f'{esc(s["id"])} ({esc(s["sensor_text"])}{": " + esc(s["detail_text"]) if s["detail_text"] else ""})'
                          for s in method["estimated"])
        out.append(f"  <p><b>Estimated, not measured:</b>\n  {named}.\n  These figures come from a model of the hardware, "
                   "not from a counter: compare runs with them, do not bill with them.</p>\n")
    if gpu:
        charge = ("<b>GPU energy is split among the GPU's kernels by busy time</b> and charged to the stacks that launched them "
                  "(see GPU kernels); time with no kernel busy is [GPU idle].")
    elif method["has_gpu"]:
        charge = ("<b>GPU energy is charged by wall time</b>: GPU work is asynchronous, so the Python stack on screen is often a "
                  "synchronisation point (such as <code>loss.item()</code>), not the code that launched the kernel.")
    else:
        charge = ("GPU energy, when measured, is charged by wall time (GPU work is asynchronous, so the stack is often a "
                  "synchronisation point).")
    out.append(
        "  <h3>Sampling</h3>\n  <ul>\n"
        f'    <li>Stack sampler: {esc(meta.get("sampler", "?"))}, every {esc(fmt_seconds(meta.get("interval_s")))}; '
        f'sensors read every {esc(fmt_seconds(meta.get("sensor_interval_s")))}.</li>\n'
        "    <li>Each sample is charged the energy of the sensor intervals it overlaps, in proportion to its CPU time for CPU "
        f"and memory sources.\n      {charge}</li>\n"
        "    <li>A function seen in <i>n</i> samples has a sampling error of about 1/√<i>n</i> (the ± column): ±32% at 10 "
        "samples, ±10% at 100.</li>\n"
        "    <li>A function or window that ran for less than three updates of a sensor is marked &#9873;: its share of that "
        "sensor's energy is finer than the sensor can see (GPUs such as the A100/H100 refresh power about every 100 ms).</li>\n"
        f'  </ul>\n  <h3>Idle policy: {esc(method["policy"])}</h3>\n  <p>{esc(method["policy_text"])}</p>\n')
    if m.carbon:
        c = m.carbon
        cost = ""
        if c.program_cost is not None:
            cost = (f"Cost likewise at {esc(c.price_per_kwh)} {esc(c.currency)}/kWh: "
                    f"{esc(fmt_money(c.program_cost, c.currency))} "
                    f"(machine {esc(fmt_money(c.machine_cost, c.currency))}).")
        out.append(
            "  <h3>Carbon</h3>\n"
            f"  <p>Emissions = energy × PUE × carbon intensity ({'%.4g' % c.intensity_g_per_kwh} gCO₂eq/kWh, {esc(c.source)}, "
            f"PUE {'%g' % c.pue}), one formula for both figures:\n"
            f"  the program's attributed energy gives the headline, {esc(fmt_grams(c.program_g))} CO₂eq; everything the sensors "
            f"measured gives the machine's, {esc(fmt_grams(c.machine_g))} CO₂eq.\n  {cost}</p>\n")
    host = method["host"]
    facts = [f'    <dt>command</dt><dd><code><bdi>{esc(method["command"])}</bdi></code></dd>\n'
             f'    <dt>energyprof</dt><dd>{esc(meta.get("energyprof_version", "?"))}, '
             f'Python {esc(meta.get("python", "?"))}</dd>\n']
    if host:
        text = esc(host.get("cpu_model", ""))
        if host.get("cores"):
            text += f', {esc(host["cores"])} cores'
        if host.get("memory_bytes"):
            text += f', {esc(fmt_bytes(host["memory_bytes"]))}'
        if host.get("platform"):
            text += f', {esc(host["platform"])}'
        facts.append(f"    <dt>host</dt><dd>{text}</dd>\n")
    if method.get("settings"):
        lines = "<br>".join(f"<code>{esc(k)}</code> {esc(v)}" for k, v in method["settings"])
        facts.append(f'    <dt>machine settings</dt><dd class="settings">{lines}</dd>\n')
    if method["exit"]:
        facts.append("    <dt>exit</dt><dd>" + ", ".join(f"{esc(k)}: {esc(v)}" for k, v in method["exit"].items()) + "</dd>\n")
    out.append('  <h3>This run</h3>\n  <dl class="facts">\n' + "".join(facts) + "  </dl>\n</section>\n\n")
    return "".join(out)
