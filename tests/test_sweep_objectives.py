"""The sweep's table, pure: mean and spread per configuration, the front, and each objective's choice on a
power-limit table whose answers follow by hand."""

from __future__ import annotations

import pytest

from energyprof.analysis.sweep import ObjectiveError, Objective, RunResult, parse_objective, score, summarize


def table() -> tuple[list[dict[str, str]], list[RunResult]]:
    # Five limits (W) with their window time (s) and energy (J), two repeats each, spread +-1%:
    # the means are the numbers below exactly.
    rows = [(300, 10.0, 2700.0), (275, 10.2, 2600.0), (250, 10.6, 2500.0), (225, 11.4, 2450.0), (200, 12.8, 2480.0)]
    configs = [{"gpu_power_limit": str(w)} for w, _, _ in rows]
    results = [RunResult(i, r, t * f, e * f) for i, (_, t, e) in enumerate(rows) for r, f in enumerate((0.99, 1.01))]
    return configs, results


def test_mean_spread_and_front():
    configs, results = table()
    s = summarize(configs, results)
    assert [x.n for x in s] == [2] * 5
    assert s[0].time_s == pytest.approx(10.0) and s[0].time_std == pytest.approx(0.02 * 10.0 / 2 ** 0.5)
    # 200 W is slower than 225 W and spends more: off the front; the rest trade time for energy
    assert [x.pareto for x in s] == [True, True, True, True, False]


@pytest.mark.parametrize("objective, best", [
    ("energy", "225"), ("time", "300"),
    ("edp", "250"),  # 27000, 26520, 26500, 27930, 31744
    ("slowdown:1.05", "275"),  # within 10.5 s: 300, 275 -> the lesser energy
    ("slowdown:1.1", "250"),  # within 11 s: adds 250
    ("cost:1", "225"), ("cost:0", "300"),
    ("cost:0.5", "275"),  # 0.5 E + 0.5 x 300 W x T: 2850, 2830, 2840, 2935, 3160
])
def test_objectives(objective, best):
    configs, results = table()
    s = summarize(configs, results)
    limits = [float(c["gpu_power_limit"]) for c in configs]
    chosen = score(s, parse_objective(objective), max(limits))
    assert chosen is not None and chosen.values["gpu_power_limit"] == best


def test_cost_without_a_power_limit_uses_the_highest_mean_power():
    s = summarize([{"n": "1"}, {"n": "2"}], [RunResult(0, 0, 1.0, 100.0), RunResult(1, 0, 4.0, 200.0)])
    score(s, Objective("cost", 0.0))  # eta 0: P_max x T, P_max = 100 W (the first's 100 J / 1 s)
    assert [x.score for x in s] == [pytest.approx(100.0), pytest.approx(400.0)]


def test_slowdown_leaves_the_slow_ones_unscored():
    configs, results = table()
    s = summarize(configs, results)
    score(s, parse_objective("slowdown:1.05"))
    assert [x.score is not None for x in s] == [True, True, False, False, False]


@pytest.mark.parametrize("bad", ["fast", "slowdown", "slowdown:0.9", "cost:2", "cost:x", "energy:1"])
def test_bad_objective(bad):
    with pytest.raises(ObjectiveError):
        parse_objective(bad)


def test_a_configuration_without_runs_is_left_out():
    s = summarize([{"n": "1"}, {"n": "2"}], [RunResult(1, 0, 2.0, 3.0)])
    assert [x.index for x in s] == [1] and s[0].time_std == 0.0 and score(s, Objective("energy")) is s[0]
