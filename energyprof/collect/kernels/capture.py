"""GPU kernels, the supervisor's side: whether `--gpu-kernels` can run here, and the split of each GPU
source's energy among the kernels the program reduced (agent/kernel_capture.py reduces each profiler
cycle in the program, agent/kernels/reduce.py; the job feed folds the records, core/gpu_tree.py's
KernelFold), made before the tree is built so that samples and kernels build it together.

Clocks: Kineto stamps host events on the Unix clock, and CUPTI / roctracer bring the device's
timestamps onto it. The program puts every record on perf_counter_ns (energyprof's clock) with the
offset it reads at each cycle's end (agent/kernel_capture.clock_offset).
"""

from __future__ import annotations

import os
from typing import Any

DEVICE_NODES = ("dev/nvidiactl", "dev/kfd", "dev/dxg")  # NVIDIA, AMD (ROCm), WSL; under $ENERGYPROF_DEV_ROOT (default /)
DEV_ROOT_ENV = "ENERGYPROF_DEV_ROOT"  # a fake device tree, as ENERGYPROF_POWERCAP_ROOT is a fake powercap tree


def unavailable() -> str | None:
    """Why --gpu-kernels cannot run here (one line), or None. Checked before the program starts,
    without importing torch (seconds) in the supervisor."""
    import importlib.util  # only asked with --gpu-kernels: it brings contextlib, functools and more to every run

    if importlib.util.find_spec("torch") is None:
        return "--gpu-kernels needs PyTorch (its profiler records the kernels), and torch is not installed"
    root = os.environ.get(DEV_ROOT_ENV) or "/"
    if not any(os.path.exists(os.path.join(root, p)) for p in DEVICE_NODES):
        return "--gpu-kernels: no GPU on this machine (no NVIDIA or AMD device node); leave the flag out"
    return None


def kernel_split(fold: Any, ledger: Any, collector: Any, sources: list[Any], *, mode: bool | None = True
                 ) -> tuple[Any, list[Any]]:
    """(the split of each GPU source's energy among the kernels, or None; the notes to add). Where there
    is no kernel (torch never used the GPU, a CUDA program that is not PyTorch, no step profiled), the
    wall-time rule stays and a note says that its GPU figures are where Python waited. `mode`: the
    capture was asked for (True), on by default (None) or turned off (False)."""
    split, notes = _gpu_split(fold, ledger, collector, sources, mode=mode)
    backward = getattr(fold, "backward", None)
    if backward:  # training: backward's CPU time per path, grafted onto the modules (core/backward.py)
        if split is None:
            from ...core.gpu_tree import KernelSplit

            split = KernelSplit(None, {}, {}, {}, list(fold.spans), fold.cycles, fold.records, dict(fold.counts))
        split.backward = backward
    return split, notes


def _gpu_split(fold: Any, ledger: Any, collector: Any, sources: list[Any], *, mode: bool | None = True
               ) -> tuple[Any, list[Any]]:
    ids = list(ledger.source_ids)
    gpus = [sid for sid in ids if sid.partition(":")[0] == "gpu" and sid.partition(":")[2].isdigit()]
    notes: list[Any] = []
    if not gpus:  # most runs: nothing of the kernels' maths is loaded for them
        return None, notes
    from ...core.gpu_tree import WALL_TIME_NOTE, split_kernels, timeline_intervals
    from ...facts.profile import Note
    if fold is None or not fold:
        if mode:
            why = ("no profiler cycle ended (no kernel capture ran: not PyTorch on the GPU, or no GPU work)"
                   if fold is None or not fold.cycles else
                   f"the profiler's {fold.cycles} cycle(s) held no GPU kernel (not PyTorch on the GPU, or no GPU work)")
            notes.append(Note("gpu-wall-time", f"{WALL_TIME_NOTE}; --gpu-kernels: {why}",
                              {"cycles": fold.cycles if fold is not None else 0}))
        elif mode is False:
            notes.append(Note("gpu-wall-time", f"{WALL_TIME_NOTE} (--no-gpu-kernels: the kernel capture was off)",
                              {"cycles": 0}))
        else:
            notes.append(Note("gpu-wall-time", f"{WALL_TIME_NOTE} (the kernel capture, on by default when the"
                              " program uses CUDA through PyTorch, did not run"
                              + (f": {fold.cycles} cycle(s) held no GPU kernel)" if fold is not None and fold.cycles
                                 else ")"), {"cycles": fold.cycles if fold is not None else 0}))
        return None, notes
    tl = ledger.timeline
    power: dict[int, Any] = {}
    period: dict[int, float] = {}
    interval_ns = float(getattr(collector, "interval_s", 0.0) or 0.0) * 1e9
    for k, sid in enumerate(ids):
        if sid not in gpus:
            continue
        d = int(sid.partition(":")[2])
        power[d] = timeline_intervals(tl.t0, tl.t1, tl.energy, k)
        src = next((s for s in sources if _get(s, "id") == sid), None)
        declared = float(_get(src, "update_period_s", 0.0) or 0.0) * 1e9
        finer = driver_samples(collector, sid, power[d], max(declared, interval_ns))
        if finer is not None:  # the driver's buffered samples: power at its own rate, not the ticks'
            power[d], spacing = finer
            period[d] = spacing
            notes.append(Note("gpu-power-samples", f"{sid}: the kernel split used the driver's {len(finer[0])}"
                              f" buffered power samples (nvmlDeviceGetSamples, every {spacing / 1e6:.0f} ms,"
                              " measured) for the shape of power over time; the total is the sensor's",
                              {"source": sid, "samples": len(finer[0]), "period_ns": spacing}))
            continue
        # no declared update period: the sensor interval is the finest the energy was seen at
        period[d] = declared or interval_ns
    split = split_kernels(fold, power, period, sources=gpus)
    if split is None:
        notes.append(Note("gpu-wall-time", f"{WALL_TIME_NOTE}; no GPU source matched the kernels' devices"))
        return None, notes
    split.lanes = busy_lanes(fold, split.devices, list(zip(tl.t0, tl.t1)), int(ledger.first_ns or 0))
    return split, notes


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def busy_lanes(fold: Any, devices: Any, cells: list[tuple[int, int]], origin_ns: int) -> dict[int, list[list[Any]]]:
    """Each device's busy seconds per timeline cell, as [start_s, end_s, busy_s] from `origin_ns` (the
    profile timeline's zero), for the report's timeline (gpu_kernels.devices[d].busy_lane). A cell
    outside every profiled cycle has busy None: not profiled, not idle."""
    from ...core.gpu_tree import busy_cells

    cells = [(int(a), int(b)) for a, b in cells if b > a]
    out: dict[int, list[list[Any]]] = {}
    if not cells:
        return out
    spans = fold.spans
    for d in devices:
        busy = busy_cells(fold, int(d), cells)
        out[int(d)] = [[(a - origin_ns) / 1e9, (b - origin_ns) / 1e9,
                        x if any(s < b and a < t for s, t in spans) else None] for (a, b), x in zip(cells, busy)]
    return out


def driver_samples(collector: Any, sid: str, ticks: list[tuple[int, int, float]],
                   tick_ns: float) -> tuple[list[Any], float] | None:
    """The source's driver power samples over the ticks' span, with their median spacing (ns), where
    its sensor keeps some (`Sensor.power_intervals`, NVML's nvmlDeviceGetSamples) closer together than
    the sensor's ticks (`tick_ns`: its update period or the collector's interval); None otherwise."""
    sensor = next((s for s in getattr(collector, "sensors", ()) or () if getattr(s, "id", None) == sid), None)
    if not ticks or sensor is None:
        return None
    got = sensor.power_intervals(ticks[0][0], ticks[-1][1])
    if got is None or not 0 < got[1] < tick_ns:
        return None
    return got
