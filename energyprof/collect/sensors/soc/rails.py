"""Jetson power rails: reading a tegrastats line, and turning rails into sources that never overlap.

Rails differ per module and per release (see docs/sensors.md):
- a board with an input rail (VDD_IN on TX2, Xavier NX, Orin NX/Nano; POM_5V_IN on Nano) reads
  the module's total there; the other rails are parts of it, and the rest is `other`;
- AGX Orin (VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0, VDDQ_VDD2_1V8AO) and AGX Xavier (GPU, CPU,
  SOC, CV, VDDRQ, SYS5V) have no input rail: their rails are separate and their sum is the module.
`NC` rails (not connected) are skipped. The first value of a field is the instantaneous power;
the second is tegrastats' running mean since it started and is never used.
"""

from __future__ import annotations

import re
from typing import Mapping

from ..base import split_total

#: `NAME cur/avg` (old L4T, no unit), `NAME curmW/avgmW`, JetPack 7's `NAME curmW/avgmW/maxmW`.
#: The lookahead stops a field with another unit (`RAM 896/7859MB`) from matching.
RAIL_RE = re.compile(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_]*) (\d+)(?:mW)?/(\d+)(?:mW)?(?:/(\d+)(?:mW)?)?(?=\s|$)")
INPUT_RAILS = ("VDD_IN", "POM_5V_IN")
SKIPPED = {"NC"}
NOT_RAILS = {"RAM", "SWAP", "IRAM"}  # memory fields, should a release print them without a unit


def parse_line(line: str) -> dict[str, float]:
    """{rail: instantaneous milliwatts} of one tegrastats line (empty for a line with no rail)."""
    rails: dict[str, float] = {}
    for m in RAIL_RE.finditer(line):
        name = m.group(1)
        if name in SKIPPED or name in NOT_RAILS or name in rails:
            continue
        rails[name] = float(m.group(2))
    return rails


def input_rail(names: list[str]) -> str | None:
    for name in INPUT_RAILS:
        if name in names:
            return name
    return None


def sources_watts(rails_mw: Mapping[str, float]) -> dict[str, float]:
    """{source id: watts} that add up to the module's power once: the parts of an input rail
    plus `other`, or the separate rails of a module without one."""
    total = input_rail(list(rails_mw))
    parts = {name: mw / 1000.0 for name, mw in rails_mw.items() if name != total}
    return split_total((total, rails_mw[total] / 1000.0) if total else None, parts)


def board_watts(rails_mw: Mapping[str, float]) -> float:
    """The module's power as the board states it: its input rail, else the sum of its rails."""
    total = input_rail(list(rails_mw))
    return rails_mw[total] / 1000.0 if total else sum(rails_mw.values()) / 1000.0


def component(rail: str) -> str:
    """The component a rail feeds, for how its energy is shared: a pure GPU rail is the GPU's
    (shared by wall time), memory rails are dram, a pure CPU rail is cpu; rails that mix
    blocks (VDD_CPU_GPU_CV, VDD_GPU_SOC), the SoC, I/O and `other` are the SoC's."""
    upper = rail.upper()
    blocks = set(upper.split("_")) & {"CPU", "GPU", "SOC", "CV"}
    if any(k in upper for k in ("DDR", "VDDRQ", "VDDQ", "DRAM")):
        return "dram"
    if blocks == {"GPU"}:
        return "gpu:0"
    if blocks == {"CPU"}:
        return "cpu"
    return "soc"
