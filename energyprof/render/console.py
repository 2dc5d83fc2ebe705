"""The short summary printed on stderr at the end of a run."""

from __future__ import annotations

from ..profile import SPECIAL_NODES, Profile
from .exports import FunctionRow, function_rows
from .format import fmt_energy


def top_functions(profile: Profile, n: int = 8) -> list[FunctionRow]:
    """Functions by self energy, merged over call paths (the flat view users ask first)."""
    rows = [r for r in function_rows(profile, include_root=False)
            if r.function not in SPECIAL_NODES and r.self_total_energy > 0]
    return sorted(rows, key=lambda r: -r.self_total_energy)[:n]


def render_summary(profile: Profile) -> str:
    t = profile.totals
    lines = ["", f"energyprof: {profile.meta.get('target', '<program>')} ran {t['duration_s']:.2f} s,"
             f" CPU {t.get('cpu_time_s', 0.0):.2f} s, idle policy {profile.meta.get('idle_policy')}"]
    for src in profile.sources:
        sid = src["id"]
        total = t["energy_j"].get(sid, 0.0)
        mine = t["attributed_j"].get(sid, 0.0)
        lines.append(f"  {sid:<8} {fmt_energy(total):>9}  {src['method']:<9} ({src['sensor']})"
                     f"  program: {fmt_energy(mine)}")
    total = profile.total_energy_j
    lines.append(f"  {'total':<8} {fmt_energy(total):>9} ({total / 3600:.3g} Wh)  {_methods(profile)}")
    if profile.carbon and t.get("carbon_g") is not None:
        c = profile.carbon
        how = "time-series mean" if c.get("time_series") else "at"
        lines.append(f"  carbon   {t['carbon_g']:.4g} gCO2eq {how} {c['intensity_g_per_kwh']:.4g} g/kWh ({c['source']}),"
                     f" PUE {c['pue']:g}  estimated")
    if t.get("cost") is not None and profile.carbon:
        lines.append(f"  cost     {t['cost']:.4g} {profile.carbon.get('currency', '')}")
    top = top_functions(profile)
    if top:
        lines.append("  top functions by self energy (all sources; \u00b1 = sampling error, 1/sqrt(samples)):")
        for row in top:
            e = row.self_total_energy
            share = e / total * 100 if total else 0.0
            err = row.relative_error
            where = f"{_short(row.file)}:{row.line}" if row.file else ""
            lines.append(f"    {fmt_energy(e):>9} {share:5.1f}% {'' if err is None else f'±{err * 100:.0f}%':>5}"
                         f"  {row.function}  {where}")
    for note in profile.notes:
        lines.append(f"  note: {note.get('message', note)}")
    return "\n".join(lines) + "\n"


def _methods(profile: Profile) -> str:
    methods = {s["method"] for s in profile.sources}
    if not methods:
        return "no energy source"
    return "measured" if methods == {"measured"} else ("estimated" if methods == {"estimated"} else "measured + estimated")


def _short(path: str) -> str:
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:]) if len(parts) > 2 else path
