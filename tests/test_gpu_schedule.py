"""--gpu-kernel-steps: the profiler on a schedule of step windows, and the split confined to them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from energyprof.core.gpu_tree import GPU_FIELD, clip_intervals, regraft
from energyprof.core.kernels import GPU_IDLE_NODE
from energyprof.options import OptionError, Options, parse_kernel_steps
from test_gpu_kernels import MS, _kernel, _sampled_profile


def test_step_spec_is_parsed_and_bad_ones_refused():
    assert parse_kernel_steps("100:5") == (100, 5, 0)
    assert parse_kernel_steps("10:2:3") == (10, 2, 3)
    for bad in ("5", "5:6", "0:0", "a:b", "10:2:-1", "1:1:1:1"):
        with pytest.raises(OptionError, match="--gpu-kernel-steps"):
            parse_kernel_steps(bad)
    with pytest.raises(OptionError, match="give --gpu-kernels too"):
        Options(gpu_kernel_steps="10:2")
    assert Options(gpu_kernels=True, gpu_kernel_steps="10:2").gpu_kernel_steps == "10:2"


def test_clip_keeps_each_intervals_time_share():
    got = clip_intervals([(0, 100, 10.0), (100, 200, 4.0)], [(50, 150)])
    assert got == [(50, 100, 5.0), (100, 150, 2.0)]
    assert clip_intervals([(0, 100, 10.0)], [(200, 300)]) == []


def test_outside_the_windows_the_energy_stays_on_the_wall_time_rule():
    before = _sampled_profile()
    prof = copy.deepcopy(before)
    fwd_path = [("<module>", "train.py", 42), ("train", "train.py", 5), ("forward", "model.py", 20)]
    # 100 ms at a flat 100 W (10 J); the profiler ran over the first 50 ms, a kernel busy 30 ms of them
    regraft(prof, [_kernel("gemm", 10, 30, fwd_path)], {0: [(0, 100 * MS, 10.0)]}, period_ns=0, spans=[(0, 50 * MS)])
    prof.root.fill_inclusive()
    def gpu(p, name):
        return p.find(name)[0].self_energy_j.get("gpu:0", 0.0)

    # half the device's energy fell inside the window: the program's 10 J -> 5 J split, 5 J kept in place
    assert gpu(prof, "item_wait") == pytest.approx(gpu(before, "item_wait") / 2) and gpu(before, "item_wait") == 9.0
    fwd_before, fwd_after = before.find("Net.forward")[0].energy_j["gpu:0"], prof.find("Net.forward")[0].energy_j["gpu:0"]
    assert fwd_after == pytest.approx(fwd_before / 2 + 3.0)  # 30 ms busy of the window's 5 J
    assert prof.find(GPU_IDLE_NODE)[0].self_energy_j["gpu:0"] == pytest.approx(2.0)
    assert prof.root.energy_j["gpu:0"] == pytest.approx(before.root.energy_j["gpu:0"], rel=1e-12)  # conservation
    sched = prof.extra[GPU_FIELD]["schedule"]
    assert sched["profiled_share"]["0"] == pytest.approx(0.5) and sched["spans_ns"] == [[0, 50 * MS]]
    (note,) = [n for n in prof.notes if n.kind == "gpu-kernels-schedule"]
    assert "1 window(s)" in note.message and "5.000 J" in note.message and "wall time" in note.message


def test_scheduled_capture_on_real_torch_records_only_the_scheduled_steps(tmp_path):
    """A CPU loop of 12 steps under EVERY=4, ACTIVE=1, WINDOWS=2: two traces, holding steps 0 and 4
    only, each with its span on perf_counter_ns around its own step."""
    torch = pytest.importorskip("torch")
    import time

    from torch.profiler import ProfilerActivity, record_function

    from energyprof.integrations import gpu_kernels
    from energyprof.integrations.gpu_kernels import KernelCapture, read_spans, read_traces

    cap = KernelCapture(str(tmp_path), activities=[ProfilerActivity.CPU], steps="4:1:2")
    cap.start()
    gpu_kernels.register(cap)
    try:
        marks = {}
        a = torch.randn(32, 32)
        for n in range(12):
            gpu_kernels.step()  # as energyprof.torch.track does at each step's start
            t0 = time.perf_counter_ns()
            with record_function(f"step{n}"):
                (a @ a).sum()
            marks[n] = (t0, time.perf_counter_ns())
        cap.stop()
    finally:
        gpu_kernels.register(None)
    traces = sorted(tmp_path.glob("*.kineto.json"))
    assert len(traces) == 2
    seen = set()
    for t in traces:
        names = {e.get("name") for e in json.loads(t.read_text())["traceEvents"]}
        seen |= {x for x in names if str(x).startswith("step")}
    assert seen == {"step0", "step4"}
    spans = read_spans(str(tmp_path))
    assert len(spans) == 2
    for (s, e), n in zip(spans, (0, 4)):
        assert s <= marks[n][0] and marks[n][1] <= e  # the window holds its step
        assert e <= marks[n + 1][1]  # and closed at the next step's start
    kernels, notes, _, read = read_traces(str(tmp_path))
    assert read == 2 and kernels == [] and notes == []


def test_no_marked_step_leaves_the_wall_time_rule_and_says_why():
    from energyprof.integrations.gpu_kernels import attach_kernels

    prof = _sampled_profile()
    attach_kernels(prof, None, ([], [], 0, 0, []), None)
    assert any(n.kind == "gpu-wall-time" and "no window" in n.message for n in prof.notes)
    assert prof.find("item_wait")[0].self_energy_j["gpu:0"] == 9.0
