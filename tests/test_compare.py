"""`energyprof compare`: totals, windows and function deltas of saved profiles, CI gates, the page."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import run_cli
from energyprof.analysis.compare import Run, _change, _mark_pareto, compare, gate
from energyprof.analysis.stats import t_cdf, t_quantile, welch
from energyprof.facts.profile import load
from energyprof.facts.profile import Node
from energyprof.facts.profile import Profile


def profile(joules: dict[str, float], duration: float, fn_j: float, fn_samples: int, argv: list[str] | None = None,
            windows: list[dict] | None = None, fn: str = "work") -> Profile:
    leaf = Node(fn, "w.py", 3, time_s=duration / 2, self_time_s=duration / 2, samples=fn_samples,
                self_samples=fn_samples, energy_j={"cpu": fn_j}, self_energy_j={"cpu": fn_j})
    root = Node("w.py", time_s=duration, samples=fn_samples * 2, self_samples=fn_samples,
                energy_j={"cpu": joules["cpu"]}, self_energy_j={"cpu": joules["cpu"] - fn_j}, children=[leaf])
    return Profile(meta={"argv": argv or ["python", "w.py"], "target": "w.py"},
                   sources=[{"id": "cpu", "component": "cpu", "method": "measured"}],
                   totals={"energy_j": dict(joules), "attributed_j": dict(joules), "duration_s": duration},
                   root=root, windows=windows or [])


# -- the maths (pure) ------------------------------------------------------------------------------
@pytest.mark.parametrize("p, df, t", [
    (0.975, 1, 12.7062), (0.975, 4, 2.7764), (0.995, 4, 4.6041), (0.995, 2, 9.9248), (0.975, 10, 2.2281),
    (0.95, 30, 1.6973), (0.5, 3, 0.0), (0.025, 4, -2.7764)])
def test_t_quantiles_match_the_table(p: float, df: float, t: float) -> None:
    assert t_quantile(p, df) == pytest.approx(t, abs=1e-4)


def test_t_cdf_inverts_the_quantile_at_fractional_degrees_of_freedom() -> None:
    for df in (1.3, 2.5, 7.25):
        for p in (0.6, 0.9, 0.995):
            assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-10)


def test_welch_known_answer() -> None:
    # equal spreads: se = sqrt(1/3 + 1/3), df = 4, t(0.975, 4) = 2.776445
    iv = welch([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], confidence=0.95)
    assert iv.diff == 3.0 and iv.df == pytest.approx(4.0) and iv.n == (3, 3)
    assert iv.half_width == pytest.approx(2.776445 * (2 / 3) ** 0.5, rel=1e-5)
    # unequal: variances 4 and 5/12 over 3 and 4 runs: se^2 = 4/3 + 5/48, df = se^4 / ((4/3)^2/2 + (5/48)^2/3)
    iv = welch([10.0, 12.0, 14.0], [20.0, 20.5, 21.0, 21.5], confidence=0.99)
    assert iv.diff == pytest.approx(20.75 - 12.0)
    assert iv.df == pytest.approx(2.3152, abs=1e-4)
    assert iv.half_width == pytest.approx(7.93000 * (4 / 3 + 5 / 48) ** 0.5, rel=1e-5)  # t(0.995, 2.3153) = 7.93000


def test_identical_figures_differ_by_exactly_nothing() -> None:
    iv = welch([5.0, 5.0, 5.0], [5.0, 5.0])
    assert (iv.diff, iv.low, iv.high) == (0.0, 0.0, 0.0)


@given(st.lists(st.floats(1, 1000), min_size=2, max_size=6), st.lists(st.floats(1, 1000), min_size=2, max_size=6))
def test_welch_interval_holds_its_difference_and_turns_with_the_sides(a: list[float], b: list[float]) -> None:
    iv, back = welch(a, b), welch(b, a)
    assert iv.low <= iv.diff <= iv.high
    assert back.diff == pytest.approx(-iv.diff, abs=1e-9) and back.half_width == pytest.approx(iv.half_width, rel=1e-9)
    assert welch(a, b, confidence=0.9).half_width <= iv.half_width + 1e-9


def test_one_run_per_side_is_judged_by_its_sampling_error_only() -> None:
    # 100 J and 130 J from 100 samples each: +-10 J and +-13 J, combined 16.40 J; at 95% (z = 1.959964) 32.15 J
    c = _change([100.0], [100], [130.0], [100])
    assert c.error == pytest.approx(1.959964 * (10**2 + 13**2) ** 0.5, rel=1e-6)
    assert not c.significant and c.pct == pytest.approx(30.0)
    assert _change([100.0], [100], [150.0], [100]).significant  # 50 J > 1.96 x 18.03 J = 35.3 J
    # a figure no sample carried has no sampling error to judge by: one run per side cannot call it a change
    assert not _change([0.4], [0], [0.8], [0]).significant
    assert not _change([100.0], [100], [150.0], [0]).significant
    # repeats judge it by their own spread: 0.40-0.42 J against 0.80-0.82 J is a change
    assert _change([0.40, 0.42, 0.41], [0, 0, 0], [0.80, 0.82, 0.81], [0, 0, 0]).significant
    v = gate([100.0], [130.0], [100], [100], "program energy")
    assert not v.repeats and v.hidden_pct == pytest.approx(32.146, abs=0.001)
    assert v.fails(-2.2) and not v.fails(-2.1)  # the lower end is 30 - 32.146 = -2.146%


def test_repeats_gate_on_the_lower_end_of_welchs_interval() -> None:
    # base 100, 102, 98 (sd 2), head 120, 124, 116 (sd 4): diff 20, se sqrt(4/3 + 16/3) = 2.582, df 2.94
    v = gate([100.0, 102.0, 98.0], [120.0, 124.0, 116.0], [10**6] * 3, [10**6] * 3, "program energy")
    assert v.repeats and v.pct == pytest.approx(20.0)
    assert v.interval.df == pytest.approx(20 / 3 * 20 / 3 / ((4 / 3) ** 2 / 2 + (16 / 3) ** 2 / 2))
    assert v.low_pct == pytest.approx(20.0 - 3.218759 * (20 / 3) ** 0.5, rel=1e-6)  # t(0.975, 2.9412) = 3.218759
    assert v.fails(v.low_pct - 0.01) and not v.fails(v.low_pct + 0.01)
    assert not gate([120.0, 124.0, 116.0], [100.0, 102.0, 98.0], [10**6] * 3, [10**6] * 3, "").fails(0.0)


def test_repeats_never_judge_below_the_sampling_error() -> None:
    """Three identical figures per side have no spread; their sampling error still counts."""
    v = gate([100.0] * 3, [104.0] * 3, [100] * 3, [100] * 3, "program energy")
    assert v.repeats and v.hidden_pct > 4.0 and not v.fails(0.0)


def test_a_figure_that_appeared_fails_and_nothing_never_does() -> None:
    assert gate([0.0], [1.0], [0], [10], "").fails(1000.0)
    assert not gate([0.0, 0.0], [0.0, 0.0], [0, 0], [0, 0], "").fails(0.0)


def test_function_deltas_windows_and_totals_from_two_profiles() -> None:
    win = [{"name": "epoch", "index": i, "start_s": i, "end_s": i + 1, "time_s": 1.0, "energy_j": {"cpu": 4.0 + i}}
           for i in range(2)]
    a = profile({"cpu": 100.0}, 2.0, 40.0, 400, windows=win)
    b = profile({"cpu": 150.0}, 2.0, 80.0, 400, windows=[dict(w, energy_j={"cpu": 9.0}) for w in win])
    cmp = compare([a, b], ["a.json", "b.json"], ["base", "head"])
    assert [r.label for r in cmp.runs] == ["base", "head"]
    assert cmp.base.program_total == 100.0 and cmp.last.program_total == 150.0
    (w,) = cmp.windows
    assert w.mean_j == [4.5, 9.0] and w.pct == pytest.approx(100.0)
    work = next(f for f in cmp.functions if f.function == "work")
    assert work.self_energy.delta == 40.0 and work.self_energy.significant  # +-2 and +-4 J against 40 J
    assert work.self_time.delta == 0.0 and not work.self_time.significant
    labels = {n.function for n in cmp.tree}
    assert labels == {"w.py", "work"}


def test_labels_default_to_each_runs_command_line() -> None:
    a = profile({"cpu": 1.0}, 1.0, 0.5, 10, argv=["python", "train.py", "--bs", "32"])
    b = profile({"cpu": 1.0}, 1.0, 0.5, 10, argv=["python", "train.py", "--bs", "64"])
    assert [r.label for r in compare([a, b]).runs] == ["python train.py --bs 32", "python train.py --bs 64"]


def test_pareto_front_known_answer() -> None:
    runs = [Run(str(i), "", t, {}, {"cpu": e}, {}) for i, (t, e) in enumerate([(1, 10), (2, 5), (3, 6), (1.5, 12)])]
    _mark_pareto(runs)
    assert [r.pareto for r in runs] == [True, True, False, False]


@given(st.lists(st.tuples(st.floats(0.1, 100), st.floats(0.1, 100)), min_size=1, max_size=12))
def test_pareto_front_is_never_empty_and_never_dominated(points: list[tuple[float, float]]) -> None:
    runs = [Run(str(i), "", t, {}, {"cpu": e}, {}) for i, (t, e) in enumerate(points)]
    _mark_pareto(runs)
    front = [r for r in runs if r.pareto]
    assert front
    for r in front:
        assert not any(o.duration_s <= r.duration_s and o.program_total <= r.program_total
                       and (o.duration_s, o.program_total) != (r.duration_s, r.program_total) for o in runs)
    for r in runs:  # everything off the front is dominated by something
        if not r.pareto:
            assert any(o.duration_s <= r.duration_s and o.program_total <= r.program_total for o in runs if o is not r)


def test_markdown_keeps_program_strings_as_text() -> None:
    from energyprof.render.compare import render_markdown

    a = profile({"cpu": 10.0}, 1.0, 2.0, 100, fn="<img src=x onerror=alert(1)>|x")
    b = profile({"cpu": 20.0}, 1.0, 12.0, 100, fn="<img src=x onerror=alert(1)>|x")
    md = render_markdown(compare([a, b]))
    assert "<img" not in md and "&lt;img" in md and "\\|x" in md
    assert md.startswith("### energyprof: +100.0% program energy")


# -- the command line, on real runs --------------------------------------------------------------------
SCRIPT = "import time\ndef load():\n    time.sleep(1.5)\nload()\n"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Path:
    """One script under a replayed 40 W and then 60 W trace, idle policy all.

    Program energy = power x duration, so the ratio is 1.5 x (duration ratio); the script sleeps a
    fixed 1.5 s, so the durations differ by the profiler's own start and stop (tens of ms even on a
    loaded machine): the ratio stays well inside (1.1, 1.6), far from both gates below."""
    d = tmp_path_factory.mktemp("compare")
    (d / "w.py").write_text(SCRIPT)
    for name, watts in (("a", 40), ("b", 60)):
        (d / f"{name}.csv").write_text(f"t_s,cpu\n0,{watts}\n")
        res = run_cli(["-q", "--power-trace", f"{name}.csv", "--idle", "all", "--json", f"{name}.json",
                       "-o", f"{name}.html", "w.py"], cwd=d)
        assert res.returncode == 0, res.stderr
    return d


def _verdict(stderr: str, what: str = "program energy") -> tuple[float, float]:
    """The change and the change its sampling error hides, as the gate printed them."""
    m = re.search(what + r" ([+-]\d+\.\d)% \(one run per side: .* within \u00b1(\d+\.\d)%", stderr)
    if m is None:  # the program's total is not sampled: with one run per side nothing hides a change
        m = re.search(what + r" ([+-]\d+\.\d)% \(one run per side: .*smallest change it can detect is unknown", stderr)
        assert m, stderr
        return float(m.group(1)), 0.0
    return float(m.group(1)), float(m.group(2))


@pytest.mark.slow
def test_fail_above_gates_on_program_energy(two_runs: Path) -> None:
    """One run per side: the program's total fails beyond the limit as measured (it is not a sampled figure);
    a function fails only beyond the change its sampling error could hide. The limits are put on either
    side of what the files hold, not of a figure the machine decides. `--idle all` by name: the gate's figure is
    then the program's energy under it (power x duration), whose change the two traces set."""
    res = run_cli(["compare", "a.json", "b.json", "--idle", "all", "--fail-above", "0"], cwd=two_runs)
    assert "Totals per source" in res.stdout
    pct, hidden = _verdict(res.stderr)
    a, b = (json.loads((two_runs / f"{n}.json").read_text())["totals"]["attributed_j"]["cpu"] for n in "ab")
    assert pct == pytest.approx((b - a) / a * 100, abs=0.051)
    low = pct - hidden
    assert res.returncode == (1 if low > 0 else 0) and ("FAIL" if low > 0 else "ok") in res.stderr
    if low > 1:
        assert run_cli(["compare", "a.json", "b.json", "--idle", "all", "--fail-above", f"{low - 0.5:.2f}", "-q"],
                       cwd=two_runs).returncode == 1
    res = run_cli(["compare", "a.json", "b.json", "--idle", "all", "--fail-above", f"{max(low, 0) + 0.5:.2f}", "-q"],
                  cwd=two_runs)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "" and "ok" in res.stderr
    res = run_cli(["compare", "a.json", "b.json", "--idle", "all", "--fail-above", "0", "--function", "load"], cwd=two_runs)
    pct, hidden = _verdict(res.stderr, "function load")  # the function holds most of the run's energy
    assert pct > 0 and res.returncode == (1 if pct - hidden > 0 else 0)
    res = run_cli(["compare", "b.json", "a.json", "--idle", "all", "--fail-above", "0"], cwd=two_runs)
    assert res.returncode == 0  # less energy never fails a gate


@pytest.mark.slow
def test_markdown_and_text_outputs(two_runs: Path) -> None:
    res = run_cli(["compare", "a.json", "b.json", "--idle", "all", "--label", "40 W", "--label", "60 W", "--markdown", "pr.md"],
                  cwd=two_runs)
    assert res.returncode == 0, res.stderr
    md = (two_runs / "pr.md").read_text()
    assert "| 40 W |" in md and "| 60 W |" in md and "load" in md
    # under `all` nothing is idle: float dust (femtojoules) once showed here as a "+9.7%" change
    assert "other processes and idle" not in md
    assert all(load(two_runs / f"{n}.json").find("[other processes and idle]")[0].energy_j["cpu"] == 0 for n in "ab")
    a, b = (json.loads((two_runs / f"{n}.json").read_text())["totals"]["attributed_j"]["cpu"] for n in "ab")
    pct = (b - a) / a * 100
    assert md.startswith(f"### energyprof: {pct:+.1f}% program energy")
    assert f"{pct:+.1f}%" in res.stdout


@pytest.mark.slow
def test_idle_option_compares_both_runs_under_one_policy(two_runs: Path) -> None:
    """The runs used `all`; seen under `share` each is its report model's program energy under share."""

    res = run_cli(["compare", "a.json", "b.json", "--idle", "share", "--markdown", "share.md"], cwd=two_runs)
    assert res.returncode == 0, res.stderr
    a, b = (sum(load(two_runs / f"{n}.json").with_policy("share").totals.attributed_j.values()) for n in "ab")
    assert (two_runs / "share.md").read_text().startswith(f"### energyprof: {(b - a) / a * 100:+.1f}% program energy")


@pytest.mark.parametrize("args, message", [
    (["a.json"], "at least two profiles"),
    (["a.json", "missing.json"], "cannot read missing.json"),
    (["a.json", "bad.json"], "not valid JSON"),
    (["a.json", "b.json", "--fail-above", "5", "--function", "no_such_function"], "no_such_function"),
    (["a.json", "b.json", "--label", "only one"], "--label"),
    (["a.json", "b.json", "--fail-above", "-3"], "--fail-above"),
    (["a.json", "b.json", "--idle", "nonsense"], "--idle"),
])
def test_bad_input_is_one_line_and_exit_2(two_runs: Path, args: list[str], message: str) -> None:
    (two_runs / "bad.json").write_text("{\"schema\": ")
    res = run_cli(["compare", *args], cwd=two_runs)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and message in res.stderr and res.stdout == ""


@pytest.mark.browser
@pytest.mark.slow
def test_html_renders_offline_without_errors(two_runs: Path, browser) -> None:  # noqa: F811
    from test_report_browser import Page

    res = run_cli(["compare", "a.json", "b.json", "a.json", "-o", "compare.html"], cwd=two_runs)
    assert res.returncode == 0, res.stderr
    page = Page(browser)
    page.open(two_runs / "compare.html")
    ids = page.page.eval_on_selector_all(".js-plotly-plot", "els => els.map(e => e.id)")
    assert set(ids) == {"diff-icicle", "pareto"}
    assert page.page.locator("#diff-icicle g.slice").count() >= 2
    assert page.errors == [] and page.blocked == []
    front = page.page.evaluate("() => document.getElementById('pareto').data[1].x.length")
    assert front >= 1
    page.close()


@pytest.mark.browser
def test_hostile_names_stay_text_in_the_page(tmp_path: Path, browser) -> None:  # noqa: F811
    from test_report_browser import Page

    from energyprof.render.compare import write_html

    evil = "</script><script>window.pwned=1</script><img src=x onerror=window.pwned=2>"
    a = profile({"cpu": 10.0}, 1.0, 2.0, 100, fn=evil, argv=[evil])
    b = profile({"cpu": 20.0}, 2.0, 12.0, 100, fn=evil, argv=["b"])
    path = tmp_path / "evil.html"
    write_html(compare([a, b]), str(path))
    page = Page(browser)
    page.open(path)
    p = page.page
    assert p.evaluate("() => window.pwned") is None and p.locator("img").count() == 0
    assert evil in p.eval_on_selector_all(".fn-table .name", "els => els.map(e => e.textContent)")
    p.hover("#diff-icicle g.slice >> nth=1")
    p.evaluate("() => Plotly.Fx.hover('pareto', [{curveNumber: 0, pointNumber: 0}])")  # the run's label
    assert "window.pwned" in p.text_content("#pareto .hoverlayer")
    assert p.evaluate("() => window.pwned") is None
    assert page.errors == []
    page.close()


from test_report_browser import browser  # noqa: E402, F401 - the shared headless Chromium fixture


def test_help_lists_every_subcommand(tmp_path: Path) -> None:
    res = run_cli(["--help"], cwd=tmp_path)
    assert res.returncode == 0
    listed = re.findall(r"^  (\w+)\b", res.stdout.split("subcommands:", 1)[1], flags=re.M)
    assert {"report", "compare", "merge", "sensors"} <= set(listed)


def test_increases_are_drawn_red_as_the_caption_says() -> None:
    """plotly's own "RdBu" runs blue (low) to red (high); the scale is named stops, never reversed."""
    from energyprof.render.compare import figures

    a = profile({"cpu": 10.0}, 1.0, 2.0, 100)
    b = profile({"cpu": 20.0}, 1.0, 12.0, 100)
    marker = figures(compare([a, b]))["icicle"]["data"][0]["marker"]
    assert not marker.get("reversescale")
    scale = dict((stop, colour) for stop, colour in marker["colorscale"])
    red, blue = (int(scale[1.0][i:i + 2], 16) for i in (1, 5)), (int(scale[0.0][i:i + 2], 16) for i in (1, 5))
    (r_hi, b_hi), (r_lo, b_lo) = red, blue
    assert r_hi > b_hi and b_lo > r_lo  # the top of the scale (more energy) is red, the bottom blue
    assert marker["cmax"] > 0 > marker["cmin"] and max(marker["colors"]) > 0


def test_a_side_without_repeats_is_judged_by_sampling_error_and_says_so() -> None:
    from energyprof.render.compare import verdict_text

    v = gate([100.0], [130.0, 128.0, 131.0], [100], [100] * 3, "program energy")
    assert not v.repeats and v.interval.n == (1, 3)
    assert "a side with one run: the verdict cannot separate run-to-run noise" in verdict_text(v)
    assert "one run per side" in verdict_text(gate([100.0], [130.0], [100], [100], "program energy"))


def test_the_programs_total_is_judged_by_repeats_never_by_sampling_error() -> None:
    from energyprof.analysis.compare import program_gate
    from energyprof.render.compare import verdict_text

    # one run per side: no spread, so the change is taken as measured (a sampled figure's +-44% is gone)
    v = program_gate([40.0], [59.92])
    assert not v.repeats and not v.sampled and v.low_pct == pytest.approx(49.8) and v.fails(10.0)
    assert "smallest change it can detect is unknown" in verdict_text(v) and "sampling error" not in verdict_text(v)
    # repeats: Welch's interval alone, narrower than the sampling error of three 100-sample runs (+-11%)
    v = program_gate([100.0, 100.5, 99.5], [104.0, 104.5, 103.5])
    assert v.repeats and v.low_pct == pytest.approx(4.0 - 2.776445 * (1 / 6) ** 0.5, rel=1e-5)  # t(0.975, 4)
    assert v.fails(2.0) and not gate([100.0, 100.5, 99.5], [104.0, 104.5, 103.5], [100] * 3, [100] * 3, "").fails(2.0)
    assert "the smallest change these repeats can detect: \u00b11.1%" in verdict_text(v)
