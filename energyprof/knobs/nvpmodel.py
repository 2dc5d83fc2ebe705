"""Jetson power mode through `nvpmodel`: `-q` reads the mode, `-m N` sets it.

The modes come from `nvpmodel -q --verbose` (`POWER_MODEL: ID=0 NAME=MAXN`) or, where that lists
none, from /etc/nvpmodel.conf (`< POWER_MODEL ID=0 NAME=MAXN >`). A mode is a choice, not a range:
only the listed ids are allowed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .base import Knob, KnobError, KnobPart, KnobRange, Part

CONF_ENV = "ENERGYPROF_NVPMODEL_CONF"
DEFAULT_CONF = "/etc/nvpmodel.conf"
_MODE = re.compile(r"POWER_MODEL\s*:?\s*ID\s*=\s*(\d+)\s+NAME\s*=\s*([^\s>]+)")
TIMEOUT_S = 30.0  # a hang guard: nvpmodel returns in well under a second


def parse_modes(text: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for m in _MODE.finditer(text)}


def parse_current(text: str) -> int:
    """`nvpmodel -q`: `NV Power Mode: MAXN` then the id alone on a line."""
    for line in reversed(text.splitlines()):
        if line.strip().isdigit():
            return int(line.strip())
    raise KnobError(f"nvpmodel -q printed no mode number: {text.strip()[:80]!r}")


def _run(args: list[str]) -> str:
    exe = shutil.which("nvpmodel")
    if exe is None:
        raise KnobError("nvpmodel is not on PATH (Jetson only)")
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KnobError(f"nvpmodel {' '.join(args)}: {exc}") from None
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise KnobError(f"nvpmodel {' '.join(args)} failed: {why[-1] if why else f'exit {done.returncode}'}")
    return done.stdout


class PowerMode(Knob):
    kind = "jetson_power_mode"
    unit = "mode"

    def __init__(self, modes: dict[int, str]) -> None:
        super().__init__("0")
        self.modes = modes

    def read(self) -> float:
        return float(parse_current(_run(["-q"])))

    def range(self) -> KnobRange:
        ids = sorted(self.modes)
        return KnobRange(float(ids[0]), float(ids[-1]), 1.0, tuple(float(i) for i in ids))

    def _write(self, value: float) -> None:
        _run(["-m", str(int(value))])

    def parts(self) -> list[Part]:
        return [_ModePart(self)]


class _ModePart(KnobPart):
    def __init__(self, knob: PowerMode) -> None:
        super().__init__(knob, "nvpmodel:mode")

    def record(self, value: str) -> dict[str, Any]:
        return {"argv": [shutil.which("nvpmodel") or "nvpmodel", "-m", str(int(float(value)))]}


def discover() -> list[Knob]:
    if shutil.which("nvpmodel") is None:
        return []
    try:
        modes = parse_modes(_run(["-q", "--verbose"]))
    except KnobError:
        modes = {}
    if not modes:
        conf = Path(os.environ.get(CONF_ENV) or DEFAULT_CONF)
        try:
            modes = parse_modes(conf.read_text())
        except OSError:
            return []
    return [PowerMode(modes)] if modes else []
