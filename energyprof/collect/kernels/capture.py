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
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from ...core.gpu_tree import DevicePower, KernelFold, KernelSplit
    from ...core.ledger import Ledger
    from ...facts.profile import Note
    from ..collector import Collector
    from ..sensors.base import Sensor

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


def kernel_split(fold: KernelFold | None, ledger: Ledger, collector: Collector | None, *, mode: bool | None = True
                 ) -> tuple[KernelSplit | None, list[Note]]:
    """(the split of each GPU source's energy among the kernels, or None; the notes to add). Where there
    is no kernel (torch never used the GPU, a CUDA program that is not PyTorch, no step profiled), the
    wall-time rule stays and a note says that its GPU figures are where Python waited. `mode`: the
    capture was asked for (True), on by default (None) or turned off (False). `collector`: the sensors
    that read the run (None: the ledger's sources alone, as a replayed fold)."""
    split, notes = _gpu_split(fold, ledger, collector, mode=mode)
    if fold is not None and fold.backward:  # training: backward's CPU time per path, grafted onto the modules
        from ...core.gpu_tree import KernelSplit

        if split is None:
            split = KernelSplit(None, {}, {}, {}, list(fold.spans), fold.cycles, fold.records, dict(fold.counts))
        split.backward = fold.backward
    return split, notes


def _gpu_split(fold: KernelFold | None, ledger: Ledger, collector: Collector | None, *, mode: bool | None = True
               ) -> tuple[KernelSplit | None, list[Note]]:
    ids = list(ledger.source_ids)
    gpus = [sid for sid in ids if sid.partition(":")[0] == "gpu" and sid.partition(":")[2].isdigit()]
    if not gpus:  # most runs: nothing of the kernels' maths is loaded for them
        return None, []
    from ...core.gpu_tree import split_run
    from ...facts.profile import Note

    if fold is None or not fold:
        return None, [_wall_time_note(fold, mode)]
    notes: list[Note] = []
    power = []
    for sid in gpus:
        got = _device_power(ledger, collector, sid)
        power.append(got[0])
        if got[1] is not None:
            notes.append(got[1])
    split = split_run(fold, power)
    if split is None:
        from ...core.gpu_tree import WALL_TIME_NOTE

        notes.append(Note("gpu-wall-time", f"{WALL_TIME_NOTE}; no GPU source matched the kernels' devices"))
        return None, notes
    tl = ledger.timeline
    split.lanes = busy_lanes(fold, split.devices, list(zip(tl.t0, tl.t1)), int(ledger.first_ns or 0))
    return split, notes


def _wall_time_note(fold: KernelFold | None, mode: bool | None) -> Note:
    """Why the GPU figures stay where Python waited: no cycle, or cycles without a kernel."""
    from ...core.gpu_tree import WALL_TIME_NOTE
    from ...facts.profile import Note

    cycles = fold.cycles if fold is not None else 0
    if mode:
        why = ("no profiler cycle ended (no kernel capture ran: not PyTorch on the GPU, or no GPU work)" if not cycles
               else f"the profiler's {cycles} cycle(s) held no GPU kernel (not PyTorch on the GPU, or no GPU work)")
        return Note("gpu-wall-time", f"{WALL_TIME_NOTE}; --gpu-kernels: {why}", {"cycles": cycles})
    if mode is False:
        return Note("gpu-wall-time", f"{WALL_TIME_NOTE} (--no-gpu-kernels: the kernel capture was off)", {"cycles": 0})
    return Note("gpu-wall-time", f"{WALL_TIME_NOTE} (the kernel capture, on by default when the program uses CUDA"
                " through PyTorch, did not run" + (f": {cycles} cycle(s) held no GPU kernel)" if cycles else ")"),
                {"cycles": cycles})


def _device_power(ledger: Ledger, collector: Collector | None, sid: str) -> tuple[DevicePower, Note | None]:
    """One GPU source's power for the split: the ledger's timeline at the sensor's period, or its driver's
    finer samples where it keeps any (with a note saying so)."""
    from ...core.gpu_tree import DevicePower, timeline_intervals

    tl = ledger.timeline
    d = int(sid.partition(":")[2])
    ticks = timeline_intervals(tl.t0, tl.t1, tl.energy, ledger.source_ids.index(sid))
    sensor = next((s for s in collector.sensors if s.id == sid), None) if collector is not None else None
    declared = _declared_period(ledger, sid)
    interval_ns = collector.interval_s * 1e9 if collector is not None else 0.0
    tick_ns = max((declared or 0.0) * 1e9, interval_ns)
    finer = driver_samples(sensor, ticks, tick_ns)
    if finer is None:  # no declared update period: the sensor interval is the finest the energy was seen at
        return DevicePower(d, sid, ticks, (declared or 0.0) * 1e9 or interval_ns), None
    from ...facts.profile import Note

    intervals, spacing = finer
    return DevicePower(d, sid, intervals, spacing), Note(
        "gpu-power-samples", f"{sid}: the kernel split used the driver's {len(intervals)} buffered power samples"
        f" (nvmlDeviceGetSamples, every {spacing / 1e6:.0f} ms, measured) for the shape of power over time; the"
        " total is the sensor's", {"source": sid, "samples": len(intervals), "period_ns": spacing})


def _declared_period(ledger: Ledger, sid: str) -> float | None:
    """The update period (s) the source's description in the ledger declares (None: none declared)."""
    period = ledger.sources[ledger.source_ids.index(sid)].get("update_period_s")
    return float(period) if isinstance(period, (int, float)) else None


def busy_lanes(fold: KernelFold, devices: Iterable[int], cells: list[tuple[int, int]], origin_ns: int
               ) -> dict[int, list[list[float | None]]]:
    """Each device's busy seconds per timeline cell, as [start_s, end_s, busy_s] from `origin_ns` (the
    profile timeline's zero), for the report's timeline (gpu_kernels.devices[d].busy_lane). A cell
    outside every profiled cycle has busy None: not profiled, not idle."""
    from ...core.gpu_tree import busy_cells

    cells = [(int(a), int(b)) for a, b in cells if b > a]
    out: dict[int, list[list[float | None]]] = {}
    if not cells:
        return out
    spans = fold.spans
    for d in devices:
        busy = busy_cells(fold, int(d), cells)
        out[int(d)] = [[(a - origin_ns) / 1e9, (b - origin_ns) / 1e9,
                        x if any(s < b and a < t for s, t in spans) else None] for (a, b), x in zip(cells, busy)]
    return out


def driver_samples(sensor: Sensor | None, ticks: list[tuple[int, int, float]],
                   tick_ns: float) -> tuple[list[tuple[int, int, float]], float] | None:
    """The sensor's own power samples over the ticks' span, with their median spacing (ns), where it keeps
    some (`Sensor.power_intervals`, NVML's nvmlDeviceGetSamples) closer together than its ticks (`tick_ns`:
    its update period or the collector's interval); None otherwise."""
    if not ticks or sensor is None:
        return None
    got = sensor.power_intervals(ticks[0][0], ticks[-1][1])
    if got is None or not 0 < got[1] < tick_ns:
        return None
    return got
