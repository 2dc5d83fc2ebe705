"""Windows and the training breakdown per rank: windows named the same in every rank are shown per
rank and summed over ranks; each rank's tracked loop is broken down from its own windows. Synthetic
profiles with known answers for the model, one real two-rank gloo run under torchrun, and the
section in Chromium."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest_report import small_profile
from energyprof import load
from energyprof.analysis.report import build
from energyprof.analysis.training import breakdown
from energyprof.analysis.windows import WindowRow, window_groups
from energyprof.facts.profile import Window
from energyprof.record import asdict, replace
from energyprof.render.format import fmt_energy
from energyprof.render.html import render_html

from conftest import run_cli
from test_distributed import TIMEOUT, needs_torchrun, per_rank_run, torchrun
from test_report_browser import Page, browser  # noqa: F401  (the fixture)

# Per rank: (epoch energy, per step (fetch J, compute J)); rank 1 is the slower, hungrier one.
RANKS = {0: (10.0, [(0.5, 2.0), (0.25, 2.0), (0.5, 3.0)]),
         1: (14.0, [(1.0, 3.0), (0.75, 3.0), (1.0, 4.0)])}


def _ranked_windows(ranks: dict[int, tuple[float, list[tuple[float, float]]]] = RANKS,
                    with_rank: bool = True) -> list[dict]:
    """An `epoch` window and a tracked loop (`step.fetch`, `step.compute`, steps from 0) per rank,
    over the same span of time, as each rank's supervisor marks them."""
    out = []
    for rank, (epoch_j, steps) in ranks.items():
        who = {"pid": 100 + rank, "rank": rank} if with_rank else {"pid": 100}
        out.append({"name": "epoch", "index": 0, "depth": 0, "start_s": 0.0, "end_s": 0.06, "time_s": 0.06,
                    "energy_j": {"cpu": epoch_j}, **who})
        for i, (fetch_j, compute_j) in enumerate(steps):
            t = i * 0.02
            out.append({"name": "step.fetch", "index": i, "depth": 1, "start_s": t, "end_s": t + 0.005,
                        "time_s": 0.005, "energy_j": {"cpu": fetch_j}, **who})
            out.append({"name": "step.compute", "index": i, "depth": 1, "start_s": t + 0.005, "end_s": t + 0.02,
                        "time_s": 0.015, "energy_j": {"cpu": compute_j}, **who})
    return out


def _profile(windows: list[dict]):
    p = small_profile()
    p.windows = [Window(**w) for w in windows]
    return p


def test_windows_named_the_same_in_every_rank_are_per_rank_and_the_machine_once() -> None:
    """The ranks' windows lie over the same spans; each window's energy_j is what its rank read of
    the machine (they disagree here, as they would by where edges fall between readings: the
    group takes their mean over the common span). Rank rows hold the program's share (none was
    given here: a file from before windows held it, so the machine's figure stands in)."""
    m = build(_profile(_ranked_windows()))
    groups = {g.name: g for g in m.window_groups}
    epoch = groups["epoch"]
    assert (epoch.count, epoch.total_j) == (1, pytest.approx(12.0))  # one epoch; not 10 + 14
    assert [(r.name, r.count, r.total_j, r.mean_j) for r in epoch.ranks] == [("rank 0", 1, 10.0, 10.0),
                                                                            ("rank 1", 1, 14.0, 14.0)]
    compute = groups["step.compute"]
    assert (compute.count, compute.total_j) == (3, pytest.approx(2.5 + 2.5 + 3.5))
    assert [(r.name, r.count, r.total_j) for r in compute.ranks] == [("rank 0", 3, 7.0), ("rank 1", 3, 10.0)]
    assert [r.mean_time_s for r in compute.ranks] == pytest.approx([0.015, 0.015])
    html = render_html(m)
    assert html.count('class="rank-row"') == 2 * len(groups) and "the machine over 2 ranks" in html


def _two_rank_epochs(rank0_j: float, rank1_j: float, first: dict[str, float] | None = None) -> list[Window]:
    """100 W: epoch 0 in rank 0 over 0-1 s and in rank 1 over 0.2-1.3 s, charged rank0_j and rank1_j
    of it; epoch 1 in rank 0 alone over 2-2.5 s, charged 20 J."""
    return [Window(name="epoch", index=0, start_s=0.0, end_s=1.0, time_s=1.0, energy_j=first or {"cpu": 100.0},
                   program_energy_j={"cpu": rank0_j}, pid=100, rank=0),
            Window(name="epoch", index=0, start_s=0.2, end_s=1.3, time_s=1.1, energy_j={"cpu": 110.0},
                   program_energy_j={"cpu": rank1_j}, pid=101, rank=1),
            Window(name="epoch", index=1, start_s=2.0, end_s=2.5, time_s=0.5, energy_j={"cpu": 50.0},
                   program_energy_j={"cpu": 20.0}, pid=100, rank=0)]


def test_summed_row_is_the_machine_over_the_union_span() -> None:
    """100 W; rank 0's epoch spans 0-1 s, rank 1's 0.2-1.3 s: the machine over the union is 130 J,
    not 100 + 110 J; each rank's row is its program share."""
    ws = _two_rank_epochs(40.0, 45.0, first={"cpu": 90.0, "dram": 10.0})
    (epoch,) = window_groups([WindowRow(w) for w in ws])
    assert epoch.total_j == pytest.approx(130.0 + 50.0, rel=1e-12)
    assert (epoch.count, epoch.min_j, epoch.max_j) == (2, pytest.approx(50.0), pytest.approx(130.0))
    assert epoch.mean_time_s == pytest.approx((1.3 + 0.5) / 2)
    assert [(r.name, r.total_j) for r in epoch.ranks] == [("rank 0", 60.0), ("rank 1", 45.0)]
    # two nodes: each node's machine once, summed over nodes
    other = [replace(w, node="b", rank=w.rank + 2) for w in ws]
    (both,) = window_groups([WindowRow(w) for w in ws + other])
    assert both.total_j == pytest.approx(2 * 180.0, rel=1e-12)


def test_ranks_charged_more_than_the_machine_are_scaled_to_fit_it() -> None:
    """Two ranks that used nearly the whole machine, their shares taken apart by their own
    supervisors: 70 + 65 J charged against the 130 J the machine measured over the union. The
    summed row stays the measurement; both ranks' shares of that epoch are scaled by 130/135, the
    next epoch's (20 J of 50) are left alone, and another node is held on its own."""
    ws = _two_rank_epochs(70.0, 65.0)
    (epoch,) = window_groups([WindowRow(w) for w in ws])
    assert (epoch.total_j, epoch.max_j, epoch.min_j) == (pytest.approx(180.0, rel=1e-12), pytest.approx(130.0),
                                                         pytest.approx(50.0))
    k = 130.0 / 135.0
    assert [(r.name, r.total_j) for r in epoch.ranks] == [("rank 0", pytest.approx(70.0 * k + 20.0, rel=1e-12)),
                                                          ("rank 1", pytest.approx(65.0 * k, rel=1e-12))]
    assert epoch.ranks[0].max_j == pytest.approx(70.0 * k) and epoch.ranks[0].min_j == pytest.approx(20.0)
    # on another node the same epoch's shares fit its machine: left as they were
    other = [replace(w, node="b", rank=w.rank + 2, program_energy_j={"cpu": 30.0}) for w in ws]
    (both,) = window_groups([WindowRow(w) for w in [replace(w, node="a") for w in ws] + other])
    assert both.total_j == pytest.approx(2 * 180.0, rel=1e-12)
    assert [r.total_j for r in both.ranks] == [pytest.approx(70.0 * k + 20.0), pytest.approx(65.0 * k),
                                               pytest.approx(60.0), pytest.approx(30.0)]


def test_training_breakdown_per_rank_from_each_ranks_own_steps() -> None:
    p = _profile(_ranked_windows())
    m = build(p)
    assert m.training == {}  # the ranks' steps are not paired across ranks
    assert sorted(m.training_ranks) == ["step"] and sorted(m.training_ranks["step"]) == [0, 1]
    for rank, (_, steps) in RANKS.items():
        b = m.training_ranks["step"][rank]
        assert [s["step"] for s in b["steps"]] == [0, 1, 2]
        assert [(s["fetch_j"], s["compute_j"]) for s in b["steps"]] == steps
        assert [e["epoch"] for e in b["epochs"]] == [0] and b["epochs"][0]["steps"] == 3
        assert b["step_energy_j"]["mean"] == pytest.approx(sum(f + c for f, c in steps) / 3)
        # the same as the breakdown of a profile holding only that rank's windows
        alone = _profile(_ranked_windows({rank: RANKS[rank]}))
        assert b == breakdown(alone, "step")
    html = render_html(m)
    assert "Training loop per rank: step" in html and "Training loop: step" not in html


def test_a_profile_without_ranks_has_the_model_it_always_had() -> None:
    """One process: no rank rows, no per-rank breakdown, the same groups and breakdown as before; a
    job where a single rank marked every window reads the same."""
    p = _profile(_ranked_windows({0: RANKS[0]}, with_rank=False))
    m = build(p)
    assert m.training_ranks == {} and all(g.ranks == [] for g in m.window_groups)
    assert [tuple(asdict(g).values()) for g in m.window_groups] == [
        ("epoch", 1, 10.0, 10.0, 0.0, 10.0, 10.0, pytest.approx(0.06), 0, [], 10.0),
        ("step.fetch", 3, 1.25, pytest.approx(1.25 / 3), pytest.approx(0.1443375673), 0.25, 0.5, pytest.approx(0.005), 0, [],
         pytest.approx(1.25 / 3)),
        ("step.compute", 3, 7.0, pytest.approx(7 / 3), pytest.approx(0.5773502692), 2.0, 3.0, pytest.approx(0.015), 0, [],
         pytest.approx(7 / 3))]  # no program part in these windows: the machine's, in both
    assert m.training == {"step": breakdown(p, "step")}
    assert [(s["fetch_j"], s["compute_j"]) for s in m.training["step"]["steps"]] == RANKS[0][1]
    html = render_html(m)
    assert 'class="rank-row"' not in html and "the machine over" not in html and "Training loop per rank" not in html
    one_rank = build(_profile(_ranked_windows({0: RANKS[0]})))
    assert one_rank.window_groups == m.window_groups and one_rank.training == m.training
    assert one_rank.training_ranks == {}
    # small_profile's own windows (no pid, no rank) still render as they did
    plain = build(small_profile())
    assert all(g.ranks == [] for g in plain.window_groups) and plain.training_ranks == {}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["epoch 0", "epoch 1", "step"]), st.sampled_from([None, 0, 1, 2]),
                          st.floats(0, 1e3, allow_nan=False), st.floats(1e-4, 10, allow_nan=False),
                          st.floats(0, 10, allow_nan=False), st.floats(0, 1)),
                min_size=1, max_size=40))
def test_rank_rows_add_up_to_their_group(ws) -> None:
    """On a constant-power machine (W watts): the group is W x the union of the spans (never more
    than the windows' sum, never less than the longest); the rank rows add up the program's parts,
    each window index's scaled down to W x the union of its spans where they would exceed it."""
    watts = 37.0
    rows = [WindowRow(Window(name=n, rank=r, pid=None if r is not None else 7, start_s=s0, end_s=s0 + t, time_s=t,
                             energy_j={"cpu": watts * t}, program_energy_j={"cpu": f * watts * t}))
            for n, r, _, t, s0, f in ws]
    ranks = {r for _, r, _, _, _, _ in ws if r is not None}
    for g in window_groups(rows):
        mine = [x for x in rows if x.window.name == g.name]
        if len(ranks) <= 1:
            assert g.ranks == []
            continue
        assert sum(r.count for r in g.ranks) == len(mine)
        fitted = 0.0
        for index in {x.window.index for x in mine}:
            inst = [x for x in mine if x.window.index == index]
            fitted += min(sum(x.program for x in inst), watts * _union([(x.window.start_s, x.window.end_s)
                                                                         for x in inst]))
        assert sum(r.total_j for r in g.ranks) == pytest.approx(fitted, rel=1e-9, abs=1e-9)
        assert sum(r.total_j for r in g.ranks) <= sum(x.program for x in mine) * (1 + 1e-9) + 1e-9
        assert max(x.energy for x in mine) * (1 - 1e-9) <= g.total_j <= sum(x.energy for x in mine) * (1 + 1e-9)
        union = _union([(x.window.start_s, x.window.end_s) for x in mine])
        assert g.total_j == pytest.approx(watts * union, rel=1e-9, abs=1e-9)
        if len({x.window.index for x in mine}) == 1:  # one instance: never more than the machine
            assert sum(r.total_j for r in g.ranks) <= g.total_j * (1 + 1e-9) + 1e-9
        labels = [r.name for r in g.ranks]
        assert len(set(labels)) == len(labels)
        assert {int(x.split()[1]) for x in labels if x.startswith("rank ")} == \
            {r for n, r, *_ in ws if n == g.name and r is not None}


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total, end = total + (b - a), b
        elif b > end:
            total, end = total + (b - end), b
    return total


# ---------------------------------------------------------------- a real two-rank run
TRACKED = """
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import energyprof.torch as ept


def burn_for(seconds):
    end = time.process_time() + seconds
    s = 0
    while time.process_time() < end:
        for i in range(10_000):
            s += i * i
    return s


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = ept.track([torch.randn(8, 16) for _ in range(3)])
    for epoch in range(2):
        with ept.window("epoch", epoch):
            for x in loader:
                opt.zero_grad()
                model(x).pow(2).mean().backward()
                opt.step()
                burn_for(0.05)
    dist.barrier()
    dist.destroy_process_group()


main()
"""


@pytest.fixture(scope="module", params=["wrapped", "in each rank"])
def tracked_job(request, tmp_path_factory) -> Path:
    """The job's profile p.json and page r.html: one supervisor around torchrun, or energyprof in
    each rank (the ranks' profiles joined by rank 0)."""
    d = tmp_path_factory.mktemp("ranks")
    (d / "trace.csv").write_text("t_s,cpu\n0,50\n")
    (d / "train.py").write_text(textwrap.dedent(TRACKED))
    if request.param == "wrapped":
        res = run_cli(["-q", "--power-trace", "trace.csv", "--json", "p.json", "-o", "r.html", "--",
                       *torchrun("train.py")], cwd=d, timeout=TIMEOUT, env={"OMP_NUM_THREADS": "1"})
    else:
        res = per_rank_run(d, "--json", "p.json", "-o", "r.html")
    assert res.returncode == 0, res.stderr
    return d


@needs_torchrun
def test_two_rank_run_is_broken_down_per_rank(tracked_job: Path) -> None:
    p = load(tracked_job / "p.json")
    m = build(p)
    assert m.training == {} and sorted(m.training_ranks) == ["step"]
    by_rank = m.training_ranks["step"]
    assert sorted(by_rank) == [0, 1]
    for b in by_rank.values():
        assert [s["step"] for s in b["steps"]] == list(range(6))
        assert [(e["epoch"], e["steps"]) for e in b["epochs"]] == [(0, 3), (1, 3)]
        assert all(s["compute_j"] > 0 for s in b["steps"])  # 50 W over every compute span
    epoch = next(g for g in m.window_groups if g.name == "epoch")
    assert [(r.name, r.count) for r in epoch.ranks] == [("rank 0", 2), ("rank 1", 2)]
    # 50 W: the summed row is the machine over the union of the ranks' epochs (not twice it); each
    # rank's row its program share, the ranks' together within the machine
    epochs = [w for w in p.windows if w.name == "epoch"]
    union = _union([(w.start_s, w.end_s) for w in epochs])
    assert epoch.total_j == pytest.approx(50.0 * union, rel=0.03)
    assert epoch.total_j < 0.8 * sum(sum(w.energy_j.values()) for w in epochs)
    assert sum(r.total_j for r in epoch.ranks) <= epoch.total_j * 1.001
    for r in epoch.ranks:
        assert 0 < r.total_j
    # the program's part of each window survives rank 0's join: below the machine's, never empty
    assert all(0 < sum(w.program_energy_j.values()) < sum(w.energy_j.values()) for w in epochs)
    # the live run's page and a re-render of its profile are the same page
    assert (tracked_job / "r.html").read_text(encoding="utf-8") == render_html(build(load(tracked_job / "p.json")))


@pytest.mark.browser
@needs_torchrun
def test_rank_sections_render_in_chromium(browser, tracked_job: Path) -> None:  # noqa: F811
    page = Page(browser)
    page.open(tracked_job / "r.html")
    assert page.errors == [] and page.blocked == []
    assert page.page.locator("#windows tr.rank-row").count() >= 2 * 3  # epoch, step.fetch, step.compute
    assert page.page.locator("#windows .training-ranks h3").inner_text().startswith("Training loop per rank: step")
    rows = page.page.eval_on_selector_all("#windows .training-ranks tbody tr td:first-child",
                                          "els => els.map(e => e.textContent)")
    assert rows[:2] == ["rank 0", "rank 1"]
    # per epoch, the ranks of each epoch next to each other
    cells = page.page.eval_on_selector_all("#windows .training-ranks details tbody tr",
                                           "rs => rs.map(r => [...r.cells].slice(0, 3).map(c => c.textContent))")
    assert cells == [["0", "rank 0", "3"], ["0", "rank 1", "3"], ["1", "rank 0", "3"], ["1", "rank 1", "3"]]
    page.close()



def test_the_per_rank_table_says_whose_energy_its_figures_are() -> None:
    """As the single-process table does: the program's part of each window, the machine's beside it;
    the machine's where the windows hold no program part."""
    def section(html: str) -> str:
        i = html.index('<section class="training-ranks">')
        return html[i:html.index("</section>", i)]

    machine_only = section(render_html(build(_profile(_ranked_windows()))))
    assert "Energy here is the machine&#39;s: this file&#39;s windows hold no program part" in machine_only
    # the program's part: a third of each window, so each rank's step mean is a third of the machine's
    thirds = [{**w, "program_energy_j": {"cpu": w["energy_j"]["cpu"] / 3}} for w in _ranked_windows()]
    m = build(_profile(thirds))
    program = section(render_html(m))
    assert "Energy here is the program&#39;s, its part of each window like the total above" in program
    for rank in RANKS:
        b = m.training_ranks["step"][rank]
        assert b["energy_of"] == "program"
        assert b["step_energy_j"]["mean"] == pytest.approx(b["machine_step_energy_j"]["mean"] / 3)
        assert f"(the machine's: {fmt_energy(b['machine_step_energy_j']['mean'])})" in program
    # a join of a rank whose windows hold the program's part and one whose windows do not: said per rank
    mixed = [w if w["rank"] == 0 else {k: v for k, v in w.items() if k != "program_energy_j"} for w in thirds]
    assert "for every rank but 1, whose figures are the machine&#39;s" in section(render_html(build(_profile(mixed))))
