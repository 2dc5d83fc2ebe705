"""GPU kernels reduced in the program: a profiler cycle's in-memory events -> per-path busy time -> the
run's fold -> the GPU's energy split among the launching lines, grafted while the tree is built.

The device side is fed Kineto-shaped events (tests/kineto_events.py: the fields torch 2.13's
`_KinetoEvent` gives), since a CPU build records no kernel; everything else is the real pipeline:
the reduction, the fold, the spool's records, the ledger, build_profile. Power is replayed.
"""

from __future__ import annotations

import pytest

from energyprof.collect.kernels.reduce import reduce_events
from energyprof.core.autograd import BACKWARD_FRAME
from energyprof.core.gpu_tree import GPU_FIELD, KernelFold
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

    split, notes = kernel_split(fold, ledger, None, ledger.sources)
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
    under = _child(_child(_child(bwd_node, "<module>"), "train"), "forward")
    assert under.energy_j[g] == pytest.approx(2.0, rel=1e-9)  # beneath the forward line that made them
    step = _child(train, "step")
    assert step.energy_j[g] == pytest.approx(0.5, rel=1e-9)
    assert _child(prof.root, GPU_IDLE_NODE).self_energy_j[g] == pytest.approx(6.5, rel=1e-9)
    assert train.self_energy_j[g] == pytest.approx(0.0, abs=1e-12)  # nothing left on the wait
    assert train.energy_j["cpu"] == pytest.approx(0.5, rel=1e-9)  # CPU untouched
    gpu = prof.extra[GPU_FIELD]
    assert gpu["devices"]["0"]["split_share"] == pytest.approx(1.0)
    assert gpu["unplaced"] == {"backward: AccumulateGrad (a leaf's gradient: no forward op)": 2}
    rows = {tuple(r["path"][-1]): r for r in gpu["stacks"]}
    assert {k["name"] for k in rows[("aten::mm", "", 0)]["kernels"]} in ({"fwd_gemm"}, {"bwd_gemm_a", "bwd_gemm_b"})
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
    assert prof.extra[GPU_FIELD]["devices"]["0"]["split_share"] == pytest.approx(0.5)
    (note,) = [n for n in prof.notes if n.kind == "gpu-kernels-split"]
    assert "50.0%" in note.message and "where Python waited" in note.message


def test_no_kernels_says_the_gpu_figures_are_where_python_waited():
    from energyprof.collect.kernels.capture import kernel_split

    ledger = _folded_run()
    for mode, words in ((None, "did not run"), (False, "--no-gpu-kernels"), (True, "no profiler cycle ended")):
        split, notes = kernel_split(KernelFold(), ledger, None, ledger.sources, mode=mode)
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
