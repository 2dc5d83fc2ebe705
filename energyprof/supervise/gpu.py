"""--gpu-kernels, the supervisor's side: the program's kernel traces into the built profile."""

from __future__ import annotations

import os
from typing import Any

from ..core.gpu_tree import WALL_TIME_NOTE, regraft, timeline_intervals
from ..profile import Note, Profile

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def attach_kernels(profile: Profile, ledger: Any, traces: Any, collector: Any) -> None:
    """Move the GPU sources' joules onto the kernels' launch stacks; where there is no trace or no
    kernel (torch never used the GPU, a CUDA program that is not PyTorch), say that the wall-time
    rule stayed."""
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
    regraft(profile, kernels, power, period or float(collector.interval_s * 1e9 if hasattr(collector, "interval_s") else 0),
            package_dir=PACKAGE_DIR, clock_error_ns=clock_error)
