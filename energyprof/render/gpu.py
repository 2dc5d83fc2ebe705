"""The report's GPU kernels panel: what render/page.py writes (None: no panel)."""

from __future__ import annotations

from typing import Any


from ..analysis.gpu import gpu_devices, gpu_functions, gpu_table

MAX_ROWS = 40


def gpu_panel(model: Any) -> dict[str, Any] | None:
    return gpu_figures(model.profile)


def gpu_figures(profile: Any) -> dict[str, Any] | None:
    """The GPU panel's figures from the profile's kernel facts (analysis/gpu.py): the page and
    `gpu-trace`'s console both read them, so their joules and bars are one computation."""
    gpu = gpu_table(profile)
    devices = [{"device": d, "source": v.source, "energy_j": v.energy_j, "idle_j": v.idle_j, "busy_s": v.busy_s,
                "update_period_s": v.update_period_s, "short_share": v.short_share, "idle_error_j": v.idle_error_j}
               for d, v in gpu_devices(profile)]
    if gpu is None or not devices:
        return None
    functions = gpu_functions(profile)
    # error_j: each function's bar from its tree nodes' (their stacks taken together), analysis/gpu.py
    rows = [{"function": f.function, "file": f.file, "line": f.line, "joules": f.joules, "error_j": f.error_j,
             "busy_s": f.busy_s, "kernels": f.top_kernels()} for f in functions[:MAX_ROWS]]
    sched = gpu.schedule
    schedule = None
    if sched is not None:  # --gpu-kernel-steps: which spans were profiled, and how much energy they held
        schedule = {"windows": len(sched.spans_ns), "profiled_s": sched.profiled_s,
                    "shares": [{"device": d, "percent": 100 * x} for d, x in sorted(sched.profiled_share.items())]}
    return {"devices": devices, "functions": rows, "more": max(0, len(functions) - MAX_ROWS), "schedule": schedule}


CONSOLE_LINES = 8  # functions shown: the panel's first rows


def function_label(row: dict[str, Any]) -> str:
    """A panel row as the console names it: the function, then where it is."""
    return f"{row['function']}  {row['file']}:{row['line']}" if row["file"] else str(row["function"])


def gpu_console(profile: Any) -> str:
    """`gpu-trace`'s console lines, from the same figures as the report's GPU panel (`gpu_figures`):
    per device its energy and [GPU idle] with its bar, then the panel's heaviest functions with their
    bars, then what of backward could not be linked (the profile's meta["backward"])."""
    from .format import fmt_energy, fmt_percent

    fig = gpu_figures(profile)
    if fig is None:
        return ""
    total = sum(d["energy_j"] for d in fig["devices"])
    out = ["  GPU energy by function, as the report's GPU panel (busy time split each power sample; a function holds the"
           " kernels of every launch stack it is on; \u00b1 = what the samples it shares with other lines could move,"
           " plus the sensor's error):"]
    for d in fig["devices"]:
        e, idle = d["energy_j"], d["idle_j"]
        kernels_j = e - idle
        out.append(f"    {d['source']} {fmt_energy(e):>9}  kernels {fmt_energy(kernels_j)} ({fmt_percent(kernels_j, e)}),"
                   f" [GPU idle] {fmt_energy(idle)} ({fmt_percent(idle, e)})")
        bar = d["idle_error_j"]
        out.append(f"      {fmt_energy(idle):>9} \u00b1 {'' if bar is None else fmt_energy(bar):<9} "
                   f"{fmt_percent(idle, e):>6}  [GPU idle]")
    for row in fig["functions"][:CONSOLE_LINES]:
        j = row["joules"]
        out.append(f"      {fmt_energy(j):>9} \u00b1 {fmt_energy(row['error_j']):<9} {fmt_percent(j, total):>6}  "
                   f"{function_label(row)}")
    more = len(fig["functions"]) - CONSOLE_LINES + fig["more"]
    if more > 0:
        out.append(f"      ({more} more functions: the report's GPU panel and the profile's gpu_kernels)")
    bw = profile.meta.get("backward")
    if isinstance(bw, dict) and bw.get("records"):
        line = (f"  backward: {bw.get('linked_records', 0)} of {bw['records']} device records under the forward line"
                " that made them")
        unlinked = bw.get("unlinked_records") or {}
        if unlinked:
            line += "; not linked: " + ", ".join(f"{n} ({r})" for r, n in sorted(unlinked.items(), key=lambda x: -x[1]))
        out.append(line)
    return "\n".join(out) + "\n"
