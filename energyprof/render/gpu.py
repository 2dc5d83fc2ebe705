"""The report's GPU kernels panel: what render/page.py writes (None: no panel)."""

from __future__ import annotations

from typing import Any

from ..analysis.gpu import gpu_devices, gpu_functions

MAX_ROWS = 40


def gpu_panel(model: Any) -> dict[str, Any] | None:
    devices = gpu_devices(model.profile)
    if not devices:
        return None
    functions = gpu_functions(model.profile)
    rows = [{"function": f.function, "file": f.file, "line": f.line, "joules": f.joules, "error_j": f.error_j,
             "busy_s": f.busy_s, "kernels": f.top_kernels()} for f in functions[:MAX_ROWS]]
    return {"devices": devices, "functions": rows, "more": max(0, len(functions) - MAX_ROWS)}
