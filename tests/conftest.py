"""Shared test helpers: run the real CLI in a subprocess, write power traces and scripts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


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
