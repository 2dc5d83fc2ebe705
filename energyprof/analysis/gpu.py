"""GPU figures per function from a profile's kernel table (`gpu_kernels`, core/gpu_tree.py). Pure.

A function's GPU joules are those of every launch stack it is on (counted once per stack, so a
recursive function is not counted twice), with the kernels of those stacks merged by name. Its
error bar is the sum of its kernels' (a worst case: their errors are not assumed to cancel).
"""

from __future__ import annotations

from typing import Any

from ..record import field, record
from ..facts.profile import Profile

GPU_FIELD = "gpu_kernels"
TOP_KERNELS = 10


@record
class GpuFunction:
    function: str
    file: str
    line: int
    joules: float = 0.0
    error_j: float = 0.0
    busy_s: float = 0.0
    kernels: dict[str, dict[str, Any]] = field(default_factory=dict)

    def top_kernels(self, n: int = TOP_KERNELS) -> list[dict[str, Any]]:
        return sorted(self.kernels.values(), key=lambda k: -k["joules"])[:n]


def gpu_table(profile: Profile) -> dict[str, Any] | None:
    """The profile's kernel table, or None when it has none (a run without GPU kernels)."""
    gpu = profile.extra.get(GPU_FIELD)
    return gpu if isinstance(gpu, dict) and isinstance(gpu.get("stacks"), list) else None


def gpu_functions(profile: Profile) -> list[GpuFunction]:
    """Every frame on a launch stack with its inclusive GPU figures, most joules first."""
    gpu = gpu_table(profile)
    if gpu is None:
        return []
    rows: dict[tuple[str, str, int], GpuFunction] = {}
    for stack in gpu["stacks"]:
        seen: set[tuple[str, str, int]] = set()
        for frame in stack.get("path", []):
            key = (str(frame[0]), str(frame[1]), int(frame[2]))
            if key in seen:
                continue
            seen.add(key)
            row = rows.get(key)
            if row is None:
                row = rows[key] = GpuFunction(*key)
            row.joules += float(stack.get("joules", 0.0))
            row.error_j += float(stack.get("error_j", 0.0))
            row.busy_s += float(stack.get("busy_s", 0.0))
            for k in stack.get("kernels", []):
                m = row.kernels.setdefault(str(k["name"]), {"name": str(k["name"]), "count": 0, "time_s": 0.0, "joules": 0.0})
                m["count"] += int(k["count"])
                m["time_s"] += float(k["time_s"])
                m["joules"] += float(k["joules"])
    return sorted(rows.values(), key=lambda r: -r.joules)


def gpu_devices(profile: Profile) -> list[dict[str, Any]]:
    """Per device: energy, idle, busy time and the share from records shorter than the sensor sees."""
    gpu = gpu_table(profile)
    if gpu is None:
        return []
    return [dict(v, device=k) for k, v in sorted((gpu.get("devices") or {}).items())]
