"""Energy sources: one module per vendor or method, one small interface (base.Sensor)."""

from __future__ import annotations

from .base import Discovery, Sensor, SensorError

__all__ = ["Discovery", "Sensor", "SensorError", "discover"]


def discover(
    power_trace: str | None = None,
    powercap_root: str | None = None,
    cpu_tdp: float | None = None,
    gpus: bool = True,
) -> Discovery:
    """Every source this machine offers, and a line for each one it does not.

    A replayed trace, when given, is the only source. Otherwise RAPL for CPU and DRAM (the
    model when RAPL cannot be read) and NVML for NVIDIA GPUs.
    """
    if power_trace:
        from . import replay

        return replay.discover(power_trace)
    from . import estimate, rapl

    found = rapl.discover(powercap_root)
    if not any(s.component == "cpu" for s in found.sensors):
        est = estimate.discover(cpu_tdp, want_ram=not any(s.component == "dram" for s in found.sensors))
        found.sensors.extend(est.sensors)
        found.notes.extend(est.notes)
        found.notes.append("model: no readable CPU energy counter, so CPU (and RAM) power are estimates")
    if gpus:
        try:
            from .gpu import nvml
        except ImportError:
            pass
        else:
            gpu = nvml.discover()
            found.sensors.extend(gpu.sensors)
            found.notes.extend(gpu.notes)
    return found
