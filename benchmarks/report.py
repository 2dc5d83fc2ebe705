"""Report timings: building the model, writing the page and drawing it, for a 50,000-function profile.

    python benchmarks/report.py                 # 5 repeats, medians (~1 min), plus the browser draw
    python benchmarks/report.py --no-browser    # model and page only
    python benchmarks/report.py --quick         # 2,000 functions, 1 repeat: the smoke variant

These were timed assertions in the test suite (10 s to draw, 3 s to build); on a loaded 2-core
machine they failed for reasons that had nothing to do with the code, so they live here, printed
as medians with their spread, beside the machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from conftest_report import big_profile, small_profile  # noqa: E402
from energyprof.analysis.report import build  # noqa: E402
from energyprof.render.html import render_html  # noqa: E402

PLOTS_READY = ("() => { const p = document.querySelectorAll('.js-plotly-plot');"
               " return p.length > 0 && [...p].every(e => e._fullLayout); }")


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} s [{min(xs):.3f}-{max(xs):.3f}]"


def draw_times(path: Path, repeats: int) -> list[float] | str:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return "playwright is not installed"
    chromium = "/usr/bin/chromium"
    if not os.path.exists(chromium):
        return f"no browser at {chromium}"
    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for _ in range(repeats):
            page = browser.new_page()
            t0 = time.perf_counter()
            page.goto(path.resolve().as_uri())
            page.wait_for_function(PLOTS_READY, timeout=300_000)
            out.append(time.perf_counter() - t0)
            page.close()
        browser.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--functions", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--quick", action="store_true", help="2,000 functions, 1 repeat")
    ns = ap.parse_args()
    if ns.quick:
        ns.functions, ns.repeats = 2_000, 1
    print(f"machine load average (1 min): {os.getloadavg()[0]:.1f} on {os.cpu_count()} logical CPUs")
    render_html(build(small_profile()))  # plotly.js read once, as a real run does
    profile = big_profile(functions=ns.functions, modules=max(1, ns.functions // 500))
    builds, renders = [], []
    page = ""
    for _ in range(ns.repeats):
        t0 = time.perf_counter()
        model = build(profile)
        t1 = time.perf_counter()
        page = render_html(model)
        t2 = time.perf_counter()
        builds.append(t1 - t0)
        renders.append(t2 - t1)
    print(f"{ns.functions} functions: model {spread(builds)}, page {spread(renders)}, "
          f"{len(page.encode()) / 1e6:.2f} MB")
    if not ns.no_browser:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "big.html"
            path.write_text(page, encoding="utf-8")
            draws = draw_times(path, ns.repeats)
        print(f"browser draw: {spread(draws)}" if isinstance(draws, list) else f"browser draw: skipped ({draws})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
