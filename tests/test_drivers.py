"""The two drivers of a run are siblings on one ground: neither imports the other."""

from __future__ import annotations

import subprocess
import sys


def loaded_by(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(m for m in sys.modules if m.startswith('energyprof')))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return set(res.stdout.split())


def test_the_supervised_run_does_not_import_the_in_process_profiler() -> None:
    """Before, supervise/ took the run's metadata, notes and checkpoint header from profiler.py."""
    mods = loaded_by("energyprof.supervise.supervisor")
    assert "energyprof.drive.meta" in mods
    assert "energyprof.drive.profiler" not in mods


def test_the_profiler_does_not_import_the_supervised_run() -> None:
    mods = loaded_by("energyprof.drive.profiler")
    assert "energyprof.drive.meta" in mods
    assert not {m for m in mods if m.startswith("energyprof.supervise")}
