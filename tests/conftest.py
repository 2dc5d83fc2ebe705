"""Shared test helpers: run the real CLI in a subprocess, write power traces and scripts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

try:
    from hypothesis import settings as _hypothesis_settings
except ImportError:  # the test extra brings it; without it the property tests skip on their own import
    pass
else:
    # No wall-clock bound in a test: hypothesis's default 200 ms deadline per example fails a property test
    # beside two CPU hogs (an example that took 250 ms), whatever the property.
    _hypothesis_settings.register_profile("energyprof", deadline=None)
    _hypothesis_settings.load_profile("energyprof")

# The programs these tests start see SIGINT, SIGQUIT and SIGHUP as a shell's foreground job does, however
# the suite was started: a job started in the background inherits SIGINT and SIGQUIT ignored, one started
# by nohup SIGHUP, and an ignored signal stays ignored through exec (a caught one is reset to its default).
for _name in ("SIGINT", "SIGQUIT", "SIGHUP"):
    if hasattr(signal, _name):
        signal.signal(getattr(signal, _name), signal.default_int_handler if _name == "SIGINT" else signal.SIG_DFL)


# The modules that start torchrun, Ray clusters, MLflow's store or a browser, heaviest first (seconds on a
# quiet machine, in benchmarks/README.md). Two workers take one module at a time in collection order, so
# these go first: started last, one of them runs alone while the other worker has nothing left.
# test_gpu_capture starts some thirty torch programs (150 s alone on a busy machine), test_knob_sweep a
# Ray cluster (26 s alone, 131 s for its Ray test in a suite beside two CPU hogs).
HEAVY_MODULES = ("test_distributed", "test_report_browser", "test_engines", "test_gpu_capture", "test_torch",
                 "test_mlflow", "test_knob_sweep", "test_rank_windows", "test_follow", "test_signals",
                 "test_report_lenet")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.stem
        return HEAVY_MODULES.index(name) if name in HEAVY_MODULES else len(HEAVY_MODULES)
    items.sort(key=rank)  # stable: every module keeps its own order, the rest keep theirs


def run_cli(args: list[str], cwd: Path, timeout: float = 120, env: dict[str, str] | None = None,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env.pop("ENERGYPROF_POWERCAP_ROOT", None)
    if env:
        full_env.update(env)
    return subprocess.run([sys.executable, "-m", "energyprof", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=full_env, input=stdin)


def processes(profile) -> list:
    """A profile's `processes` table (records that also read as mappings: r["role"])."""
    return list(profile.processes)


@pytest.fixture
def write_script(tmp_path: Path):
    def write(name: str, body: str) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(body))
        return path
    return write


@pytest.fixture
def trace_50w(tmp_path: Path) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text("t_s,cpu\n0,50\n")
    return path


# -- programs run under the supervisor (test_supervisor.py, test_follow.py) --------------------------
BURN = """
import time

def burn(n):
    s = 0
    for i in range(n):
        s += i * i
    return s

def burn_for(seconds):  # long enough for dozens of 5 ms samples on a loaded machine
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        burn(10_000)
"""


@pytest.fixture
def here(tmp_path: Path) -> Path:
    """A folder holding a constant 50 W power trace, `trace.csv`."""
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    return tmp_path


def script(dirpath: Path, name: str, *parts: str) -> Path:
    p = dirpath / name
    p.write_text("".join(textwrap.dedent(part) for part in parts))
    return p


def installed_script(name: str) -> str | None:
    """A console script of this interpreter's environment: the one beside `sys.executable` (a venv
    run without activating it), else the one on PATH."""
    beside = Path(sys.executable).with_name(name)
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    import shutil

    return shutil.which(name)


def report_text(path: Path) -> str:
    """A saved report page with its data block unpacked: what a reader of the page can find in it."""
    import json
    import re

    from energyprof.render.html import unpacked_json

    page = path.read_text()
    block = re.search(r'<script type="application/json" id="report-data"[^>]*>(.*?)</script>', page, re.S)
    return page + (json.dumps(unpacked_json(block.group(1)), ensure_ascii=False) if block else "")


def profiled(*args: str) -> list[str]:
    return ["-q", "--power-trace", "trace.csv", "--json", "p.json", "-o", "r.html", *args]


def plain(here: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The same program under plain python, for byte-for-byte comparison."""
    return subprocess.run([sys.executable, *args], cwd=here, capture_output=True, text=True, timeout=120, input=stdin)


@pytest.fixture
def keeper(monkeypatch):
    """A knob Keeper (its process restores after kill -9) for a test's changes; closed at the test's end."""
    from energyprof.knobs.keeper import Keeper

    root = str(Path(__file__).resolve().parent.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    held = Keeper()
    yield held
    held.close()
