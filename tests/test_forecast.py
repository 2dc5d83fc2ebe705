"""Forecasts of a training run's total during it (track(epochs=N), --expect-epochs): the maths with known
answers, a tracked loop at a replayed flat power predicted after its first epoch, each later forecast the
maths' on the passes it measured, for equal and growing epochs, both in the report; and the one stderr
line under `python -m energyprof`."""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from pathlib import Path

import pytest

import energyprof.torch as ept
from conftest import run_cli
from energyprof.analysis import forecast as F
from energyprof.analysis.report import build
from energyprof.analysis.stats import t_quantile
from energyprof.drive.profiler import Profiler
from energyprof.facts.profile import Profile
from energyprof.facts.forecast import read_forecast
from energyprof.facts.records import Window
from energyprof.render.html import render_html


# -- the maths --------------------------------------------------------------------------------------
def test_equal_epochs_project_exactly_with_no_spread() -> None:
    p = F.project_total([10.0, 10.0], 6)
    assert (p["value"], p["low"], p["high"], p["basis"]) == (60.0, 60.0, 60.0, "epochs")


def test_epoch_interval_is_the_t_prediction_interval_of_the_remaining_sum() -> None:
    done = [13.0, 10.0, 12.0, 11.0]  # from three epochs on, the first (warm-up) is left out of the mean
    p = F.project_total(done, 10)
    stable = [10.0, 12.0, 11.0]
    m, s, left = 11.0, 1.0, 6
    assert statistics.stdev(stable) == s
    half = t_quantile(0.975, 2) * s * math.sqrt(left + left * left / 3)
    assert p["value"] == pytest.approx(46.0 + left * m) and p["basis"] == "epochs"
    # a trend through the stable epochs (by an amount: slope 0.5; by a share: a line in log), not told apart
    # from none on one degree of freedom, is not ruled out: the interval holds the straight line's prediction
    # interval for the sum of the epochs to come, and the log line's sum with the same half-width
    b, a, s_line = 0.5, 10.0, math.sqrt(1.5)
    future = range(4, 10)
    line = sum(a + b * x for x in future)
    line_half = t_quantile(0.975, 1) * s_line * math.sqrt(left + left * left / 3 + sum(x - 2 for x in future) ** 2 / 2)
    lb, la = statistics.linear_regression([1, 2, 3], [math.log(v) for v in stable])
    log_line = sum(math.exp(la + lb * x) for x in future)
    lows = (46.0 + left * m - half, 46.0 + line - line_half, 46.0 + log_line - line_half)
    highs = (46.0 + left * m + half, 46.0 + line + line_half, 46.0 + log_line + line_half)
    assert p["low"] == pytest.approx(max(min(lows), 46.0)) and p["high"] == pytest.approx(max(highs))
    assert t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-5)


def _noisy(values: list[float], seed: int, cv: float = 0.02) -> list[float]:
    rng = random.Random(seed)
    return [v * (1 + rng.uniform(-cv, cv)) for v in values]


@pytest.mark.parametrize("growth", ["linear", "geometric"])
def test_a_trend_across_epochs_is_in_the_interval_until_and_once_it_is_known(growth: str) -> None:
    """Epochs that grow 30% each (of the first, or of the one before): after epochs 4 and 5 of 10 the intervals
    about the stable epochs' mean held the outcome in none of 200 runs (the forecast 19-61% low). A line through the
    stable epochs is in the interval until its slope is told apart from none, and then the forecast follows it."""
    base = [1.0 + 0.3 * e if growth == "linear" else 1.3 ** e for e in range(10)]
    inside = {4: 0, 5: 0}
    runs = 200
    for seed in range(runs):
        epochs = _noisy(base, seed)
        for k in inside:
            p = F.project_total(epochs[:k], 10)
            inside[k] += p["low"] <= sum(epochs) <= p["high"]
    # 95% intervals: at 95% coverage, 180 or fewer of 200 inside has a chance under 0.1%
    assert all(n > 0.90 * runs for n in inside.values()), inside
    # exact growth: the slope is known at once, the forecast is the trend's (by an amount or by a share)
    exact = base
    p = F.project_total(exact[:4], 10)
    assert p["basis"] == "trend" and p["value"] == pytest.approx(sum(exact[:4]) + sum(
        1.0 + 0.3 * e if growth == "linear" else 1.3 ** e for e in range(4, 10)))
    # epochs with no trend keep the stable epochs' mean as the forecast
    flat = _noisy([2.0] * 6, 1)
    assert F.project_total(flat[:4], 6)["value"] == pytest.approx(sum(flat[:4]) + 2 * statistics.fmean(flat[1:4]))


def test_one_epoch_interval_from_its_steps_and_what_they_cannot_see() -> None:
    steps = [1.0, 1.2, 0.8, 1.0]  # cv = 0.1633: an epoch of 4 such steps varies by 0.0816 of itself
    p = F.project_total([5.0], 3, steps, unseen=0.02)
    cv = statistics.stdev(steps) / statistics.fmean(steps)
    half = t_quantile(0.975, 3) * cv * math.sqrt(1 / (2 * 4) + 1 / 4) * 2 * 5.0 + 2 * 5.0 * 0.02
    # steps all alike: the epochs' spread is taken to be EPOCH_CV_FLOOR at least
    flat = F.project_total([5.0], 3, [1.0, 1.0, 1.0, 1.0])
    assert flat["high"] == pytest.approx(15.0 + t_quantile(0.975, 3) * F.EPOCH_CV_FLOOR * math.sqrt(1 / 2 + 1) * 10.0)
    assert p["basis"] == "steps" and p["value"] == 15.0
    assert p["high"] == pytest.approx(15.0 + half) and p["low"] == pytest.approx(15.0 - half)
    # no spread to measure: a point without an interval, never a zero-width one
    assert F.project_total([5.0], 3)["low"] is None
    # the low end never falls below what was spent
    assert F.project_total([5.0, 1.0], 3)["low"] >= 6.0
    assert F.project_total([5.0, 5.0, 5.0], 3)["basis"] == "complete"


def test_after_one_epoch_the_others_share_of_the_machine_widens_both_intervals() -> None:
    """Neighbours that took 30% of the machine's CPU in the first epoch may stay, go or grow: the epochs to
    come may move by as much, so the time's and the energy's half-widths take 0.3 x the epochs to come whole
    (one epoch of 10 s, 4 to come: 12 s more each way). From two epochs on their spread shows it."""
    steps = [1.0] * 10
    quiet = F.forecast_facts([100.0], [10.0], 5, steps)
    busy = F.forecast_facts([100.0], [10.0], 5, steps, others_share=0.3)
    assert busy["time_high_s"] - quiet["time_high_s"] == pytest.approx(0.3 * 4 * 10.0)
    assert quiet["time_low_s"] - busy["time_low_s"] == pytest.approx(0.3 * 4 * 10.0)
    assert busy["energy_high_j"] - quiet["energy_high_j"] == pytest.approx(0.3 * 4 * 100.0)
    assert busy["time_s"] == quiet["time_s"] and busy["energy_j"] == quiet["energy_j"]  # the point stays
    two = F.forecast_facts([100.0, 101.0], [10.0, 10.1], 5, others_share=0.3)
    assert two == F.forecast_facts([100.0, 101.0], [10.0, 10.1], 5)


def test_forecast_facts_price_carbon_with_the_energy() -> None:
    f = F.forecast_facts([3.6e6], [100.0], 2, [1.0, 1.1, 0.9], intensity_g_per_kwh=500.0, pue=1.2)
    assert f["energy_j"] == 7.2e6 and f["carbon_g"] == pytest.approx(2 * 500.0 * 1.2)
    assert f["carbon_low_g"] == pytest.approx(f["energy_low_j"] / 3.6e6 * 600.0)
    assert f["time_s"] == 200.0 and f["by_steps"] == 1.0 and f["epochs_done"] == 1.0


def test_a_forecast_window_reads_back_as_a_typed_fact_and_old_profiles_have_none() -> None:
    facts = F.forecast_facts([10.0, 11.0], [1.0, 1.1], 4)
    w = Window(name="step.forecast", index=2, start_s=3.0, end_s=3.0, loop=facts)
    f = read_forecast(w)
    assert f is not None and (f.loop, f.epochs_done, f.epochs, f.made_at_s) == ("step", 2, 4, 3.0)
    assert f.energy_j == pytest.approx(21.0 + 2 * 10.5) and f.by_steps is False
    assert read_forecast(Window(name="epoch", index=0)) is None
    crafted = Window(name="step.forecast", index=1, loop={**facts, "energy_j": -5.0})
    assert read_forecast(crafted) is None  # a crafted file's impossible figures are left out, not a failed report
    old = Profile.from_dict(json.loads(OLD_PROFILE))
    assert old.forecasts == []


OLD_PROFILE = json.dumps({"schema": "energyprof.profile/2", "meta": {"idle_policy": "share"}, "sources": [],
                          "totals": {}, "nodes": [{"parent": -1, "function": "<root>"}],
                          "windows": [{"name": "epoch", "index": 0, "start_s": 0.0, "end_s": 1.0, "time_s": 1.0}]})


# -- a tracked loop at a replayed flat power ------------------------------------------------------------
def tracked_run(tmp_path: Path, grow: float) -> tuple[Profile, ept.TrackedLoader]:
    trace = tmp_path / "flat.csv"
    trace.write_text("t_s,cpu\n0,50\n")
    prof = Profiler(quiet=True, summary=False, gpus=False, power_trace=str(trace), idle="all", sensor_interval=0.01)
    prof.start()
    tracked = ept.track(range(10), epochs=6)
    for epoch in range(6):
        for _ in tracked:
            time.sleep(0.02 * (1 + grow * epoch))
    return prof.stop(), tracked


def passes_total(profile: Profile) -> float:
    return sum(w.program_total_j for w in profile.windows if w.name == "step.pass")


def test_equal_epochs_predicted_after_the_first_and_growing_ones_with_wider_intervals(tmp_path: Path) -> None:
    equal, tracked = tracked_run(tmp_path, 0.0)
    growing, _ = tracked_run(tmp_path, 0.3)
    assert [f.epochs_done for f in equal.forecasts] == [1, 2, 3, 4, 5] == [int(f["epochs_done"]) for f in tracked.forecasts]
    total = passes_total(equal)
    first = equal.forecasts[0]
    # the outcome inside the interval (which carries the machine's load in the first epoch), not a fixed
    # share: beside a changing load the point after one epoch was 12-19% off
    assert first.by_steps and first.energy_low_j <= total <= first.energy_high_j
    assert first.time_low_s <= sum(w.time_s for w in equal.windows if w.name == "step.pass") <= first.time_high_s
    assert first.carbon_g is not None and first.carbon_g > 0
    # from two epochs on, each forecast is the maths' on the passes measured so far (the trend and the spread
    # are the pure tests' above, on exact figures): comparing two real runs' widths compared the machine's
    # scheduling noise (ten 20-ms sleeps an epoch, beside two CPU hogs) with the growth, and the noise won
    for profile in (equal, growing):
        passes = sorted((w for w in profile.windows if w.name == "step.pass"), key=lambda w: w.index)
        for f in profile.forecasts[1:]:
            k = f.epochs_done
            want = F.forecast_facts([w.program_total_j for w in passes[:k]], [w.time_s for w in passes[:k]], 6)
            assert (f.energy_j, f.energy_low_j, f.energy_high_j) == pytest.approx(
                (want["energy_j"], want["energy_low_j"], want["energy_high_j"]), rel=1e-9)
            assert (f.time_s, f.time_low_s, f.time_high_s) == pytest.approx(
                (want["time_s"], want["time_low_s"], want["time_high_s"]), rel=1e-9)
    # prediction against outcome, in the report model and on the page, for both loops
    for profile in (equal, growing):
        model = build(profile)
        fc = model.forecasts["step"]
        assert fc["outcome"]["energy_j"] == pytest.approx(passes_total(profile))
        assert [r["epochs_done"] for r in fc["rows"]] == [1, 2, 3, 4, 5]
        assert all(r["energy_error"] is not None for r in fc["rows"])
        assert model.derived()["forecasts"]["step"]["outcome"] == fc["outcome"]
        # forecasts are facts, not spans: no row of the windows table, and every row's carbon is its own
        assert not any(r.window.name == "step.forecast" for r in model.windows)
        assert model.carbon is not None
        for r in model.windows:
            assert r.carbon_g == pytest.approx(model.carbon.grams(r.window.energy_j))
        html = render_html(model)
        assert "Forecast: step" in html and "after epoch" in html
    assert build(equal).forecasts["step"]["rows"][0]["energy_inside"] is True
    # after one epoch growth is unseen: the forecast is low (whether its interval holds the outcome depends on
    # how much of the machine others took in that epoch)
    assert build(growing).forecasts["step"]["rows"][0]["energy_error"] < -0.2


def test_no_epochs_no_forecast_and_no_pass_windows(tmp_path: Path) -> None:
    trace = tmp_path / "flat.csv"
    trace.write_text("t_s,cpu\n0,50\n")
    prof = Profiler(quiet=True, summary=False, gpus=False, power_trace=str(trace))
    prof.start()
    tracked = ept.track(range(3))
    for _ in range(2):
        for _ in tracked:
            pass
    profile = prof.stop()
    assert profile.forecasts == [] and not any(w.name == "step.pass" for w in profile.windows)
    assert build(profile).forecasts == {}


# -- under python -m energyprof --------------------------------------------------------------------------
LOOP = """\
import sys, time
import energyprof.torch as ept
tracked = ept.track(range(5))
for epoch in range(3):
    for _ in tracked:
        time.sleep(0.01)
print("the program's own output")
"""


def test_expect_epochs_prints_one_line_per_forecast_on_stderr_only(tmp_path: Path) -> None:
    (tmp_path / "loop.py").write_text(LOOP)
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    proc = run_cli(["--power-trace", "trace.csv", "--expect-epochs", "3", "--json", "p.json", "-o", "r.html",
                    "loop.py", "--epochs", "9"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "the program's own output\n"
    lines = [x for x in proc.stderr.splitlines() if "forecast" in x]
    assert len(lines) == 2 and lines[0].startswith("energyprof: forecast for 'step' after epoch 1 of 3: ")
    saved = Profile.from_dict(json.loads((tmp_path / "p.json").read_text()))
    assert [f.epochs_done for f in saved.forecasts] == [1, 2]
    assert "Forecast: step" in (tmp_path / "r.html").read_text()
    quiet = run_cli(["-q", "--power-trace", "trace.csv", "--expect-epochs", "3", "loop.py"], tmp_path)
    assert quiet.returncode == 0 and "forecast" not in quiet.stderr
    bad = run_cli(["--expect-epochs", "0", "loop.py"], tmp_path)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--expect-epochs" in bad.stderr


def test_forecasts_reach_mlflow_through_the_live_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    if importlib.util.find_spec("energyprof.output.live") is None:
        pytest.skip("this tree has no live export (energyprof.output.live)")
    mlflow = pytest.importorskip("mlflow")
    (tmp_path / "loop.py").write_text(LOOP)
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    # A folder store: SQLite's is opened by migrating its schema (seconds on a loaded machine), and
    # test_mlflow covers it; what is tested here is the forecasts' way there
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    proc = run_cli(["--power-trace", "trace.csv", "--expect-epochs", "3", "--mlflow", "-q", "loop.py"], tmp_path,
                   env={"MLFLOW_TRACKING_URI": uri, "MLFLOW_ALLOW_FILE_STORE": "true"})
    assert proc.returncode == 0, proc.stderr
    client = mlflow.MlflowClient(tracking_uri=uri)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    key = "energyprof.forecast.step.epochs_done"
    history = [(m.step, m.value) for r in runs for m in client.get_metric_history(r.info.run_id, key)]
    assert sorted(history) == [(1, 1.0), (2, 2.0)]
