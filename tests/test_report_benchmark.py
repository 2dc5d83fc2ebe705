"""Smoke test of benchmarks/report.py: it runs and prints its figures (never a target)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_report_benchmark_quick_prints_figures() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "report.py"), "--quick", "--no-browser"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"2000 functions: model \d+\.\d+ s .* page \d+\.\d+ s .* \d+\.\d+ MB", proc.stdout), proc.stdout
