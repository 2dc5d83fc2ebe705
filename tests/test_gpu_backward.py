"""Backward's GPU joules on the lines that made them, through `energyprof gpu-trace` on a written
Kineto-shaped trace (as torch's exporter writes it: `Sequence number`, `Fwd thread id`, `fwdbwd`
flows) and a replayed power log. The trace is synthetic; its shape follows the real CUDA traces in
tests/fixtures/kineto (a backward op on autograd's thread with `Fwd thread id` 1 and its sequence
number; the MI250 step's `fwdbwd` flows, `s` on the forward op, `f` on the backward op)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from energyprof.collect.kernels import kineto
from energyprof.agent.kernels.autograd import ACCUMULATE_GRAD, BACKWARD_FRAME
from energyprof.facts.profile import load

PID, MAIN, AUTOGRAD = 4037, 4037, 23695
WATTS = 200.0

CALLER = [("<module>", "train.py", 1), ("train", "train.py", 10), ("step", "train.py", 20)]
BACKWARD_CALL = [("backward", "torch/_tensor.py", 570), ("backward", "torch/autograd/__init__.py", 200)]


def _x(cat, name, tid, ts, dur, pid=PID, **args):
    ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": float(ts), "dur": float(dur)}
    if args:
        ev["args"] = args
    return ev


def step_trace(python: bool = True, flows: bool = True, sequence: bool = True) -> dict:
    """One training step, times in us: forward on the main thread, backward on autograd's, the optimizer."""
    ev: list[dict] = []

    def py(name, ts, dur):
        if python:
            ev.append(_x("python_function", name, MAIN, ts, dur))

    def op(name, tid, ts, dur, seq=None, fwd=0, flow=None):
        args = {}
        if seq is not None and sequence:
            args = {"Fwd thread id": fwd, "Sequence number": seq}
        ev.append(_x("cpu_op", name, tid, ts, dur, **args))
        if flow is not None and flows:
            ph, fid = flow
            f = {"ph": ph, "id": fid, "pid": PID, "tid": tid, "ts": float(ts), "cat": "fwdbwd", "name": "fwdbwd"}
            if ph == "f":
                f["bp"] = "e"
            ev.append(f)

    def launch(tid, ts, corr, kernel, k0, kdur):
        ev.append(_x("cuda_runtime", "cudaLaunchKernel", tid, ts, 1, correlation=corr))
        ev.append(_x("kernel", kernel, 7, k0, kdur, pid=0, device=0, stream=7, correlation=corr))

    py("train.py(1): <module>", 0, 1000)
    py("train.py(10): train", 1, 998)
    py("train.py(20): step", 2, 996)
    # forward
    py("model.py(5): forward", 10, 90)
    py("<built-in method linear of type object at 0x7f>", 19, 42)  # a C call: not a frame
    op("aten::linear", MAIN, 20, 40, seq=5)
    op("aten::t", MAIN, 21, 4, seq=5)
    op("aten::addmm", MAIN, 30, 25, seq=6, flow=("s", 1))
    launch(MAIN, 40, 1, "gemm_fwd", 100, 100)
    op("aten::mse_loss", MAIN, 110, 20, seq=7, flow=("s", 2))
    launch(MAIN, 115, 2, "loss_fwd", 200, 10)
    # loss.backward(): the main thread waits in it while autograd's thread runs the nodes
    py("torch/_tensor.py(570): backward", 200, 400)
    py("torch/autograd/__init__.py(200): backward", 201, 398)
    op("autograd::engine::evaluate_function: MseLossBackward0", AUTOGRAD, 300, 20, seq=7, fwd=1, flow=("f", 2))
    op("MseLossBackward0", AUTOGRAD, 301, 18, seq=7, fwd=1)
    op("aten::mse_loss_backward", AUTOGRAD, 302, 16)
    launch(AUTOGRAD, 305, 3, "loss_bwd", 320, 10)
    op("autograd::engine::evaluate_function: AddmmBackward0", AUTOGRAD, 330, 70, seq=6, fwd=1, flow=("f", 1))
    op("AddmmBackward0", AUTOGRAD, 331, 68, seq=6, fwd=1)
    op("aten::mm", AUTOGRAD, 340, 20)
    launch(AUTOGRAD, 345, 4, "gemm_bwd_input", 400, 100)
    op("aten::mm", AUTOGRAD, 361, 19)
    launch(AUTOGRAD, 365, 5, "gemm_bwd_weight", 500, 100)
    op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", AUTOGRAD, 410, 10)
    op("aten::add_", AUTOGRAD, 411, 8)
    launch(AUTOGRAD, 412, 6, "accumulate", 600, 10)
    # the optimizer
    py("optim.py(30): opt_step", 700, 100)
    op("aten::_foreach_add_", MAIN, 710, 40)
    launch(MAIN, 715, 7, "foreach_add", 760, 20)
    ev.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
               "ts": 0.0, "dur": 1000.0})
    return {"schemaVersion": 1, "baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": ev,
            "traceName": "step.json"}


def _run(tmp_path: Path, doc: dict, name: str = "step.json"):
    trace = tmp_path / name
    trace.write_text(json.dumps(doc))
    power = tmp_path / "power.csv"
    power.write_text("t_s,gpu:0\n" + "".join(f"{t / 10000:.4f},{WATTS}\n" for t in range(10)))  # 0.1 ms rows
    out = tmp_path / (name + ".profile.json")
    r = run_cli(["gpu-trace", str(trace), "--power-trace", str(power), "--json", str(out)], tmp_path)
    assert r.returncode == 0, r.stderr
    return load(out), r.stderr


def _at(profile, *path):
    node = profile.root
    for fn in path:
        found = [c for c in node.children if c.function == fn]
        assert found, f"no {fn} under {node.function}: {[c.function for c in node.children]}"
        (node,) = found
    return node.energy_j.get("gpu:0", 0.0)


def J(us: float) -> float:
    return WATTS * us * 1e-6


@pytest.mark.parametrize("flows, sequence", [(True, True), (False, True), (True, False)],
                         ids=["flows+sequence", "sequence-only", "flows-only"])
def test_backward_goes_under_the_backward_call_then_the_forward_line(tmp_path, flows, sequence):
    p, err = _run(tmp_path, step_trace(flows=flows, sequence=sequence))
    step = ("<module>", "train", "step")
    bwd = step + ("backward", "backward", BACKWARD_FRAME[0])
    # forward's kernel on the forward line; the optimizer's on its line
    assert _at(p, *step, "forward", "aten::linear", "aten::addmm") == pytest.approx(J(100), rel=1e-9)
    assert _at(p, *step, "aten::mse_loss") == pytest.approx(J(10), rel=1e-9)
    assert _at(p, *step, "opt_step", "aten::_foreach_add_") == pytest.approx(J(20), rel=1e-9)
    # backward: under loss.backward() > [backward] > the forward line that made it, then its backward ops
    assert _at(p, *bwd, "forward", "aten::linear", "aten::addmm", "AddmmBackward0", "aten::mm") == \
        pytest.approx(J(200), rel=1e-9)
    assert _at(p, *bwd, "forward") == pytest.approx(2 * _at(p, *step, "forward"), rel=1e-9)
    assert _at(p, *bwd, "aten::mse_loss", "MseLossBackward0", "aten::mse_loss_backward") == pytest.approx(J(10), rel=1e-9)
    # AccumulateGrad has no forward op: under [backward] on its own ops, and counted
    assert _at(p, *bwd, "torch::autograd::AccumulateGrad", "aten::add_") == pytest.approx(J(10), rel=1e-9)
    assert _at(p, *step, "backward") == pytest.approx(J(220), rel=1e-9)  # the backward() line holds the backward pass
    assert _at(p, "[GPU idle]") == pytest.approx(J(1000 - 350), rel=1e-9)
    total = sum(n.self_energy_j.get("gpu:0", 0.0) for n, _ in p.walk())
    assert total == pytest.approx(J(1000), rel=1e-9)
    bw = p.meta["backward"]
    assert bw["records"] == 4 and bw["linked_records"] == 3 and bw["unlinked_records"] == {ACCUMULATE_GRAD: 1}
    assert bw["unlinked_j"] == pytest.approx(J(10), rel=1e-9)
    (note,) = [n for n in p.notes if n.kind == "gpu-backward"]
    assert "3 of 4" in note.message and "AccumulateGrad" in note.message
    # the console, as the page's GPU panel: the forward line's row holds its forward and its backward
    # (3x the forward's kernel: 100 us + 200 us at a flat power), with its bar; [GPU idle]; what was not linked
    (row,) = [line for line in err.splitlines() if line.rstrip().endswith("forward  model.py:5") and " ± " in line]
    assert row.split()[:2] == ["60", "mJ"], row  # J(300) of the J(1000) the 200 W log holds over 1 ms
    assert "[GPU idle]" in err
    assert "backward: 3 of 4 device records" in err and "AccumulateGrad" in err
    # a flat power: no sample moves joules between lines; the bars are the sensor's 5%
    (row,) = [s for s in p.gpu_kernels.stacks if s.path[-1][0] == "aten::addmm"]
    assert row.error_j == pytest.approx(0.05 * J(100), rel=1e-9)


def test_without_python_stacks_the_link_uses_the_operator_chain(tmp_path):
    p, _ = _run(tmp_path, step_trace(python=False))
    op = kineto.OPERATOR_NODE
    assert _at(p, op, "aten::linear", "aten::addmm") == pytest.approx(J(100), rel=1e-9)
    assert _at(p, op, BACKWARD_FRAME[0], "aten::linear", "aten::addmm", "AddmmBackward0") == pytest.approx(J(200), rel=1e-9)
    assert _at(p, op, BACKWARD_FRAME[0], "torch::autograd::AccumulateGrad") == pytest.approx(J(10), rel=1e-9)


def test_without_links_backward_stays_on_its_ops_and_is_counted(tmp_path):
    p, _ = _run(tmp_path, step_trace(flows=False, sequence=False))
    bwd = ("<module>", "train", "step", "backward", "backward", BACKWARD_FRAME[0])
    assert _at(p, *bwd, "AddmmBackward0", "aten::mm") == pytest.approx(J(200), rel=1e-9)
    assert p.meta["backward"]["linked_records"] == 0 and sum(p.meta["backward"]["unlinked_records"].values()) == 4


def _links_both_ways(doc):
    """A trace's backward links through the reduction (agent/kernels/reduce.launches), once with its fwdbwd
    flows and once by sequence numbers alone; and how many flows join a forward op to a backward op."""
    from energyprof.agent.kernels.reduce import launches

    reader = kineto._Reader()
    for ev in doc["traceEvents"]:
        reader.add(ev)
    reader._bind_loose_flows()
    ops = [e for e in reader.events if e.activity_type() == "cpu_op"]
    ends: dict = {}
    for e in ops:
        if e.flow is not None:
            ends.setdefault(e.flow, set()).add(e.flow_is_start)
    by_flows = launches(reader.events).auto.links
    for e in ops:
        e.flow = None
    return by_flows, launches(reader.events).auto.links, sum(1 for v in ends.values() if v == {True, False})


def test_the_real_mi250_step_links_by_flows_and_by_sequence_numbers_alike():
    MI250 = Path(__file__).parent / "fixtures" / "kineto" / "hta__amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    import gzip

    doc = json.loads(gzip.open(MI250).read())
    by_flows, by_numbers, pairs = _links_both_ways(doc)
    assert pairs == 4  # the step's four fwdbwd flows
    assert by_flows.forward_of == by_numbers.forward_of and by_flows.forward_of
    t = kineto.load(MI250)
    assert t.backward.records == 7 and t.backward.linked_records == 5
    assert t.backward.unlinked_records == {ACCUMULATE_GRAD: 2}
    mm = [k for k in t.kernels if k.correlation == 132][0]  # the backward GEMM of aten::linear
    assert mm.stack[:4] == ((kineto.OPERATOR_NODE, "", 0), BACKWARD_FRAME, ("aten::linear", "", 0), ("aten::addmm", "", 0))


def test_a_real_torch_trace_links_backward_as_its_flows_do(tmp_path):
    """torch's own exporter (CPU build: backward runs on the calling thread, so its ops carry the
    caller's Python stack): the flows and the rule agree, and a kernel launched inside backward's
    aten::mm lands under backward() > [backward] > the model line that ran the forward op."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def loss_of(x):
        return model(x).pow(2).mean()

    def train_step(x):
        loss = loss_of(x)
        loss.backward()

    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        train_step(torch.randn(4, 8))
    path = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    by_flows, by_numbers, pairs = _links_both_ways(doc)
    assert pairs >= 5  # one per backward node with a forward op (TBackward0, AddmmBackward0, ...)
    assert by_flows.forward_of == by_numbers.forward_of and by_flows.forward_of
    events = doc["traceEvents"]
    mm = [e for e in events if e.get("cat") == "cpu_op" and e.get("name") == "aten::mm"][0]  # in the last AddmmBackward0
    # the launch goes in aten::mm's own time: the widest gap between the ops nested in it (aten::resolve_conj, ...)
    inner = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "cpu_op" and e["tid"] == mm["tid"]
                   and mm["ts"] < e["ts"] and e["ts"] + e["dur"] <= mm["ts"] + mm["dur"])
    gaps, at = [], mm["ts"]
    for a, b in inner:  # the spans' union, walked in order
        if a > at:
            gaps.append((at, a))
        at = max(at, b)
    gaps.append((at, mm["ts"] + mm["dur"]))
    gap = max(gaps, key=lambda g: g[1] - g[0])
    mid = (gap[0] + gap[1]) / 2
    events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": mm["pid"], "tid": mm["tid"],
                   "ts": mid, "dur": 0.001, "args": {"correlation": 9}})
    events.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": mid + 1, "dur": 5,
                   "args": {"device": 0, "stream": 7, "correlation": 9}})
    trace = kineto.parse(doc)
    (k,) = trace.kernels
    names = [f[0] for f in k.stack]
    i = names.index(BACKWARD_FRAME[0])
    caller = names[:i]
    assert "train_step" in caller and caller.index("backward") > caller.index("train_step")  # torch/_tensor.py's
    assert names[i + 1] == "loss_of"  # the line that ran the forward op, less the frames shared with the caller
    assert names[-4:] == ["aten::linear", "aten::addmm", "AddmmBackward0", "aten::mm"]
    assert trace.backward.linked_records == 1
