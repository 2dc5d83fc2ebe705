"""GPU energy on the kernels that drew it: the Kineto reader, the busy-time split and its error bars.

Traces: two real ones (an MI250 training step under ROCm 6.2, a CUDA autograd-thread fragment) and
one synthetic CUDA trace written by hand in Kineto's format (tests/fixtures/kineto/README.md).
Power is replayed; nothing else is faked. The PyTorch profiler runs for real on the CPU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energyprof.agent.kernel_capture import clock_offset
from energyprof.collect.kernels import kineto
from energyprof.core.gpu_tree import build_gpu_profile
from energyprof.core.kernels import GPU_IDLE_NODE, attribute, split_energy

KINETO = Path(__file__).parent / "fixtures" / "kineto"
MI250 = KINETO / "hta__amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz"
BACKWARD = KINETO / "hta__call_stack__backward_thread.json"
SYNTHETIC = KINETO / "synthetic_cuda_with_stack.json"
MS = 1_000_000


# ---------------------------------------------------------------- the split, known answers

def test_a_kernel_alone_for_10_ms_at_300_w_gets_3_j():
    s = split_energy([(0, 20 * MS, 300 * 0.020)], [(5 * MS, 15 * MS)])
    assert s.joules == [pytest.approx(3.0, rel=1e-12)]
    assert s.idle_j == pytest.approx(3.0, rel=1e-12)
    assert s.busy_union_ns == 10 * MS


def test_overlapping_kernels_share_each_instant():
    # [0,6) and [4,10) ms at 100 W: 4 ms alone each, 2 ms shared -> each 5 ms of busy time, 0.5 J.
    s = split_energy([(0, 10 * MS, 1.0)], [(0, 6 * MS), (4 * MS, 10 * MS)])
    assert s.joules == [pytest.approx(0.5), pytest.approx(0.5)]
    assert s.busy_ns == [pytest.approx(5 * MS), pytest.approx(5 * MS)]
    assert s.idle_j == pytest.approx(0.0, abs=1e-15)
    # three deep: the middle 1 ms is shared three ways
    s = split_energy([(0, 3 * MS, 3.0)], [(0, 2 * MS), (1 * MS, 3 * MS), (1 * MS, 2 * MS)])
    assert s.joules == [pytest.approx(1.0 + 1 / 3), pytest.approx(1.0 + 1 / 3), pytest.approx(1 / 3)]


def test_power_changes_inside_a_kernel_follow_each_interval():
    # 100 W for 5 ms then 400 W for 5 ms; the kernel spans [2, 8) ms: 3 ms x 100 W + 3 ms x 400 W = 1.5 J
    s = split_energy([(0, 5 * MS, 0.5), (5 * MS, 10 * MS, 2.0)], [(2 * MS, 8 * MS)])
    assert s.joules[0] == pytest.approx(1.5, rel=1e-12)
    assert s.idle_j == pytest.approx(1.0, rel=1e-12)


def test_busy_time_outside_the_power_log_holds_no_joules():
    s = split_energy([(0, 10 * MS, 1.0)], [(8 * MS, 14 * MS)])
    assert s.joules[0] == pytest.approx(0.2)
    assert s.unmeasured_busy_ns == 4 * MS
    assert s.joules[0] + s.idle_j == pytest.approx(s.total_j, rel=1e-12)


def test_overlapping_power_intervals_are_refused():
    with pytest.raises(ValueError):
        split_energy([(0, 10, 1.0), (5, 15, 1.0)], [])


intervals = st.lists(st.tuples(st.integers(1, 50_000), st.floats(0, 500, allow_nan=False)), min_size=1, max_size=12)
spans = st.lists(st.tuples(st.integers(-5_000, 400_000), st.integers(0, 60_000)), max_size=30)


@settings(max_examples=150, deadline=None)
@given(intervals, spans, st.integers(0, 10_000))
def test_conservation_property(widths, raw_spans, gap):
    ivs, t = [], 0
    for k, (w, watts) in enumerate(widths):
        ivs.append((t, t + w, watts * w / 1e9))
        t += w + (gap if k % 3 == 2 else 0)  # some gaps between intervals: unread time
    sp = [(s, s + d) for s, d in raw_spans]
    res = split_energy(ivs, sp)
    total = sum(j for _, _, j in ivs)
    assert sum(res.joules) + res.idle_j == pytest.approx(total, rel=1e-9, abs=1e-12)
    assert all(j >= 0 for j in res.joules) and res.idle_j >= -1e-12
    # a span's busy time never exceeds its duration, and shared busy time sums to the union of busy time
    assert all(b <= (e - s) + 1e-6 for b, (s, e) in zip(res.busy_ns, sp))
    assert sum(res.busy_ns) == pytest.approx(res.busy_union_ns, abs=1e-6 * max(1, len(sp)))


def test_short_share_and_the_bars_of_one_interval():
    att = attribute([("a", 0, "short", 0, 1 * MS), ("b", 0, "long", 10 * MS, 210 * MS)],
                    {0: [(0, 300 * MS, 90.0)]}, {0: 50 * MS})
    dev = att.devices[0]
    assert dev.short_j == pytest.approx(0.3)  # the 1 ms kernel: 300 W x 1 ms
    assert dev.short_share == pytest.approx(0.3 / 90.0)
    # one interval and no hotter one: its power is taken as flat (the peak is its own mean), so the
    # bars are the sensor's 5% alone (tests/test_gpu_error_bars.py tests the bars)
    assert att.stacks["a"][0].error_j == pytest.approx(0.05 * 0.3)
    assert att.stacks["b"][0].error_j == pytest.approx(0.05 * 60.0)


# ---------------------------------------------------------------- the reader on real traces

def test_mi250_trace_reads_every_device_record_with_its_launch():
    t = kineto.load(MI250)  # gzipped
    assert len(t.kernels) == 16 and t.unmatched == 0 and not t.has_python
    assert {k.device for k in t.kernels} == {2}
    assert sum(k.kind == "memcpy" for k in t.kernels) == 2
    by_corr = {k.correlation: k for k in t.kernels}
    # the backward GEMM, launched by hipExtModuleLaunchKernel inside aten::mm on the autograd thread
    mm = by_corr[132]
    assert mm.runtime == "hipExtModuleLaunchKernel"
    assert mm.operators[-1] == "aten::mm" and mm.operators[0].startswith("autograd::engine::evaluate_function")
    assert mm.stack[0] == (kineto.OPERATOR_NODE, "", 0)
    assert by_corr[117].operators == ("aten::to", "aten::_to_copy", "aten::copy_")
    # times are the trace's ns: ts (us) x 1000; Unix time needs the trace's base
    assert t.unix_base_ns == 1735632360000000000
    assert by_corr[132].duration_ns == 12640


def test_cuda_fragment_matches_by_correlation_not_external_id():
    t = kineto.load(BACKWARD)
    (k,) = t.kernels
    assert k.correlation == 2131433 and k.runtime == "cudaLaunchKernel"
    assert k.operators[-1] == "aten::mm" and k.stream == 7 and k.device == 0
    assert t.unix_base_ns == 0  # an older trace: ts is Unix microseconds


def test_synthetic_cuda_trace_puts_each_kernel_on_its_python_line():
    t = kineto.load(SYNTHETIC)
    assert t.has_python and t.unmatched == 1
    stacks = {k.name.split()[0]: k.stack for k in t.kernels}
    assert stacks["ampere_sgemm_128x64_nn"] == (("<module>", "train.py", 1), ("train_step", "train.py", 10),
                                                ("forward", "model.py", 20), ("aten::linear", "", 0),
                                                ("aten::addmm", "", 0))
    assert stacks["sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4"
                  "_execute_kernel_trt"][2] == ("backward", "train.py", 30)
    assert stacks["Memcpy"][-1] == ("aten::_local_scalar_dense", "", 0)
    assert stacks["nccl_orphan_kernel"] == ((kineto.UNLAUNCHED_NODE, "", 0),)
    assert t.start_ns == 0 and t.end_ns == 100 * MS  # the profiler's own span is not the program's


def test_bad_traces_are_one_line_errors(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    (tmp_path / "y.json").write_text(json.dumps({"foo": 1}))
    (tmp_path / "z.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    for name in ("x.json", "y.json", "z.json.gz", "missing.json"):
        with pytest.raises(kineto.TraceFormatError) as exc:
            kineto.load(tmp_path / name)
        assert "\n" not in str(exc.value)


def test_python_function_names():
    assert kineto.parse_python_name("/a/b(c)/m.py(12): forward") == ("forward", "/a/b(c)/m.py", 12)
    assert kineto.parse_python_name("torch/nn/modules/module.py(1527): _call_impl") == \
        ("_call_impl", "torch/nn/modules/module.py", 1527)
    assert kineto.parse_python_name("<built-in method relu>") == ("<built-in method relu>", "", 0)


# ---------------------------------------------------------------- the real MI250 trace with replayed power

def _step_power(t0: int, t1: int, step_ns: int) -> list[tuple[int, int, float, float]]:
    """Power that changes every `step_ns`: (a, b, joules, watts), watts a known sequence."""
    out, a, k = [], t0, 0
    while a < t1:
        b = min(t1, a + step_ns)
        w = 120.0 + 37.0 * (k % 5)
        out.append((a, b, w * (b - a) / 1e9, w))
        a, k = b, k + 1
    return out


def test_mi250_kernels_get_power_times_busy_time_and_sum_to_the_gpu():
    t = kineto.load(MI250)
    steps = _step_power(t.start_ns, t.end_ns, 700_000)  # 0.7 ms: kernels straddle power changes
    power = {2: [(a, b, j) for a, b, j, _ in steps]}
    prof = build_gpu_profile(t.kernels, power, {2: 700_000}, start_ns=t.start_ns, end_ns=t.end_ns, meta={"target": "mi250"})
    gpu = prof.gpu_kernels
    total = sum(j for _, _, j, _ in steps)
    # per-function GPU joules (the tree's leaves' self figures, [GPU idle] included) sum to the GPU's energy
    leaves = sum(n.self_energy_j.get("gpu:2", 0.0) for n, _ in prof.walk())
    assert abs(leaves - total) <= 1e-9 * total
    assert prof.root.energy_j["gpu:2"] == pytest.approx(total, rel=1e-12)
    assert prof.totals.energy_j["gpu:2"] == pytest.approx(total, rel=1e-12)
    # each record: power x busy time, checked on an independent 100 ns grid (one stream: no overlap here)
    order = sorted(t.kernels, key=lambda k: k.start_ns)
    assert all(a.end_ns <= b.start_ns for a, b in zip(order, order[1:]))
    att = attribute(((k.correlation, k.device, k.name, k.start_ns, k.end_ns) for k in t.kernels), power, {2: 700_000})
    for k in t.kernels:
        expect = sum(w * max(0, min(b, g + 100, k.end_ns) - max(a, g)) / 1e9
                     for g in range(k.start_ns, k.end_ns, 100) for a, b, _, w in steps if a < g + 100 and b > g)
        got = att.stacks[k.correlation][2].joules
        assert got == pytest.approx(expect, rel=0.01)
    # the backward GEMM sits on aten::mm under its autograd operator chain, in the labelled node
    mm = [n for n in prof.find("aten::mm")]
    assert len(mm) == 1 and mm[0].self_energy_j["gpu:2"] > 0
    labelled = prof.find(kineto.OPERATOR_NODE)
    assert len(labelled) == 1 and labelled[0].energy_j["gpu:2"] == pytest.approx(total - gpu.devices["2"].idle_j)
    idle = prof.find(GPU_IDLE_NODE)[0].self_energy_j["gpu:2"]
    busy = gpu.devices["2"].busy_s
    assert busy == pytest.approx(sum(k.duration_ns for k in t.kernels) / 1e9)
    assert 0 < idle < total


# ---------------------------------------------------------------- the PyTorch profiler, for real, on the CPU

def test_cpu_torch_profiler_stacks_reach_the_launch_chain(tmp_path):
    """Real torch.profiler output with with_stack=True: the Python frames and operators holding an
    `aten::addmm` are the ones the reader gives a device record launched inside it. On the CPU there
    is no device record, so one runtime call and one kernel are added inside the real operator's span:
    the rest (frames, nesting, names, clocks) is the profiler's own."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    lin = torch.nn.Linear(8, 8)

    def forward(x):
        return lin(x).relu()

    def step(x):
        return forward(x).sum()

    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(2):
            step(torch.randn(4, 8))
    path = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    addmm = [e for e in events if e.get("cat") == "cpu_op" and e.get("name") == "aten::addmm"]
    assert len(addmm) == 2
    op = addmm[1]
    mid = op["ts"] + op["dur"] / 2
    events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": op["pid"], "tid": op["tid"],
                   "ts": mid, "dur": 0.001, "args": {"correlation": 777}})
    events.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": mid + 5, "dur": 10,
                   "args": {"device": 0, "stream": 7, "correlation": 777}})
    trace = kineto.parse(doc)
    assert trace.has_python
    (k,) = trace.kernels
    # C calls (named with an object's address) and module marks are not frames
    assert not [f for f in k.python if f[0].startswith(("<built-in", "nn.Module"))]
    assert any(e.get("cat") == "python_function" and e["name"].startswith("<built-in") for e in events)
    # every operator on that thread whose span holds the call, outermost first, found by brute force
    held = sorted((e for e in events if e.get("cat") == "cpu_op" and e["tid"] == op["tid"]
                   and e["ts"] <= mid < e["ts"] + e["dur"]), key=lambda e: (e["ts"], -e["dur"]))
    assert k.operators == tuple(e["name"] for e in held)
    assert k.operators.index("aten::linear") < k.operators.index("aten::addmm")
    names = [(f[0], Path(f[1]).name, f[2]) for f in k.python]
    here = Path(__file__).name
    code_f, code_s = forward.__code__, step.__code__
    # the profiler names a frame by its function's first line, as energyprof's own frames do
    assert (code_s.co_name, here, code_s.co_firstlineno) in names
    assert (code_f.co_name, here, code_f.co_firstlineno) in names
    assert names.index((code_s.co_name, here, code_s.co_firstlineno)) < names.index((code_f.co_name, here,
                                                                                       code_f.co_firstlineno))
    # Unix time of the trace, from its base: within this test's run
    import time
    unix_s = (trace.unix_base_ns + trace.start_ns) / 1e9
    assert abs(unix_s - time.time()) < 3600


def test_clock_offset_bracket():
    ticks = iter(range(0, 10_000, 10))
    off, err = clock_offset(rounds=3, clock=lambda: 1_000_000 + next(ticks), reference=lambda: next(ticks))
    # reference a, clock 1e6 + a + 10, reference a + 20: clock = reference-midpoint + 1e6, within +-10 ns
    assert off == 1_000_000 and err == 10
    off, err = clock_offset()
    import time
    assert err >= 0 and math.isfinite(off)
    assert abs(time.time_ns() - (time.perf_counter_ns() + off)) < 50_000_000  # hang-free sanity: same clocks


# ---------------------------------------------------------------- a live run's tree: kernels replace the wall-time rule

def _sampled_profile():
    """A sampled run's tree as the wall-time rule leaves it: the GPU's joules on the sync point."""
    from energyprof.facts.profile import IDLE_NODE
    from energyprof.facts.profile import Node
    from energyprof.facts.profile import Profile
    from energyprof.facts.profile import Source
    from energyprof.facts.profile import Totals

    def node(fn, file, line, cpu, gpu, kids=()):
        return Node(function=fn, file=file, line=line, self_energy_j={"cpu": cpu, "gpu:0": gpu},
                    other_policy_self_energy_j={"cpu": cpu * 2, "gpu:0": gpu * 2}, children=list(kids))

    forward = node("Net.forward", "/p/model.py", 20, 3.0, 1.0)  # the sampler's qualified name and full path
    item = node("item_wait", "/p/train.py", 30, 0.5, 9.0)
    train = node("train", "/p/train.py", 5, 0.2, 0.0, [forward, item])
    module = node("<module>", "/p/train.py", 1, 0.1, 0.0, [train])
    idle = node(IDLE_NODE, "", 0, 4.0, 5.0)
    root = node("train.py", "", 0, 0.0, 0.0, [module, idle])
    root.fill_inclusive()
    totals = Totals(energy_j={"cpu": 7.8, "gpu:0": 15.0}, attributed_j={"cpu": 3.8, "gpu:0": 10.0},
                    idle_j={"cpu": 4.0, "gpu:0": 5.0})
    return Profile(meta={"target": "train.py"}, sources=[Source(id="cpu"), Source(id="gpu:0", component="gpu:0")],
                   totals=totals, root=root)


def _kernel(name, start_ms, dur_ms, python, ops=("aten::mm",), device=0):
    return kineto.Kernel(device=device, stream=7, name=name, kind="kernel", start_ns=int(start_ms * MS),
                         end_ns=int((start_ms + dur_ms) * MS), correlation=1, runtime="cudaLaunchKernel",
                         python=tuple(python), operators=tuple(ops))


def fold_of(kernels, spans):
    """The fold the program's reduction gives for these kernels, over these profiled spans."""
    from energyprof.agent.kernels.reduce import PathFigures, _share_busy
    from energyprof.core.gpu_tree import KernelFold

    figures, by_dev = {}, {}
    for k in kernels:
        fig = figures.setdefault((k.stack, k.device), PathFigures())
        n = fig.names.setdefault(k.name, [0, 0.0])
        n[0] += 1
        n[1] += k.duration_ns
        by_dev.setdefault(k.device, []).append((k.start_ns, k.end_ns, k.stack, k.name))
    for d, recs in by_dev.items():
        _share_busy(recs, d, figures, MS)
    fold = KernelFold()
    for a, b in spans:
        fold.add_cycle(a, b, 0)
    fold.records = len(kernels)
    for (p, d), f in figures.items():
        fold.add_busy(p, d, MS, f.busy)
        fold.add_names(p, d, f.names)
    return fold


def graft_into(prof, kernels, power, period_ns, spans=None):
    """The kernels grafted into a hand-built tree, as build_profile grafts them into the tree it builds."""
    from energyprof.core.gpu_tree import DevicePower, graft, split_run

    if spans is None:
        spans = [(min(a for iv in power.values() for a, _, _ in iv), max(b for iv in power.values() for _, b, _ in iv))]
    ids = {s.id for s in prof.sources}
    split = split_run(fold_of(kernels, spans), [DevicePower(d, f"gpu:{d}", iv, period_ns) for d, iv in power.items()
                                                if f"gpu:{d}" in ids])
    if split is None:
        return None
    notes, gpu = graft(prof.root, split)
    prof.root.fill_inclusive()
    prof.notes.extend(notes)
    prof.gpu_kernels = gpu
    return split


def test_kernels_move_the_gpu_joules_from_the_sync_point_to_the_launching_line():
    prof = _sampled_profile()
    # the profiler's names: code name, path less its sys.path entry, a module frame's current line
    fwd_path = [("<module>", "train.py", 42), ("train", "train.py", 5), ("forward", "model.py", 20)]
    kernels = [_kernel("gemm", 10, 30, fwd_path), _kernel("gemm", 50, 10, fwd_path),
               _kernel("copy", 90, 10, fwd_path[:2] + [("item_wait", "train.py", 30)], ops=("aten::item",))]
    # 100 ms at a flat 100 W: 10 J measured; the tree held 10 J of it for the program (5 J more is idle's)
    graft_into(prof, kernels, {0: [(0, 100 * MS, 10.0)]}, period_ns=20 * MS)
    fwd = prof.find("Net.forward")
    assert len(fwd) == 1 and not prof.find("forward")  # the kernel met the sampled frame
    assert fwd[0].energy_j["gpu:0"] == pytest.approx(4.0)  # 40 ms busy of 100 ms of the program's 10 J
    assert fwd[0].energy_j["cpu"] == pytest.approx(3.0)  # CPU joules untouched
    (item,) = prof.find("item_wait")
    assert item.energy_j["gpu:0"] == pytest.approx(1.0)  # only its own copy, not 9 J of waiting
    assert prof.find(GPU_IDLE_NODE)[0].self_energy_j["gpu:0"] == pytest.approx(5.0)
    from energyprof.facts.profile import IDLE_NODE
    assert prof.find(IDLE_NODE)[0].self_energy_j["gpu:0"] == pytest.approx(5.0)  # other processes' part stays
    assert prof.root.energy_j["gpu:0"] == pytest.approx(15.0, rel=1e-12)  # conservation, both policies
    other = sum((n.other_policy_self_energy_j or {}).get("gpu:0", 0.0) for n, _ in prof.walk())
    assert other == pytest.approx(30.0, rel=1e-12)
    assert prof.gpu_kernels.devices["0"].busy_s == pytest.approx(0.05)


def test_kernels_without_a_matching_gpu_source_keep_the_wall_time_rule():
    prof = _sampled_profile()
    split = graft_into(prof, [_kernel("gemm", 10, 30, [("f", "x.py", 1)], device=3)], {3: [(0, 100 * MS, 10.0)]},
                       period_ns=0)
    assert split is None
    assert prof.find("item_wait")[0].self_energy_j["gpu:0"] == 9.0


# ---------------------------------------------------------------- --gpu-kernels: the in-process capture, on the CPU

def test_in_memory_events_are_on_the_unix_clock_that_clock_offset_ties_to_perf_counter():
    """The events the capture reduces (kineto_results.events(), no JSON) are stamped in Unix ns: taken
    back by `clock_offset`, a record_function's span lies inside the perf_counter bracket taken around
    it. The margin (1 ms) is far above the clocks' agreement (a few us), far below any offset error."""
    pytest.importorskip("torch")
    import time

    from torch.profiler import ProfilerActivity, profile, record_function

    brackets = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(3):
            a = time.perf_counter_ns()
            with record_function(f"mark{i}"):
                sum(range(20_000))
            brackets.append((a, time.perf_counter_ns()))
    offset, err = clock_offset()
    marks = {e.name(): e for e in prof.profiler.kineto_results.events() if e.name().startswith("mark")}
    for i, (a, b) in enumerate(brackets):
        e = marks[f"mark{i}"]
        assert a - MS <= e.start_ns() - offset <= e.end_ns() - offset <= b + MS
    assert 0 <= err < MS


def test_capture_reduces_each_cycle_in_memory_and_writes_no_file(tmp_path, monkeypatch):
    """The capture the agent starts, with the CPU activity only (no GPU here): the whole-run cycle ends
    at stop, is reduced into the sink (no device record: no figures), its span on perf_counter_ns
    around the work, and no file is written anywhere."""
    pytest.importorskip("torch")
    import time

    import torch

    from torch.profiler import ProfilerActivity

    from energyprof.agent.kernel_capture import KernelCapture
    from energyprof.core.gpu_tree import KernelFold

    monkeypatch.chdir(tmp_path)
    fold = KernelFold()
    cap = KernelCapture(fold, activities=[ProfilerActivity.CPU])
    a = time.perf_counter_ns()
    cap.start()
    x = torch.randn(32, 32)
    for _ in range(5):
        x = (x @ x).tanh()
    cap.stop()
    b = time.perf_counter_ns()
    cap.stop()  # once (atexit calls it again)
    assert cap.failed is None and cap.cycles == 1 and fold.cycles == 1
    (span,) = fold.spans
    assert a <= span[0] <= span[1] <= b
    assert not fold and fold.records == 0  # a CPU build records no device record
    assert cap.cost_ns > 0  # what the reduction cost, charged to energyprof
    assert list(tmp_path.iterdir()) == []


def test_gpu_kernels_without_a_gpu_is_one_line_and_exit_2_before_the_program(tmp_path):
    from conftest import run_cli

    script = tmp_path / "prog.py"
    marker = tmp_path / "ran"
    script.write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    r = run_cli(["--gpu-kernels", "-q", "--json", str(tmp_path / "o.json"), str(script)], tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--gpu-kernels" in lines[0]
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_gpu_kernels_run_end_to_end_on_a_cpu_torch_program(tmp_path):
    """The whole in-process path on this GPU-less machine: a fake device node lets the flag through;
    the agent starts the real profiler in the program (CUDA activity asked, torch CPU disables it),
    its cycle is reduced in the program and reaches the supervisor through the spool, and with no
    kernel in it the wall-time rule stays, said in a note. The program's own output and stderr are
    unchanged: torch's profiler warnings and Kineto's log lines stay off it."""
    pytest.importorskip("torch")
    from conftest import run_cli
    from energyprof.facts.profile import load

    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").write_text("")
    (tmp_path / "p.csv").write_text("t_s,gpu:0\n0,100\n")
    script = tmp_path / "prog.py"
    script.write_text("import torch\nx = torch.randn(64, 64)\nfor _ in range(50):\n    x = (x @ x).tanh()\n"
                      "print('done', x.shape[0])\n")
    r = run_cli(["--gpu-kernels", "--power-trace", str(tmp_path / "p.csv"), "-q", "--json", str(tmp_path / "o.json"),
                 "-o", str(tmp_path / "o.html"), str(script)], tmp_path, env={"ENERGYPROF_DEV_ROOT": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "done 64"
    assert r.stderr == ""
    p = load(tmp_path / "o.json")
    notes = [n for n in p.notes if n.kind == "gpu-wall-time"]
    assert len(notes) == 1 and "held no GPU kernel" in notes[0].message and notes[0].extra["cycles"] == 1
    assert "where Python waited" in notes[0].message
    assert p.totals.energy_j["gpu:0"] > 0
    assert p.gpu_kernels is None


def test_kernels_meet_a_region_profile_whose_outer_frames_were_cut():
    prof = _sampled_profile()
    module = prof.root.children[0]
    prof.root.children[0:1] = module.children  # a region's profile: `train` is the top frame
    prof.root.fill_inclusive()
    outer = [("<module>", "run.py", 3), ("main", "run.py", 10), ("train", "train.py", 5), ("forward", "model.py", 20)]
    graft_into(prof, [_kernel("gemm", 0, 50, outer)], {0: [(0, 100 * MS, 10.0)]}, period_ns=0)
    assert [n.function for n in prof.root.children if not n.is_special][:1] == ["train"]
    assert not prof.find("main")
    (fwd,) = prof.find("Net.forward")
    assert fwd.self_energy_j["gpu:0"] == 0.0 and fwd.energy_j["gpu:0"] == pytest.approx(5.0)  # on its aten::mm


def test_api_gpu_kernels_without_a_gpu_raises_before_profiling():
    import energyprof
    from energyprof.setup.options import OptionError

    with pytest.raises(OptionError, match="--gpu-kernels"):
        energyprof.energy_profile(gpu_kernels=True)


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_api_gpu_kernels_runs_the_profiler_in_process(tmp_path, monkeypatch):
    """gpu_kernels=True in the API, on this GPU-less machine behind a fake device node: the real
    profiler runs around the block, its trace is read, and with no kernel the wall-time rule stays."""
    torch = pytest.importorskip("torch")
    from energyprof import energy_profile
    from energyprof.facts.profile import load

    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kfd").write_text("")
    monkeypatch.setenv("ENERGYPROF_DEV_ROOT", str(tmp_path))
    power = tmp_path / "p.csv"
    power.write_text("t_s,gpu:0,cpu\n0,100,20\n")
    out = tmp_path / "o.json"

    @energy_profile(json=str(out), power_trace=str(power), gpu_kernels=True, quiet=True)
    def work():
        x = torch.randn(32, 32)
        for _ in range(20):
            x = (x @ x).tanh()
        return float(x.sum())

    assert isinstance(work(), float)
    p = load(out)
    (note,) = [n for n in p.notes if n.kind == "gpu-wall-time"]
    assert note.extra["cycles"] == 1
    assert p.totals.energy_j["gpu:0"] > 0


def test_kernels_on_a_decorated_function_profile_land_on_the_root():
    from energyprof.facts.profile import Node
    from energyprof.facts.profile import Profile
    from energyprof.facts.profile import Source
    from energyprof.facts.profile import Totals

    root = Node(function="train_step", file="/p/train.py", line=7, self_energy_j={"gpu:0": 2.0})
    root.children.append(Node(function="helper", file="/p/train.py", line=20, self_energy_j={"gpu:0": 1.0}))
    root.fill_inclusive()
    prof = Profile(meta={}, sources=[Source(id="gpu:0", component="gpu:0")], totals=Totals(energy_j={"gpu:0": 3.0}),
                   root=root)
    path = [("<module>", "run.py", 1), ("wrapper", "energyprof/drive/api.py", 150), ("train_step", "train.py", 7)]
    graft_into(prof, [_kernel("gemm", 0, 100, path)], {0: [(0, 100 * MS, 5.0)]}, period_ns=0)
    kids = {c.function: c for c in prof.root.children}
    assert set(kids) == {"helper", "aten::mm", GPU_IDLE_NODE}  # the launch sat in train_step's own body
    assert kids["aten::mm"].energy_j["gpu:0"] == pytest.approx(3.0)  # all busy: the whole 3 J the tree held
    assert kids["helper"].energy_j["gpu:0"] == 0.0 and prof.root.energy_j["gpu:0"] == pytest.approx(3.0)


def test_kernels_in_a_folded_run_use_the_timeline_power(tmp_path):
    """The supervisor's step on a real fold (Ledger, timeline, build_profile) of a replayed run: the
    main thread sat in `sync` the whole second, so the wall-time rule gave it all the GPU's energy;
    the kernels, launched from `forward` and `backward`, take it by their busy time at the power of
    their own half-second."""
    from energyprof.collect.sensors.replay import load_trace
    from energyprof.core.ledger import DEFAULT_SHARE_WINDOW_NS, Ledger
    from energyprof.core.recording import Recording, Sample, Tick
    from energyprof.core.tree import build_profile
    from energyprof.collect.kernels.capture import kernel_split

    S = 1_000_000_000
    (tmp_path / "t.csv").write_text("t_s,cpu,gpu:0\n0,10,100\n0.5,10,300\n")
    tr = load_trace(tmp_path / "t.csv")
    src = [{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"},
           {"id": "gpu:0", "component": "gpu:0", "method": "measured", "sensor": "replay", "update_period_s": 0.1}]
    rec = Recording(sources=src)
    module, step = ("<module>", "/p/train.py", 1), ("step", "/p/train.py", 10)
    sync = rec.stacks.intern([module, step, ("sync", "/p/train.py", 30)])
    rec.stacks.intern([module, step, ("forward", "/p/train.py", 20)])
    times = [k / 10 for k in range(11)]
    rec.ticks = [Tick(int(round(t * S)), tuple(tr.energy_at(c, t) for c in ("cpu", "gpu:0")), int(round(t * S)), 0,
                      int(round(t * S))) for t in times]
    rec.samples = [Sample(k * S // 10, (k + 1) * S // 10, sync, S // 10) for k in range(10)]
    ledger = Ledger(rec.sources, rec.stacks, DEFAULT_SHARE_WINDOW_NS, cpus=1)
    events = sorted([(t.t_ns, 1, t) for t in rec.ticks] + [(s.t1_ns, 0, s) for s in rec.samples], key=lambda e: e[:2])
    for _, kind, ev in events:
        (ledger.add_sample if kind == 0 else ledger.add_tick)(ev)
    ledger.finish()
    prof = build_profile(ledger, "all", {"target": "train.py"})
    total = prof.root.energy_j["gpu:0"]
    assert total == pytest.approx(200.0)  # 0.5 s at 100 W + 0.5 s at 300 W
    assert prof.find("sync")[0].energy_j["gpu:0"] == pytest.approx(200.0)  # before: all on the wait
    py = [("<module>", "train.py", 99), ("step", "train.py", 10)]
    kernels = [_kernel("fwd_gemm", 100, 200, py + [("forward", "train.py", 20)]),
               _kernel("bwd_gemm", 600, 300, py + [("backward", "train.py", 40)])]
    split, notes = kernel_split(fold_of(kernels, [(0, S)]), ledger, None)
    split.clock_error_ns = 250
    prof = build_profile(ledger, "all", {"target": "train.py"}, notes=notes, gpu=split)
    assert prof.find("forward")[0].energy_j["gpu:0"] == pytest.approx(20.0, rel=1e-9)  # 0.2 s x 100 W
    assert prof.find("backward")[0].energy_j["gpu:0"] == pytest.approx(90.0, rel=1e-9)  # 0.3 s x 300 W
    assert prof.find("sync")[0].energy_j["gpu:0"] == pytest.approx(0.0, abs=1e-12)
    assert prof.find(GPU_IDLE_NODE)[0].energy_j["gpu:0"] == pytest.approx(90.0, rel=1e-9)
    assert prof.root.energy_j["gpu:0"] == pytest.approx(total, rel=1e-12)
    assert prof.find("sync")[0].energy_j["cpu"] == pytest.approx(10.0)  # CPU untouched
    gpu = prof.gpu_kernels
    assert gpu.clock_error_ns == 250 and gpu.devices["0"].update_period_s == pytest.approx(0.1)
