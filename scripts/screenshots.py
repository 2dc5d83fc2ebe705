"""The README's and docs' screenshots: real runs of the examples, drawn in headless Chromium at 1280x800.

    python scripts/screenshots.py                 # all of them, into docs/
    python scripts/screenshots.py --from DIR      # reuse reports already in DIR (quickstart.html, lenet.html)

Each example is profiled through the CLI (`python -m energyprof`), LeNet with OMP_NUM_THREADS=1 and its
default size (two DataLoader worker processes, so its report has a Processes section); the pages
are opened with the network refused, and a shot is taken of the first screen and of the sections
below it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
CHROMIUM = os.environ.get("ENERGYPROF_CHROMIUM", "/usr/bin/chromium")
READY = "() => [...document.querySelectorAll('.js-plotly-plot')].every(e => e._fullLayout)"

# (report, file in docs/, the element to scroll to the top first, or None for the first screen)
SHOTS = [
    ("quickstart.html", "report.png", None),
    ("lenet.html", "lenet-report.png", None),
    ("lenet.html", "lenet-functions.png", "#functions"),
    ("lenet.html", "lenet-processes.png", "#processes"),
]


def profile(example: str, out: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "energyprof", "-q", "-o", str(out), f"examples/{example}"]
    subprocess.run(cmd, cwd=REPO, env=env, check=True, timeout=600)


def shoot(folder: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    made = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        for report, name, anchor in SHOTS:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort())
            page.goto((folder / report).resolve().as_uri())
            page.wait_for_function(READY, timeout=120_000)
            if anchor:
                page.eval_on_selector(anchor, "e => e.scrollIntoView({block: 'start'})")
                page.wait_for_timeout(300)
            page.screenshot(path=str(DOCS / name))
            made.append(DOCS / name)
            page.close()
        browser.close()
    return made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="folder", help="a folder holding quickstart.html and lenet.html already")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(a.folder) if a.folder else Path(tmp)
        if not a.folder:
            profile("quickstart.py", folder / "quickstart.html")
            profile("lenet_cifar.py", folder / "lenet.html")
        for path in shoot(folder):
            print(path.relative_to(REPO))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
