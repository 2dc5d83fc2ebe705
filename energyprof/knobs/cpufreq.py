"""CPU maximum frequency through cpufreq: `scaling_max_freq`, in kHz, within cpuinfo_min/max_freq.

`cpu_max_freq:all` sets every CPU (what a sweep means by "the CPU's frequency"); `cpu_max_freq:N`
one CPU. The range of `all` is what every CPU allows.
"""

from __future__ import annotations

import os
from pathlib import Path

from .base import FilePart, Knob, KnobError, KnobRange, Part

ROOT_ENV = "ENERGYPROF_CPUFREQ_ROOT"
DEFAULT_ROOT = "/sys/devices/system/cpu"


def root(given: str | None = None) -> Path:
    return Path(given or os.environ.get(ROOT_ENV) or DEFAULT_ROOT)


def _read_khz(path: Path) -> float:
    try:
        return float(int(path.read_text().strip()))
    except (OSError, ValueError) as exc:
        raise KnobError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None


def _cpus(base: Path) -> list[Path]:
    found = [d / "cpufreq" for d in base.glob("cpu[0-9]*") if (d / "cpufreq" / "scaling_max_freq").exists()]
    return sorted(found, key=lambda p: int(p.parent.name[3:]))


class MaxFreq(Knob):
    kind = "cpu_max_freq"
    unit = "kHz"

    def __init__(self, dirs: list[Path], index: str) -> None:
        super().__init__(index)
        self.dirs = dirs

    def read(self) -> float:
        return max(_read_khz(d / "scaling_max_freq") for d in self.dirs)

    def range(self) -> KnobRange:
        low = max(_read_khz(d / "cpuinfo_min_freq") for d in self.dirs)
        high = min(_read_khz(d / "cpuinfo_max_freq") for d in self.dirs)
        return KnobRange(low, high)

    def parts(self) -> list[Part]:
        """One file per CPU: `all` and `N` share CPU N's file, and so its original."""
        return [FilePart(str(d / "scaling_max_freq"), self.name) for d in self.dirs]

    def _write_one(self, d: Path, value: float) -> None:
        path = d / "scaling_max_freq"
        try:
            path.write_text(str(int(value)))
        except OSError as exc:
            raise KnobError(f"{self.name}: cannot write {path}: {exc.strerror or exc} (root, or energyprof sensors"
                            " serve, can)") from None

    def _write(self, value: float) -> None:
        for d in self.dirs:
            self._write_one(d, value)


def discover(given_root: str | None = None) -> list[Knob]:
    dirs = _cpus(root(given_root))
    if not dirs:
        return []
    return [MaxFreq(dirs, "all"), *(MaxFreq([d], d.parent.name[3:]) for d in dirs)]
