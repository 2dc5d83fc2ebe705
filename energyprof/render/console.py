"""The short summary printed on stderr at the end of a run, from the report model."""

from __future__ import annotations

from ..analysis.report import ReportModel
from ..facts.profile import GROUP_PREFIXES, Node
from ..analysis.kinds import has_test_or_batch
from .charts import path_shortener
from .format import fmt_energy, fmt_error, fmt_grams, fmt_money, fmt_percent, fmt_seconds, source_how


GROUPS_SHOWN = 4  # the libraries and imports after the user's functions: a summary, not the table
GROUP_MEMBERS_SHOWN = 3  # each group's heaviest functions, indented beneath it


def render_summary(model: ReportModel) -> str:
    t = model.totals
    lines = ["", f"energyprof: {model.meta.get('target', '<program>')} ran {fmt_seconds(t.duration_s)},"
             f" CPU {fmt_seconds(t.cpu_time_s)} (summed over threads and processes), idle policy {model.policy}"]
    for src in model.sources:
        total = t.energy_j.get(src.id, 0.0)
        mine = t.attributed_j.get(src.id, 0.0)
        lines.append(f"  {src.id:<8} {fmt_energy(total):>9}  {src.method:<9} ({source_how(src)})"
                     f"  program: {fmt_energy(mine)}")
    total = model.total_energy_j
    lines.append(f"  {'total':<8} {fmt_energy(total):>9} ({total / 3600:.3g} Wh)  {_methods(model)}")
    program = model.program_j
    lines.append(f"  {'program':<8} {fmt_energy(program):>9} ({fmt_percent(program, total)} of the machine's);"
                 " percentages below are of the program's energy")
    c = model.carbon
    if c is not None:
        how = "time-series mean" if c.time_series else "at"
        lines.append(f"  carbon   program {fmt_grams(c.program_g)} CO2eq (machine {fmt_grams(c.machine_g)}) {how}"
                     f" {c.intensity_g_per_kwh:.4g} g/kWh ({c.source}), PUE {c.pue:g}  estimated")
        if c.program_cost is not None:
            lines.append(f"  cost     program {fmt_money(c.program_cost, c.currency)}"
                         f" (machine {fmt_money(c.machine_cost, c.currency)})")
    short = path_shortener(model)
    if model.top:
        lines.append("  top functions by self energy" if model.top_by_self else "  your functions by total energy")
        lines[-1] += " (all sources; \u00b1 = sampling error, 1/sqrt(samples)):"
        for row in model.top:
            e = row.self_total_energy if model.top_by_self else row.total_energy
            err = row.relative_error
            where = f"{short(row.file)}:{row.line}" if row.file else ""
            lines.append(f"    {fmt_energy(e):>9} {fmt_percent(e, program):>6} {'' if err is None else f'±{err * 100:.0f}%':>5}"
                         f"  {row.function}  {where}")
    if model.modules:
        lines.append(heaviest_modules(model))
    groups = model.groups[:GROUPS_SHOWN]
    if groups:
        lines.append("  outside your code (each library's and import's own energy;"
                     " beneath it, its heaviest functions' self energy):")
        for g in groups:
            lines.append(f"    {fmt_energy(g.total):>9} {fmt_percent(g.total, program):>6} {_error(g.self_samples):>5}"
                         f"  {g.label} {g.count} function{'' if g.count == 1 else 's'}")
            for (function, file, line), joules, samples in g.heaviest(GROUP_MEMBERS_SHOWN):
                where = f"{short(file)}:{line}" if file else ""
                lines.append(f"      {fmt_energy(joules):>9} {fmt_percent(joules, program):>6} {_error(samples):>5}"
                             f"  {function}  {where}")
    roles = _roles(model)[:GROUPS_SHOWN]
    if roles:
        lines.append("  threads and processes grouped by what they run (xN: how many ran it):")
        for node in roles:
            e = node.total_energy
            lines.append(f"    {fmt_energy(e):>9} {fmt_percent(e, program):>6}        {node.function}")
    units = model.unit_tables()
    if units:  # the units', tests' and tokens' modules only for a run that has some (analysis/kinds.py decides)
        from .units import console_lines as unit_lines

        lines.extend(unit_lines(units))
    if has_test_or_batch(model.profile.windows):
        from .unit_tables import per_test_lines, tokens_lines

        lines.extend([*per_test_lines(model.profile), *tokens_lines(model.profile)])
    for note in model.notes:
        lines.append(f"  note: {note.message}")
    return "\n".join(lines) + "\n"


def heaviest_modules(model: ReportModel, shown: int | None = None) -> str:
    """`heaviest modules (...): encoder 13.6 J ±2% (61% backward ±3%), ...`: each module's forward and
    backward together, and the share of it in backward (analysis/phases.py; `shown` None: its MODULES_SHOWN)."""
    if shown is None:  # the phases' module only for a run whose backward was linked
        from ..analysis.phases import MODULES_SHOWN

        shown = MODULES_SHOWN
    parts = []
    for row in model.modules[:shown]:
        forward, backward = model.row_phases(row) or (0.0, 0.0)
        total = forward + backward
        err, berr = row.relative_error, row.backward_relative_error
        parts.append(f"{row.function} {fmt_energy(total)}{fmt_error(err)} ({fmt_percent(backward, total)} backward"
                     f"{fmt_error(berr)})")
    return (f"  heaviest modules (forward + backward, {_methods(model)}; \u00b1 = sampling error, 1/sqrt(samples)): "
            + ", ".join(parts))


def _error(samples: int) -> str:
    return f"\u00b1{100 / samples ** 0.5:.0f}%" if samples > 0 else ""


def _roles(model: ReportModel) -> list[Node]:
    """The thread and process group nodes (`[threads: T x150]`), most energy first."""
    nodes = [n for n, _ in model.profile.walk() if n.function.startswith(GROUP_PREFIXES)]
    return sorted(nodes, key=lambda n: -n.total_energy)


def _methods(model: ReportModel) -> str:
    methods = {s.method for s in model.sources}
    if not methods:
        return "no energy source"
    return "measured" if methods == {"measured"} else ("estimated" if methods == {"estimated"} else "measured + estimated")

