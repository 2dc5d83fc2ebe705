"""--gpu-kernel-steps: the profiler on a schedule of step windows, and the split confined to them."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from energyprof.core.gpu_tree import clip_intervals
from energyprof.core.kernels import GPU_IDLE_NODE
from energyprof.setup.options import OptionError
from energyprof.setup.options import Options
from energyprof.setup.options import parse_kernel_steps
from test_gpu_kernels import MS, _kernel, _sampled_profile, fold_of, graft_into


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
    graft_into(prof, [_kernel("gemm", 10, 30, fwd_path)], {0: [(0, 100 * MS, 10.0)]}, period_ns=0, spans=[(0, 50 * MS)])

    def gpu(p, name):
        return p.find(name)[0].self_energy_j.get("gpu:0", 0.0)

    # half the device's energy fell inside the window: the program's 10 J -> 5 J split, 5 J kept in place
    assert gpu(prof, "item_wait") == pytest.approx(gpu(before, "item_wait") / 2) and gpu(before, "item_wait") == 9.0
    fwd_before, fwd_after = before.find("Net.forward")[0].energy_j["gpu:0"], prof.find("Net.forward")[0].energy_j["gpu:0"]
    assert fwd_after == pytest.approx(fwd_before / 2 + 3.0)  # 30 ms busy of the window's 5 J
    assert prof.find(GPU_IDLE_NODE)[0].self_energy_j["gpu:0"] == pytest.approx(2.0)
    assert prof.root.energy_j["gpu:0"] == pytest.approx(before.root.energy_j["gpu:0"], rel=1e-12)  # conservation
    sched = prof.gpu_kernels.schedule
    assert sched.profiled_share["0"] == pytest.approx(0.5) and sched.spans_ns == [[0, 50 * MS]]
    (note,) = [n for n in prof.notes if n.kind == "gpu-kernels-split"]
    assert "1 window(s)" in note.message and "5.000 J" in note.message and "wall time" in note.message
    assert "50.0%" in note.message


def test_scheduled_capture_on_real_torch_records_only_the_scheduled_steps():
    """A CPU loop of 12 steps under EVERY=4, ACTIVE=1, WINDOWS=2: the profiler's own schedule (a warm-up
    step, then the active one) records steps 3 and 7 only, each cycle reduced at its end (no file), its
    span on perf_counter_ns around its own step."""
    torch = pytest.importorskip("torch")
    import time

    from torch.profiler import ProfilerActivity

    from energyprof.agent import kernel_capture as gpu_kernels
    from energyprof.agent.kernel_capture import KernelCapture
    from energyprof.core.gpu_tree import KernelFold

    fold = KernelFold()
    cap = KernelCapture(fold, activities=[ProfilerActivity.CPU], steps="4:1:2")
    cap.start()
    gpu_kernels.register(cap)
    try:
        marks = {}
        a = torch.randn(32, 32)
        for n in range(12):
            gpu_kernels.step()  # as energyprof.torch.track does at each step's start
            t0 = time.perf_counter_ns()
            (a @ a).sum()
            marks[n] = (t0, time.perf_counter_ns())
        cap.stop()
    finally:
        gpu_kernels.register(None)
    assert cap.failed is None and cap.cycles == 2 and fold.cycles == 2
    assert len(fold.spans) == 2
    for (s, e), n in zip(fold.spans, (3, 7)):
        assert s <= marks[n][0] and marks[n][1] <= e  # the window holds its step
        assert marks[n - 1][1] <= s and e <= marks[n + 1][1]  # and no other
    assert not fold  # a CPU build: no device record


def test_the_budget_halves_how_often_windows_come():
    """A capture on by default keeps its CPU under its share of the loop's time: past it, EVERY doubles."""
    from energyprof.agent.kernel_capture import KernelCapture

    cap = KernelCapture(None, every=100, active=3, budget=0.01)
    cap.cycles, cap.cost_ns = 1, 30_000_000  # 30 ms a cycle
    cap._loop_steps, cap._loop_ns = 10, 10 * 10_000_000  # steps of 10 ms: 1% of 100 steps is 10 ms
    cap._keep_to_budget()
    assert cap.every == 400  # 30 ms <= 1% of 400 x 10 ms


def test_the_budget_counts_what_profiled_steps_took_beyond_plain_ones():
    """On a CPU-bound loop the profiler's recording is the capture's cost: 3 profiled steps of 30 ms beside
    plain ones of 10 ms cost 60 ms a cycle, so windows come every 800 steps (60 ms <= 1% of 800 x 10 ms)."""
    from energyprof.agent.kernel_capture import KernelCapture

    cap = KernelCapture(None, every=100, active=3, budget=0.01)
    cap.cycles, cap.cost_ns = 1, 0
    cap._loop_steps, cap._loop_ns = 10, 10 * 10_000_000
    cap._rec_steps, cap._rec_ns = 3, 3 * 30_000_000
    cap._keep_to_budget()
    assert cap.every == 800


def _program_nodes(p, script):
    return {(n.function, n.line) for n, _ in p.walk() if n.file.endswith(script.name)}


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_scheduled_run_end_to_end_and_the_tree_without_the_flag(tmp_path):
    """The supervised path with --gpu-kernel-steps 4:1:2 on a CPU torch loop through
    energyprof.torch.track: the agent's profiler writes one trace per window (two), the supervisor
    reads them, and with no kernel (torch CPU) the wall-time rule stays. The same program without
    --gpu-kernels has the same program nodes (each function runs ~0.2 s of CPU, sampled every 10 ms)."""
    pytest.importorskip("torch")
    from conftest import run_cli
    from energyprof.facts.profile import load

    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").write_text("")
    (tmp_path / "p.csv").write_text("t_s,gpu:0\n0,100\n")
    script = tmp_path / "prog.py"
    script.write_text(
        "import time, torch\nimport energyprof.torch as ept\n"
        "def spin(s):\n    end = time.process_time() + s\n    while time.process_time() < end:\n        pass\n"
        "def forward(x):\n    spin(0.02)\n    return (x @ x).tanh()\n"
        "def load():\n    spin(0.2)\n"
        "x = torch.randn(32, 32)\nload()\n"
        "for batch in ept.track(list(range(10))):\n    x = forward(x)\n"
        "print('done', x.shape[0])\n")
    common = ["--power-trace", str(tmp_path / "p.csv"), "-q", "--interval", "0.01"]
    env = {"ENERGYPROF_DEV_ROOT": str(tmp_path)}
    r = run_cli(["--gpu-kernels", "--gpu-kernel-steps", "4:1:2", *common, "--json", str(tmp_path / "on.json"), str(script)],
                tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "done 32"
    on = load(tmp_path / "on.json")
    notes = [n for n in on.notes if n.kind == "gpu-wall-time"]
    assert len(notes) == 1 and "held no GPU kernel" in notes[0].message and notes[0].extra["cycles"] == 2
    assert r.stderr == ""  # torch's profiler warnings and Kineto's lines: not on the program's stderr
    r = run_cli([*common, "--no-gpu-kernels", "--json", str(tmp_path / "off.json"), str(script)], tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    off = load(tmp_path / "off.json")
    assert {"forward", "load", "spin"} <= {f for f, _ in _program_nodes(off, script)}
    assert off.gpu_kernels is None and on.gpu_kernels is None
    # the tree with the flag and the scheduled profiler holds the same program nodes as the tree without
    assert {f for f, _ in _program_nodes(on, script) if f != "<module>"} == {f for f, _ in _program_nodes(off, script)
                                                                            if f != "<module>"}


def test_bad_step_spec_exits_2_before_the_program_starts(tmp_path):
    from conftest import run_cli

    marker = tmp_path / "ran"
    script = tmp_path / "prog.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    r = run_cli(["--gpu-kernels", "--gpu-kernel-steps", "3:5", "-q", str(script)], tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--gpu-kernel-steps" in r.stderr
    assert not marker.exists()


def _folded_run(tmp_path):
    """A real fold (Ledger, timeline, build_profile) of a replayed 1 s run: gpu:0 at 100 W then
    300 W (200 J), the main thread in `sync` throughout, so the wall-time rule gives it all 200 J."""
    from energyprof.collect.sensors.replay import load_trace
    from energyprof.core.ledger import DEFAULT_SHARE_WINDOW_NS, Ledger
    from energyprof.core.recording import Recording, Sample, Tick
    from energyprof.core.tree import build_profile

    S = 1_000_000_000
    (tmp_path / "t.csv").write_text("t_s,cpu,gpu:0\n0,10,100\n0.5,10,300\n")
    tr = load_trace(tmp_path / "t.csv")
    src = [{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"},
           {"id": "gpu:0", "component": "gpu:0", "method": "measured", "sensor": "replay", "update_period_s": 0.1}]
    rec = Recording(sources=src)
    module, step = ("<module>", "/p/train.py", 1), ("step", "/p/train.py", 10)
    sync = rec.stacks.intern([module, step, ("sync", "/p/train.py", 30)])
    rec.ticks = [Tick(k * S // 10, tuple(tr.energy_at(c, k / 10) for c in ("cpu", "gpu:0")), k * S // 10, 0, k * S // 10)
                 for k in range(11)]
    rec.samples = [Sample(k * S // 10, (k + 1) * S // 10, sync, S // 10) for k in range(10)]
    ledger = Ledger(rec.sources, rec.stacks, DEFAULT_SHARE_WINDOW_NS, cpus=1)
    events = sorted([(t.t_ns, 1, t) for t in rec.ticks] + [(s.t1_ns, 0, s) for s in rec.samples], key=lambda e: e[:2])
    for _, kind, ev in events:
        (ledger.add_sample if kind == 0 else ledger.add_tick)(ev)
    ledger.finish()
    prof = build_profile(ledger, "all", {"target": "train.py"})
    assert prof.root.energy_j["gpu:0"] == pytest.approx(200.0)
    return prof, ledger


def test_a_window_over_the_first_half_splits_only_its_joules(tmp_path):
    from energyprof.collect.kernels.capture import kernel_split
    from energyprof.core.tree import build_profile

    _, ledger = _folded_run(tmp_path)
    py = [("<module>", "train.py", 99), ("step", "train.py", 10)]
    kernels = [_kernel("fwd_gemm", 100, 200, py + [("forward", "train.py", 20)])]
    split, notes = kernel_split(fold_of(kernels, [(0, 500 * MS)]), ledger, None)
    prof = build_profile(ledger, "all", {"target": "train.py"}, notes=notes, gpu=split)
    # inside the window: 0.5 s x 100 W = 50 J of the 200 J, split: forward 0.2 s x 100 W, idle 30 J
    assert prof.find("forward")[0].energy_j["gpu:0"] == pytest.approx(20.0, rel=1e-9)
    assert prof.find(GPU_IDLE_NODE)[0].energy_j["gpu:0"] == pytest.approx(30.0, rel=1e-9)
    assert prof.find("sync")[0].energy_j["gpu:0"] == pytest.approx(150.0, rel=1e-9)  # outside: the wall-time rule
    assert prof.root.energy_j["gpu:0"] == pytest.approx(200.0, rel=1e-12)
    assert prof.gpu_kernels.schedule.profiled_share["0"] == pytest.approx(0.25)
    lane = prof.gpu_kernels.devices["0"].busy_lane  # the timeline's 1 ms cells; forward ran 0.1-0.3 s
    assert len(lane) == 1000 and lane[0][0] == pytest.approx(0.0) and lane[-1][1] == pytest.approx(1.0)
    assert all(c[2] is None for c in lane if c[0] >= 0.5 - 1e-9)  # outside the window: not profiled, not idle
    busy = [c for c in lane if c[2]]
    assert len(busy) == 200 and busy[0][0] == pytest.approx(0.1) and busy[-1][1] == pytest.approx(0.3)
    assert all(c[2] == pytest.approx(0.001) for c in busy)
    from energyprof.analysis.report import build
    from energyprof.render.html import render_html

    page = render_html(build(prof))  # the report states the schedule beside the kernel table
    assert "1 window(s) of steps" in page and "25.0% of gpu:0" in page and "stays charged by wall time" in page


def test_driver_samples_shape_the_split_and_the_total_stays_the_sensors(tmp_path):
    """The driver's samples say 300 W in the first half and 100 W after (the ticks said the reverse):
    the forward kernel's 0.2 s in the first half takes 0.2 x 300 W; the device's 200 J is kept."""
    from energyprof.collect.kernels.capture import kernel_split
    from energyprof.core.tree import build_profile
    from test_power_samples import SamplingNvml
    from test_nvml import FakeGpu, found

    _, ledger = _folded_run(tmp_path)
    (sensor,) = found(SamplingNvml([FakeGpu()])).sensors
    sensor.samples.samples = [(k * 50 * MS, 300.0 if k < 10 else 100.0) for k in range(20)]  # as drained, on the run's clock
    py = [("<module>", "train.py", 99), ("step", "train.py", 10)]
    kernels = [_kernel("fwd_gemm", 100, 200, py + [("forward", "train.py", 20)])]
    split, notes = kernel_split(fold_of(kernels, [(0, 1000 * MS)]), ledger,
                                SimpleNamespace(sensors=[sensor], interval_s=0.1))
    prof = build_profile(ledger, "all", {"target": "train.py"}, notes=notes, gpu=split)
    sensor.close()
    assert prof.find("forward")[0].energy_j["gpu:0"] == pytest.approx(60.0, rel=1e-9)
    assert prof.root.energy_j["gpu:0"] == pytest.approx(200.0, rel=1e-12)
    (note,) = [n for n in prof.notes if n.kind == "gpu-power-samples"]
    assert note.extra["samples"] == 20 and note.extra["period_ns"] == 50 * MS


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_api_schedule_reaches_the_in_process_profiler(tmp_path, monkeypatch):
    """energy_profile(gpu_kernels=True, gpu_kernel_steps="3:1"): a tracked loop of 7 steps records
    steps 2 and 5 (each after a warm-up step), two cycles; a loop outside track opens none and says so."""
    torch = pytest.importorskip("torch")
    import energyprof.torch as ept
    from energyprof import energy_profile
    from energyprof.facts.profile import load

    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").write_text("")
    monkeypatch.setenv("ENERGYPROF_DEV_ROOT", str(tmp_path))
    power = tmp_path / "p.csv"
    power.write_text("t_s,gpu:0,cpu\n0,100,20\n")

    def loop(items):
        x = torch.randn(16, 16)
        for _ in items:
            x = (x @ x).tanh()
        return float(x.sum())

    tracked = energy_profile(json=str(tmp_path / "a.json"), power_trace=str(power), gpu_kernels=True,
                             gpu_kernel_steps="3:1", quiet=True)(lambda: loop(ept.track(list(range(7)))))
    plain = energy_profile(json=str(tmp_path / "b.json"), power_trace=str(power), gpu_kernels=True,
                           gpu_kernel_steps="3:1", quiet=True)(lambda: loop(range(7)))
    assert isinstance(tracked(), float) and isinstance(plain(), float)
    (note,) = [n for n in load(tmp_path / "a.json").notes if n.kind == "gpu-wall-time"]
    assert note.extra["cycles"] == 2
    (note,) = [n for n in load(tmp_path / "b.json").notes if n.kind == "gpu-wall-time"]
    assert "no profiler cycle ended" in note.message
