"""Energy sources: one module per vendor or method, one small interface (base.Sensor).

`discover` chooses what a run reads. Left to itself: a replayed trace alone when given; else a
system-on-chip's own tool where there is one (jtop or tegrastats on a Jetson, macmon or
powermetrics on a Mac), which covers the whole module; else RAPL for CPU and DRAM (powercap,
then the privileged reader, then the `power` perf events) and the model when none can be
read; and the GPUs (NVML, amdsmi). Named backends (`--sensor`) are used alone, in the order
given, on any platform. Every backend not found leaves the step that would enable it in
`Discovery.missing` (what `energyprof sensors` prints). A backend's module is imported only where
presence.py's cheap check finds its hardware, tool or binding (or a fake one injected into it).
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence

from ...setup.options import SENSORS
from . import presence
from .base import Discovery, Sensor, SensorError

__all__ = ["Discovery", "Sensor", "SensorError", "discover", "survey", "SENSORS"]


def _rapl(ctx: dict, explicit: bool) -> Discovery:
    found = presence.no_rapl(ctx["powercap_root"])
    if found is None:
        from . import rapl

        found = rapl.discover(ctx["powercap_root"], cpu_tdp=ctx.get("cpu_tdp"))
    if not found.sensors:
        why = next((n for n in found.notes if n.startswith("RAPL")), "RAPL: not found").removeprefix("RAPL: ")
        if "permission denied" not in why:
            why += ("; on an Intel or AMD machine load the driver (sudo modprobe intel_rapl_msr); "
                    "most VMs expose no RAPL")
        found.missing["rapl"] = why
        served = presence.no_served(explicit=explicit)
        if served is None:
            from . import served as client

            served = client.discover(explicit=explicit)
        found.extend(served)
        if found.sensors:
            found.missing.pop("rapl", None)
    return found


def _perf(ctx: dict, explicit: bool) -> Discovery:
    absent = presence.no_perf(explicit=explicit)
    if absent is not None:  # no power PMU: perf.py and its ctypes structure are not imported
        return absent
    from . import perf

    return perf.discover(explicit=explicit, cpu_tdp=ctx.get("cpu_tdp"))


def _nvml(ctx: dict, explicit: bool) -> Discovery:
    found = presence.no_nvml(explicit)  # no driver: not even the device layer is imported
    if found is None:
        found = _nvml_binding(explicit)
    if not found.sensors:
        found.missing["nvml"] = "; ".join(found.notes) or "NVML found no GPU"
    return found


def _nvml_binding(explicit: bool) -> Discovery:
    from .gpu import nvml_device

    nv, why = nvml_device.load_binding(explicit=explicit)
    if nv is None:  # no binding: nvml.py, its numbering and its sharing are not imported (2 ms)
        found = Discovery()
        found.notes.append(why or "NVML: unavailable")
    else:
        from .gpu import nvml

        found = nvml.discover(binding=nv)
    return found


def _amdsmi(ctx: dict, explicit: bool) -> Discovery:
    absent = presence.no_amdsmi(explicit)
    if absent is not None:  # amdsmi.py imports NVML's numbering and sharing: 1.5 ms to say there is none
        return absent
    from .gpu import amdsmi

    return amdsmi.discover(explicit=explicit)


def _tegrastats(ctx: dict, explicit: bool) -> Discovery:
    absent = presence.no_tool("tegrastats", explicit)  # the tools' modules import subprocess and their parsers
    if absent is not None:
        return absent
    from .soc import tegrastats

    return tegrastats.discover(explicit=explicit)


def _jtop(ctx: dict, explicit: bool) -> Discovery:
    absent = presence.no_jtop(explicit)
    if absent is not None:
        return absent
    from .soc import jtop

    return jtop.discover(explicit=explicit)


def _powermetrics(ctx: dict, explicit: bool) -> Discovery:
    absent = presence.no_tool("powermetrics", explicit)
    if absent is not None:
        return absent
    from .soc import powermetrics

    return powermetrics.discover(explicit=explicit)


def _macmon(ctx: dict, explicit: bool) -> Discovery:
    absent = presence.no_tool("macmon", explicit)
    if absent is not None:
        return absent
    from .soc import macmon

    return macmon.discover(explicit=explicit)


def _model(ctx: dict, explicit: bool) -> Discovery:
    from . import estimate

    return estimate.discover(ctx["cpu_tdp"], want_ram=not ctx.get("has_dram", False))


def _replay(ctx: dict, explicit: bool) -> Discovery:
    from . import replay

    if not ctx["power_trace"]:
        found = Discovery()
        found.notes.append("replay: no --power-trace given")
        return found
    return replay.discover(ctx["power_trace"])


BACKENDS: dict[str, Callable[[dict, bool], Discovery]] = {
    "rapl": _rapl, "perf": _perf, "nvml": _nvml, "amdsmi": _amdsmi, "tegrastats": _tegrastats, "jtop": _jtop,
    "powermetrics": _powermetrics, "macmon": _macmon, "model": _model, "replay": _replay,
}
assert tuple(BACKENDS) == SENSORS


def _add(found: Discovery, part: Discovery, name: str) -> None:
    """Add a backend's sources, leaving out any whose id another backend already gave (two
    sources of one name would be one machine counted twice)."""
    ids = {s.id for s in found.sensors}
    for s in part.sensors:
        if s.id in ids:
            found.notes.append(f"{name}: {s.id} is already read by {next(o.sensor for o in found.sensors if o.id == s.id)}; "
                               "not read twice")
            s.close()
    part.sensors = [s for s in part.sensors if s.id not in ids]
    found.extend(part)


def discover(
    power_trace: str | None = None,
    powercap_root: str | None = None,
    cpu_tdp: float | None = None,
    gpus: bool = True,
    only: Sequence[str] | None = None,
) -> Discovery:
    """Every source this machine offers (or only the named backends), and a line for each one it does not."""
    ctx = {"power_trace": power_trace, "powercap_root": powercap_root, "cpu_tdp": cpu_tdp}
    found = Discovery()
    if only:
        for name in dict.fromkeys(only):
            ctx["has_dram"] = any(s.component in ("dram", "ram") for s in found.sensors)
            _add(found, BACKENDS[name](ctx, True), name)
        return found
    if power_trace:
        return _replay(ctx, False)
    for name in _soc_backends():
        part = BACKENDS[name](ctx, False)
        _add(found, part, name)
        if part.sensors:
            break
    if not found.sensors:
        for name in ("rapl", "perf"):
            _add(found, BACKENDS[name](ctx, False), name)
            if any(s.component == "cpu" for s in found.sensors):
                break
        if not any(s.component == "cpu" for s in found.sensors):
            ctx["has_dram"] = any(s.component == "dram" for s in found.sensors)
            _add(found, _model(ctx, False), "model")
            found.notes.append("model: no readable CPU energy counter, so CPU (and RAM) power are estimates")
    if gpus:
        for name in ("nvml", "amdsmi"):
            _add(found, BACKENDS[name](ctx, False), name)
    return found


def _soc_backends() -> tuple[str, ...]:
    """The system-on-chip tools that apply here, best first (a Python API before a child tool)."""
    if sys.platform == "darwin":
        return ("macmon", "powermetrics")
    return ("jtop", "tegrastats") if presence.on_jetson() else ()


def survey(powercap_root: str | None = None) -> Discovery:
    """Every backend tried, whatever the platform (for `energyprof sensors`): what each finds,
    and the step that would enable each one that finds nothing."""
    ctx = {"power_trace": None, "powercap_root": powercap_root, "cpu_tdp": None}
    found = Discovery()
    for name in SENSORS:
        if name in ("model", "replay"):
            continue
        part = BACKENDS[name](ctx, False)
        if not part.sensors and name not in part.missing:
            part.missing[name] = "; ".join(part.notes) or "not found"
        _add(found, part, name)
    return found
