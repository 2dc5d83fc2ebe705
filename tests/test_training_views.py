"""One view of a training step: each function's forward and backward, the steps' forward, backward and
optimizer, the model's heaviest modules, and epochs from a tracked loop's passes; every view agreeing.

The trees are built by hand in the shape the capture writes (core/autograd.py): the line that called
`backward()` > torch's backward frames > `[backward]` > the forward op's Python stack, so each module's
frame sits once on the forward path and once beneath `[backward]`. Known answers at 1e-9.
"""

from __future__ import annotations

import csv
import io
import json

import pytest

from conftest_report import CPU, profile_from
from energyprof.analysis.phases import (BACKWARD_NODE, is_backward_frame, is_optimizer_frame, split_span,
                                        tree_split)
from energyprof.analysis.report import build
from energyprof.analysis.training import breakdown
from energyprof.facts.profile import IDLE_NODE, Node, Window
from energyprof.render.console import render_summary
from energyprof.render.exports import csv_text
from energyprof.render.charts import function_table
from energyprof.render.format import fmt_energy, fmt_percent

TORCH = "/venv/lib/python3.11/site-packages/torch"
MODEL, TRAIN = "/work/baler/model.py", "/work/baler/train.py"


def node(function: str, file: str, line: int, joules: float, samples: int, *children: Node) -> Node:
    n = Node(function=function, file=file, line=line, self_time_s=joules / 10, self_cpu_time_s=joules / 10,
             self_samples=samples, self_energy_j={"cpu": joules})
    n.children = list(children)
    return n


def baler_tree(backward_node: bool = True) -> Node:
    """An autoencoder step: encoder 3x the decoder's forward, backward 2x its forward, Adam."""
    def model(scale: float, samples: int) -> Node:
        return node("AE.forward", MODEL, 30, 0.1 * scale, 1,
                    node("Encoder.forward", MODEL, 10, 3.0 * scale, 30 * samples,
                         node("aten::addmm", "", 0, 0.5 * scale, 5)),
                    node("Decoder.forward", MODEL, 20, 1.0 * scale, 10 * samples))

    loss = node("mse_loss", f"{TORCH}/nn/functional.py", 3300, 0.2, 2)
    bw_inner = [model(2.0, 2), node("mse_loss", f"{TORCH}/nn/functional.py", 3300, 0.1, 1),
                node("torch::autograd::AccumulateGrad", "", 0, 0.3, 3)]
    engine = node("_engine_run_backward", f"{TORCH}/autograd/graph.py", 760, 0.1, 1,
                  *([node(BACKWARD_NODE, "", 0, 0.0, 0, *bw_inner)] if backward_node else bw_inner))
    backward = node("Tensor.backward", f"{TORCH}/_tensor.py", 570, 0.05, 1,
                    node("backward", f"{TORCH}/autograd/__init__.py", 200, 0.0, 0, engine))
    adam = node("Adam.step", f"{TORCH}/optim/adam.py", 200, 1.5, 15, node("_single_tensor_adam", f"{TORCH}/optim/adam.py",
                                                                      300, 0.5, 5))
    zero = node("Optimizer.zero_grad", f"{TORCH}/optim/optimizer.py", 900, 0.2, 2)
    train = node("train", TRAIN, 5, 0.4, 4, model(1.0, 1), loss, backward, adam, zero)
    root = node("train.py", "", 0, 0.0, 0, node("<module>", TRAIN, 1, 0.25, 2, train),
                node(IDLE_NODE, "", 0, 2.0, 0))
    root.fill_inclusive()
    return root


# the tree's figures by hand: forward path, backward path, optimizer
ENCODER_FWD, ENCODER_BWD = 3.0 + 0.5, 2 * (3.0 + 0.5)
DECODER_FWD, DECODER_BWD = 1.0, 2.0
BACKWARD_J = 0.05 + 0.1 + (0.1 + 3.5 + 1.0) * 2 + 0.1 + 0.3
OPTIMIZER_J = 1.5 + 0.5 + 0.2


def step_windows(computes: list[float], per_pass: int, pass_windows: bool = True) -> list[Window]:
    """A tracked loop's windows: per step a fetch (0.5 J) then a compute; a `step.pass` window per pass."""
    out, t = [], 0.0
    for i, j in enumerate(computes):
        if pass_windows and i % per_pass == 0:
            end = t + per_pass * 1.0 - 0.05  # the end-of-data fetch inside it, the next pass after it
            out.append(Window(name="step.pass", index=i // per_pass, start_s=t, end_s=end, time_s=end - t,
                              energy_j={"cpu": 1.0}, program_energy_j={"cpu": 1.0}))
        out.append(Window(name="step.fetch", index=i, start_s=t + 0.01, end_s=t + 0.2, time_s=0.19,
                          energy_j={"cpu": 0.6}, program_energy_j={"cpu": 0.5}))
        out.append(Window(name="step.compute", index=i, start_s=t + 0.2, end_s=t + 0.9, time_s=0.7,
                          energy_j={"cpu": j + 1.0}, program_energy_j={"cpu": j}))
        t += 1.0
    return out


def baler_profile(backward_node: bool = True, windows: list[Window] | None = None):
    return profile_from(baler_tree(backward_node), [CPU], windows=windows or [])


# -- the rule -----------------------------------------------------------------------------------------
def test_frames_are_told_apart_by_their_path():
    assert is_backward_frame(BACKWARD_NODE, "")
    assert is_backward_frame("Tensor.backward", f"{TORCH}/_tensor.py")
    assert is_backward_frame("backward", "torch/autograd/__init__.py")  # as a saved trace names it
    assert not is_backward_frame("MyFunction.backward", MODEL)  # a user's autograd.Function: under [backward] anyway
    assert is_optimizer_frame("Adam.step", f"{TORCH}/optim/adam.py")
    assert is_optimizer_frame("Module.zero_grad", f"{TORCH}/nn/modules/module.py")
    assert is_optimizer_frame("MyOptimizer.step", MODEL)
    assert not is_optimizer_frame("Trainer.step", TRAIN)


def test_split_span_is_forward_as_the_rest_and_clamps_to_the_span():
    assert split_span(10.0, 3.0, 1.5) == pytest.approx((5.5, 3.0, 1.5), abs=1e-9)
    # read from another account, backward and optimizer exceed the span: scaled alike, forward 0
    f, b, o = split_span(10.0, 8.0, 4.0)
    assert (f, b, o) == pytest.approx((0.0, 20 / 3, 10 / 3), abs=1e-9)
    assert split_span(0.0, 1.0, 1.0) == (0.0, 0.0, 0.0)


def test_tree_split_known_answer():
    s = tree_split(baler_tree())
    assert s.backward_j == pytest.approx(BACKWARD_J, abs=1e-9)
    assert s.optimizer_j == pytest.approx(OPTIMIZER_J, abs=1e-9)
    assert s.total_j == pytest.approx(baler_tree().total_energy, abs=1e-9)
    assert s.backward_samples == 1 + 1 + (1 + 60 + 5 + 20) + 1 + 3


# -- the function table and the modules --------------------------------------------------------------
def _row(model, function):
    (row,) = [r for r in model.rows if r.function == function]
    return row


def test_each_module_row_holds_its_forward_and_its_backward():
    m = build(baler_profile())
    assert m.backward_split
    enc = m.row_phases(_row(m, "Encoder.forward"))
    assert enc == pytest.approx((ENCODER_FWD, ENCODER_BWD), abs=1e-9)
    assert m.row_phases(_row(m, "Decoder.forward")) == pytest.approx((DECODER_FWD, DECODER_BWD), abs=1e-9)
    # the step's line holds its backward() below it: train's backward is all of backward
    fwd, bwd = m.row_phases(_row(m, "train"))
    assert bwd == pytest.approx(BACKWARD_J, abs=1e-9)
    assert fwd + bwd == pytest.approx(_row(m, "train").total_energy, abs=1e-9)
    # beneath [backward] everything is backward
    assert m.row_phases(_row(m, BACKWARD_NODE))[0] == pytest.approx(0.0, abs=1e-12)
    # the model's top module holds nearly all: opened to its layers, heaviest first
    assert [r.function for r in m.modules] == ["Encoder.forward", "Decoder.forward", "mse_loss"]


def test_a_recursive_function_counts_its_backward_once():
    inner = node("Block.forward", MODEL, 5, 1.0, 1)
    outer = node("Block.forward", MODEL, 5, 1.0, 1, inner)
    bw_inner = node("Block.forward", MODEL, 5, 2.0, 1)
    bw = node("Block.forward", MODEL, 5, 2.0, 1, bw_inner)
    root = node("p", "", 0, 0.0, 0, node("main", TRAIN, 1, 0.0, 0, outer, node(BACKWARD_NODE, "", 0, 0.5, 1, bw)))
    root.fill_inclusive()
    m = build(profile_from(root, [CPU]))
    assert m.row_phases(_row(m, "Block.forward")) == pytest.approx((2.0, 4.0), abs=1e-9)
    assert m.row_phases(_row(m, "main")) == pytest.approx((2.0, 4.5), abs=1e-9)


def test_without_a_backward_frame_no_view_splits():
    m = build(baler_profile(backward_node=False))
    assert not m.backward_split and not m.modules
    assert all(m.row_phases(r) is None for r in m.rows)
    assert "heaviest modules" not in render_summary(m)
    assert "backward_j" not in csv_text(m).splitlines()[0]
    assert "bwd_e" not in function_table(m)
    assert "phases" not in m.derived()


def test_console_names_the_heaviest_modules_with_their_backward_share():
    m = build(baler_profile())
    (line,) = [x for x in render_summary(m).splitlines() if "heaviest modules" in x]
    enc = ENCODER_FWD + ENCODER_BWD
    # forward + backward, measured, with the ± of each figure (1/sqrt(samples))
    assert "measured" in line and "\u00b1" in line
    assert f"Encoder.forward {enc:.3g} J \u00b1{100 / (35 + 65) ** 0.5:.0f}%" in line
    assert f"({100 * ENCODER_BWD / enc:.1f}% backward \u00b1{100 / 65 ** 0.5:.0f}%)" in line
    assert line.index("Encoder.forward") < line.index("Decoder.forward") < line.index("mse_loss")


# -- the training table ------------------------------------------------------------------------------
COMPUTES = [5.0, 5.0, 4.0, 6.0]


def test_each_step_splits_into_forward_backward_and_optimizer():
    p = baler_profile(windows=step_windows(COMPUTES, per_pass=2))
    b = breakdown(p, "step")
    ph = b["phases"]
    whole = sum(COMPUTES)
    assert ph["method"] == "estimated"
    assert (ph["forward_j"], ph["backward_j"], ph["optimizer_j"]) == pytest.approx(
        (whole - BACKWARD_J - OPTIMIZER_J, BACKWARD_J, OPTIMIZER_J), abs=1e-9)
    for r, j in zip(b["steps"], COMPUTES):
        assert r["backward_j"] == pytest.approx(BACKWARD_J * j / whole, abs=1e-9)
        assert r["optimizer_j"] == pytest.approx(OPTIMIZER_J * j / whole, abs=1e-9)
        assert r["forward_j"] + r["backward_j"] + r["optimizer_j"] == pytest.approx(r["compute_j"], abs=1e-9)
    e0 = b["epochs"][0]
    assert e0["backward_j"] == pytest.approx(BACKWARD_J * 10 / whole, abs=1e-9)


def test_a_forward_only_loop_gets_no_backward():
    """Train and validation loops in one run: the timeline says which ran beside backward."""
    train = step_windows(COMPUTES, per_pass=2, pass_windows=False)
    val = [Window(name=w.name.replace("step", "val"), index=w.index, start_s=w.start_s + 10, end_s=w.end_s + 10,
                  time_s=w.time_s, energy_j=w.energy_j, program_energy_j=w.program_energy_j) for w in train]
    p = baler_profile(windows=train + val)
    fns = [["Tensor.backward", f"{TORCH}/_tensor.py", 570], ["Encoder.forward", MODEL, 10]]
    p.timeline = type(p.timeline)(t_s=[0.5 + i for i in range(20)], start_s=[float(i) for i in range(20)],
                                  end_s=[float(i + 1) for i in range(20)], functions=fns,
                                  active=[[0, 1] if i < 4 else [1] for i in range(20)])
    assert breakdown(p, "val")["phases"] is None
    assert breakdown(p, "step")["phases"]["backward_j"] == pytest.approx(BACKWARD_J, abs=1e-9)


def test_the_passes_of_track_epochs_are_the_epochs():
    """track(loader, epochs=N) writes a `step.pass` window per pass and no `epoch` window: each pass is an
    epoch, with its energy (this failed before: 0 epochs, no energy per epoch)."""
    p = baler_profile(windows=step_windows(COMPUTES, per_pass=2))
    b = breakdown(p, "step")
    assert b["epoch_count"] == 2
    assert [e["epoch"] for e in b["epochs"]] == [0, 1]
    per_step = [0.5 + j for j in COMPUTES]
    assert [e["energy_j"] for e in b["epochs"]] == pytest.approx([sum(per_step[:2]), sum(per_step[2:])], abs=1e-9)
    assert b["energy_per_epoch_j"] == pytest.approx(sum(per_step) / 2, abs=1e-9)


def test_epoch_windows_still_win_over_passes():
    ws = step_windows(COMPUTES, per_pass=2)
    ws.append(Window(name="epoch", index=7, start_s=0.0, end_s=100.0, time_s=100.0, energy_j={"cpu": 30.0}))
    b = breakdown(baler_profile(windows=ws), "step")
    assert [e["epoch"] for e in b["epochs"]] == [7]


# -- every view agrees -------------------------------------------------------------------------------
def test_every_view_gives_the_same_forward_and_backward():
    m = build(baler_profile(windows=step_windows(COMPUTES, per_pass=2)))
    derived = json.loads(json.dumps(m.derived()))["phases"]
    by_json = {(r["function"], r["line"]): (r["forward_j"], r["backward_j"]) for r in derived["functions"]}
    rows = list(csv.DictReader(io.StringIO(csv_text(m))))
    by_csv = {(r["function"], int(r["line"])): (float(r["forward_energy_j"]), float(r["backward_energy_j"]))
              for r in rows if float(r["backward_energy_j"])}
    table = function_table(m)
    scale = {k: 10.0 ** table[k]["exp"] for k in ("fwd_e", "bwd_e")}
    by_page = {(f, line): (fw * scale["fwd_e"], bw * scale["bwd_e"])
               for f, line, fw, bw in zip(table["fn"], table["line"], table["fwd_e"]["v"], table["bwd_e"]["v"]) if bw}
    assert set(by_json) == set(by_csv) == set(by_page)
    for key, (fw, bw) in by_json.items():
        assert by_csv[key] == pytest.approx((fw, bw), rel=1e-12, abs=1e-12)
        assert by_page[key] == pytest.approx((fw, bw), rel=5e-3)  # the page's columns keep 3 digits
    assert [r["function"] for r in derived["modules"]] == [r.function for r in m.modules]
    # the console's heaviest modules and the JSON's are the same figures
    (line,) = [x for x in render_summary(m).splitlines() if "heaviest modules" in x]
    for r in derived["modules"][:3]:
        forward, backward = r["forward_j"], r["backward_j"]
        assert f'{r["function"]} {fmt_energy(r["energy_j"])}' in line
        assert f'({fmt_percent(backward, forward + backward)} backward' in line


# -- the GPU's kernels, linked by the existing capture (a synthetic Kineto trace through gpu-trace) -----
def test_a_gpu_step_gives_each_line_its_forward_and_backward(tmp_path):
    from test_gpu_backward import J, _run, step_trace

    p, _ = _run(tmp_path, step_trace())
    m = build(p)
    assert m.backward_split
    (row,) = [r for r in m.rows if r.function == "forward" and r.file == "model.py"]
    # the forward line's kernel (100 us) and its backward's two GEMMs (200 us) at a flat 200 W
    assert m.row_phases(row) == pytest.approx((J(100), J(200)), rel=1e-9)
    assert [r.function for r in m.modules] == ["forward"]
    (line,) = [x for x in render_summary(m).splitlines() if "heaviest modules" in x]
    assert f"forward {fmt_energy(J(300))}" in line and "(66.7% backward" in line
    # the training rule on the same tree: backward() holds the pass (220 us), the rest is forward
    s = tree_split(p.root)
    assert s.backward_j == pytest.approx(J(220), rel=1e-9)
    assert s.total_j == pytest.approx(p.root.total_energy, rel=1e-9)


def test_a_real_tracked_loop_with_epochs_counts_its_passes(tmp_path):
    """track(loader, epochs=3) under the in-process profiler at a replayed flat power, no `epoch` window:
    the report's training table has 3 epochs, each its steps' energy."""
    import time

    import energyprof.torch as ept
    from energyprof import Profiler

    trace = tmp_path / "flat.csv"
    trace.write_text("t_s,cpu\n0,50\n")
    prof = Profiler(quiet=True, summary=False, gpus=False, power_trace=str(trace), idle="all", sensor_interval=0.01)
    prof.start()
    tracked = ept.track(range(3), epochs=3)
    for _ in range(3):
        for _ in tracked:
            time.sleep(0.01)
    b = build(prof.stop()).training["step"]
    assert b["epoch_count"] == 3 and b["epochs_from"] == "step.pass"
    assert [e["steps"] for e in b["epochs"]] == [3, 3, 3]
    assert b["energy_per_epoch_j"] == pytest.approx(sum(r["energy_j"] for r in b["steps"]) / 3, rel=1e-9)


def test_the_page_and_the_json_give_each_epoch_the_same_three_phases():
    from energyprof.render.html import render_html

    m = build(baler_profile(windows=step_windows(COMPUTES, per_pass=2)))
    training = json.loads(json.dumps(m.derived()))["training"]["step"]
    html = render_html(m)
    for e in training["epochs"]:
        cells = "".join(f"<td>{fmt_energy(e[k])}</td>" for k in ("forward_j", "backward_j", "optimizer_j"))
        assert cells in html
        assert e["forward_j"] + e["backward_j"] + e["optimizer_j"] == pytest.approx(e["compute_j"], abs=1e-9)
    ph = training["phases"]
    assert f"backward {fmt_energy(ph['backward_j'])}" in html and "estimated" in html
