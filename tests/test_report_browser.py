"""The report in a real headless Chromium with every non-file request aborted (the network is off).

Skipped only when Chromium is missing outside CI; with CI set, a missing browser is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from conftest_report import big_profile, hostile_profile, small_profile
from energyprof.analysis.report import build
from energyprof.render.html import render_html


def write_html(profile, path: str) -> None:
    Path(path).write_text(render_html(build(profile)), encoding="utf-8")

pytestmark = pytest.mark.browser

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run", "--disable-sync"]
PLOTS_READY = ("() => { const p = [...document.querySelectorAll('.js-plotly-plot')];"
               " return p.length > 0 && p.every(e => e._fullLayout); }")


def _chromium() -> str | None:
    for candidate in (os.environ.get("ENERGYPROF_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    exe = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if exe is None or sync_playwright is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set but Chromium or Playwright's Python package is missing")
        pytest.skip("no chromium (or playwright) on this machine")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=ARGS)
        yield b
        b.close()


class Page:
    """A page that refuses the network and remembers console errors and outside requests."""

    def __init__(self, browser, width: int = 1280, height: int = 800) -> None:
        self.page = browser.new_page(viewport={"width": width, "height": height})
        self.errors: list[str] = []
        self.blocked: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.route("**/*", self._route)

    def _route(self, route) -> None:
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort()

    def open(self, path: Path, timeout_ms: int = 60_000) -> None:
        """Open and wait until every plot is drawn (a generous limit: a loaded machine is slow)."""
        self.page.goto(path.resolve().as_uri())
        self.page.wait_for_function(PLOTS_READY, timeout=timeout_ms)

    def first_column(self) -> list[str]:
        return self.page.eval_on_selector_all("#fn-body tr td.fn .name", "els => els.map(e => e.textContent)")

    def close(self) -> None:
        self.page.close()


@pytest.fixture(scope="module")
def small_report(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("report") / "small.html"
    write_html(small_profile(), str(path))
    return path


def test_loads_offline_and_draws(browser, small_report: Path) -> None:
    page = Page(browser)
    page.open(small_report)
    assert page.errors == [] and page.blocked == []
    ids = page.page.eval_on_selector_all(".js-plotly-plot", "els => els.map(e => e.id)")
    assert set(ids) == {"icicle", "timeline-plot"}
    assert page.page.locator("#icicle g.slice").count() > 5  # the icicle drew its boxes
    page.close()


def test_table_sorts_and_filters(browser, small_report: Path) -> None:
    page = Page(browser)
    page.open(small_report)
    p = page.page
    # default: the user's functions by total energy, largest first (the script's body holds them all)
    assert page.first_column()[:3] == ["<module>", "train", "forward"]
    p.click("#fn-head th[data-key=fn]")
    names = page.first_column()
    special = [n for n in names if n.startswith("[")]
    # the program's functions first, whatever the column: idle and energyprof after them
    assert special and names[len(names) - len(special):] == special
    assert names[:len(names) - len(special)] == sorted(names[:len(names) - len(special)])
    p.click("#fn-head th[data-key=n]")
    samples = [int(x) for x in p.eval_on_selector_all(
        "#fn-body tr", "rs => rs.map(r => r.children[r.children.length - 2].textContent)")]
    assert samples == sorted(samples, reverse=True)
    p.fill("#table-search", "fib")
    p.wait_for_function("() => document.querySelectorAll('#fn-body tr').length === 2")
    assert set(page.first_column()) == {"fib"}
    p.fill("#table-search", "json/encoder")  # file paths are searched too
    p.wait_for_function("() => document.querySelectorAll('#fn-body tr').length === 1")
    assert page.first_column() == ["dumps"]
    assert page.errors == []
    page.close()


def test_chart_switches_redraw(browser, small_report: Path) -> None:
    page = Page(browser)
    page.open(small_report)
    p = page.page
    root = "() => document.getElementById('icicle').data[0].values[0]"
    program = p.evaluate(root)
    p.check("#chart-idle")  # other processes, idle and energyprof: left out by default, shown on request
    # small_profile's idle node: 2 J cpu + 1 J gpu; energyprof's: 0.05 J
    assert p.evaluate(root) == pytest.approx(program + 3.05)
    before = p.evaluate("() => document.getElementById('icicle').data[0].values.slice()")
    p.select_option("#chart-metric", "t")
    after = p.evaluate("() => document.getElementById('icicle').data[0].values.slice()")
    assert after != before
    labels = p.evaluate("() => document.getElementById('icicle').data[0].labels")
    assert "sum" not in labels and "callback" in labels  # library frames grouped by default
    p.uncheck("#chart-collapse")
    labels = p.evaluate("() => document.getElementById('icicle').data[0].labels")
    assert "sum" in labels
    p.select_option("#chart-colour", "mix")
    p.check("#chart-flame")
    assert page.errors == []
    page.close()


def test_hostile_names_stay_text(browser, tmp_path: Path) -> None:
    path = tmp_path / "hostile.html"
    write_html(hostile_profile(), str(path))
    page = Page(browser)
    page.open(path)
    p = page.page
    assert p.evaluate("() => window.pwned") is None
    assert p.locator("img").count() == 0
    assert "</script><script>window.pwned=1</script>" in page.first_column()
    p.hover("#icicle g.slice >> nth=2")  # hover labels go through plotly's HTML-ish text too
    assert p.evaluate("() => window.pwned") is None
    assert page.errors == []
    page.close()


def test_narrow_window_and_print(browser, small_report: Path) -> None:
    page = Page(browser, width=400, height=800)
    page.open(small_report)
    p = page.page
    overflow = p.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, overflow
    p.emulate_media(media="print")
    assert p.evaluate("() => getComputedStyle(document.querySelector('.controls')).display") == "none"
    page.close()


def test_fifty_thousand_functions_draw_and_paginate(browser, tmp_path: Path) -> None:
    """Behaviour only; the time to draw is measured by benchmarks/report.py."""
    path = tmp_path / "big.html"
    write_html(big_profile(), str(path))
    page = Page(browser)
    page.open(path, timeout_ms=120_000)
    p = page.page
    assert p.locator("#fn-body tr").count() == 100  # paginated, not 50,000 rows in the DOM
    assert "of 50104" in p.text_content("#page-info")
    p.fill("#table-search", "mod7_function_12")
    p.wait_for_function("() => document.getElementById('page-info').textContent.includes('filtered')")
    assert all(n.startswith("mod7_function_12") for n in page.first_column())
    assert page.errors == []
    page.close()


def test_clicking_a_function_shades_when_it_ran(browser, tmp_path: Path) -> None:
    """A real run: `first` runs, then `second`; clicking `second` shades only the later part."""
    import subprocess
    import sys

    (tmp_path / "t.csv").write_text("t_s,cpu\n0,30\n")
    (tmp_path / "w.py").write_text(
        "import time\n"
        "def first():\n    end = time.perf_counter() + 0.4\n    while time.perf_counter() < end: pass\n"
        "def second():\n    time.sleep(0.4)\n"
        "first()\nsecond()\n")
    res = subprocess.run([sys.executable, "-m", "energyprof", "-q", "--power-trace", "t.csv", "-o", "r.html",
                          "--json", "p.json", "w.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    duration = json.loads((tmp_path / "p.json").read_text())["totals"]["duration_s"]
    page = Page(browser)
    page.open(tmp_path / "r.html")
    p = page.page
    p.fill("#table-search", "second")
    p.wait_for_function("() => document.getElementById('page-info').textContent.includes('filtered')")
    before = p.evaluate("() => (document.getElementById('timeline-plot').layout.shapes || []).length")
    p.click("#fn-body tr")
    shapes = p.evaluate("() => document.getElementById('timeline-plot').layout.shapes")
    added = shapes[before:]
    assert added, "no span was shaded"
    assert min(s["x0"] for s in added) > 0.3  # `second` ran after `first`'s 0.4 s
    assert max(s["x1"] for s in added) <= duration + 1e-3  # within the run, however slow the machine was
    assert "second" in p.text_content("#timeline-selection")
    assert page.errors == []
    page.close()


def test_functions_shorter_than_three_sensor_updates_are_flagged(browser, tmp_path: Path) -> None:
    from energyprof.facts.profile import Node
    from energyprof.facts.profile import Profile

    src = [{"id": "gpu:0", "component": "gpu:0", "method": "measured", "sensor": "nvml", "detail": {},
            "update_period_s": 0.1}]
    quick = Node("quick_kernel", "k.py", 1, time_s=0.05, self_time_s=0.05, samples=10, self_samples=10,
                 energy_j={"gpu:0": 5.0}, self_energy_j={"gpu:0": 5.0})
    slow = Node("long_epoch", "k.py", 9, time_s=2.0, self_time_s=2.0, samples=400, self_samples=400,
                energy_j={"gpu:0": 95.0}, self_energy_j={"gpu:0": 95.0})
    root = Node("t", time_s=2.05, samples=410, energy_j={"gpu:0": 100.0}, self_energy_j={"gpu:0": 0.0},
                children=[quick, slow])
    p = Profile(meta={"target": "t"}, sources=src, root=root,
                totals={"energy_j": {"gpu:0": 100.0}, "attributed_j": {"gpu:0": 100.0}, "duration_s": 2.05})
    path = tmp_path / "r.html"
    write_html(p, str(path))
    page = Page(browser)
    page.open(path)
    flagged = page.page.eval_on_selector_all(
        "#fn-body tr", "rows => rows.filter(r => r.querySelector('.short')).map(r => r.querySelector('.name').textContent)")
    assert flagged == ["quick_kernel"]
    assert page.errors == []
    page.close()


# --- the first screen's interactions ---------------------------------------------------------

def _labels(p) -> list[str]:
    return p.evaluate("() => document.getElementById('icicle').data[0].labels")


def _click_box(p, text: str) -> None:
    p.locator("#icicle g.slice", has_text=text).first.click()
    p.wait_for_timeout(900)  # plotly animates the zoom


def test_group_boxes_fold_library_frames_and_open_on_click(browser, small_report: Path) -> None:
    page = Page(browser)
    page.open(small_report)
    p = page.page
    labels = _labels(p)
    # the library frames are folded into their group boxes; the user callbacks stay visible under them
    assert "[library: numpy] sum" in labels and "[library: json] dumps" in labels
    assert "sum" not in labels and "dumps" not in labels
    assert {"callback", "default", "forward", "train"} <= set(labels)
    _click_box(p, "[numpy]")  # the box shows its package on a line of its own
    assert "sum" in _labels(p) and "dumps" not in _labels(p)  # only that group opened
    _click_box(p, "[numpy]")
    assert "sum" not in _labels(p)
    assert page.errors == []
    page.close()


def test_boxes_are_labelled_with_energy_and_share_of_the_program(browser, small_report: Path) -> None:
    from energyprof.render.format import fmt_energy, fmt_percent

    model = build(small_profile())
    page = Page(browser)
    page.open(small_report)
    p = page.page
    trace = p.evaluate("() => { const t = document.getElementById('icicle').data[0];"
                       " return {labels: t.labels, text: t.customdata, values: t.values, tt: t.texttemplate}; }")
    assert trace["tt"] == "%{customdata}"
    i = trace["labels"].index("forward")
    forward = next(n for n, _ in model.profile.walk() if n.function == "forward")
    lines = trace["text"][i].split("<br>")
    assert lines[0] == "<b>forward</b>"
    energy, share = fmt_energy(forward.total_energy), fmt_percent(forward.total_energy, model.program_j)
    assert lines[1:] in ([f"{energy} \u00b7 {share}"], [energy, share])
    # the root is the program: 100% of the program's energy, idle and energyprof left out
    assert trace["text"][0].endswith("100.0%")
    assert trace["values"][0] == pytest.approx(model.program_j, rel=1e-5)
    legend = p.eval_on_selector_all("#chart-legend .legend-item", "els => els.map(e => e.textContent)")
    assert "example.py" in legend and "library code" in legend and "imports" in legend
    page.close()


def test_clicking_a_box_selects_its_function_in_the_table(browser, small_report: Path) -> None:
    page = Page(browser)
    page.open(small_report)
    p = page.page
    _click_box(p, "forward")
    assert p.text_content("#fn-body tr.selected .name") == "forward"
    assert "forward" in p.text_content("#selection")
    trace = p.evaluate("() => { const t = document.getElementById('icicle').data[0];"
                       " return {labels: t.labels, c: t.marker.line.color}; }")
    outlined = {label for label, c in zip(trace["labels"], trace["c"]) if c == "#111"}
    assert outlined == {"forward"}
    level = "() => { const t = document.getElementById('icicle').data[0]; return t.labels[t.ids.indexOf(t.level)]; }"
    assert p.evaluate(level) == "forward"  # and zoomed into it
    p.locator("#icicle [class*=pathbar] path.surface").first.click(force=True)  # the top bar zooms out
    p.wait_for_timeout(600)
    assert p.evaluate(level) == "train"
    assert page.errors == []
    page.close()


def test_clicking_a_box_keeps_it_in_view(browser, small_report: Path) -> None:
    """The table row is brought into the table's own scroll box; the page does not scroll away."""
    page = Page(browser, height=600)
    page.open(small_report)
    p = page.page
    p.evaluate("() => document.getElementById('icicle').scrollIntoView({block: 'start'})")
    where = "() => document.getElementById('icicle').getBoundingClientRect().top"
    before = p.evaluate(where)
    box = p.locator("#icicle g.slice", has_text="forward").first.bounding_box()  # where the reader sees it
    p.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)  # no scrolling to it first
    p.wait_for_timeout(900)
    assert p.text_content("#fn-body tr.selected .name") == "forward"
    # the chart, and the box zoomed into, stay where they were (the browser's scroll anchoring may
    # move the page by the few pixels the selection line adds above the chart; the table's row
    # used to pull the page 35 px down)
    assert abs(p.evaluate(where) - before) <= 1
    assert page.errors == []
    page.close()


def test_clicking_a_row_outlines_its_boxes(browser, small_report: Path) -> None:
    page = Page(browser)
    page.open(small_report)
    p = page.page
    p.locator("#fn-body tr", has_text="callback").first.click()
    trace = p.evaluate("() => { const t = document.getElementById('icicle').data[0];"
                       " return {labels: t.labels, c: t.marker.line.color}; }")
    assert {label for label, c in zip(trace["labels"], trace["c"]) if c == "#111"} == {"callback"}
    p.locator("#fn-body tr", has_text="callback").first.click()  # a second click clears it
    colours = p.evaluate("() => document.getElementById('icicle').data[0].marker.line.color")
    assert set(colours) == {"#fff"}
    assert page.errors == []
    page.close()


def test_table_fits_1280_with_its_header_in_view(browser, tmp_path: Path) -> None:
    path = tmp_path / "big.html"
    write_html(big_profile(functions=2000, modules=20), str(path))
    page = Page(browser)
    page.open(path)
    p = page.page
    wrap = "document.querySelector('#functions .table-wrap')"
    assert p.evaluate(f"() => {wrap}.scrollWidth - {wrap}.clientWidth") <= 1  # no column cut off
    p.evaluate(f"() => {wrap}.scrollTop = 1500")
    top = p.evaluate(f"() => [{wrap}.getBoundingClientRect().top,"
                     " document.querySelector('#fn-head th').getBoundingClientRect().top]")
    assert abs(top[1] - top[0]) <= 2, top  # the header stuck to the top of the scrolled box
    # installed code reads package/module.py, with the full path in a tooltip
    p.fill("#table-search", "mod3_function_1")
    p.wait_for_function("() => document.getElementById('page-info').textContent.includes('filtered')")
    where = p.eval_on_selector("#fn-body tr td.fn .where", "e => [e.textContent, e.title]")
    assert where[0].startswith("pkg/mod3.py:") and where[1].startswith("pkg/mod3.py:")
    page.close()


def test_timeline_draws_the_program_over_the_machine_without_overlaps(browser, small_report: Path) -> None:
    page = Page(browser)
    page.open(small_report)
    p = page.page
    names = p.evaluate("() => document.getElementById('timeline-plot').data.map(t => t.name)")
    assert "the program (W)" in names and "cpu (W)" in names
    program = p.evaluate("() => document.getElementById('timeline-plot').data.find(t => t.name === 'the program (W)')")
    assert "stackgroup" not in program and program["y"][:3] == [15, 16, 17]
    boxes = p.evaluate("""() => {
      const r = e => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
      const tl = document.getElementById('timeline-plot'), fl = tl._fullLayout, top = tl.getBoundingClientRect().top;
      return {xtitle: r(tl.querySelector('text.xtitle')), ytitle: r(tl.querySelector('text.ytitle')),
              y2title: r(tl.querySelector('text.y2title')),
              rss: [0, 0, 0, top + fl._size.t + (1 - fl.yaxis2.domain[0]) * fl._size.h],
              icicleBar: document.querySelector('#icicle .modebar') !== null};
    }""")
    assert boxes["icicleBar"] is False  # no plotly toolbar over the icicle's zoom bar
    assert boxes["xtitle"][1] >= boxes["rss"][3] - 1  # "time (s)" below the RSS lane, not inside it
    assert boxes["y2title"][1] >= boxes["ytitle"][3]  # each lane's title beside its own lane
    assert page.errors == []
    page.close()


def test_processes_section_marks_the_slowest_and_hungriest_rank(browser, tmp_path: Path) -> None:
    from energyprof.facts.records import Process

    profile = small_profile()
    profile.processes = [
        Process(pid=100, command="/usr/bin/python -m torch.distributed.run train.py", role="main", cpu_time_s=0.5),
        Process(pid=101, parent_pid=100, command="/usr/bin/python train.py", role="rank", rank=0, cpu_time_s=9.0,
                energy_j={"cpu": 2.0}, peak_rss_bytes=2**30, exit={"status": "exit", "code": 0}),
        Process(pid=102, parent_pid=100, command="/usr/bin/python train.py", role="rank", rank=1, cpu_time_s=7.0,
                energy_j={"cpu": 3.0}, peak_rss_bytes=2**30, exit={"status": "exit", "code": 0}),
    ]
    path = tmp_path / "ranks.html"
    write_html(profile, str(path))
    page = Page(browser)
    page.open(path)
    rows = page.page.eval_on_selector_all(
        "#processes tbody tr", "rs => rs.map(r => [...r.children].map(c => c.textContent.trim()))")
    by_role = {r[1]: r for r in rows}
    assert by_role["rank 0"][-1] == "slowest" and by_role["rank 1"][-1] == "most energy"
    assert by_role["rank 0"][2] == "python train.py" and by_role["rank 0"][6] == "1 GiB"
    page.close()


def test_the_page_formats_numbers_as_python_does(browser, small_report: Path) -> None:
    """One definition of units and rounding: the page's formatter, run in Chromium, against Python's."""
    import random

    from energyprof.render import format as f

    rng = random.Random(7)
    values = [0.0, 1e-10, 0.000999, 0.001, 0.0012345, 0.125, 1.125, 9.995, 59.4, 59.5, 60.0, 61.7, 99.95, 999.5,
              999.7, 1000.0, 3569.0, 3570.0, 3700.0, 86399.0, 1e6, 2.5e9, -3.25]
    values += [10 ** rng.uniform(-9, 7) for _ in range(400)]
    values += [round(rng.uniform(0, 5000), rng.randint(0, 4)) for _ in range(200)]
    page = Page(browser)
    page.open(small_report)
    js = page.page.evaluate("""(vs) => { const F = window.energyprofFormat;
        return vs.map(v => [F.energy(v), F.seconds(v), F.bytes(Math.abs(v)), F.grams(v), F.power(v), F.percent(v, 1234.5)]); }""",
                            values)
    for v, got in zip(values, js):
        want = [f.fmt_energy(v), f.fmt_seconds(v), f.fmt_bytes(abs(v)), f.fmt_grams(v), f.fmt_power(v),
                f.fmt_percent(v, 1234.5)]
        assert got == want, v
    assert f.fmt_seconds(3700.0) == "1 h 02 min"
    page.close()


def _tooltip(model, n, parent: int, through: list, total_t: float) -> str:
    """A box's tooltip as Python wrote it into the page before the page built its own from the arrays:
    the reference the page's script must match, word for word."""
    import math

    from energyprof.render.charts import _escape
    from energyprof.render.format import fmt_energy, fmt_percent, fmt_seconds

    program = model.program_j
    if n.folded:
        head = [f"other: {n.folded} smaller call paths"]
    elif n.kind == "group":
        head = [_escape(n.function), "click to show its frames" if n.children else ""]
    else:
        head = [_escape(n.function)] + ([_escape(f"{n.file}:{n.line}")] if n.file else [])
    energy = (f"the program's energy {fmt_energy(program)} (100%); the machine measured {fmt_energy(model.total_energy_j)}"
              if parent < 0 else
              f"energy {fmt_energy(n.value_e)} ({fmt_percent(n.value_e, program)} of the program's),"
              f" self {fmt_energy(sum(n.self_e.values()))}")
    parts = head + [energy, f"time (summed over threads) {fmt_seconds(n.value_t)} ({fmt_percent(n.value_t, total_t)}),"
                    f" samples {n.samples}" + (f" \u00b1{100 / math.sqrt(n.samples):.0f}%" if n.samples else "")]
    if len(n.energy) > 1 and n.value_e > 0:
        parts.append(", ".join(f"{_escape(k)} {v / n.value_e * 100:.0f}%" for k, v in n.energy.items()))
    text = "<br>".join(p for p in parts if p)
    return text + ("<br>called through " + " \u203a ".join(_escape(w.function) for w in through) if through else "")


@pytest.mark.parametrize("which", ["small", "hostile", "big"])
def test_the_page_writes_every_tooltip_as_python_would(browser, tmp_path: Path, which: str) -> None:
    """The tooltips travel as numbers and the table's names, not as 130 KB of strings: every box's
    tooltip the page builds (all frames shown, idle included) equals the one Python would have written."""
    from energyprof.render.charts import chart_boxes

    profiles = {"small": small_profile, "hostile": hostile_profile, "big": lambda: big_profile(functions=3000, modules=30)}
    profile = profiles[which]()
    model = build(profile)
    path = tmp_path / f"{which}.html"
    write_html(profile, str(path))
    page = Page(browser)
    page.open(path)
    p = page.page
    p.check("#chart-idle")
    if p.is_enabled("#chart-collapse"):  # disabled where there is no library or import frame to fold
        p.uncheck("#chart-collapse")
    shown = p.evaluate("() => document.getElementById('icicle').data[0].hovertext")
    boxes, _ = chart_boxes(model.chart)
    assert len(shown) == len(boxes)  # every frame drawn: box k is the chart's k-th box
    total_t = model.chart.value_t or 1.0
    want = [_tooltip(model, n, parent, through, total_t) for n, parent, through in boxes]
    assert shown == want
    if which == "small":  # the root's box is as wide as the machine's energy, but its tooltip names the program
        assert model.program_j == pytest.approx(14.1)
        assert "the program's energy 14.1 J (100%); the machine measured 17.1 J" in shown[0]
    if which == "big":
        assert any(s.startswith("other: ") for s in shown) and any("called through" in s for s in shown)
    if which == "hostile":
        assert any("&lt;/script&gt;" in s for s in shown) and not any("<script" in s for s in shown)
    assert page.errors == []
    page.close()


def test_a_training_run_shows_each_functions_forward_and_backward(browser, tmp_path: Path) -> None:
    """A tree with [backward]: the table has forward and backward columns whose cells are the model's figures
    (ReportModel.row_phases), the modules' card is on the first screen, and the table still fits 1280."""
    from test_training_views import baler_profile

    from energyprof.render.format import fmt_energy

    model = build(baler_profile())
    path = tmp_path / "baler.html"
    path.write_text(render_html(model), encoding="utf-8")
    page = Page(browser)
    page.open(path)
    p = page.page
    heads = p.eval_on_selector_all("#fn-head th", "ths => ths.map(t => t.dataset.key)")
    assert heads[5:7] == ["fwd_e", "bwd_e"]
    p.fill("#table-search", "Encoder")
    p.wait_for_function("() => document.querySelectorAll('#fn-body tr').length === 1")
    cells = p.eval_on_selector("#fn-body tr", "r => [...r.children].map(c => c.textContent)")
    (row,) = [r for r in model.rows if r.function == "Encoder.forward"]
    forward, backward = model.row_phases(row)
    assert cells[5] == fmt_energy(forward)
    assert cells[6] == f"{fmt_energy(backward)} \u00b1{100 / row.backward_samples ** 0.5:.0f}%"
    card = p.eval_on_selector(".card-modules", "c => [c.textContent, c.getBoundingClientRect().bottom]")
    assert "Encoder.forward" in card[0] and "Decoder.forward" in card[0] and card[1] <= 800  # the first screen
    wrap = "document.querySelector('#functions .table-wrap')"
    assert p.evaluate(f"() => {wrap}.scrollWidth - {wrap}.clientWidth") <= 1
    assert page.errors == []
    page.close()
