"""The report's plotly.js is the custom bundle the repository builds, and it holds every trace type
the report draws.

plotly.js turns a trace of a type it does not have into a scatter without an error, so a chart
added to the report with a new trace type would be drawn wrong, silently, until the bundle is
rebuilt (scripts/build-plotly-bundle.sh, with the type added to scripts/plotly-bundle/entry.js).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from conftest_report import small_profile
from energyprof.analysis.report import RenderOptions, build
from energyprof.render.html import _plotly_js, _plotly_js_bytes, render_html_bytes, render_html_parts
from energyprof.store.files import FileBytes, write_text
from test_report_browser import write_html
from test_report_browser import Page, browser  # noqa: F401  (browser is a fixture)

ROOT = Path(__file__).resolve().parent.parent
RECORD = json.loads((ROOT / "templates" / "plotly-custom.json").read_text(encoding="utf-8"))


def test_bundle_matches_its_build_record_and_entry_file() -> None:
    bundle = (ROOT / "templates" / "plotly-custom.min.js").read_bytes()
    assert len(bundle) == RECORD["bytes"] and hashlib.sha256(bundle).hexdigest() == RECORD["sha256"]
    assert bundle.startswith(f"/*! plotly.js v{RECORD['plotly_js']} (MIT".encode())
    assert "MIT License" in (ROOT / "templates" / "plotly.js-LICENSE.txt").read_text(encoding="utf-8")
    entry = (ROOT / "scripts" / "plotly-bundle" / "entry.js").read_text(encoding="utf-8")
    assert re.findall(r"require\('plotly\.js/lib/(\w+)'\)", entry) == ["core", *RECORD["traces"]]
    pinned = json.loads((ROOT / "scripts" / "plotly-bundle" / "package.json").read_text(encoding="utf-8"))
    assert pinned["dependencies"]["plotly.js"] == RECORD["plotly_js"]
    assert _plotly_js().startswith(f"/*! plotly.js v{RECORD['plotly_js']} ")  # what the report inlines


def test_the_page_written_from_the_bundles_file_is_the_page(tmp_path: Path) -> None:
    """A page file gets plotly.js copied from the shipped file as it is: the bundle holds no "</script" (any
    case) for the inline script's escape to change, so the file is the page `render_html_bytes` makes."""
    bundle = (ROOT / "templates" / "plotly-custom.min.js").read_bytes()
    assert re.search(rb"</script", bundle, re.IGNORECASE) is None and _plotly_js_bytes() == bundle
    model = build(small_profile(), RenderOptions())
    parts = render_html_parts(model)
    assert isinstance(parts[1], FileBytes) and os.path.samefile(parts[1].path, ROOT / "templates" / "plotly-custom.min.js")
    write_text(str(tmp_path / "r.html"), parts)
    assert (tmp_path / "r.html").read_bytes() == render_html_bytes(model)


@pytest.mark.browser
def test_every_trace_the_report_draws_is_in_the_bundle(browser, tmp_path: Path) -> None:  # noqa: F811
    path = tmp_path / "r.html"
    write_html(small_profile(), str(path))
    page = Page(browser)
    page.open(path, timeout_ms=60_000)
    drawn = page.page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].map("
                               "gd => gd.data.map((t, i) => [t.type || 'scatter', gd._fullData[i].type]))")
    asked = [pair for plot in drawn for pair in plot]
    assert len(drawn) >= 2 and {a for a, _ in asked} >= {"icicle", "scatter"}
    assert all(a == b for a, b in asked), asked  # no type fell back to scatter
    assert {a for a, _ in asked} <= set(RECORD["traces"])
    # the check can fail: a type outside the bundle comes back as a scatter
    fallback = page.page.evaluate("() => { const d = document.createElement('div'); document.body.appendChild(d);"
                                  " return Plotly.newPlot(d, [{type: 'bar', x: [1], y: [1]}])"
                                  ".then(gd => gd._fullData[0].type); }")
    assert fallback == "scatter"
    assert not page.errors and not page.blocked
    page.close()
