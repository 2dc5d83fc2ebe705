"""`--gpu-kernels`, the supervisor's side: whether the flag can run here, the traces the program's
processes left (agent/kernel_capture.py runs the PyTorch profiler inside the program and writes
them, with the clock pair that ties each to energyprof's clock), and their kernels' joules moved
onto the launching lines.

Clocks: Kineto stamps host events on the Unix clock (`baseTimeNanoseconds + ts`), and CUPTI /
roctracer bring the device's timestamps onto it. energyprof stamps everything on perf_counter_ns;
the clock pair written beside each trace gives the offset and its error.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

from ...agent.kernel_capture import CLOCK_SUFFIX, TRACE_SUFFIX
from ...record import replace
from . import kineto

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

DEVICE_NODES = ("dev/nvidiactl", "dev/kfd", "dev/dxg")  # NVIDIA, AMD (ROCm), WSL; under $ENERGYPROF_DEV_ROOT (default /)
DEV_ROOT_ENV = "ENERGYPROF_DEV_ROOT"  # a fake device tree, as ENERGYPROF_POWERCAP_ROOT is a fake powercap tree


def unavailable() -> str | None:
    """Why --gpu-kernels cannot run here (one line), or None. Checked before the program starts,
    without importing torch (seconds) in the supervisor."""
    if importlib.util.find_spec("torch") is None:
        return "--gpu-kernels needs PyTorch (its profiler records the kernels), and torch is not installed"
    root = os.environ.get(DEV_ROOT_ENV) or "/"
    if not any(os.path.exists(os.path.join(root, p)) for p in DEVICE_NODES):
        return "--gpu-kernels: no GPU on this machine (no NVIDIA or AMD device node); leave the flag out"
    return None


def read_spans(folder: str) -> list[tuple[int, int]]:
    """The scheduled windows' spans on energyprof's clock ([] for a whole-run trace)."""
    spans = []
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(CLOCK_SUFFIX))
    except OSError:
        names = []
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                span = json.load(fh).get("span_ns")
        except (OSError, ValueError):
            continue
        if span:
            spans.append((int(span[0]), int(span[1])))
    return sorted(spans)


def read_traces(folder: str) -> tuple[list[kineto.Kernel], list[str], int, int]:
    """Every trace the run's processes left, as kernels on energyprof's clock (perf_counter_ns):
    (kernels, notes, the largest clock error in ns, traces read)."""
    kernels: list[kineto.Kernel] = []
    notes: list[str] = []
    worst = read = 0
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(TRACE_SUFFIX))
    except OSError:
        names = []
    for name in names:
        path = os.path.join(folder, name)
        try:
            with open(path[: -len(TRACE_SUFFIX)] + CLOCK_SUFFIX, encoding="utf-8") as fh:
                clock = json.load(fh)
            trace = kineto.load(path)
        except (OSError, ValueError) as exc:
            notes.append(f"--gpu-kernels: the trace {name} could not be read ({exc}); its kernels are left out")
            continue
        read += 1
        shift = trace.unix_base_ns - int(clock["unix_minus_perf_ns"])
        worst = max(worst, int(clock.get("error_ns", 0)))
        kernels.extend(to_clock(trace.kernels, shift))
        if trace.unmatched:
            notes.append(f"--gpu-kernels: {trace.unmatched} device record(s) had no launching call in the trace")
    return kernels, notes, worst, read


def to_clock(kernels: list[kineto.Kernel], shift_ns: int) -> list[kineto.Kernel]:
    return [replace(k, start_ns=k.start_ns + shift_ns, end_ns=k.end_ns + shift_ns) for k in kernels]


def attach_kernels(profile: Any, ledger: Any, traces: Any, collector: Any) -> None:
    """Move the GPU sources' joules onto the kernels' launch stacks; where there is no trace or no
    kernel (torch never used the GPU, a CUDA program that is not PyTorch), say that the wall-time
    rule stayed."""
    from ...core.gpu_tree import WALL_TIME_NOTE, regraft, timeline_intervals
    from ...facts.profile import Note

    kernels, notes, clock_error, read = traces[:4] if traces else ([], [], 0, 0)
    # a fifth item: the scheduled windows' spans (--gpu-kernel-steps); absent or None for the whole run
    spans = traces[4] if traces and len(traces) > 4 else None
    profile.notes.extend(Note("gpu-kernels", n) for n in notes)
    if spans is not None and not spans:
        profile.notes.append(Note("gpu-wall-time", f"{WALL_TIME_NOTE}; --gpu-kernel-steps profiled no window (no step"
                                  " was marked: the loop must iterate through energyprof.torch.track)"))
        return
    if not kernels:
        why = (f"--gpu-kernels found no kernel in the program's trace ({read} read: not PyTorch on the GPU, or no GPU"
               " work)") if read else "--gpu-kernels got no trace from the program (its profiler did not start or stop)"
        profile.notes.append(Note("gpu-wall-time", f"{WALL_TIME_NOTE}; {why}", {"traces": read}))
        return
    ids = list(ledger.source_ids)
    tl = ledger.timeline
    power = {}
    period = 0.0
    for k, sid in enumerate(ids):
        head, _, tail = sid.partition(":")
        if head == "gpu" and tail.isdigit():
            power[int(tail)] = timeline_intervals(tl.t0, tl.t1, tl.energy, k)
            src = next((s for s in profile.sources if s.id == sid), None)
            tick_ns = max(float(getattr(src, "update_period_s", 0.0) or 0.0), float(getattr(collector, "interval_s", 0.0) or 0.0))
            finer = driver_samples(collector, sid, power[int(tail)], tick_ns * 1e9)
            if finer is not None:  # the driver's buffered samples: power at its own rate, not the ticks'
                power[int(tail)], spacing = finer
                period = max(period, spacing)
                profile.notes.append(Note("gpu-power-samples", f"{sid}: the kernel split used the driver's {len(finer[0])}"
                                          f" buffered power samples (nvmlDeviceGetSamples, every {spacing / 1e6:.0f} ms,"
                                          " measured) for the shape of power over time; the total is the sensor's",
                                          {"source": sid, "samples": len(finer[0]), "period_ns": spacing}))
                continue
            if src is not None and src.update_period_s:
                period = max(period, float(src.update_period_s) * 1e9)
    if not power:
        profile.notes.append(Note("gpu-wall-time", WALL_TIME_NOTE + "; no GPU energy source was read"))
        return
    # no declared update period: the sensor interval is the finest the energy was seen at
    period = period or float(getattr(collector, "interval_s", 0.0)) * 1e9
    regraft(profile, kernels, power, period, package_dir=PACKAGE_DIR, clock_error_ns=clock_error, spans=spans or None)
    add_busy_lanes(profile, kernels, list(zip(tl.t0, tl.t1)), spans)


def add_busy_lanes(profile: Any, kernels: list[kineto.Kernel], cells: list[tuple[int, int]],
                   spans: list[tuple[int, int]] | None = None) -> None:
    """Each device's busy seconds per timeline cell, as [start_s, end_s, busy_s] on the profile's
    timeline clock, for the report's timeline (gpu_kernels.devices[d].busy_lane). With a schedule,
    a cell outside every window has busy None: not profiled, not idle."""
    from ...core.gpu_tree import GPU_FIELD, busy_per_cell

    gpu = profile.extra.get(GPU_FIELD)
    starts = getattr(profile.timeline, "start_s", None) or []
    cells = [(int(a), int(b)) for a, b in cells if b > a]
    if not gpu or not cells or not starts:
        return
    origin = cells[0][0] - round(starts[0] * 1e9)  # the timeline's zero on energyprof's clock
    for d, dev in gpu.get("devices", {}).items():
        busy = busy_per_cell([(k.start_ns, k.end_ns) for k in kernels if str(k.device) == d], cells)
        dev["busy_lane"] = [[(a - origin) / 1e9, (b - origin) / 1e9,
                             x if spans is None or any(s < b and a < t for s, t in spans) else None]
                            for (a, b), x in zip(cells, busy)]


def driver_samples(collector: Any, sid: str, ticks: list[tuple[int, int, float]],
                   tick_ns: float) -> tuple[list[Any], float] | None:
    """The source's driver power samples over the ticks' span, with their median spacing (ns), where
    its sensor kept some (NVML's nvmlDeviceGetSamples) closer together than the sensor's ticks
    (`tick_ns`: its update period or the collector's interval); None otherwise."""
    from ..sensors.gpu.power_samples import median_spacing_ns

    sensor = next((s for s in getattr(collector, "sensors", ()) or () if getattr(s, "id", None) == sid), None)
    buf = getattr(sensor, "samples", None)
    if not ticks or buf is None or len(getattr(buf, "samples", ())) < 2 or getattr(buf, "dropped", 0):
        return None  # past the buffer's cap the run's end has no samples: the ticks' power throughout
    spacing = median_spacing_ns(buf.samples)
    if not 0 < spacing < tick_ns:
        return None
    intervals = sensor.power_intervals(ticks[0][0], ticks[-1][1])
    return (intervals, spacing) if intervals else None
