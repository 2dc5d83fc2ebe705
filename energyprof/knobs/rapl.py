"""CPU package power limit through Linux powercap (RAPL): `constraint_N_power_limit_uw`.

The constraint named `long_term` is the one a package runs under; its ceiling is
`constraint_N_max_power_uw` where the kernel gives one, else the package's own TDP
(`constraint_N_power_limit_uw` of the original is never taken as the ceiling).
"""

from __future__ import annotations

import os
from pathlib import Path

from .base import FilePart, Knob, KnobError, KnobRange, Part

ROOT_ENV = "ENERGYPROF_POWERCAP_ROOT"
DEFAULT_ROOT = "/sys/class/powercap"
MIN_W = 1.0  # below a watt a package cannot run; the kernel would clamp it anyway


def root(given: str | None = None) -> Path:
    return Path(given or os.environ.get(ROOT_ENV) or DEFAULT_ROOT)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise KnobError(f"cannot read {path}: {exc.strerror or exc}") from None


class RaplLimit(Knob):
    kind = "cpu_power_limit"
    unit = "W"

    def __init__(self, zone: Path, index: str, constraint: int) -> None:
        super().__init__(index)
        self.zone = zone
        self.constraint = constraint

    def _file(self, what: str) -> Path:
        return self.zone / f"constraint_{self.constraint}_{what}"

    def read(self) -> float:
        return int(_read(self._file("power_limit_uw"))) / 1e6

    def range(self) -> KnobRange:
        top = self._file("max_power_uw")
        high = int(_read(top)) / 1e6 if top.exists() else 0.0
        if high <= 0:
            raise KnobError(f"{self.name}: the kernel gives no maximum for {self._file('power_limit_uw')}")
        return KnobRange(MIN_W, high)

    def parts(self) -> list[Part]:
        return [FilePart(str(self._file("power_limit_uw")), self.name)]

    def _write(self, value: float) -> None:
        path = self._file("power_limit_uw")
        try:
            path.write_text(str(int(round(value * 1e6))))
        except OSError as exc:
            raise KnobError(f"{self.name}: cannot write {path}: {exc.strerror or exc} (root, or energyprof sensors"
                            " serve, can)") from None


def _long_term(zone: Path) -> int | None:
    for n in range(8):
        name = zone / f"constraint_{n}_name"
        if not name.exists():
            break
        if name.read_text().strip() == "long_term":
            return n
    return 0 if (zone / "constraint_0_power_limit_uw").exists() else None


def discover(given_root: str | None = None) -> list[Knob]:
    """One knob per package zone (`intel-rapl:N`, or AMD's `amd-rapl:N`), indexed by N."""
    base = root(given_root)
    knobs: list[Knob] = []
    for zone in sorted(base.glob("*-rapl:*")):
        if zone.name.count(":") != 1:  # sub-zones (core, uncore, dram) are not the package's limit
            continue
        n = _long_term(zone)
        if n is not None:
            knobs.append(RaplLimit(zone, zone.name.split(":")[1], n))
    return knobs
