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
from typing import Any

from ..collect.kernels import kineto

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
    """torch.profiler over the process's life, its trace written to `folder` at exit."""

    def __init__(self, folder: str, activities: Any = None) -> None:
        self.folder = folder
        self.activities = activities
        self.prof: Any = None
        self.path = os.path.join(folder, f"{os.getpid()}{TRACE_SUFFIX}")

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        acts = self.activities
        if acts is None:
            acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]  # ROCm builds report through the CUDA activity
        self.prof = profile(activities=acts, with_stack=True, record_shapes=False)
        self.prof.start()
        atexit.register(self.stop)

    def stop(self) -> str | None:
        """Stop and write the trace and its clock pair; the trace's path (None if already stopped)."""
        prof, self.prof = self.prof, None
        if prof is None:
            return None
        prof.stop()
        offset, error = kineto.clock_offset()
        part = self.path + ".part"
        prof.export_chrome_trace(part)
        os.replace(part, self.path)
        with open(self.path[: -len(TRACE_SUFFIX)] + CLOCK_SUFFIX, "w", encoding="utf-8") as fh:
            json.dump({"unix_minus_perf_ns": offset, "error_ns": error}, fh)
        return self.path


_capture: KernelCapture | None = None


def start_capture(folder: str) -> KernelCapture:
    """The agent's entry: start the profiler in this process (once)."""
    global _capture
    if _capture is None:
        _capture = KernelCapture(folder)
        _capture.start()
    return _capture


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
    from ..core.gpu_tree import WALL_TIME_NOTE, regraft, timeline_intervals
    from ..profile import Note

    kernels, notes, clock_error, read = traces if traces else ([], [], 0, 0)
    profile.notes.extend(Note("gpu-kernels", n) for n in notes)
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
            if src is not None and src.update_period_s:
                period = max(period, float(src.update_period_s) * 1e9)
    if not power:
        profile.notes.append(Note("gpu-wall-time", WALL_TIME_NOTE + "; no GPU energy source was read"))
        return
    # no declared update period: the sensor interval is the finest the energy was seen at
    period = period or float(getattr(collector, "interval_s", 0.0)) * 1e9
    regraft(profile, kernels, power, period, package_dir=PACKAGE_DIR, clock_error_ns=clock_error)
