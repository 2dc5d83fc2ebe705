"""`%load_ext energyprof` and the magics, in a notebook run on a real kernel with nbclient."""

from __future__ import annotations

import html as html_lib
import json
import os
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed")
pytest.importorskip("ipykernel", reason="ipykernel is not installed")

from energyprof.render.html import unpacked_json  # noqa: E402 - after the skips: no kernel, no module

ROOT = Path(__file__).resolve().parent.parent

CELLS = [
    "%load_ext energyprof",
    "%%energyprof --power-trace trace.csv --idle all\n"
    "import time\n"
    "def crunch():\n"
    "    end = time.perf_counter() + 0.3\n"
    "    while time.perf_counter() < end:\n"
    "        pass\n"
    "crunch()\n"
    "print('cell ran')",
    "print(type(_energyprof).__name__, _energyprof.totals['energy_j']['cpu'] > 0,\n"
    "      any(n.function == 'crunch' for n, _ in _energyprof.nodes()))",
    "%energyprof --power-trace trace.csv -- sum(i * i for i in range(200_000))",
    "print(type(_energyprof).__name__, _energyprof.meta['target'])",
    "%%energyprof --idle nonsense\nprint('never')",
]


def outputs(cell) -> tuple[str, str, list[str]]:
    out = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")
    err = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stderr")
    html = [o.data["text/html"] for o in cell.outputs if o.output_type == "display_data" and "text/html" in o.data]
    return out, err, html


@pytest.mark.slow
def test_notebook_magics_on_a_real_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,40\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    env_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", env_path)  # the kernel imports this checkout's energyprof
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    cells = nb.cells

    _, _, host = outputs(cells[0])  # plotly.js, once for the session, in %load_ext's output
    assert len(host) == 1 and "__energyprofPlotly" in host[0] and len(host[0]) > 1_000_000
    out, err, html = outputs(cells[1])
    assert "cell ran" in out
    assert "Warning" not in err, err  # IPython's HTML() once warned about the iframe in every cell
    assert len(html[0].encode()) <= 300_000  # the figures alone: plotly.js is not in it
    assert "energyprof:plotly?" in html[0]
    assert "energyprof: <cell> ran" in out  # the summary, in the cell's output
    assert len(html) == 1 and html[0].startswith('<iframe sandbox="allow-scripts"')
    assert "<script" not in html[0]  # the report is escaped inside srcdoc, never part of the notebook's page
    assert "&lt;script" in html[0]
    page = html_lib.unescape(html[0].split('srcdoc="', 1)[1].rsplit('"', 1)[0])
    block = re.search(r'id="report-data" data-encoding="deflate">(.*?)</script>', page, re.S).group(1)
    assert "crunch" in json.dumps(unpacked_json(block))  # the cell's own function, in the report's data

    out, _, _ = outputs(cells[2])
    assert out.strip() == "Profile True True"

    out, _, html = outputs(cells[3])
    assert len(html) == 1
    results = [o for o in cells[3].outputs if o.output_type == "execute_result"]
    assert results and results[0].data["text/plain"] == str(sum(i * i for i in range(200_000)))
    assert outputs(cells[4])[0].strip() == "Profile sum(i * i for i in range(200_000))"

    out, err, html = outputs(cells[5])
    assert "never" not in out and html == []
    assert err.strip().startswith("%energyprof:") and "idle" in err and err.strip().count("\n") == 0


def test_a_report_frame_draws_with_plotly_from_the_notebook_page(tmp_path: Path) -> None:
    """The notebook page holds plotly.js once (%load_ext's output); a report's sandboxed frame asks
    for it and draws, in a real Chromium. Without the host, the frame says what to do."""
    import shutil

    from energyprof.analysis.report import build
    from energyprof.integrations.jupyter import frame_page, iframe, plotly_host
    from energyprof.render.html import render_html

    exe = next((c for c in ("/usr/bin/chromium", shutil.which("chromium")) if c and Path(c).is_file()), None)
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    if exe is None:
        pytest.skip("no chromium on this machine")
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest_report import small_profile

    frame = iframe(frame_page(render_html(build(small_profile()))))
    (tmp_path / "nb.html").write_text(f"<html><body>{plotly_host()}{frame}</body></html>", encoding="utf-8")
    (tmp_path / "bare.html").write_text(f"<html><body>{frame}</body></html>", encoding="utf-8")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.goto((tmp_path / "nb.html").as_uri())
        report = page.frames[1]
        report.wait_for_function("() => document.querySelectorAll('#icicle g.slice').length > 5"
                                 " && document.querySelectorAll('#fn-body tr').length > 0", timeout=60_000)
        assert errors == []
        page.goto((tmp_path / "bare.html").as_uri())
        page.frames[1].wait_for_function("() => document.body.textContent.includes('run %load_ext energyprof again')",
                                         timeout=20_000)
        browser.close()
