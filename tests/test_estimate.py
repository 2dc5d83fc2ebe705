"""`energyprof estimate`: energy per step fitted on saved profiles (log FLOPs, device and its interaction,
parameters, batch) and predicted for a new configuration with a prediction interval. The maths with known
answers; real MLP training of 4 widths on the CPU at a replayed power predicting a fifth; refusals."""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import run_cli
from energyprof.analysis import forecast as F
from energyprof.analysis.stats import t_quantile


def obs(flops: float, j: float, device: str = "cpu: A", params: float | None = None, batch: float | None = None,
        name: str = "") -> dict:
    return {"name": name, "flops": flops, "params": params, "batch": batch, "device": device, "power_limit_w": None,
            "energy_per_step_j": j, "steps_per_epoch": 10}


# -- the maths --------------------------------------------------------------------------------------
def test_an_exact_power_law_is_recovered() -> None:
    data = [obs(f, math.exp(-3.0) * f ** 0.8) for f in (1e6, 3e6, 1e7, 3e7, 1e8)]
    m = F.fit(data)
    assert m["columns"] == ["1", "log_flops"]
    assert m["coefficients"] == pytest.approx([-3.0, 0.8])
    p = F.predict(m, {"flops": 2e7, "device": "cpu: A"}, steps_per_epoch=50, epochs=4)
    assert p["per_step_j"]["value"] == pytest.approx(math.exp(-3.0) * 2e7 ** 0.8)
    assert p["per_run_j"]["value"] == pytest.approx(200 * p["per_step_j"]["value"])
    assert m["loo"]["max_abs_error"] < 1e-9


def test_the_interval_is_the_textbook_prediction_interval() -> None:
    rng = random.Random(7)
    xs = [1e6 * 2 ** i for i in range(6)]
    data = [obs(f, math.exp(0.5 * math.log(f) - 5 + rng.gauss(0, 0.1))) for f in xs]
    m = F.fit(data)
    lx = [math.log(f) for f in xs]
    ly = [math.log(o["energy_per_step_j"]) for o in data]
    n, xbar, ybar = len(lx), statistics.fmean(lx), statistics.fmean(ly)
    sxx = sum((x - xbar) ** 2 for x in lx)
    slope = sum((x - xbar) * (y - ybar) for x, y in zip(lx, ly)) / sxx
    icpt = ybar - slope * xbar
    s = math.sqrt(sum((y - icpt - slope * x) ** 2 for x, y in zip(lx, ly)) / (n - 2))
    x0 = math.log(5e6)
    half = t_quantile(0.975, n - 2) * s * math.sqrt(1 + 1 / n + (x0 - xbar) ** 2 / sxx)
    p = F.predict(m, {"flops": 5e6, "device": "cpu: A"})["per_step_j"]
    assert p["value"] == pytest.approx(math.exp(icpt + slope * x0))
    assert (p["low"], p["high"]) == (pytest.approx(math.exp(icpt + slope * x0 - half)),
                                     pytest.approx(math.exp(icpt + slope * x0 + half)))


def test_a_column_the_others_already_explain_is_left_out() -> None:
    # parameters proportional to FLOPs (one batch size): log params is log FLOPs plus a constant
    data = [obs(f, 1e-9 * f, params=f / 384, batch=64) for f in (1e6, 2e6, 4e6, 8e6, 16e6)]
    m = F.fit(data)
    assert "log_params" not in m["columns"] and "log_batch" not in m["columns"]  # collinear, constant


def test_the_device_and_its_interaction_with_flops_matter() -> None:
    """Two devices, one twice as fast per FLOP at large sizes and with a fixed cost per step at small ones:
    FLOPs alone mispredicts both; the device and its interaction with FLOPs fit them (the study's finding)."""
    rng = random.Random(3)
    data = []
    for f in (1e8, 3e8, 1e9, 3e9, 1e10, 3e10):
        data.append(obs(f, 2e-10 * f ** 1.0 * math.exp(rng.gauss(0, 0.02)), "cpu: A", name=f"cpu {f:g}"))
        data.append(obs(f, 3e-6 * f ** 0.5 * math.exp(rng.gauss(0, 0.02)), "gpu: B", name=f"gpu {f:g}"))
    alone = F.leave_one_out(data, columns=["1", "log_flops"])
    full = F.fit(data)
    assert {"device=gpu: B", "log_flops*device=gpu: B"} <= set(full["columns"])
    assert alone["median_abs_error"] > 0.5 and full["loo"]["median_abs_error"] < 0.05
    assert F.outside_range(full, {"flops": 1e9, "device": "gpu: C"}).startswith("device 'gpu: C' is not among")


def test_far_outside_the_range_is_refused_in_one_line() -> None:
    m = F.fit([obs(f, 1e-9 * f) for f in (1e6, 2e6, 4e6)])
    assert F.outside_range(m, {"flops": 8e6, "device": "cpu: A"}) is None  # 2x beyond: still in
    why = F.outside_range(m, {"flops": 4e7, "device": "cpu: A"})
    assert why is not None and "\n" not in why and "FLOPs per step" in why
    assert F.outside_range(m, {"flops": 1e5, "device": "cpu: A"}) is not None


# -- real MLP training on the CPU, profiled at a replayed power -------------------------------------------
# Five widths in one run, each its own tracked loop, one epoch of each in turn: the machine's load (other
# processes on its cores) falls on all of them alike. Run one after another, the same width measured up to
# 2x apart on a busy two-core machine, and no fit survives that.
MLP = """\
import sys, torch
import energyprof.torch as ept
torch.manual_seed(0)
torch.set_num_threads(1)
IN, OUT, B, STEPS, EPOCHS = 512, 10, 64, 12, 6
batches = [(torch.randn(B, IN), torch.randint(0, OUT, (B,))) for _ in range(STEPS)]
runs = []
for width in map(int, sys.argv[1:]):
    model = torch.nn.Sequential(torch.nn.Linear(IN, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                torch.nn.ReLU(), torch.nn.Linear(width, OUT))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    runs.append((model, opt, ept.track(batches, model=model, flops=True, name=f"w{width}")))
for epoch in range(EPOCHS):
    for model, opt, tracked in runs:
        for x, y in tracked:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
"""
WIDTHS = (512, 704, 1024, 1408)  # multiples of 64: a width BLAS tiles unevenly runs slower per FLOP
HELD_OUT = 896  # inside the range, a multiple of 64 as the others


@pytest.mark.torch
@pytest.mark.slow
def test_four_mlp_widths_predict_a_fifth_and_refuse_ten_times_beyond(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "mlp.py").write_text(MLP)
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    proc = run_cli(["--power-trace", "trace.csv", "--sensor-interval", "0.02", "-q", "--json", "p.json", "-o", "p.html", "mlp.py",
                    *map(str, (*WIDTHS, HELD_OUT))], tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    loops = [a for w in WIDTHS for a in ("--loop", f"w{w}")]
    fit = run_cli(["estimate", "fit", "p.json", *loops, "-o", "model.json"], tmp_path)
    assert fit.returncode == 0, fit.stderr
    assert "held out one at a time" in fit.stdout and "log_flops" in fit.stdout
    model = json.loads((tmp_path / "model.json").read_text())
    assert model["schema"] == F.SCHEMA and len(model["profiles"]) == 4 and model["range"]["flops"][0] > 0
    pred = run_cli(["estimate", "predict", "model.json", "--from", "p.json", "--loop", f"w{HELD_OUT}", "--json"], tmp_path)
    assert pred.returncode == 0, pred.stderr
    out = json.loads(pred.stdout)
    predicted, measured = out["per_epoch_j"]["value"], out["measured"]["per_epoch_j"]
    assert abs(predicted - measured) <= 0.15 * measured, (predicted, measured, fit.stdout)
    assert out["per_epoch_j"]["low"] < predicted < out["per_epoch_j"]["high"]
    text = run_cli(["estimate", "predict", "model.json", "--from", "p.json", "--loop", f"w{HELD_OUT}"], tmp_path)
    assert text.returncode == 0 and "energy per epoch (12 steps)" in text.stdout and "measured" in text.stdout
    # ten times the largest profiled model's FLOPs: refused, one line, exit 2
    far = run_cli(["estimate", "predict", "model.json", "--flops", str(10 * model["range"]["flops"][1]),
                   "--params", "1e6", "--batch", "64"], tmp_path)
    assert far.returncode == 2 and far.stdout == ""
    assert len(far.stderr.strip().splitlines()) == 1 and "far outside the profiles' range" in far.stderr


def test_estimate_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "not-a-model.json").write_text('{"schema": "energyprof.profile/2"}')
    for args in (["estimate", "fit", "a.json", "-o", "m.json"], ["estimate", "predict", "not-a-model.json", "--flops", "1e9"],
                 ["estimate"], ["estimate", "predict", "missing.json", "--flops", "1"]):
        proc = run_cli(args, tmp_path)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)


@pytest.mark.torch
def test_the_first_step_flops_are_counted_once_and_read_back(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import energyprof.torch as ept
    from energyprof.drive.profiler import Profiler

    (tmp_path / "flat.csv").write_text("t_s,cpu\n0,50\n")
    B, IN, OUT = 16, 8, 4
    model = torch.nn.Linear(IN, OUT, bias=False)
    batches = [torch.randn(B, IN) for _ in range(3)]
    prof = Profiler(quiet=True, summary=False, gpus=False, power_trace=str(tmp_path / "flat.csv"), idle="all",
                    sensor_interval=0.01)
    prof.start()
    tracked = ept.track(batches, model=model, flops=True)
    for _ in range(2):
        for x in tracked:
            model(x).sum().backward()
            time.sleep(0.01)  # steps of a few sensor periods: each holds energy
    profile = prof.stop()
    # forward: one B x IN x OUT product (2 FLOPs each); backward: the weight's gradient, another (the input
    # needs none): FlopCounterMode counts 4 B IN OUT, on the first step's compute window only
    counted = [w for w in profile.windows if "flops" in w.loop]
    assert [(w.name, w.index, w.loop["flops"], w.loop["cuda_device"]) for w in counted] == [
        ("step.compute", 0, 4.0 * B * IN * OUT, -1.0)]
    assert tracked.flops == 4.0 * B * IN * OUT
    o = F.observation(profile, "step", name="p")
    assert (o["flops"], o["params"], o["batch"], o["steps_per_epoch"], o["epochs"]) == (4.0 * B * IN * OUT, IN * OUT, B, 3, 2)
    assert o["device"].startswith("cpu: ") and o["energy_per_step_j"] > 0
    assert F.counted_loops(profile) == ["step"]


@pytest.mark.torch
@pytest.mark.parametrize("args", ["model=m", "model=m, flops=True"])
def test_counting_flops_never_touches_a_compiled_program(tmp_path: Path, args: str) -> None:
    """A program that compiles its model (torch.compile) and tracks its loop with `model=` (for the
    parameter count) or asks for FLOPs: its graph is compiled as under plain python (a dispatch mode
    around the first step would turn compilation off for the run) and torch prints nothing on its stderr."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    script = tmp_path / "prog.py"
    script.write_text(
        "import sys, torch\nfrom torch._dynamo.testing import CompileCounter\n"
        "from energyprof.drive.profiler import Profiler\nfrom energyprof.integrations.torch import track\n"
        "m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())\n"
        "cnt = CompileCounter(); compiled = torch.compile(m, backend=cnt)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "p = Profiler(quiet=True, summary=False, gpus=False, power_trace=sys.argv[1]); p.start()\n"
        f"t = track([torch.ones(2, 4)] * 5, {args})\n"
        "for x in t:\n    compiled(x).sum().backward(); opt.step()\n"
        "p.stop()\nprint('graphs compiled:', cnt.frame_count, 'flops:', t.flops)\n")
    (tmp_path / "flat.csv").write_text("t_s,cpu\n0,50\n")
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "flat.csv")], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "graphs compiled: 1 flops: None" and r.stderr == ""


@pytest.mark.torch
def test_model_alone_keeps_the_parameter_count_and_counts_no_flops(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import energyprof.torch as ept
    from energyprof.drive.profiler import Profiler

    (tmp_path / "flat.csv").write_text("t_s,cpu\n0,50\n")
    model = torch.nn.Linear(8, 4, bias=False)
    prof = Profiler(quiet=True, summary=False, gpus=False, power_trace=str(tmp_path / "flat.csv"))
    prof.start()
    tracked = ept.track([torch.randn(16, 8) for _ in range(2)], model=model)
    for x in tracked:
        model(x).sum().backward()
    profile = prof.stop()
    assert tracked.flops is None and not [w for w in profile.windows if "flops" in w.loop]
    assert any(w.loop.get("parameters") == 32 for w in profile.windows)


def test_predict_refuses_bad_numbers_and_a_damaged_range_in_one_line(tmp_path: Path) -> None:
    """Steps per epoch and epochs must be positive finite numbers (nan, a negative count and inf gave a
    traceback or a negative energy), a prediction past what a float holds is refused, and a model whose
    range entry is not [low, high] is damaged: one line, exit 2, nothing on stdout."""
    data = [obs(f, 1e-9 * f) for f in (1e9, 2e9, 4e9, 8e9)]
    model = F.fit(data)
    (tmp_path / "m.json").write_text(json.dumps(model))
    (tmp_path / "r.json").write_text(json.dumps({**model, "range": {"flops": [1e9]}}))
    (tmp_path / "k.json").write_text(json.dumps({**model, "range": {"flops": [1e9, "8e9"]}}))
    good = run_cli(["estimate", "predict", "m.json", "--flops", "2e9", "--steps-per-epoch", "10", "--epochs", "3"],
                   tmp_path)
    assert good.returncode == 0 and "per run (3 epochs)" in good.stdout, good.stderr
    for args in (["m.json", "--steps-per-epoch", "nan", "--json"], ["m.json", "--steps-per-epoch", "-100"],
                 ["m.json", "--steps-per-epoch", "0"], ["m.json", "--steps-per-epoch", "10", "--epochs", "inf"],
                 ["m.json", "--steps-per-epoch", "1e300", "--epochs", "1e300"], ["r.json"], ["k.json"]):
        proc = run_cli(["estimate", "predict", *args[:1], "--flops", "2e9", *args[1:]], tmp_path)
        assert proc.returncode == 2 and proc.stdout == "", (args, proc.stdout, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, (args, proc.stderr)


# -- damaged model files: one line, exit 2, whatever the damage ------------------------------------------------
def _good_model() -> dict:
    return F.fit([obs(f, 1e-9 * f, params=f / 1e3, batch=2 ** (i % 3 + 4)) for i, f in enumerate((1e9, 2e9, 3e9, 4e9, 6e9, 8e9))])


def test_a_damaged_model_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """The four files that gave a traceback (coefficients of 1000, a column that is not a name, confidence
    as a list, dof of 10^300), a missing key, and --power-limit on a model that has no power-limit column
    (it was silently left out of the prediction)."""
    model = _good_model()
    p = len(model["columns"])
    damaged = {"coef": {**model, "coefficients": [1000.0] * p}, "column": {**model, "columns": [1, *model["columns"][1:]]},
               "conf": {**model, "confidence": [0.95]}, "dof": {**model, "dof": 10 ** 300},
               "missing": {k: v for k, v in model.items() if k != "xtx_inverse"}}
    for name, m in damaged.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(m))
    (tmp_path / "m.json").write_text(json.dumps(model))
    runs = [[f"{name}.json", "--flops", "2e9", "--params", "2e6", "--batch", "32"] for name in damaged]
    runs.append(["m.json", "--flops", "2e9", "--params", "2e6", "--batch", "32", "--power-limit", "250"])
    for args in runs:
        proc = run_cli(["estimate", "predict", *args], tmp_path)
        assert proc.returncode == 2 and proc.stdout == "", (args, proc.stdout, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, (args, proc.stderr)
    assert "power-limit" in proc.stderr
    good = run_cli(["estimate", "predict", "m.json", "--flops", "2e9", "--params", "2e6", "--batch", "32"], tmp_path)
    assert good.returncode == 0, good.stderr


JSON = st.recursive(st.none() | st.booleans() | st.integers(min_value=-10 ** 400, max_value=10 ** 400)
                    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=8)
MODEL = _good_model()


def _damage(model: dict, draw: st.DrawFn) -> dict:
    """A model with one field replaced, removed, or one item of a list field replaced."""
    out = json.loads(json.dumps(model))
    key = draw(st.sampled_from(sorted(out)))
    how = draw(st.sampled_from(["replace", "remove", "item"]))
    if how == "remove":
        del out[key]
    elif how == "item" and isinstance(out[key], list) and out[key]:
        i = draw(st.integers(0, len(out[key]) - 1))
        if isinstance(out[key][i], list) and out[key][i] and draw(st.booleans()):
            out[key][i][draw(st.integers(0, len(out[key][i]) - 1))] = draw(JSON)
        else:
            out[key][i] = draw(JSON)
    else:
        out[key] = draw(st.one_of(JSON, st.sampled_from([1000.0, -1e308, 10 ** 300, 1e-320, 0, -1, "x"])))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_predict_on_any_damaged_model_predicts_or_refuses_in_one_line(tmp_path: Path, data: st.DataObject,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever one field of the file holds, `estimate predict` either predicts finite numbers (exit 0) or
    says why not in one line (exit 2): never a traceback."""
    from energyprof.cli import main

    path = tmp_path / "d.json"
    path.write_text(json.dumps(_damage(MODEL, data.draw), allow_nan=False))
    capsys.readouterr()
    rc = main(["estimate", "predict", str(path), "--flops", "2e9", "--params", "2e6", "--batch", "32",
               "--steps-per-epoch", "10", "--epochs", "3", "--json"])
    out, err = capsys.readouterr()
    assert rc in (0, 2), (rc, err)
    if rc == 0:
        pred = json.loads(out)
        assert all(math.isfinite(pred[k][e]) for k in ("per_step_j", "per_epoch_j", "per_run_j")
                   for e in ("value", "low", "high"))
    else:
        assert out == "" and len(err.strip().splitlines()) == 1, err


# -- model families: how a step's FLOPs split among convolutions, matrix products and elementwise operators ----
@pytest.mark.torch
def test_the_flops_of_a_cnn_and_an_mlp_split_by_family_counted_once(tmp_path: Path) -> None:
    """One FlopCounterMode over the first step gives both its FLOPs (as torch counts them: the figure is
    unchanged) and their split: a small CNN's are mostly convolutions, an MLP's matrix products, and both
    have their activations' elementwise FLOPs (one an output element: ReLU forward and its gradient)."""
    torch = pytest.importorskip("torch")
    import energyprof.torch as ept
    from energyprof.drive.profiler import Profiler
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    (tmp_path / "flat.csv").write_text("t_s,cpu\n0,50\n")
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 14 * 14, 4))
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    got = {}
    for name, model, shape in (("cnn", cnn, (2, 3, 16, 16)), ("mlp", mlp, (2, 64))):
        batches = [torch.randn(*shape) for _ in range(2)]
        with FlopCounterMode(display=False) as plain:  # torch's own count of the same step, for the figure
            model(batches[0]).sum().backward()
        prof = Profiler(quiet=True, summary=False, gpus=False, power_trace=str(tmp_path / "flat.csv"), idle="all",
                        sensor_interval=0.01)
        prof.start()
        for x in ept.track(batches, model=model, flops=True, name=name):
            model(x).sum().backward()
            time.sleep(0.01)
        profile = prof.stop()
        (facts,) = [w.loop for w in profile.windows if "flops" in w.loop]
        assert facts["flops"] == plain.get_total_flops()
        relu = 2 * math.prod(shape[:1]) * (8 * 14 * 14 if name == "cnn" else 32)  # forward and threshold_backward
        every = facts["flops"] + relu
        assert facts["flop_share_elementwise"] == pytest.approx(relu / every)
        got[name] = F.observation(profile, name, name=name)
    assert got["cnn"]["conv_share"] > 0.5 and got["mlp"]["conv_share"] == 0.0 and got["mlp"]["matmul_share"] > 0.9
    assert all(abs(sum(o[k] for k in F.SHARES) - 1.0) < 1e-9 for o in got.values())  # nothing else counted here


def _family_obs() -> list[dict]:
    """MLPs and CNNs whose energy per FLOP differs by family (a CNN's three times an MLP's), not by size."""
    out = []
    for i, f in enumerate((1e9, 2e9, 4e9, 8e9)):
        for fam, conv, k in (("mlp", 0.0, 1.0), ("cnn", 0.8, 3.0)):
            o = obs(f * (1.1 if fam == "cnn" else 1.0), 1e-9 * f * k * (1.1 if fam == "cnn" else 1.0), name=f"{fam}{i}")
            o.update(conv_share=conv, matmul_share=0.97 - conv, elementwise_share=0.03)
            out.append(o)
    return out


def test_a_column_of_the_flops_family_tells_cnns_from_mlps() -> None:
    """Across families FLOPs alone cannot say a CNN's step costs three times an MLP's of the same FLOPs: the
    conv share column can (known answer: log 3 per unit of conv share / 0.8)."""
    data = _family_obs()
    alone = F.leave_one_out(data, columns=["1", "log_flops"])
    m = F.fit(data)
    assert "conv_share" in m["columns"]
    assert m["coefficients"][m["columns"].index("conv_share")] == pytest.approx(math.log(3.0) / 0.8, rel=1e-6)
    assert m["loo"]["max_abs_error"] < 1e-6 < 0.3 < alone["median_abs_error"]


def test_a_prediction_for_a_family_outside_the_fit_is_flagged(tmp_path: Path) -> None:
    """A fit on MLPs alone predicting a CNN: refused in one line (exit 2), and with --extrapolate predicted
    and flagged; a model of the fit's family is predicted as before."""
    mlps = [o for o in _family_obs() if o["name"].startswith("mlp")]
    (tmp_path / "m.json").write_text(json.dumps(F.fit(mlps)))
    cnn = ["estimate", "predict", "m.json", "--flops", "2e9", "--conv-share", "0.8", "--matmul-share", "0.17",
           "--elementwise-share", "0.03"]
    proc = run_cli(cnn, tmp_path)
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "model family outside the fit" in proc.stderr and "80% convolutions" in proc.stderr
    flagged = run_cli([*cnn, "--extrapolate", "--json"], tmp_path)
    assert flagged.returncode == 0 and "model family outside the fit" in json.loads(flagged.stdout)["extrapolated"]
    assert "model family outside the fit" in flagged.stderr
    same = run_cli(["estimate", "predict", "m.json", "--flops", "2e9", "--conv-share", "0", "--matmul-share", "0.97",
                    "--elementwise-share", "0.03"], tmp_path)
    assert same.returncode == 0 and "warning" not in same.stderr, same.stderr
