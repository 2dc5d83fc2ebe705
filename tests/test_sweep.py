"""Pareto over windows: a sweep's configurations (windows NAME:LABEL) as points of energy against time."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import run_cli
from energyprof.analysis.compare import compare
from energyprof.analysis.pareto import front, split_name, sweep_names, window_points
from energyprof.analysis.report import RenderOptions, build
from energyprof.facts.profile import Node
from energyprof.facts.profile import Profile
from energyprof.facts.profile import Window
from energyprof.render.html import unpacked_json

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sweep.py"


def w(name: str, time_s: float, machine: float, program: float | None = None, index: int | None = None) -> Window:
    return Window(name=name, index=index, time_s=time_s, end_s=time_s, energy_j={"cpu": machine},
                  program_energy_j={"cpu": program} if program is not None else {})


def test_front_known_answer() -> None:
    # (time, energy): the fast one, the frugal one, and one between that both beat... and a tie
    pts = [(1.0, 10.0), (4.0, 2.0), (3.0, 11.0), (2.0, 5.0), (2.0, 5.0)]
    assert front(pts) == [True, True, False, True, True]


@given(st.lists(st.tuples(st.floats(0.01, 100), st.floats(0.01, 100)), min_size=1, max_size=15))
def test_the_front_is_never_empty_and_nothing_on_it_is_beaten(pts: list[tuple[float, float]]) -> None:
    flags = front(pts)
    assert any(flags)
    for (t, e), on in zip(pts, flags):
        beaten = any(t2 <= t and e2 <= e and (t2, e2) != (t, e) for t2, e2 in pts)
        assert on == (not beaten)


def test_labels_come_from_the_window_names() -> None:
    assert split_name("config:bs=128,pl=250") == ("config", "bs=128,pl=250")
    assert split_name("epoch") == ("epoch", "")
    ws = [w("config:bs=32", 4.0, 40.0, 10.0), w("config:bs=128", 1.0, 30.0, 12.0), w("config:bs=512", 2.0, 50.0, 20.0),
          w("epoch", 7.0, 120.0, 42.0, index=0)]
    assert sweep_names(ws) == ["config"]
    points, program = window_points([ws], "config")
    assert program and [(p.label, p.time_s, p.energy_j, p.pareto) for p in points] == [
        ("bs=32", 4.0, 10.0, True), ("bs=128", 1.0, 12.0, True), ("bs=512", 2.0, 20.0, False)]
    # a window from a file that predates the program's share: every point is the machine's energy
    older = [*ws[:2], w("config:bs=512", 2.0, 50.0)]
    points, program = window_points([older], "config")
    assert not program and [p.energy_j for p in points] == [40.0, 30.0, 50.0]
    # plain names are points labelled by index; several runs say which run each point is from
    points, _ = window_points([[w("epoch", 1.0, 5.0, 4.0, 0)], [w("epoch", 2.0, 3.0, 2.0, 0)]], "epoch")
    assert [p.label for p in points] == ["[0] #0", "[1] #0"] and [p.pareto for p in points] == [True, True]


def _profile(windows: list[Window]) -> Profile:
    root = Node("sweep.py", energy_j={"cpu": 100.0}, self_energy_j={"cpu": 100.0}, time_s=10.0, samples=1000,
                self_samples=1000)
    return Profile(meta={"argv": ["sweep.py"], "target": "sweep.py", "idle_policy": "all"},
                   sources=[{"id": "cpu", "component": "cpu", "method": "measured"}],
                   totals={"energy_j": {"cpu": 100.0}, "attributed_j": {"cpu": 100.0}, "duration_s": 10.0},
                   root=root, windows=[x.to_dict() for x in windows])


def test_compare_places_each_runs_windows_and_the_report_its_own() -> None:
    a = _profile([w("config:bs=32", 4.0, 40.0, 10.0), w("config:bs=128", 1.0, 30.0, 12.0)])
    b = _profile([w("config:bs=32", 3.0, 40.0, 9.0), w("config:bs=128", 0.5, 30.0, 30.0)])
    cmp = compare([a, b], windows="config")
    assert [(p.label, p.pareto) for p in cmp.sweep_points] == [
        ("[0] bs=32", False), ("[0] bs=128", True), ("[1] bs=32", True), ("[1] bs=128", True)]
    from energyprof.render.compare import figures, render_markdown, render_text

    fig = figures(cmp)["sweep"]
    assert fig["data"][0]["text"] == ["[0] bs=32", "[0] bs=128", "[1] bs=32", "[1] bs=128"]
    assert fig["data"][1]["x"] == [0.5, 1.0, 3.0]  # the front, joined from the fastest
    assert re.search(r"\[1\] bs=128 +500 ms +30 J  \*", render_text(cmp))
    assert "Pareto front of windows config (3 of 4)" in render_markdown(cmp)
    model = build(a, RenderOptions(carbon=None))
    points, program = model.sweeps["config"]
    assert program and [p.label for p in points if p.pareto] == ["bs=32", "bs=128"]


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sweep")
    shutil.copy(EXAMPLE, d / "sweep.py")
    (d / "p.csv").write_text("t_s,cpu\n0,50\n")
    res = run_cli(["-q", "--power-trace", "p.csv", "--json", "s.json", "-o", "s.html", "sweep.py", "--samples", "512"],
                  cwd=d, timeout=300)
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.splitlines()) == 6  # the example's own output: one line per configuration
    return d


@pytest.mark.slow
def test_the_example_sweep_gives_its_front_from_one_run(sweep_run: Path) -> None:
    page = (sweep_run / "s.html").read_text()
    assert "Sweep <bdi>config</bdi>: energy against time" in page
    data = unpacked_json(re.search(r'<script type="application/json" id="report-data"[^>]*>(.*?)</script>', page, re.S).group(1))
    (sweep,) = data["sweeps"]
    labels = sweep["figure"]["data"][0]["text"]
    assert sweep["name"] == "config" and sweep["program"]
    assert sorted(labels) == sorted(f"bs={bs},pl={pl}" for bs in (16, 64, 256) for pl in ("100%", "60%"))
    assert 1 <= len(sweep["figure"]["data"][1]["x"]) <= 6


@pytest.mark.slow
def test_compare_windows_on_the_command_line(sweep_run: Path) -> None:
    res = run_cli(["compare", "s.json", "s.json", "--windows", "config", "-o", "c.html"], cwd=sweep_run)
    assert res.returncode == 0, res.stderr
    rows = re.findall(r"^  \[[01]\] bs=\d+,pl=\d+%.*$", res.stdout, flags=re.M)
    assert len(rows) == 12 and any(r.endswith("*") for r in rows)
    assert "id='sweep'" in (sweep_run / "c.html").read_text()
    res = run_cli(["compare", "s.json", "s.json", "--windows", "nothing"], cwd=sweep_run)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "no window named 'nothing'" in res.stderr


@pytest.mark.browser
@pytest.mark.slow
def test_the_sweep_is_drawn_in_the_report(sweep_run: Path, browser) -> None:  # noqa: F811
    from test_report_browser import Page

    page = Page(browser)
    page.open(sweep_run / "s.html")
    drawn = page.page.evaluate("() => { const d = document.getElementById('sweep-0');"
                               " return d && d.data ? [d.data[0].x.length, d.data[1].x.length] : null; }")
    assert drawn is not None and drawn[0] == 6 and drawn[1] >= 1
    assert page.errors == [] and page.blocked == []
    page.close()


from test_report_browser import browser  # noqa: E402, F401 - the shared headless Chromium fixture
