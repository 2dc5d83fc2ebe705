"""The units-of-work tables (requests by route, engine tasks, tests): console lines and the page's section.

Each table comes from analysis/units.py; these only lay it out. A request's joules are its samples' (a sample
goes to the request whose task or thread ran it; +- one sample's worth at each edge), another unit's the
program's part of its window over its span (+- its edges' sensor intervals); each table says which, and the
sensors' method (measured or estimated).
"""

from __future__ import annotations

from typing import Any

from ..agent.window_facts import REQUEST_FACT
from ..analysis.units import UnitTable
from .format import esc as _esc, fmt_energy, fmt_percent, fmt_seconds

CONSOLE_GROUPS = 4  # the console is a summary: the costliest names, the page has them all


def _share(g: Any, t: UnitTable) -> str:
    return fmt_percent(g.total_j, t.program_j) if t.program_j else ""


def _what(t: UnitTable) -> str:
    """What a table's figures are: the sources' method, and the runs' joules sample-based (+- their edge
    samples, the totals adding up) or span-based (+- their edges' sensor intervals)."""
    if t.totals_from == "samples":
        return (f"{t.method}; joules per {t.kind}: the samples that ran it (a sample goes to the {t.kind} whose task "
                "or thread ran it; waiting costs nothing), +- one sample's worth at each edge; a run shorter than "
                "the sampling interval reads 0 or a whole sample, so read the mean; total: the runs' sum")
    total = "its route's node in the tree" if t.totals_from == "routes" else "the runs' spans summed"
    return (f"{t.method}; joules per {t.kind}: the program's over its span, +- its edges' sensor intervals; "
            f"total: {total}")


def console_lines(tables: list[UnitTable], groups: int = CONSOLE_GROUPS) -> list[str]:
    """A few lines per table: each name's count and joules per run (mean, median +- edge, p95, max), most energy
    first, then the table's notes."""
    lines = []
    for t in tables:
        lines.append(f"  {t.label} ({t.count}; mean, median +- edge, p95, max; total, share of the program):")
        lines.append(f"    ({_what(t)})")
        for g in t.groups[:groups]:
            lines.append(f"    {g.count:>6}x  {fmt_energy(g.mean_j):>9} {fmt_energy(g.median_j):>9} +-{fmt_energy(g.edge_j):<9} "
                         f"{fmt_energy(g.p95_j):>9} {fmt_energy(g.max_j):>9}  {fmt_energy(g.total_j):>9} {_share(g, t):>6}  "
                         f"{g.name}")
        if len(t.groups) > groups:
            lines.append(f"    ... {len(t.groups) - groups} more in the report")
        lines.extend(f"    note: {n}" for n in t.notes)
    return lines


def page_section(tables: list[UnitTable]) -> str:
    """The page's "Units of work" section: a table per kind, then its costliest runs."""
    if not tables:
        return ""
    out = ['<section id="units" class="panel">\n  <h2>Units of work</h2>\n'
           '  <p class="hint">Each request (or task) is a window the program did not mark. A request\'s joules are '
           "those of the samples that ran it; a task's, the program's part of its window; the share is of the "
           "program's energy. See docs/units.md.</p>\n"]
    for t in tables:
        out.append(f'  <h3>{_esc(t.label.capitalize())}: {_esc(t.count)}</h3>\n'
                   f'  <p class="hint">Figures: {_esc(_what(t))}.</p>\n'
                   '  <div class="table-wrap"><table class="windows units">\n'
                   f'    <thead><tr><th>{_esc(_name_head(t.kind))}</th><th>{_esc(t.label)}</th><th>mean</th><th>median</th>'
                   '<th>&plusmn; edge</th><th>p95</th><th>max</th><th>total</th><th>share</th>'
                   '<th>median time</th></tr></thead>\n    <tbody>\n')
        for g in t.groups:
            out.append(f'    <tr><td class="fn"><bdi>{_esc(g.name)}</bdi></td><td>{_esc(g.count)}</td>'
                       f'<td>{_esc(fmt_energy(g.mean_j))}</td><td>{_esc(fmt_energy(g.median_j))}</td><td>&plusmn;{_esc(fmt_energy(g.edge_j))}</td>'
                       f'<td>{_esc(fmt_energy(g.p95_j))}</td>'
                       f'<td>{_esc(fmt_energy(g.max_j))}</td><td>{_esc(fmt_energy(g.total_j))}</td>'
                       f'<td>{_esc(_share(g, t))}</td><td>{_esc(fmt_seconds(g.median_time_s))}</td></tr>\n')
        out.append("    </tbody>\n  </table></div>\n")
        if t.costliest:
            out.append(f'  <p class="hint">The costliest {_esc(t.label)}:</p>\n'
                       '  <div class="table-wrap"><table class="windows units-top">\n'
                       f'    <thead><tr><th>{_esc(_name_head(t.kind))}</th><th>started</th><th>time</th>'
                       '<th>energy</th><th>status</th></tr></thead>\n    <tbody>\n')
            for r in t.costliest:
                out.append(f'    <tr><td class="fn"><bdi>{_esc(r.name)}</bdi></td><td>{_esc(fmt_seconds(r.start_s))}</td>'
                           f'<td>{_esc(fmt_seconds(r.time_s))}</td><td>{_esc(fmt_energy(r.joules))}</td>'
                           f'<td>{_esc("" if r.status is None else r.status)}</td></tr>\n')
            out.append("    </tbody>\n  </table></div>\n")
        out.extend(f'  <p class="note">{_esc(n)}</p>\n' for n in t.notes)
    out.append("</section>\n\n")
    return "".join(out)


def _name_head(kind: str) -> str:
    return {REQUEST_FACT: "route"}.get(kind, kind)


def compare_lines(changes: list[Any]) -> list[str]:
    """`energyprof compare`'s units of work: per name (a route), each run's median joules per run and
    count, and the head's median against the base's."""
    if not changes:
        return []
    lines = ["", "Units of work (median energy per request, from the samples that ran it, or per task, the program's "
                 "over its span; all sources, measured or estimated as each report says, +- as its table says; "
                 "count in brackets):"]
    for c in changes:
        cells = "  ".join(f"{fmt_energy(v) if v is not None else '-':>10} ({n})" for v, n in zip(c.median_j, c.count))
        pct = "" if c.pct is None else f"  {c.pct:+.1f}%"
        lines.append(f"  {c.name:<28} {cells}{pct}")
    return lines
