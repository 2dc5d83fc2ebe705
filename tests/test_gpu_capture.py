"""GPU kernels reduced in the program: a profiler cycle's in-memory events -> per-path busy time -> the
run's fold -> the GPU's energy split among the launching lines, grafted while the tree is built.

The device side is fed Kineto-shaped events (tests/kineto_events.py: the fields torch 2.13's
`_KinetoEvent` gives), since a CPU build records no kernel; everything else is the real pipeline:
the reduction, the fold, the spool's records, the ledger, build_profile. Power is replayed.
"""

from __future__ import annotations

import pytest

from energyprof.agent.kernels.reduce import reduce_events
from energyprof.agent.kernels.autograd import BACKWARD_FRAME
from energyprof.core.gpu_tree import KernelFold
from energyprof.core.kernels import GPU_IDLE_NODE
from kineto_events import MS, Step, training_step

OFF = 1_700_000_000_000_000_000  # Unix ns - perf_counter ns
S = 1_000_000_000
RUNNING = {("train", 12): [("/p/train.py", 10)], ("<module>", 30): [("/p/train.py", 1)]}


def _folded_run(watts: float = 100.0, seconds: float = 0.1, policy: str = "all"):
    """A ledger of a replayed run: gpu:0 at a flat `watts`, the main thread sampled in `train` (wall-time
    rule: all the GPU's energy there), ticks every 10 ms."""
    from energyprof.core.ledger import DEFAULT_SHARE_WINDOW_NS, Ledger
    from energyprof.core.recording import Recording, Sample, Tick

    src = [{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"},
           {"id": "gpu:0", "component": "gpu:0", "method": "measured", "sensor": "replay", "update_period_s": 0.01}]
    rec = Recording(sources=src)
    module, train = ("<module>", "/p/train.py", 1), ("train", "/p/train.py", 10)
    sid = rec.stacks.intern([module, train])
    n = int(round(seconds * 100))
    ticks = [Tick(k * 10 * MS, (5.0 * k * 0.01, watts * k * 0.01), k * 10 * MS, 0, k * 10 * MS) for k in range(n + 1)]
    samples = [Sample(k * 10 * MS, (k + 1) * 10 * MS, sid, 10 * MS) for k in range(n)]
    ledger = Ledger(rec.sources, rec.stacks, DEFAULT_SHARE_WINDOW_NS, cpus=1)
    events = sorted([(t.t_ns, 1, t) for t in ticks] + [(s.t1_ns, 0, s) for s in samples], key=lambda e: e[:2])
    for _, kind, ev in events:
        (ledger.add_sample if kind == 0 else ledger.add_tick)(ev)
    ledger.finish()
    return ledger


def _profile(fold: KernelFold, ledger, policy: str = "all"):
    from energyprof.collect.kernels.capture import kernel_split
    from energyprof.core.tree import build_profile

    split, notes = kernel_split(fold, ledger, None)
    return build_profile(ledger, policy, {"target": "train.py"}, notes=notes, gpu=split)


def _child(node, name):
    found = [c for c in node.children if c.function == name]
    assert len(found) == 1, (name, [c.function for c in node.children])
    return found[0]


def test_a_training_step_puts_forward_backward_and_optimizer_on_their_lines_to_1e_9():
    """At a flat 100 W: forward's 10 ms kernel on the forward line (1 J), backward's 20 ms under
    `backward()` > [backward] > the forward line (2 J), the optimizer's 5 ms on its line (0.5 J), the
    rest [GPU idle]; the sampled `train` and the profiler's `train` are one node."""
    cycle = reduce_events(training_step(OFF), unix_minus_perf=OFF, t0=0, t1=100 * MS, running=RUNNING)
    fold = KernelFold()
    fold.add(cycle)
    prof = _profile(fold, _folded_run())
    g = "gpu:0"
    assert prof.root.energy_j[g] == pytest.approx(10.0, rel=1e-12)  # conservation
    module = _child(prof.root, "<module>")
    train = _child(module, "train")  # one row: the sampler's first line 10, the profiler's current line 12
    assert train.line == 10 and train.file == "/p/train.py"
    forward = _child(train, "forward")
    assert forward.energy_j[g] == pytest.approx(1.0, rel=1e-9, abs=1e-9)
    backward = _child(train, "backward")  # torch's Tensor.backward: the frame of the `loss.backward()` line
    assert backward.energy_j[g] == pytest.approx(2.0, rel=1e-9)
    (bwd_node,) = [n for n, _ in backward.walk() if n.function == BACKWARD_FRAME[0]]
    under = _child(bwd_node, "forward")  # the forward op's stack below the frames it shares with backward()'s caller
    assert under.energy_j[g] == pytest.approx(2.0, rel=1e-9)  # beneath the forward line that made them
    step = _child(train, "step")
    assert step.energy_j[g] == pytest.approx(0.5, rel=1e-9)
    assert _child(prof.root, GPU_IDLE_NODE).self_energy_j[g] == pytest.approx(6.5, rel=1e-9)
    assert train.self_energy_j[g] == pytest.approx(0.0, abs=1e-12)  # nothing left on the wait
    assert train.energy_j["cpu"] == pytest.approx(0.5, rel=1e-9)  # CPU untouched
    gpu = prof.gpu_kernels
    assert gpu.devices["0"].split_share == pytest.approx(1.0)
    assert gpu.unplaced == {"backward: AccumulateGrad (a leaf's gradient: no forward op)": 2}
    rows = {tuple(r.path[-1]): r for r in gpu.stacks}
    assert {k.name for k in rows[("aten::mm", "", 0)].kernels} in ({"fwd_gemm"}, {"bwd_gemm_a", "bwd_gemm_b"})
    assert any(n.kind == "gpu-kernels-split" and "100.0%" in n.message for n in prof.notes)


def test_a_frame_named_by_its_current_line_meets_the_sampled_function_without_the_start_stack():
    """The same step reduced without the frames running at the cycle's start: the profiler's `train` at
    line 12 still meets the sampled `train` (first line 10, the nearest before it): one row."""
    cycle = reduce_events(training_step(OFF), unix_minus_perf=OFF, t0=0, t1=100 * MS)
    fold = KernelFold()
    fold.add(cycle)
    prof = _profile(fold, _folded_run())
    trains = [n for n, _ in prof.walk() if n.function == "train" and BACKWARD_FRAME[0] not in
              [a.function for a in _ancestors(prof.root, n)]]
    assert len(trains) == 1 and trains[0].line == 10


def _ancestors(root, target):
    path = []

    def go(node):
        if node is target:
            return True
        for c in node.children:
            if go(c):
                path.append(node)
                return True
        return False

    go(root)
    return path


def test_outside_the_cycles_the_wall_time_rule_stays():
    """The cycle covers [0, 100] ms of a 200 ms run at 100 W: half the GPU's energy is split, the other
    half stays on `train`, and the report's note says which share was split."""
    cycle = reduce_events(training_step(OFF), unix_minus_perf=OFF, t0=0, t1=100 * MS, running=RUNNING)
    fold = KernelFold()
    fold.add(cycle)
    prof = _profile(fold, _folded_run(seconds=0.2))
    train = _child(_child(prof.root, "<module>"), "train")
    assert train.self_energy_j["gpu:0"] == pytest.approx(10.0, rel=1e-9)
    assert _child(train, "forward").energy_j["gpu:0"] == pytest.approx(1.0, rel=1e-9)
    assert prof.root.energy_j["gpu:0"] == pytest.approx(20.0, rel=1e-12)
    assert prof.gpu_kernels.devices["0"].split_share == pytest.approx(0.5)
    (note,) = [n for n in prof.notes if n.kind == "gpu-kernels-split"]
    assert "50.0%" in note.message and "where Python waited" in note.message


def test_no_kernels_says_the_gpu_figures_are_where_python_waited():
    from energyprof.collect.kernels.capture import kernel_split

    ledger = _folded_run()
    for mode, words in ((None, "did not run"), (False, "--no-gpu-kernels"), (True, "no profiler cycle ended")):
        split, notes = kernel_split(KernelFold(), ledger, None, mode=mode)
        assert split is None
        (note,) = notes
        assert note.kind == "gpu-wall-time" and "where Python waited" in note.message and words in note.message


def test_the_reduction_grows_with_lines_not_kernels():
    """Cycles of many kernels launched from three lines: the reduced records (per cycle, and the fold's
    entries and names over many cycles) are the same for 4x the kernels, and bounded by lines x buckets."""
    def cycle_of(n_kernels: int, k: int):
        s = Step(OFF + k * 100 * MS)
        mod = s.py("train.py(1): <module>", 0, 100)
        for j in range(3):
            s.py(f"model.py({10 * (j + 1)}): layer{j}", 30 * j, 30 * j + 30, mod)
            s.op("aten::mm", 30 * j, 30 * j + 30, seq=j)
        width = 90.0 / n_kernels
        for i in range(n_kernels):
            s.launch(30 * (i % 3) + 1 + (i // 3) * 27.0 / n_kernels, f"gemm{i % 13}", 5 + i * width,
                     5 + (i + 0.5) * width)
        return reduce_events(s.events, unix_minus_perf=OFF, t0=k * 100 * MS, t1=(k + 1) * 100 * MS)

    sizes = {}
    for n in (3_000, 12_000):
        fold = KernelFold(max_cells=500)
        per_cycle = []
        for k in range(8):
            c = cycle_of(n, k)
            assert c.records == n and len(c.figures) == 3
            per_cycle.append(sum(len(f.busy) + len(f.names) for f in c.figures.values()))
            fold.add(c)
        sizes[n] = (per_cycle, fold.entries, sum(len(v) for v in fold.names.values()), len(fold.busy))
        assert fold.entries <= 500 and len(fold.busy) == 3  # one path a line
        assert max(per_cycle) <= 3 * (101 + 11)  # paths x (buckets in a 100 ms cycle + top names and the rest)
    assert sizes[3_000] == sizes[12_000]


def test_the_fold_coarsens_and_keeps_the_busy_time():
    fold = KernelFold(max_cells=100)
    path = (("f", "a.py", 1),)
    for k in range(1000):
        fold.add_busy(path, 0, MS, {k: 0.5 * MS})
    assert fold.entries <= 100 and fold.cell_ns >= 10 * MS
    assert sum(fold.busy[(path, 0)].values()) == pytest.approx(500 * MS)


def test_spool_records_of_a_cycle_fold_as_the_cycle_itself(tmp_path):
    """The agent's writer and the supervisor's reader of the kernel records: a cycle written to the
    spool and read back folds to what folding the cycle directly gives."""
    from energyprof.agent import wire
    from energyprof.agent.kernel_capture import SpoolSink
    from energyprof.supervise.records import parse_all

    class Lines:
        def __init__(self):
            self.text = ""

        def event(self, line):
            self.text += line

    cycle = reduce_events(training_step(OFF), unix_minus_perf=OFF, t0=0, t1=100 * MS, running=RUNNING)
    out = Lines()
    sink = SpoolSink(out)
    sink.add(cycle)
    sink.add(cycle)  # a second cycle: its paths are not written again
    assert out.text.count(wire.KPATH + "\t") == len(cycle.figures)
    direct, read = KernelFold(), KernelFold()
    direct.add(cycle)
    direct.add(cycle)
    paths = {}
    for r in parse_all(wire.decode(wire.encode(out.text))):
        name = type(r).__name__
        if name == "KernelPath":
            paths[r.kid] = r.frames
        elif name == "KernelBusy":
            read.add_busy(paths[r.kid], r.device, r.bucket_ns, r.busy)
        elif name == "KernelNames":
            read.add_names(paths[r.kid], r.device, r.names)
        elif name == "KernelCycle":
            read.add_cycle(r.t0, r.t1, r.records)
        elif name == "KernelCounts":
            read.add_counts(r.counts)
    assert read.busy == direct.busy and read.spans == direct.spans and read.counts == direct.counts
    assert read.names == direct.names and read.records == direct.records == 8


def test_real_profiler_events_give_the_launch_path_with_first_lines():
    """Real torch.profiler events (CPU build, with_stack=True) with one runtime call and kernel added
    inside the real `aten::addmm`: the reduction rebuilds the Python stack from the python_function
    events' parents, drops C calls and module marks, and names `train`, which was running when the
    profiler started (the profiler names it by its current line), by its first line, as the sampler does."""
    torch = pytest.importorskip("torch")
    import sys
    from pathlib import Path

    from torch.profiler import ProfilerActivity, profile

    from energyprof.agent.kernels.reduce import running_frames
    from kineto_events import CUDA, Event

    lin = torch.nn.Linear(8, 8)

    def forward(x):
        return lin(x).relu()

    def train():
        x = torch.randn(4, 8)
        prof = profile(activities=[ProfilerActivity.CPU], with_stack=True)
        running, _ = running_frames(sys._current_frames().values()), prof.start()  # one line: as the capture does
        for _ in range(2):
            forward(x).sum()
        prof.stop()
        return prof, running

    prof, running = train()
    events = list(prof.profiler.kineto_results.events())
    addmm = [e for e in events if e.name() == "aten::addmm"][1]
    mid = addmm.start_ns() + 1  # inside addmm, before any op nested in it
    events += [Event(activity_type="cuda_runtime", name="cudaLaunchKernel", start_ns=mid, end_ns=mid + 1000,
                     device_resource_id=addmm.device_resource_id(), correlation_id=777),
               Event(activity_type="kernel", name="gemm", device_type=CUDA, start_ns=mid + 5000, end_ns=mid + 15000,
                     correlation_id=777)]
    here = Path(__file__).name
    first, fwd = train.__code__.co_firstlineno, forward.__code__.co_firstlineno
    for given, want in ((running, first), ({}, None)):
        c = reduce_events(events, unix_minus_perf=0, t0=mid, t1=mid + 20000, running=given)
        ((path, dev),) = c.figures
        assert dev == 0 and path[-2:] == (("aten::linear", "", 0), ("aten::addmm", "", 0))
        names = [(f[0], Path(f[1]).name, f[2]) for f in path]
        assert ("forward", here, fwd) in names
        assert not [f for f in path if f[0].startswith(("<built-in", "nn.Module"))]
        (line,) = [f[2] for f in names if f[:2] == ("train", here)]
        if want is not None:
            assert line == want
        else:
            assert line > first  # the profiler's own name: the current line (the `with profile` line)


def test_capture_cpu_is_charged_to_energyprof(monkeypatch):
    """What the capture spends on the program's thread (starting, stepping, reducing, stopping) is handed
    to the sampler as energyprof's own CPU, and the sampler's ticks carry it as such."""
    pytest.importorskip("torch")
    import time

    import torch
    from torch.profiler import ProfilerActivity

    from energyprof.agent import sampler
    from energyprof.agent.kernel_capture import KernelCapture

    charged = []
    monkeypatch.setattr(sampler, "charge_own", charged.append)
    cap = KernelCapture(KernelFold(), activities=[ProfilerActivity.CPU])
    cap.start()
    x = torch.randn(16, 16)
    for _ in range(3):
        x = (x @ x).tanh()
    cap.stop()
    assert charged and sum(charged) == cap.cost_ns > 0
    monkeypatch.undo()

    class Sink:
        def __init__(self):
            self.own = []

        def tick(self, t0, t1, proc, own, rss):
            self.own.append(own)

        def __getattr__(self, name):
            return lambda *a, **k: 0

    sink = Sink()
    s = sampler.Sampler(sink, 0.005, sampler.View(), rss=False)
    s.start()
    while len(sink.own) < 2:
        time.sleep(0.005)
    before = sink.own[-1]
    sampler.charge_own(10**9)
    n = len(sink.own)
    while len(sink.own) < n + 2:
        time.sleep(0.005)
    s.stop()
    sampler._charged[0] -= 10**9
    assert sink.own[-1] - before >= 10**9  # the charged second, on top of the sampler's own CPU


def test_profiler_warnings_and_kineto_lines_stay_off_the_programs_stderr(tmp_path):
    """A torch program that writes to stderr itself, under plain python and under energyprof with the
    capture on a schedule (which makes torch warn "Profiler clears events at the end of each cycle" and
    Kineto print its `profiler_start` lines): the same stderr."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    from conftest import run_cli

    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").write_text("")
    (tmp_path / "p.csv").write_text("t_s,gpu:0\n0,100\n")
    script = tmp_path / "prog.py"
    script.write_text("import sys, torch\nimport energyprof.torch as ept\nx = torch.randn(16, 16)\n"
                      "for _ in ept.track(list(range(9))):\n    x = (x @ x).tanh()\n"
                      "sys.stderr.write('mine\\n')\nprint('done')\n")
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path)
    r = run_cli(["--gpu-kernels", "--gpu-kernel-steps", "3:2", "--power-trace", str(tmp_path / "p.csv"), "-q",
                 "--json", str(tmp_path / "o.json"), str(script)], tmp_path, env={"ENERGYPROF_DEV_ROOT": str(tmp_path)})
    assert plain.returncode == r.returncode == 0, r.stderr
    assert plain.stderr == "mine\n" and r.stderr == plain.stderr and r.stdout == plain.stdout
    from energyprof.facts.profile import load

    (note,) = [n for n in load(tmp_path / "o.json").notes if n.kind == "gpu-wall-time"]
    assert note.extra["cycles"] == 3


def test_no_gpu_kernels_flag_exists_and_turns_the_capture_off(tmp_path):
    from conftest import run_cli
    from energyprof.facts.profile import load

    (tmp_path / "p.csv").write_text("t_s,gpu:0\n0,100\n")
    script = tmp_path / "prog.py"
    script.write_text("print('done')\n")
    r = run_cli(["--no-gpu-kernels", "--power-trace", str(tmp_path / "p.csv"), "-q", "--json", str(tmp_path / "o.json"),
                 str(script)], tmp_path)
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    (note,) = [n for n in load(tmp_path / "o.json").notes if n.kind == "gpu-wall-time"]
    assert "--no-gpu-kernels" in note.message and "where Python waited" in note.message
    r = run_cli(["--gpu-kernels", "--no-gpu-kernels", "--gpu-kernel-steps", "3:1", "-q", str(script)], tmp_path)
    assert r.returncode == 2 and "--gpu-kernel-steps" in r.stderr


def test_on_by_default_only_where_the_program_uses_cuda_through_torch(tmp_path):
    """Without a flag the capture is armed, not started: a program that never touches torch loads
    nothing of it; on this CPU machine a torch program never initialises CUDA, so it stays off and the
    report says its GPU figures are where Python waited."""
    from conftest import run_cli
    from energyprof.facts.profile import load

    (tmp_path / "p.csv").write_text("t_s,gpu:0\n0,100\n")
    script = tmp_path / "prog.py"
    script.write_text("import sys\nprint(sorted(m for m in ('torch', 'energyprof.agent.kernel_capture',"
                      " 'energyprof.agent.kernels.reduce') if m in sys.modules))\n")
    r = run_cli(["--power-trace", str(tmp_path / "p.csv"), "-q", "--json", str(tmp_path / "o.json"), str(script)],
                tmp_path)
    assert r.returncode == 0 and r.stdout == "[]\n", r.stderr
    (note,) = [n for n in load(tmp_path / "o.json").notes if n.kind == "gpu-wall-time"]
    assert "where Python waited" in note.message and "did not run" in note.message


def test_through_the_capture_cycle_end_and_a_fwdbwd_flow():
    """The same step through the capture's own cycle end (`on_trace_ready` with the profiler's events in
    memory) into the in-process fold; the backward op here carries no sequence number, only Kineto's
    fwdbwd flow from the forward op: the flow links it, and the answer is the same."""
    from types import SimpleNamespace

    from energyprof.agent import kernel_capture

    s = Step(OFF)
    mod = s.py("train.py(30): <module>", 0, 100)
    train = s.py("train.py(12): train", 0, 100, mod)
    s.py("model.py(20): forward", 1, 21, train)
    s.op("aten::mm", 2, 8, seq=5, flow=(9, True))
    s.launch(3, "fwd_gemm", 10, 20)
    s.py("torch/_tensor.py(566): backward", 22, 60, train)
    s.op("autograd::engine::evaluate_function: MmBackward0", 25, 38, os_tid=200, tid=2, fwd=1, flow=(9, False))
    s.op("aten::mm", 26, 30, os_tid=200, tid=2)
    s.launch(27, "bwd_gemm", 30, 50, os_tid=200)
    fold = KernelFold()
    cap = kernel_capture.KernelCapture(fold)
    cap.t_start, cap.running = 0, RUNNING
    real = kernel_capture.clock_offset
    kernel_capture.clock_offset = lambda rounds=64: (OFF, 0)
    try:
        cap._ready(SimpleNamespace(profiler=SimpleNamespace(kineto_results=SimpleNamespace(events=lambda: s.events))))
    finally:
        kernel_capture.clock_offset = real
    assert cap.failed is None and cap.cycles == 1
    prof = _profile(fold, _folded_run())
    train_node = _child(_child(prof.root, "<module>"), "train")
    assert _child(train_node, "forward").energy_j["gpu:0"] == pytest.approx(1.0, rel=1e-9)
    backward = _child(train_node, "backward")
    bwd = _child(backward, BACKWARD_FRAME[0])
    assert _child(bwd, "forward").energy_j["gpu:0"] == pytest.approx(2.0, rel=1e-9)
    assert prof.gpu_kernels.unplaced == {}


def test_a_forked_child_never_stops_its_parents_profiler(tmp_path):
    """A DataLoader worker forked while the capture runs inherits the capture object: in the child it
    does nothing (no step, no stop of a session that is the parent's), and the parent's cycle is intact."""
    pytest.importorskip("torch")
    import os

    from torch.profiler import ProfilerActivity

    from energyprof.agent.kernel_capture import KernelCapture

    fold = KernelFold()
    cap = KernelCapture(fold, activities=[ProfilerActivity.CPU])
    cap.start()
    pid = os.fork()
    if pid == 0:  # the child: step and stop must be no-ops
        try:
            cap.step()
            cap.stop()
            os._exit(0 if cap.prof is None and not cap.live and cap.cycles == 0 else 3)
        except BaseException:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert cap.live and cap.prof is not None
    cap.stop()
    assert cap.cycles == 1 and cap.failed is None


def test_many_cycles_keep_a_bounded_number_of_spans_and_the_clip_is_exact():
    from energyprof.core.gpu_tree import clip_intervals

    fold = KernelFold(max_spans=64)
    for k in range(10_000):  # back-to-back cycles 10 ms long with gaps of 1-3 us
        fold.add_cycle(k * 10 * MS + (k % 3) * 1000, (k + 1) * 10 * MS, 0)
    assert len(fold.spans) <= 64 and fold.cycles == 10_000 and fold.joined_gap_ns <= 2000
    assert fold.spans[0][0] == 0 and fold.spans[-1][1] == 100_000 * MS
    ivs = [(k * 7 * MS, (k + 1) * 7 * MS, 1.0) for k in range(20)]
    spans = [(3 * MS, 9 * MS), (20 * MS, 21 * MS), (50 * MS, 200 * MS)]
    brute = [(max(a, s), min(b, t), e * (min(b, t) - max(a, s)) / (b - a)) for a, b, e in ivs for s, t in spans
             if min(b, t) > max(a, s)]
    assert clip_intervals(ivs, spans) == brute


def test_supervised_run_carries_the_reduced_kernels_through_the_spool(tmp_path):
    """The whole supervised path: the agent starts the capture in the program (CPU build, real torch
    profiler), each cycle's in-memory events are reduced in the program and written to the spool, the
    supervisor folds them and builds the tree with them. A CPU build has no device, so only that is
    faked, inside the program: each real `aten::mm` gets a runtime call and a 2 ms kernel on device 0
    beside it (tests/kineto_events.py). Power is a replayed flat 100 W: `forward` holds 100 W x the
    kernels' busy time, to 1e-9."""
    pytest.importorskip("torch")
    import os
    from pathlib import Path

    from conftest import run_cli
    from energyprof.facts.profile import load

    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").write_text("")
    (tmp_path / "p.csv").write_text("t_s,gpu:0,cpu\n0,100,50\n")
    tests = str(Path(__file__).parent)
    script = tmp_path / "prog.py"
    script.write_text(f"""import sys, time, torch
sys.path.insert(0, {tests!r})
import energyprof.agent.kernels.reduce as reduce
from kineto_events import CUDA, Event
real = reduce.reduce_events
def with_a_device(events, **kw):  # the only fake: device records beside each real aten::mm
    extra = []
    for k, e in enumerate([e for e in events if e.activity_type() == "cpu_op" and e.name() == "aten::mm"]):
        t = e.start_ns() + 1
        extra += [Event(activity_type="cuda_runtime", name="cudaLaunchKernel", start_ns=t, end_ns=t + 100,
                        device_resource_id=e.device_resource_id(), correlation_id=10**6 + k),
                  Event(activity_type="kernel", name="gemm", device_type=CUDA, start_ns=t + 100_000,
                        end_ns=t + 2_100_000, correlation_id=10**6 + k)]
    return real(list(events) + extra, **kw)
reduce.reduce_events = with_a_device
import energyprof.torch as ept
w = torch.randn(64, 64)
def forward(x):
    return torch.mm(x, w).tanh()
x = torch.randn(64, 64)
for _ in ept.track(list(range(30))):
    x = forward(x)
    time.sleep(0.005)
print("done")
""")
    r = run_cli(["--gpu-kernels", "--idle", "all", "--power-trace", str(tmp_path / "p.csv"), "-q", "--json",
                 str(tmp_path / "o.json"), str(script)], tmp_path,
                env={"ENERGYPROF_DEV_ROOT": str(tmp_path), "PYTHONPATH": os.pathsep.join(
                    p for p in (str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH")) if p)})
    assert r.returncode == 0 and r.stdout == "done\n" and r.stderr == "", r.stderr
    p = load(tmp_path / "o.json")
    gpu = p.gpu_kernels
    dev = gpu.devices["0"]
    assert gpu.cycles >= 3 and gpu.records >= 25  # cycles of 10 steps, each reduced as it ended
    fwd = [n for n, _ in p.walk() if n.function == "forward" and n.file.endswith("prog.py")]
    assert len(fwd) == 1  # one function, one row: the sampler's and the kernels' `forward` met
    (mm,) = fwd[0].children  # one path for all steps: the profiler's ProfilerStep#N marks are not the program's
    assert mm.function == "aten::mm" and len(gpu.stacks) == 1
    assert mm.energy_j["gpu:0"] == pytest.approx(100.0 * dev.busy_s, rel=1e-9)
    assert dev.busy_s == pytest.approx(0.002 * gpu.records, rel=1e-6)
    assert 0 < dev.split_share < 1  # the exit after the last cycle stays on the wall-time rule
    assert p.root.energy_j["gpu:0"] == pytest.approx(p.totals.energy_j["gpu:0"], rel=1e-9)
    # the capture's own CPU (torch's import at the start, each cycle's reduction) is energyprof's
    capture_ns = gpu.fold["capture_cpu_ns"]
    assert capture_ns > 0 and p.totals.energyprof_cpu_time_s * 1e9 >= capture_ns
    (own,) = [n for n in p.root.children if n.function == "[energyprof]"]
    assert own.energy_j["cpu"] > 0 and p.totals.energyprof_j["cpu"] == pytest.approx(own.energy_j["cpu"])



def test_an_event_whose_name_torch_cannot_decode_costs_that_event_only():
    """Seen on the CPU build now and then: `name()` raises UnicodeDecodeError for one event. The cycle is
    reduced without it, and the count says so (it once cost a whole cycle's kernels)."""
    from kineto_events import Event

    class Garbled(Event):
        def name(self):
            raise UnicodeDecodeError("utf-8", b"\x85", 0, 1, "invalid start byte")

    events = training_step(OFF) + [Garbled(activity_type="python_function", python_id=999, start_ns=OFF)]
    cycle = reduce_events(events, unix_minus_perf=OFF, t0=0, t1=100 * MS, running=RUNNING)
    assert cycle.records == 4 and cycle.counts["event(s) whose name could not be read"] == 1


def test_a_frame_the_sampler_never_saw_gets_its_full_path(tmp_path):
    """The profiler names `torch/nn/modules/module.py`; the tree needs the path the code carries (under
    site-packages: a library frame in the report), found under the program's sys.path."""
    from energyprof.analysis.functions import is_library
    from energyprof.agent.kernels.reduce import FullPaths

    lib = tmp_path / "site-packages"
    (lib / "torch" / "nn").mkdir(parents=True)
    (lib / "torch" / "nn" / "module.py").write_text("")
    files = FullPaths([str(tmp_path / "nothing"), str(lib)])
    s = Step(OFF)
    mod = s.py("train.py(1): <module>", 0, 100)
    s.py("torch/nn/module.py(1782): _call_impl", 1, 50, mod)
    s.op("aten::mm", 2, 8, seq=1)
    s.launch(3, "gemm", 10, 20)
    c = reduce_events(s.events, unix_minus_perf=OFF, t0=0, t1=100 * MS, files=files)
    ((path, _),) = c.figures
    assert path[0] == ("<module>", "train.py", 1)  # no such file under the entries: kept as named
    assert path[1] == ("_call_impl", str(lib / "torch" / "nn" / "module.py"), 1782) and is_library(path[1][1])


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_trace_export_is_an_option_and_streams_gzipped_files(tmp_path):
    """--gpu-kernel-trace DIR: each cycle's Chrome trace in DIR, gzipped (readable JSON); without it
    nothing is written; a folder that is not there is one line and exit 2 before the program."""
    pytest.importorskip("torch")
    import gzip
    import json

    from conftest import run_cli

    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").write_text("")
    (tmp_path / "p.csv").write_text("t_s,gpu:0\n0,100\n")
    (tmp_path / "traces").mkdir()
    script = tmp_path / "prog.py"
    script.write_text("import torch\nimport energyprof.torch as ept\nx = torch.randn(16, 16)\n"
                      "for _ in ept.track(list(range(4))):\n    x = (x @ x).tanh()\nprint('done')\n")
    env = {"ENERGYPROF_DEV_ROOT": str(tmp_path)}
    common = ["--gpu-kernels", "--gpu-kernel-steps", "2:1", "--power-trace", str(tmp_path / "p.csv"), "-q"]
    r = run_cli([*common, "--gpu-kernel-trace", str(tmp_path / "traces"), str(script)], tmp_path, env=env)
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    files = sorted((tmp_path / "traces").iterdir())
    assert len(files) == 2 and all(f.name.endswith(".kineto.json.gz") for f in files)
    assert all("traceEvents" in json.loads(gzip.open(f).read()) for f in files)
    r = run_cli([*common, "--gpu-kernel-trace", str(tmp_path / "nowhere"), str(script)], tmp_path, env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--gpu-kernel-trace" in r.stderr


def test_in_process_default_stays_off_without_cuda(tmp_path):
    """energy_profile() with no gpu_kernels= in a torch program that never initialises CUDA: no capture
    (nothing of it imported), and the note says the GPU figures are where Python waited."""
    torch = pytest.importorskip("torch")
    import sys

    from energyprof import energy_profile
    from energyprof.facts.profile import load

    sys.modules.pop("energyprof.agent.kernel_capture", None)
    power = tmp_path / "p.csv"
    power.write_text("t_s,gpu:0,cpu\n0,100,20\n")

    @energy_profile(json=str(tmp_path / "o.json"), power_trace=str(power), quiet=True)
    def work():
        return float((torch.randn(8, 8) @ torch.randn(8, 8)).sum())

    work()
    assert "energyprof.agent.kernel_capture" not in sys.modules
    (note,) = [n for n in load(tmp_path / "o.json").notes if n.kind == "gpu-wall-time"]
    assert "where Python waited" in note.message and "did not run" in note.message


FULL_DISK_KERNELS = """
import os, resource, signal, sys
sys.path.insert(0, sys.argv[2])
from energyprof.agent import wire
from energyprof.agent.kernel_capture import SpoolSink
from energyprof.agent.spool import Spool
from energyprof.agent.kernels.reduce import reduce_events
from energyprof.supervise.stream import StreamReader
from kineto_events import training_step, MS
OFF = 1_700_000_000_000_000_000
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
path = sys.argv[1]
sp = Spool(path)
sink = SpoolSink(sp)
sp.stack(0, (0,))
sp.flush()
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path), hard))  # the disk is full
sink.add(reduce_events(training_step(OFF), unix_minus_perf=OFF, t0=0, t1=100 * MS))
sp.flush()
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
sink.add(reduce_events(training_step(OFF + 100 * MS), unix_minus_perf=OFF, t0=100 * MS, t1=200 * MS))
sp.flush()
for r in StreamReader(path).read():
    print(r[0], len(r))
"""


def test_a_full_disk_drops_a_cycles_figures_and_keeps_its_paths(tmp_path):
    """The kernel records on a full disk: the first cycle's figures are dropped (a LOST record says so),
    its launch paths are written once there is room, and the next cycle's figures refer to them."""
    import subprocess
    import sys
    from pathlib import Path

    from energyprof.agent import wire

    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    res = subprocess.run([sys.executable, "-c", FULL_DISK_KERNELS, str(tmp_path / "1-1.spool"),
                          str(Path(__file__).parent)], capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    kinds = [ln.split()[0] for ln in res.stdout.splitlines()]
    assert kinds.count(wire.KPATH) == 3 and kinds.count(wire.LOST) == 1
    assert kinds.count(wire.KCYCLE) == 1 and kinds.count(wire.KBUSY) == 3  # the second cycle's only
    assert kinds.index(wire.KPATH) < kinds.index(wire.KBUSY)
