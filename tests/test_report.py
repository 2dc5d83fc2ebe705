"""The HTML report without a browser: self-contained, escaped, correct chart values, fast, reproducible."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest_report import XSS_FILE, XSS_FUNCTION, big_profile, hostile_profile, small_profile
from energyprof.analysis.chart import MAX_CHART_NODES, grouped_tree, prune
from energyprof.analysis.functions import is_library
from energyprof.analysis.report import RenderOptions, build
from energyprof.facts.profile import IDLE_NODE
from energyprof.facts.profile import Profile
from energyprof.render import charts
from energyprof.render.cards import summary_cards
from energyprof.render.html import render_html, unpacked_json


def page_of(profile: Profile, **options) -> str:
    return render_html(build(profile, RenderOptions(**options)))


class _Tags(HTMLParser):
    """Every start tag with its attributes, and the text of each <script>."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[tuple[dict, str]] = []
        self._in: dict | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in = dict(attrs)
            self.scripts.append((self._in, ""))

    def handle_data(self, data):
        if self._in is not None:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)

    def handle_endtag(self, tag):
        if tag == "script":
            self._in = None


def parse(page: str) -> _Tags:
    p = _Tags()
    p.feed(page)
    return p


def embedded(page: str) -> dict:
    (attrs, text), = [s for s in parse(page).scripts if s[0].get("type") == "application/json"]
    assert attrs.get("data-encoding") == "deflate"
    return unpacked_json(text)


@pytest.fixture(scope="module")
def small() -> Profile:
    return small_profile()


@pytest.fixture(scope="module")
def small_page(small: Profile) -> str:
    return page_of(small)


def test_page_loads_nothing_from_outside(small_page: str) -> None:
    tags = parse(small_page)
    for tag, attrs in tags.tags:
        assert tag not in ("link", "iframe", "img", "object", "embed"), tag
        assert "src" not in attrs, (tag, attrs)
    scripts = [a for a, _ in tags.scripts]
    assert len(scripts) == 3  # data, plotly.js, the report's script: plotly inlined exactly once
    assert small_page.count("Plotly") >= 1


def test_hostile_strings_are_text_everywhere() -> None:
    page = page_of(hostile_profile())
    assert XSS_FUNCTION not in page
    assert "<img src=x" not in page
    assert "<b>target</b>" not in page
    # The only script tags are ours, and the hostile strings survive intact as data.
    tags = parse(page)
    assert len(tags.scripts) == 3
    data = embedded(page)
    assert XSS_FUNCTION in data["table"]["fn"]
    assert XSS_FILE in table_files(data["table"])
    block = page.split('id="report-data" data-encoding="deflate">', 1)[1].split("</script>", 1)[0]
    assert re.fullmatch(r"[A-Za-z0-9+/=]*", block)  # base64: nothing a script block could end at
    # plotly reads HTML-ish tags in labels: ours are entity-escaped.
    full = data["chart"]["full"]
    sent = full["labels"] + [line for lines in full["head"].values() for line in lines] + list(full["through"].values())
    assert not any("<script" in s or "<img" in s for s in sent)
    # a label left out is its row's function, which the page escapes as Python does
    labels = [label or charts._escape(data["table"]["fn"][row]) for label, row in zip(full["labels"], full["row"])]
    assert any("&lt;/script&gt;" in s for s in labels) and not any("<script" in s for s in labels)


def table_files(table: dict) -> list[str]:
    """The table's files whole, as the page puts them together: a shared folder and the short name."""
    return [table["dirs"][d] + s if d >= 0 else table["full"][str(k)]
            for k, (d, s) in enumerate(zip(table["dir"], table["short"]))]


def decoded(column: dict) -> list[float]:
    """A scaled column (`charts.scaled_column`) as the page reads it."""
    return [v * 10.0 ** column["exp"] for v in column["v"]]


def _check_values(trace: dict, key: str) -> None:
    """Each parent >= the sum of its children and nothing negative: plotly's "total" rule."""
    children: dict[int, float] = {}
    value = decoded(trace[key])
    for i, parent in enumerate(trace["parents"]):
        assert value[i] >= 0
        assert parent < i  # pre-order: a parent comes before its children
        if parent >= 0:
            children[parent] = children.get(parent, 0.0) + value[i]
    for parent, total in children.items():
        # six significant digits: a parent within rounding of its children's sum is lifted to it by the page
        assert value[parent] >= total * (1 - 1e-5), (parent, value[parent], total)


def test_icicle_values_add_up(small: Profile) -> None:
    model = build(small)
    trace = charts.icicle_trace(model, model.chart)
    _check_values(trace, "value_e")
    _check_values(trace, "value_t")
    assert decoded(trace["value_e"])[0] == pytest.approx(small.total_energy_j, rel=5e-6)
    # every library frame folds into a group box that is one of its ancestors
    for i, (kind, group) in enumerate(zip(trace["kind"], trace["group"])):
        if kind in (1, 2):
            assert trace["kind"][group] == 3
            a = trace["parents"][i]
            while a != group:
                assert a >= 0
                a = trace["parents"][a]


def _walk(root):
    stack = [(root, 0)]
    while stack:
        n, d = stack.pop()
        yield n, d
        stack.extend((c, d + 1) for c in n.children)


@pytest.mark.parametrize("path, expected", [
    ("/usr/lib/python3.11/json/encoder.py", True),
    ("/venv/lib/python3.12/site-packages/torch/nn/modules/module.py", True),
    ("C:\\Python311\\Lib\\json\\encoder.py", True),
    ("<frozen importlib._bootstrap>", True),
    ("/home/me/project/train.py", False),
    ("train.py", False),
    ("", False),
])
def test_library_paths(path: str, expected: bool) -> None:
    assert is_library(path) is expected


def test_prune_folds_small_paths_into_other() -> None:
    profile = big_profile(functions=5000, modules=20)
    root = prune(grouped_tree(profile), limit=300)
    nodes = list(_walk(root))
    assert len(nodes) <= 2 * 300
    others = [n for n, _ in nodes if n.folded]
    # every call path is either drawn or counted in exactly one "other" box
    assert others and sum(n.folded for n in others) + len(nodes) - len(others) == len(list(profile.nodes()))
    assert root.value_e == pytest.approx(profile.total_energy_j, rel=1e-12)


def test_cards_show_what_is_present(small: Profile) -> None:
    cards = {c.kind: c for c in summary_cards(build(small))}
    assert {"energy", "attributed", "duration", "power", "carbon", "memory"} <= set(cards)
    energy_lines = " ".join(t for t, _ in cards["energy"].lines)
    assert "gpu:0" in energy_lines and "Wh" in energy_lines
    assert {tag for _, tag in cards["energy"].lines} >= {"measured", "estimated"}
    assert "36 W" in cards["power"].lines[1][0]  # the machine's peak of the stacked timeline: 14 + 22
    bare = hostile_profile()
    kinds = {c.kind for c in summary_cards(build(bare, RenderOptions(carbon=None)))}
    assert "carbon" not in kinds and "memory" not in kinds


def test_page_shows_methodology(small_page: str) -> None:
    for text in ("permission denied on energy_uj", "Idle policy: share", "charged by wall time",
                 "example.py --epochs 2", "0.1.0", "estimated", "1/√"):
        assert text in small_page, text


def test_table_keeps_every_function(small: Profile) -> None:
    table = embedded(page_of(small))["table"]
    keys = {(n.function, n.file, n.line) for n, _ in small.nodes()}
    assert len(table["fn"]) == len(keys)
    scale = 10.0 ** table["self_e"]["exp"]
    assert sum(table["self_e"]["v"]) * scale == pytest.approx(small.total_energy_j, rel=1e-2)
    assert IDLE_NODE in table["fn"]


def test_scaled_column_keeps_three_digits() -> None:
    values = [0.0, 1.23456e-5, 4.5e-3, 7.0, 123456.0]
    col = charts.scaled_column(values)
    back = [v * 10.0 ** col["exp"] for v in col["v"]]
    for a, b in zip(values, back):
        assert b == pytest.approx(a, rel=5e-3)


def test_fifty_thousand_functions_stay_small() -> None:
    """Size and shape only: the build time is a benchmark (benchmarks/report.py), not a test."""
    page = page_of(big_profile())
    size = len(page.encode("utf-8"))
    assert size < 8_000_000, size
    data = embedded(page)
    assert len(data["table"]["fn"]) == 50_000 + 100 + 4
    assert len(data["chart"]["full"]["parents"]) <= 3 * MAX_CHART_NODES


def test_same_profile_same_page(small: Profile, tmp_path: Path) -> None:
    small.save(tmp_path / "p.json")
    from energyprof import load

    assert page_of(load(tmp_path / "p.json")) == page_of(small)


SCRIPT = """
import math
def crunch():
    return sum(math.sqrt(i) for i in range(60000))
def encode():
    import json
    return [json.dumps(list(range(50))) for _ in range(1500)]
for _ in range(3):
    crunch(); encode()
"""


def test_report_command_gives_the_live_page(tmp_path: Path) -> None:
    (tmp_path / "work.py").write_text(SCRIPT)
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,40\n")
    live = subprocess.run([sys.executable, "-m", "energyprof", "--power-trace", "trace.csv", "--json", "p.json",
                           "-o", "live.html", "work.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert live.returncode == 0, live.stderr
    again = subprocess.run([sys.executable, "-m", "energyprof", "report", "p.json", "-o", "again.html"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    a = (tmp_path / "live.html").read_text()
    b = (tmp_path / "again.html").read_text()
    assert embedded(a) == embedded(b)
    assert re.sub(r"\s+", " ", a) == re.sub(r"\s+", " ", b)
    assert embedded(a)["total_j"] > 0


def test_timeline_stacks_power_and_shades_windows(small: Profile) -> None:
    fig = charts.timeline_figure(build(small))
    power = [t for t in fig["data"] if t.get("stackgroup")]
    assert [t["name"] for t in power] == ["cpu (W)", "gpu:0 (W)"]
    assert any(t.get("yaxis") == "y2" for t in fig["data"])  # the RSS lane
    assert len(fig["layout"]["shapes"]) == len(small.windows)
    # downsampling keeps the energy: the area under each stacked series is the source's energy
    for trace, sid in zip(power, ("cpu", "gpu:0")):
        xs, ys = trace["x"], trace["y"]
        area = sum((xs[i + 1] - xs[i]) * ys[i] for i in range(len(xs) - 1))
        tl = small.timeline
        expected = sum(p * (e - s) for p, s, e in zip(tl["power_w"][sid], tl["start_s"], tl["end_s"]))
        assert area == pytest.approx(expected, rel=1e-3)


def test_windows_section_lists_mean_and_spread_and_flags_short_ones():
    from energyprof.facts.profile import Node
    from energyprof.facts.profile import Profile

    windows = [{"name": "step", "index": i, "depth": 0, "start_s": i * 0.05, "end_s": (i + 1) * 0.05,
                "time_s": 0.05, "energy_j": {"gpu:0": 10.0 + i}} for i in range(4)]
    windows.append({"name": "epoch", "index": 0, "depth": 0, "start_s": 0.0, "end_s": 1.0, "time_s": 1.0,
                    "energy_j": {"gpu:0": 200.0}})
    p = Profile(meta={"target": "t"}, sources=[{"id": "gpu:0", "component": "gpu:0", "method": "measured",
                                                "sensor": "nvml", "detail": {}, "update_period_s": 0.1}],
                totals={"energy_j": {"gpu:0": 200.0}, "attributed_j": {"gpu:0": 200.0}, "duration_s": 1.0},
                root=Node("t", energy_j={"gpu:0": 200.0}, self_energy_j={"gpu:0": 200.0}), windows=windows)
    model = build(p)
    assert [r.short_for for r in model.windows] == [["gpu:0"]] * 4 + [[]]  # 50 ms < 3 x 100 ms
    assert not hasattr(p.windows[0], "short_for")  # a view, not written into the facts
    steps = {g.name: g for g in model.window_groups}["step"]
    assert steps.count == 4 and steps.mean_j == 11.5 and steps.min_j == 10.0 and steps.max_j == 13.0
    assert abs(steps.stdev_j - 1.2909944) < 1e-6
    page = render_html(model)
    assert 'id="windows"' in page and "too short for gpu:0" in page


def test_training_breakdown_is_computed_at_render_and_shown():
    """Windows from energyprof.torch.track (`step.fetch`, `step.compute`) become a per-epoch
    fetch/compute table in the report model; the profile itself is not touched."""
    from energyprof.facts.profile import Node
    from energyprof.facts.profile import Profile

    windows = [{"name": "epoch", "index": 0, "depth": 0, "start_s": 0.0, "end_s": 1.0, "time_s": 1.0,
                "energy_j": {"cpu": 10.0}}]
    for i in range(2):
        t = i * 0.5
        windows.append({"name": "step.fetch", "index": i, "depth": 1, "start_s": t, "end_s": t + 0.1,
                        "time_s": 0.1, "energy_j": {"cpu": 1.0}})
        windows.append({"name": "step.compute", "index": i, "depth": 1, "start_s": t + 0.1, "end_s": t + 0.5,
                        "time_s": 0.4, "energy_j": {"cpu": 4.0}})
    p = Profile(meta={"target": "t", "started_at": "2026-01-01T00:00:00+00:00"},
                sources=[{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay", "detail": {}}],
                totals={"energy_j": {"cpu": 10.0}, "attributed_j": {"cpu": 10.0}, "duration_s": 1.0},
                root=Node("t", energy_j={"cpu": 10.0}, self_energy_j={"cpu": 10.0}), windows=windows)
    model = build(p)
    epochs = model.training["step"]["epochs"]
    assert [(e["epoch"], e["steps"]) for e in epochs] == [(0, 2)]
    assert epochs[0]["fetch_s"] == pytest.approx(0.2) and epochs[0]["compute_j"] == pytest.approx(8.0)
    assert "training" not in p.extra
    page = render_html(model)
    assert "Training loop: step" in page


def test_the_exact_peak_is_shown_when_it_was_measured() -> None:
    """Defect: peak_rss_exact_bytes (the kernel's peak mark, reset at the start) was never shown."""
    from conftest_report import CPU, build as build_tree, profile_from

    root = build_tree(("t", "", {"cpu": 1.0}, 0.1, 1, []))
    sampled = profile_from(root, [CPU], totals={"peak_rss_bytes": 200 * 2**20, "baseline_rss_bytes": 100 * 2**20})
    exact = profile_from(root, [CPU], totals={"peak_rss_bytes": 200 * 2**20, "baseline_rss_bytes": 100 * 2**20,
                                              "peak_rss_exact_bytes": 350 * 2**20})
    card = {c.kind: c for c in summary_cards(build(exact))}["memory"]
    assert card.value == "350 MiB"  # a spike between two samples is still the peak
    lines = [t for t, _ in card.lines]
    assert "exact (kernel peak mark): 350 MiB" in lines and "sampled: 200 MiB" in lines
    assert "growth: 250 MiB" in lines
    assert {c.kind: c for c in summary_cards(build(sampled))}["memory"].value == "200 MiB"


# --- the timeline's buckets -------------------------------------------------------------------

def test_timeline_buckets_are_uniform_after_one_long_first_tick() -> None:
    """A 1 s first tick (say, `import torch`) then 10 ms ticks for 10 s: every bucket is one grid
    cell wide (about 1,000 of them, not 512 of ~1 s), power is kept, and energy is conserved."""
    from energyprof.core.timeline import Timeline

    tl = Timeline(1, max_points=1000)
    ms = 1_000_000
    ticks = [0, 1000 * ms] + [1000 * ms + 10 * ms * k for k in range(1, 1001)]
    for a, b in zip(ticks, ticks[1:]):
        watts = 5.0 if a == 0 else 1.0
        tl.add(a, b, [watts * (b - a) / 1e9], 0)
        tl.note_program(a, b, [0.25 * watts * (b - a) / 1e9], [0.5 * watts * (b - a) / 1e9])
    widths = [b - a for a, b in zip(tl.t0, tl.t1)]
    assert len(set(widths[:-1])) == 1 and widths[0] <= 16 * ms and widths[-1] <= widths[0]  # 11 s in <= 1,000 cells
    assert 500 <= len(tl.t0) <= 1000
    assert sum(e[0] for e in tl.energy) == pytest.approx(5.0 + 10.0)
    out = tl.export(0, ["cpu"])
    first = [w for w, e in zip(out["power_w"]["cpu"], out["end_s"]) if e <= 1.0]
    assert first and all(w == pytest.approx(5.0) for w in first)  # the long tick's power, cell by cell
    assert set(out["program_w"]) == {"share", "all"}
    spans = [(b - a) for a, b in zip(out["start_s"], out["end_s"])]
    assert sum(w * s for w, s in zip(out["program_w"]["share"], spans)) == pytest.approx(15.0 * 0.25)
    assert sum(w * s for w, s in zip(out["program_w"]["all"], spans)) == pytest.approx(15.0 * 0.5)


@given(st.lists(st.integers(min_value=1, max_value=50_000_000), min_size=1, max_size=3000))
@settings(max_examples=60, deadline=None)
def test_timeline_conserves_energy_and_stays_bounded(gaps: list[int]) -> None:
    from energyprof.core.timeline import Timeline

    tl = Timeline(1, max_points=100)
    t = 0
    for g in gaps:
        tl.add(t, t + g, [g * 1e-9], 0)
        tl.note_program(t, t + g, [g * 1e-9 / 2], [g * 1e-9])
        t += g
    assert len(tl.t0) <= 100
    assert sum(e[0] for e in tl.energy) == pytest.approx(t * 1e-9)
    assert sum(p[0] for p in tl.program) == pytest.approx(t * 1e-9 / 2)
    assert all(a <= b for a, b in zip(tl.t1, tl.t0[1:]))  # buckets never overlap
    assert len({b - a for a, b in zip(tl.t0[:-1], tl.t1[:-1])}) <= 1  # and all but the last are one cell


# --- one definition of numbers ----------------------------------------------------------------

@given(st.floats(min_value=-1e12, max_value=1e12, allow_nan=False))
@settings(max_examples=300, deadline=None)
def test_figures_never_print_exponents_and_keep_three_digits(x: float) -> None:
    from energyprof.render.format import fmt_bytes, fmt_energy, fmt_grams, fmt_seconds

    for text in (fmt_energy(x), fmt_grams(x), fmt_bytes(abs(x)), fmt_seconds(x)):
        assert "e" not in text.split(" ")[0].lower(), text
    number = fmt_energy(x).split(" ")[0].lstrip("-").replace(".", "").lstrip("0")
    assert len(number) <= 3 or abs(x) < 1e-9 or abs(x) >= 999.5e9  # beyond GJ and below nJ: more digits


def test_the_same_figure_in_every_renderer(small: Profile) -> None:
    """The console and the page print a function's share from the same formatter and the same whole."""
    from energyprof.render.console import render_summary
    from energyprof.render.format import fmt_percent

    model = build(small)
    forward = next(r for r in model.rows if r.function == "forward")
    share = fmt_percent(forward.self_total_energy, model.program_j)
    assert f"{share}" in render_summary(model)
    assert model.program_j == pytest.approx(sum(small.totals.attributed_j.values()))


# -- one number in every view -------------------------------------------------------------------------
def test_the_exact_peak_is_never_below_a_sampled_one() -> None:
    """The kernel's mark lags its per-thread counters: 100 KB below the sampled peak reads as the sampled peak."""
    p = small_profile()
    sampled = p.totals.peak_rss_bytes
    lagging = Profile.from_dict({**p.to_dict(), "totals": {**p.to_dict()["totals"], "peak_rss_exact_bytes": sampled - 100_000}})
    m = build(lagging, RenderOptions()).memory
    assert m.peak_rss_exact_bytes == sampled and m.peak == sampled
    above = Profile.from_dict({**p.to_dict(), "totals": {**p.to_dict()["totals"], "peak_rss_exact_bytes": sampled + 4096}})
    assert build(above, RenderOptions()).memory.peak == sampled + 4096  # a spike sampling missed stays


def test_table_percentages_come_from_unrounded_energies() -> None:
    """Three-digit table energies would make a root of 14.1 J over a program of 14.06 J read 100.3%."""
    from energyprof.render.charts import function_table

    model = build(small_profile(), RenderOptions())
    table = function_table(model)
    for row, self_p, tot_p in zip(model.rows, table["self_p"], table["tot_p"]):
        assert self_p == pytest.approx(row.self_total_energy / model.program_j * 100, abs=1e-4)
        assert tot_p == pytest.approx(model.row_energy(row) / model.program_j * 100, abs=1e-4)
    assert table["tot_p"][0] == 100.0


def test_processes_are_named_by_role() -> None:
    """A launcher with two ranks, a DataLoader worker under rank 1, and a plain child of the launcher."""
    from energyprof.facts.records import Process
    from energyprof.render.cards import process_rows

    procs = [Process(pid=10, command="torchrun train.py", role="main"),
             Process(pid=11, parent_pid=10, command="python train.py", role="rank", rank=0, local_rank=0),
             Process(pid=12, parent_pid=10, command="python train.py", role="rank", rank=1, local_rank=1),
             Process(pid=13, parent_pid=12, command="python train.py", role="worker"),
             Process(pid=14, parent_pid=10, command="nvidia-smi", role="child")]
    p = small_profile()
    model = build(Profile.from_dict({**p.to_dict(), "processes": [x.to_dict() for x in procs]}), RenderOptions())
    roles = {r["pid"]: r["role"] for r in process_rows(model)["rows"]}
    assert roles == {10: "launcher", 11: "rank 0", 12: "rank 1", 13: "DataLoader worker of rank 1", 14: "child"}
    alone = [Process(pid=20, command="python train.py", role="main"), Process(pid=21, parent_pid=20, role="worker")]
    model = build(Profile.from_dict({**p.to_dict(), "processes": [x.to_dict() for x in alone]}), RenderOptions())
    assert [r["role"] for r in process_rows(model)["rows"]] == ["the program", "DataLoader worker"]
    # pids wrap: a worker with a smaller pid than the program is still listed after it, as the profile has it
    wrapped = [Process(pid=32000, command="python train.py", role="main"), Process(pid=21, parent_pid=32000, role="worker")]
    model = build(Profile.from_dict({**p.to_dict(), "processes": [x.to_dict() for x in wrapped]}), RenderOptions())
    assert [r["role"] for r in process_rows(model)["rows"]] == ["the program", "DataLoader worker"]


def _importlib_chain(module: tuple) -> tuple:
    """How CPython runs `import x`: five importlib frames, then the module's body."""
    boot, ext = "<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>"
    chain = module
    for fn, f in reversed([("_find_and_load", boot), ("_find_and_load_unlocked", boot), ("_load_unlocked", boot),
                           ("exec_module", ext), ("_call_with_frames_removed", boot)]):
        chain = (fn, f, {"cpu": 0.001}, 0.0, 1, [chain])
    return chain


def test_an_opened_import_shows_its_heaviest_modules_by_name() -> None:
    """`import pkg` whose body imports five submodules: the group holds `import pkg` and under it the
    three heaviest submodules by name and one "other", with no importlib frame left to label."""
    from conftest_report import build as build_node
    from conftest_report import profile_from

    site = "/venv/lib/python3.11/site-packages/pkg/"
    subs = [_importlib_chain(("<module>", f"{site}{name}.py", {"cpu": j}, 0.01, 10, []))
            for name, j in (("a", 5.0), ("b", 1.0), ("c", 3.0), ("d", 0.5), ("e", 2.0))]
    spec = ("app.py", "", {"cpu": 0.0}, 0.0, 0, [
        ("<module>", "app.py", {"cpu": 0.1}, 0.01, 1, [_importlib_chain(("<module>", f"{site}__init__.py",
                                                                          {"cpu": 0.2}, 0.01, 2, subs))])])
    model = build(profile_from(build_node(spec), [{"id": "cpu", "component": "cpu", "method": "measured"}]),
                  RenderOptions())
    (group,) = [n for n in model.chart.preorder() if n.kind == "group"]
    assert group.function == "[import]"
    below = group.preorder()[1:]
    assert not any(n.file.startswith("<frozen importlib") for n in below)  # no unlabelled machinery
    (pkg,) = group.children
    trace = charts.icicle_trace(model, model.chart)
    names = [label for label in trace["labels"]]
    assert "import pkg" in names
    assert [c.file.rsplit("/", 1)[-1] for c in pkg.children if not c.folded] == ["a.py", "c.py", "e.py"]
    (other,) = [c for c in pkg.children if c.folded]
    assert other.value_e == pytest.approx(1.0 + 0.5)  # b and d; their importlib frames went to `import pkg`
    assert sum(pkg.self_e.values()) == pytest.approx(0.2 + 5 * 5 * 0.001)
    assert {"import pkg.a", "import pkg.c", "import pkg.e"} <= set(names)
    # nothing is lost: the group holds every joule of the import
    assert group.value_e == pytest.approx(0.2 + 11.5 + 6 * 5 * 0.001)


@pytest.mark.parametrize("where, value, needle", [
    (("nodes", 2, "self_energy_j", "cpu"), 10 ** 400, "nodes[2].self_energy_j[cpu] is an integer of about 10**400"),
    (("nodes", 2, "self_samples"), 10 ** 400, "nodes[2].self_samples"),
    (("nodes", 2, "self_time_s"), 10 ** 308, "nodes[2].self_time_s"),
    (("meta", "host", "memory_bytes"), 10 ** 400, "meta.host.memory_bytes"),
    (("nodes", 2, "self_energy_j", "cpu"), 1e308, "nodes[2].self_energy_j[cpu] is 1e+308"),
], ids=["energy-10**400", "samples-10**400", "time-10**308", "meta-10**400", "energy-1e308"])
def test_a_huge_number_is_one_line_and_exit_2(tmp_path: Path, where: tuple, value, needle: str) -> None:
    """Defect: a profile with 10**400 (or a finite 1e308 whose sums leave a float's range) made `report`
    exit 1 with a traceback or "Out of range float values". It is one line naming the field, exit 2."""

    doc = small_profile().to_table()
    at = doc
    for key in where[:-1]:
        at = at[key]
    at[where[-1]] = value
    (tmp_path / "p.json").write_text(json.dumps(doc))
    res = subprocess.run([sys.executable, "-m", "energyprof", "report", "p.json", "-o", "r.html"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("energyprof: error:"), res.stderr
    assert not (tmp_path / "r.html").exists()


def test_large_numbers_within_the_bound_are_rendered(tmp_path: Path) -> None:
    """Up to 1e100 a profile renders (page, JSON, CSV), however odd its figures."""

    from energyprof.facts.profile import load
    from energyprof.render.html import render_html_bytes
    from energyprof.render.registry import renderers

    doc = small_profile().to_table()
    for n in doc["nodes"]:
        n["self_energy_j"] = {k: v * 1e99 for k, v in n["self_energy_j"].items()}
    for part in ("energy_j", "attributed_j", "energyprof_j", "idle_j"):
        doc["totals"][part] = {k: v * 1e99 for k, v in doc["totals"][part].items()}
    doc["nodes"][1]["self_samples"] = 10 ** 100
    doc["meta"]["host"]["memory_bytes"] = 10 ** 100
    (tmp_path / "p.json").write_text(json.dumps(doc))
    model = build(load(tmp_path / "p.json"))
    assert b"<html" in render_html_bytes(model)
    assert json.loads(renderers()["json"](model))["meta"]["host"]["memory_bytes"] == 10 ** 100
    assert renderers()["csv"](model).count("\n") == len(model.rows) + 1
