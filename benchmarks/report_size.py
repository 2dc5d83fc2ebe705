"""The HTML report's size and the time headless Chromium takes to draw it, side by side with
the same page carrying the full plotly.js (what every report inlined before the custom bundle).

    python benchmarks/report_size.py                 # profile examples/quickstart.py, 7 draws of each page
    python benchmarks/report_size.py --runs 3 --profile run.json
    python benchmarks/report_size.py --profile lenet.json --page before=old.html   # and a page of an older checkout

One profile is made (or given), rendered by `energyprof report`, and copied with the custom plotly.js
bundle swapped for plotly's full plotly.min.js when the plotly Python package is installed (it holds
that file). Each draw opens the page in a fresh browser context with every non-file request
aborted, and reads `performance.now()` in the page at the first animation frame in which every
`.js-plotly-plot` has its `_fullLayout`: the time from navigation to drawn charts, without
Python's polling in it. The two pages are drawn alternately so a shared machine's drift hits both.

Needs Playwright's Python package and a Chromium (default /usr/bin/chromium).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from run import machine  # noqa: E402

DRAWN = """() => {
  if (document.readyState !== "complete") return false;
  const plots = document.querySelectorAll(".js-plotly-plot");
  if (!plots.length || ![...plots].every(p => p._fullLayout)) return false;
  return performance.now();
}"""


def make_profile(out: Path) -> Path:
    profile = out / "quickstart.json"
    subprocess.run([sys.executable, "-m", "energyprof", "-q", "--json", str(profile), "-o", str(out / "live.html"),
                    str(REPO / "examples" / "quickstart.py")], check=True, cwd=out, env=_env(), stdout=subprocess.DEVNULL)
    return profile


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def render(profile: Path, out: Path) -> dict[str, Path]:
    """{variant: page}: the report as energyprof writes it, and with the full plotly.js if available."""
    page = out / "report.html"
    subprocess.run([sys.executable, "-m", "energyprof", "report", str(profile), "-o", str(page)], check=True,
                   cwd=out, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pages = {"custom bundle": page}
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        print("plotly (Python) is not installed: no full-plotly.js page to compare with", file=sys.stderr)
        return pages
    from energyprof.render.html import _inline_script, _plotly_js

    text = page.read_text(encoding="utf-8")
    assert text.count(_plotly_js()) == 1, "the bundle is not inlined once: is this report from this tree?"
    full = out / "report-full-plotly.html"
    full.write_text(text.replace(_plotly_js(), _inline_script(get_plotlyjs())), encoding="utf-8")
    return {"full plotly.js": full, **pages}


def draw_times(pages: dict[str, Path], runs: int, chromium: str) -> dict[str, list[float]]:
    from playwright.sync_api import sync_playwright

    times: dict[str, list[float]] = {name: [] for name in pages}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            order = list(pages)
            for run in range(runs + 1):  # the first round warms the browser and the page cache
                for name in (order if run % 2 else order[::-1]):
                    context = browser.new_context(viewport={"width": 1280, "height": 800})
                    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                                  else route.abort())
                    tab = context.new_page()
                    tab.goto(pages[name].as_uri())
                    ms = tab.wait_for_function(DRAWN, polling="raf", timeout=120_000).json_value()
                    context.close()
                    if run:
                        times[name].append(ms / 1000)
        finally:
            browser.close()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="draws of each page after a warm-up round (default 7)")
    parser.add_argument("--profile", type=Path, help="a saved profile (default: profile examples/quickstart.py now)")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--page", action="append", default=[], metavar="NAME=PATH",
                        help="another page to draw alongside (say, the same profile rendered by an older checkout)")
    args = parser.parse_args()
    extra = {}
    for item in args.page:
        name, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            parser.error(f"--page {item}: give NAME=PATH of a saved page")
        extra[name] = Path(path).resolve()
    with tempfile.TemporaryDirectory(prefix="energyprof-report-bench-") as tmp:
        out = Path(tmp)
        profile = args.profile.resolve() if args.profile else make_profile(out)
        pages = {**extra, **render(profile, out)}
        times = draw_times(pages, args.runs, args.chromium)
        print(machine())
        print(f"profile: {profile.name}; {args.runs} draws per page after a warm-up; median [min-max]")
        print(f"{'page':<16} {'bytes':>10}   draw time (s)")
        for name, page in pages.items():
            t = times[name]
            print(f"{name:<16} {page.stat().st_size:>10,}   {statistics.median(t):.3f} [{min(t):.3f}-{max(t):.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
