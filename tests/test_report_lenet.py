"""The report of a real training script: examples/lenet_cifar.py at its default size, through the CLI.

The first screen must answer "which of my functions": the example's own training step, forward
and backward are labelled boxes at least 40 px wide at 1,280x800, the icicle draws at most 300
boxes until one is opened, and the table's top function reads its share of the program's energy.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from energyprof.facts.profile import load
from energyprof.render.html import unpacked_json

REPO = Path(__file__).resolve().parent.parent
HAVE_TORCH = importlib.util.find_spec("torch") is not None
CHROMIUM = "/usr/bin/chromium"

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.browser,
              pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")]


@pytest.fixture(scope="module")
def lenet(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("lenet")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    res = subprocess.run([sys.executable, "-m", "energyprof", "-q", "--json", "p.json", "-o", "r.html",
                          str(REPO / "examples" / "lenet_cifar.py")], cwd=tmp, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return tmp / "r.html", tmp / "p.json"


@pytest.fixture(scope="module")
def page(lenet):
    if not Path(CHROMIUM).is_file():
        pytest.skip("no chromium on this machine")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        pg = browser.new_page(viewport={"width": 1280, "height": 800})
        errors: list[str] = []
        pg.on("console", lambda m: m.type == "error" and errors.append(m.text))
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort())
        pg.goto(lenet[0].resolve().as_uri())
        pg.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].every(e => e._fullLayout)",
                             timeout=120_000)
        pg.wait_for_function("() => document.querySelectorAll('#icicle g.slice text').length > 0"
                             " && document.querySelectorAll('#fn-body tr').length > 0", timeout=60_000)
        pg.wait_for_timeout(500)  # let plotly finish laying out the labels
        yield pg, errors
        browser.close()


def _boxes(pg) -> list[tuple[str, float]]:
    """Every drawn box whose label is visible (drawn, not empty, inside its box): (label, width in px)."""
    return pg.eval_on_selector_all("#icicle g.slice", """gs => gs.map(g => {
        const t = g.querySelector('text'), r = g.querySelector('path').getBoundingClientRect();
        if (!t) return ['', r.width];
        const b = t.getBoundingClientRect(), style = getComputedStyle(t);
        const visible = b.width > 0 && b.height >= 9 && style.display !== 'none' && style.visibility !== 'hidden'
          && Number(style.opacity) > 0 && b.left >= r.left - 1 && b.right <= r.right + 1;
        return [visible ? t.textContent : '', r.width];
    })""")


def test_first_screen_shows_the_training_step_forward_and_backward(page) -> None:
    pg, errors = page
    boxes = _boxes(pg)
    labelled = {label: width for label, width in boxes if label}
    assert labelled, (boxes[:5], errors, pg.evaluate("document.querySelectorAll('#icicle g.slice').length"))

    def widest(fragment: str) -> float:
        return max((w for label, w in labelled.items() if fragment in label), default=0.0)

    assert widest("train_step") >= 40, labelled
    assert widest("LeNet (root)") >= 40, labelled  # the model's forward, named as its module
    assert widest("Tensor.backward") >= 40, labelled  # torch's backward, called from train_step
    assert errors == []


def test_the_icicle_draws_at_most_300_boxes_until_expanded(page, lenet) -> None:
    pg, _ = page
    drawn = pg.evaluate("() => document.getElementById('icicle').data[0].ids.length")
    assert drawn <= 300
    everything = len(unpacked_json(data_block(lenet[0].read_text()))["chart"]["full"]["parents"])
    assert everything > drawn  # the grouping folded something


def test_the_tables_first_page_is_the_scripts_functions_then_libraries_folded(page) -> None:
    pg, _ = page
    rows = pg.eval_on_selector_all("#fn-body tr", """rs => rs.map(r => [r.className, r.querySelector('.name').textContent,
        (r.querySelector('.where') || {}).textContent || ''])""")
    first_group = next(i for i, (cls, _, _) in enumerate(rows) if cls.startswith("group"))
    mine = rows[:first_group]
    assert all(where.startswith("lenet_cifar.py:") for _, _, where in mine), mine
    assert {"train_step", "LeNet (root)", "main"} <= {name for _, name, _ in mine}
    groups = [name for cls, name, _ in rows if cls.startswith("group")]
    assert any(g.endswith("[library: torch]") for g in groups) and any(g.endswith("[import: torch._dynamo]") for g in groups)
    assert not any(cls == "member" for cls, _, _ in rows)  # folded until opened


def data_block(html: str) -> str:
    return html.split('id="report-data" data-encoding="deflate">', 1)[1].split("</script>", 1)[0]


def test_the_epochs_and_steps_and_the_loaders_workers(lenet) -> None:
    """Two epochs of 200 steps by default, each a window; the DataLoader's two workers are the
    program's children, in its processes table with CPU of their own."""
    import energyprof.torch as ept

    profile = load(lenet[1])
    assert [w.index for w in profile.windows if w.name == "epoch"] == [0, 1]
    b = ept.breakdown(profile)
    assert len(b["steps"]) == 400 and [e["epoch"] for e in b["epochs"]] == [0, 1]
    (main,) = [p for p in profile.processes if p.role == "main"]
    workers = [p for p in profile.processes if p.role != "main"]
    assert len(workers) >= 2 and all(p.cpu_time_s > 0 and p.parent_pid == main.pid for p in workers), profile.processes
    assert "epoch" in lenet[0].read_text(errors="replace")


def test_the_report_is_at_most_one_and_a_half_megabytes(lenet) -> None:
    """plotly.js is 1.25 MB of it, inlined so the page opens offline; the data is what is left (it was 1.69 MB
    when the tooltips travelled as strings and every file as its whole path)."""
    html = lenet[0].read_bytes()
    assert len(html) <= 1_500_000, len(html)
    data = data_block(html.decode())
    assert len(data) <= 100_000, len(data)  # the charts' and the table's data, packed: 367 KB before, as JSON


def test_the_top_function_reads_its_share_of_the_program(page, lenet) -> None:
    pg, _ = page
    profile = load(lenet[1])
    program = sum(profile.totals.attributed_j.values())
    first = pg.eval_on_selector("#fn-body tr", "r => [...r.children].map(c => c.textContent)")
    name = pg.eval_on_selector("#fn-body tr td.fn .name", "e => e.textContent")
    head = pg.eval_on_selector_all("#fn-head th", "ths => ths.map(t => t.dataset.key)")
    assert not name.startswith("[")  # the program's functions first, not idle or energyprof
    where = pg.eval_on_selector("#fn-body tr td.fn", "td => (td.querySelector('.where') || {}).title || ''")
    file, _, line = where.rpartition(":")
    # the row is one function (name, file and first line) merged over every path it ran on
    rows = [n for n, _ in profile.walk() if n.function == name and (not where or (n.file, n.line) == (file, int(line)))]
    self_j = sum(n.self_total_energy for n in rows)
    shown = float(first[head.index("self_p")].rstrip("%"))
    # the table carries energies to 3 significant digits (at most 0.5 % off) and shows one decimal
    true = self_j / program * 100
    assert shown == pytest.approx(true, abs=0.05 + 0.005 * true + 1e-9)
