"""One reduction for the run and the offline reader: the same events, once as the profiler's in-memory
events (agent/kernels/reduce.reduce_events, what the program reduces each cycle) and once written as a
Kineto JSON trace (collect/kernels/kineto.parse, what `energyprof gpu-trace` reads), give the same launch
paths, the same kernels on each, and the same busy time on each path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kineto_events import CUDA, MS, Event, Step, training_step
from energyprof.agent.kernels.autograd import BACKWARD_FRAME
from energyprof.agent.kernels.reduce import reduce_events
from energyprof.collect.kernels import kineto
from energyprof.core.kernels import attribute

BASE = 1_000_000_000  # 1 s of Unix ns: small enough that microseconds keep their ns digits in a float
PID = 4242


def as_trace(events) -> dict:
    """The events as torch's exporter writes them: times in us, the OS thread as `tid`, the sequence number
    and the forward thread's id in `args`, a device record's device, stream and correlation."""
    out = []
    for e in events:
        kind = e.activity_type()
        ev = {"ph": "X", "cat": kind, "name": e.name(), "pid": PID, "tid": e.device_resource_id(),
              "ts": e.start_ns() / 1000, "dur": (e.end_ns() - e.start_ns()) / 1000}
        if kind == "cpu_op" and e.sequence_nr() >= 0:
            ev["args"] = {"Sequence number": e.sequence_nr(), "Fwd thread id": e.fwd_thread_id()}
        elif kind == "cuda_runtime":
            ev["args"] = {"correlation": e.correlation_id()}
        elif kind == "kernel":
            ev.update(pid=0, tid=e.device_resource_id())
            ev["args"] = {"device": e.device_index(), "stream": e.device_resource_id(), "correlation": e.correlation_id()}
        out.append(ev)
    return {"traceEvents": out, "schemaVersion": 1}


def two_steps():
    """The training step of tests/kineto_events.py, then a step of two lines whose kernels overlap on two
    devices' streams (shared busy time), a kernel launched from Python with no operator around it, one
    launched on a thread with no Python, and one whose launch is not in the events."""
    events = training_step(BASE)
    s = Step(BASE + 100 * MS)
    s._pid, s._corr = 1000, 5000  # one cycle's Python and correlation ids are unique
    mod = s.py("train.py(30): <module>", 0, 100)
    s.py("model.py(40): encode", 1, 30, mod)
    s.op("aten::addmm", 2, 10)
    s.launch(3, "enc_gemm", 10, 30)
    s.launch(4, "enc_gemm", 12, 20, device=1)
    s.py("model.py(50): decode", 31, 60, mod)
    s.op("aten::relu", 32, 40)
    s.launch(33, "dec_relu", 25, 35)  # overlaps enc_gemm's last 5 ms on device 0
    s.launch(50, "triton_fused", 62, 64)  # launched by decode with no operator around it
    s.op("aten::copy_", 80, 90, os_tid=300, tid=3)  # a thread with no Python (a C++ worker)
    s.launch(81, "copy_kernel", 82, 84, os_tid=300)
    s.events.append(Event(activity_type="kernel", name="orphan", device_type=CUDA, device_resource_id=7,
                          start_ns=s.t(70), end_ns=s.t(72), correlation_id=99_999))
    return events + s.events


def _in_run(events):
    """(path, device) -> ({kernel name: (count, ns)}, shared busy ns), as the program reduces them."""
    cycle = reduce_events(events, unix_minus_perf=0, t0=BASE, t1=BASE + 200 * MS)
    return {key: ({n: (int(c), float(t)) for n, (c, t) in fig.names.items()}, sum(fig.busy.values()))
            for key, fig in cycle.figures.items()}, cycle


def _offline(doc):
    """The same from the offline reader's kernels: names counted per launch path, busy time shared by
    core/kernels.attribute (flat power, so each instant's 1/k share is its busy time)."""
    trace = kineto.parse(doc)
    out: dict = {}
    for k in trace.kernels:
        names = out.setdefault((k.stack, k.device), ({}, 0.0))[0]
        c, t = names.get(k.name, (0, 0.0))
        names[k.name] = (c + 1, t + k.duration_ns)
    devices = {k.device for k in trace.kernels}
    power = {d: [(trace.start_ns, trace.end_ns, 1.0)] for d in devices}
    att = attribute(((k.stack, k.device, k.name, k.start_ns, k.end_ns) for k in trace.kernels), power,
                    {d: 0.0 for d in devices})
    return {key: (names, att.stacks[key[0]][key[1]].time_s * 1e9) for key, (names, _) in out.items()}, trace


def test_the_run_and_the_offline_reader_place_the_same_events_alike():
    events = two_steps()
    run, cycle = _in_run(events)
    offline, trace = _offline(as_trace(events))
    assert set(run) == set(offline)
    for key in run:
        assert run[key][0] == offline[key][0], key
        assert run[key][1] == pytest.approx(offline[key][1], rel=1e-9, abs=1e-6), key
    paths = {path for path, _ in run}
    # what the two entry points agree on is the launch rule itself, not a degenerate tree:
    # backward's GEMM under backward() > [backward] > the forward line, the overlap shared, the orphan labelled
    (bwd,) = [p for p in paths if BACKWARD_FRAME in p and p[-1][0] == "aten::mm" and len(p) > 6]
    assert [f[0] for f in bwd][-4:] == ["forward", "aten::mm", "MmBackward0", "aten::mm"]
    assert ((kineto.UNLAUNCHED_NODE, "", 0),) in paths
    (fused,) = [p for (p, _), v in run.items() if "triton_fused" in v[0]]
    assert fused[-1][0] == "decode"  # the Python line that launched it: the runtime call is not a frame
    (copy,) = [p for (p, _), v in run.items() if "copy_kernel" in v[0]]
    assert copy == ((kineto.OPERATOR_NODE, "", 0), ("aten::copy_", "", 0))  # no Python: labelled, as offline
    enc = [v for (p, d), v in run.items() if d == 0 and p[-1][0] == "aten::addmm" and p[-2][0] == "encode"]
    assert enc and enc[0][1] == pytest.approx(15 * MS + 5 * MS / 2)  # 20 ms, 5 of them shared with dec_relu
    assert trace.unmatched == 1 == cycle.counts["device record with no launch in the cycle"]
    # the backward ops neither could link (AccumulateGrad), counted alike
    assert {f"backward: {r}": n for r, n in trace.backward.unlinked_ops.items()} == \
        {k: v for k, v in cycle.counts.items() if k.startswith("backward: ")} != {}


def test_the_offline_reader_is_the_same_reduction_on_a_saved_file(tmp_path):
    """Through the CLI too: the written trace's joules per launch path are the busy shares of the run's
    reduction times the flat power."""
    from conftest import run_cli
    from energyprof.facts.profile import load

    events = two_steps()
    run, _ = _in_run(events)
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(as_trace(events)))
    power = tmp_path / "p.csv"
    power.write_text("t_s,gpu:0,gpu:1\n0,100,100\n")
    out = tmp_path / "o.json"
    r = run_cli(["gpu-trace", str(trace), "--power-trace", str(power), "--json", str(out), "-q"], tmp_path)
    assert r.returncode == 0, r.stderr
    stacks = {(tuple(map(tuple, s.path)), s.device): s.joules for s in load(out).gpu_kernels.stacks}
    assert set(stacks) == set(run)
    for key, (_, busy_ns) in run.items():
        assert stacks[key] == pytest.approx(100.0 * busy_ns / 1e9, rel=1e-9)


def test_fixture_traces_read_in_one_pass(tmp_path):
    """The real traces in tests/fixtures/kineto go through the adapter whole: every device record placed."""
    for path in sorted((Path(__file__).parent / "fixtures" / "kineto").glob("*.json*")):
        trace = kineto.load(path)
        assert trace.kernels and all(k.stack for k in trace.kernels), path
