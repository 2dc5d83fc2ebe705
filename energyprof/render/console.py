"""The short summary printed on stderr at the end of a run."""

from __future__ import annotations

from ..profile import SPECIAL_NODES, Node, Profile


def fmt_energy(j: float) -> str:
    if j >= 3600:
        return f"{j:,.0f} J ({j / 3600:.3f} Wh)"
    if j >= 1:
        return f"{j:.2f} J"
    return f"{j * 1000:.1f} mJ"


def top_functions(profile: Profile, n: int = 8) -> list[tuple[Node, float]]:
    """Functions by self energy, merged over call paths (the flat view users ask first)."""
    by_fn: dict[tuple[str, str, int], tuple[Node, float, int]] = {}
    for node, depth in profile.nodes():
        if depth == 0 or node.function in SPECIAL_NODES:
            continue
        key = (node.function, node.file, node.line)
        prev = by_fn.get(key)
        e = node.self_total_energy
        by_fn[key] = (prev[0] if prev else node, (prev[1] if prev else 0.0) + e, (prev[2] if prev else 0) + node.self_samples)
    ranked = sorted(by_fn.values(), key=lambda t: -t[1])
    return [(node, e) for node, e, _ in ranked[:n] if e > 0]


def render_summary(profile: Profile) -> str:
    t = profile.totals
    lines = ["", f"energyprof: {profile.meta.get('target', '<program>')} ran {t['duration_s']:.2f} s,"
             f" CPU {t.get('cpu_time_s', 0.0):.2f} s, idle policy {profile.meta.get('idle_policy')}"]
    for src in profile.sources:
        sid = src["id"]
        total = t["energy_j"].get(sid, 0.0)
        mine = t["attributed_j"].get(sid, 0.0)
        lines.append(f"  {sid:<8} {fmt_energy(total):>24}  {src['method']:<9} ({src['sensor']})"
                     f"  program: {fmt_energy(mine)}")
    total = profile.total_energy_j
    lines.append(f"  {'total':<8} {fmt_energy(total):>24}  {_methods(profile)}")
    if profile.carbon and t.get("carbon_g") is not None:
        c = profile.carbon
        how = "time-series mean" if c.get("time_series") else "at"
        lines.append(f"  carbon   {t['carbon_g']:.4g} gCO2eq {how} {c['intensity_g_per_kwh']:.4g} g/kWh ({c['source']}),"
                     f" PUE {c['pue']:g}  estimated")
    if t.get("cost") is not None and profile.carbon:
        lines.append(f"  cost     {t['cost']:.4g} {profile.carbon.get('currency', '')}")
    top = top_functions(profile)
    if top:
        lines.append("  top functions by self energy (all sources):")
        for node, e in top:
            share = e / total * 100 if total else 0.0
            where = f"{_short(node.file)}:{node.line}" if node.file else ""
            lines.append(f"    {fmt_energy(e):>14} {share:5.1f}%  {node.function}  {where}")
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
