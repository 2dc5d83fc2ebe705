"""The report's GPU kernels panel: what render/page.py writes (None: no panel)."""

from __future__ import annotations

from typing import Any

from ..analysis.gpu import gpu_devices, gpu_functions, gpu_table

MAX_ROWS = 40


def gpu_panel(model: Any) -> dict[str, Any] | None:
    devices = gpu_devices(model.profile)
    if not devices:
        return None
    functions = gpu_functions(model.profile)
    rows = [{"function": f.function, "file": f.file, "line": f.line, "joules": f.joules, "error_j": f.error_j,
             "busy_s": f.busy_s, "kernels": f.top_kernels()} for f in functions[:MAX_ROWS]]
    sched = (gpu_table(model.profile) or {}).get("schedule")
    schedule = None
    if sched:  # --gpu-kernel-steps: which spans were profiled, and how much energy they held
        shares = sched.get("profiled_share") or {}
        schedule = {"windows": len(sched.get("spans_ns") or []), "profiled_s": float(sched.get("profiled_s") or 0.0),
                    "shares": [{"device": d, "percent": 100 * float(x)} for d, x in sorted(shares.items())]}
    return {"devices": devices, "functions": rows, "more": max(0, len(functions) - MAX_ROWS), "schedule": schedule}
