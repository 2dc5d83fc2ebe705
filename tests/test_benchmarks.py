"""Smoke test of the benchmark commands: they run and print figures (never the targets).

CI machines are noisy, so the ratios are not checked against the issue's targets; these
tests only keep `benchmarks/run.py` and `benchmarks/longrun.py` runnable by anyone.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RATIO = r"\d+\.\d{3} \[\d+\.\d{2}-\d+\.\d{2}\]"


def test_run_quick_prints_ratio_lines() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "run.py"), "--quick", "--workloads", "loops,calls",
         "--modes", "default,cheap,pyinstrument"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.startswith("machine: ")
    for workload in ("loops", "calls"):
        rows = [line for line in out.splitlines() if line.startswith(workload)]
        assert len(rows) == 2, out  # one row in the work table, one in the wall table
        for row in rows:
            assert len(re.findall(RATIO, row)) == 3, row


def test_longrun_tiny_prints_figures() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "longrun.py"), "--scale", "0.002"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert re.search(r"attribution \(add_sample/add_tick/finish\): \d+\.\d+ s", out), out
    assert re.search(r"added RSS: \d+\.\d MB peak", out), out
    assert re.search(r"memory ratio 10x / 1x: \d+\.\d+", out), out
    assert "render_html failed" not in out, out


def test_cost_tiny_prints_every_figure_beside_plain_python() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "cost.py"), "--rounds", "1", "--fib", "12", "--boot-runs", "2"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    header = rows[0].strip("| ").split(" | ")
    assert header[:3] == ["figure", "plain", "energyprof"]  # py-spy's column follows when it is installed
    labels = [r.split(" | ")[0].lstrip("| ") for r in rows[1:]]
    assert [label.split(",")[0].split(" (")[0] for label in labels] == [
        "empty script", "fib(12) in the main process", "fib(12) in a followed child", "fixed cost",
        "a followed child's start and end", "proportional cost", "proportional cost",
        "proportional cost", "proportional cost", "the program's main thread: its CPU over plain python's",
        "in the program: its own process's CPU over plain python's",
        "one agent sample in-process", "a Python child's bootstrap"]
    for r in rows[1:]:
        assert len(r.strip("|").split(" | ")) == len(header), r
