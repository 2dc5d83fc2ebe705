"""`--gpu-kernels`: the PyTorch profiler (Kineto) inside the profiled process, its trace handed to the supervisor.

The agent (stdlib only) imports this module, and so torch, only when the flag is given, in the
program's main process. The profiler records CPU operators, the CUDA/ROCm runtime calls and the
device records, with Python stacks, from the program's start to its exit (the whole run: Kineto
keeps its records in memory, so a long run pays for them; the report says so). At exit the trace
is written into the run's spool folder with the clock pair that ties it to energyprof's clock;
the supervisor reads it before removing the folder (`read_traces`).

Clocks: Kineto stamps host events on the Unix clock (`baseTimeNanoseconds + ts`), and CUPTI /
roctracer bring the device's timestamps onto it. energyprof stamps everything on perf_counter_ns.
`kineto.clock_offset` reads both clocks in a bracket and keeps the narrowest: the offset's error
is that bracket's half-width, well under a microsecond on an idle machine.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import time
from typing import Any

from . import kineto

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

TRACE_SUFFIX = ".kineto.json"
CLOCK_SUFFIX = ".kineto-clock.json"
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


class KernelCapture:
    """torch.profiler in this process, its trace written to `folder`: over the process's life, or,
    with `steps` (EVERY:ACTIVE[:WINDOWS]), only over ACTIVE steps of every EVERY, each window its own
    trace with its span on energyprof's clock. The profiler is per thread: it is started and stopped
    where the steps are marked (`step`, called by energyprof.torch.track in the training loop)."""

    def __init__(self, folder: str, activities: Any = None, steps: str | None = None) -> None:
        from ...setup.options import parse_kernel_steps

        self.folder = folder
        self.activities = activities
        self.schedule = parse_kernel_steps(steps) if steps else None
        self.prof: Any = None
        self.path = os.path.join(folder, f"{os.getpid()}{TRACE_SUFFIX}")
        self.steps = 0  # steps marked so far
        self.windows = 0  # windows begun
        self.t_start = 0
        self.live = False

    def _begin(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        acts = self.activities
        if acts is None:
            acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]  # ROCm builds report through the CUDA activity
        self.prof = profile(activities=acts, with_stack=True, record_shapes=False)
        self.t_start = time.perf_counter_ns()
        self.prof.start()

    def start(self) -> None:
        self.live = True
        if self.schedule is None:
            self._begin()
        atexit.register(self.stop)

    def step(self) -> None:
        """A step begins: open or close a window on the schedule (nothing for the whole-run profiler)."""
        if self.schedule is None or not self.live:
            return
        every, active, windows = self.schedule
        n, self.steps = self.steps, self.steps + 1
        if self.prof is not None and n % every == active:
            self._end()
        if self.prof is None and n % every == 0 and (not windows or self.windows < windows):
            self.windows += 1
            self._begin()

    def _end(self) -> str | None:
        prof, self.prof = self.prof, None
        if prof is None:
            return None
        prof.stop()
        t_end = time.perf_counter_ns()
        offset, error = kineto.clock_offset()
        path = self.path if self.schedule is None else self.path[: -len(TRACE_SUFFIX)] + f".w{self.windows}{TRACE_SUFFIX}"
        part = path + ".part"
        prof.export_chrome_trace(part)
        os.replace(part, path)
        clock: dict[str, Any] = {"unix_minus_perf_ns": offset, "error_ns": error}
        if self.schedule is not None:
            clock["span_ns"] = [self.t_start, t_end]
        with open(path[: -len(TRACE_SUFFIX)] + CLOCK_SUFFIX, "w", encoding="utf-8") as fh:
            json.dump(clock, fh)
        return path

    def stop(self) -> str | None:
        """Stop and write the (last) trace and its clock pair; the trace's path (None if none was open)."""
        self.live = False
        return self._end()


_capture: KernelCapture | None = None


def start_capture(folder: str, steps: str | None = None) -> KernelCapture:
    """The agent's entry: start the profiler in this process (once)."""
    global _capture
    if _capture is None:
        _capture = KernelCapture(folder, steps=steps)
        _capture.start()
    return _capture


def register(capture: KernelCapture | None) -> None:
    """The in-process Profiler's capture, so that marked steps reach it (None: unset)."""
    global _capture
    _capture = capture


def step() -> None:
    """A training step begins (energyprof.torch.track calls this): the scheduled profiler's cue."""
    if _capture is not None:
        _capture.step()


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
    import dataclasses

    return [dataclasses.replace(k, start_ns=k.start_ns + shift_ns, end_ns=k.end_ns + shift_ns) for k in kernels]


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
