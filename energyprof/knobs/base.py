"""The one small interface every knob stands on: read, range, set, restore.

A knob is named `KIND:INDEX` (`gpu_power_limit:0`, `cpu_power_limit:0`, `cpu_max_freq:all`,
`jetson_power_mode:0`). Values are floats in the knob's unit (W, kHz, or a mode number). The first
`set()` remembers the value found, so `restore()` puts back what was there before energyprof
touched it, however many times it was set in between.

What a knob writes is its `parts()`: a file, or a device's field. Two knobs may write the same part
(`cpu_max_freq:all` and `cpu_max_freq:0` both write CPU 0's file), so the keeper (keeper.py), which
every change goes through, keeps originals by part, not by knob name.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Any

from ..record import record


def num(value: float) -> str:
    """A knob's value as a person writes it: 3600000, not 3.6e+06; 12.5 as it is."""
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


class KnobError(Exception):
    """A knob that cannot be read or set: the message is one line for the user."""


@record(frozen=True)
class KnobRange:
    low: float
    high: float
    step: float | None = None  # None: any value in [low, high]
    choices: tuple[float, ...] = ()  # discrete knobs (a Jetson's power modes): the only values

    def allows(self, value: float) -> bool:
        if self.choices:
            return value in self.choices
        return self.low <= value <= self.high


class Part:
    """One thing a knob writes, named by `key` (a file's real path, or a device and field): the keeper
    reads it before the first change, writes it back, and tells its process how to write it back."""

    key: str = ""
    claimed: bool = False  # claimed machine-wide while changed (keeper.py): a file, which any process may reach

    def read(self) -> str:
        raise NotImplementedError

    def write(self, value: str) -> None:
        raise NotImplementedError

    def record(self, value: str) -> dict[str, Any] | None:
        """How another process (the keeper's) writes `value` back once this one is gone; None where only
        this process can (a stand-in device held in its memory, which goes with it)."""
        raise NotImplementedError


class FilePart(Part):
    """A sysfs file written whole (cpufreq's scaling_max_freq, powercap's power_limit_uw)."""

    claimed = True

    def __init__(self, path: str, owner: str) -> None:
        # The file itself, every link followed: the keeper runs in another folder, and in real sysfs
        # cpuN/cpufreq is a link to ../cpufreq/policyM, which several CPUs share (on ARM, a cluster), so
        # two knob names may write one file: one key, one owner, one original.
        self.key = os.path.realpath(path)
        self.owner = owner

    def read(self) -> str:
        try:
            with open(self.key) as f:
                return f.read().strip()
        except OSError as exc:
            raise KnobError(f"cannot read {self.key}: {exc.strerror or exc}") from None

    def write(self, value: str) -> None:
        try:
            with open(self.key, "w") as f:
                f.write(value)
        except OSError as exc:
            raise KnobError(f"{self.owner}: cannot write {self.key}: {exc.strerror or exc} (root, or energyprof"
                            " sensors serve, can)") from None

    def record(self, value: str) -> dict[str, Any]:
        return {"files": [[self.key, value]]}


class KnobPart(Part):
    """A knob that is one field of one device, written through the knob itself: the default part."""

    def __init__(self, knob: "Knob", key: str | None = None) -> None:
        self.knob = knob
        self.key = key or f"knob:{knob.name}"

    def read(self) -> str:
        return repr(float(self.knob.read()))

    def write(self, value: str) -> None:
        self.knob._write(float(value))

    def record(self, value: str) -> dict[str, Any] | None:
        # A knob of the program's own making: only this process knows how to reach its device (finding it again
        # by name could reach another device of that kind).
        return None


class Knob(ABC):
    kind: str = ""
    unit: str = ""

    def __init__(self, index: str) -> None:
        self.index = index

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.index}"

    @abstractmethod
    def read(self) -> float: ...

    @abstractmethod
    def range(self) -> KnobRange: ...

    @abstractmethod
    def _write(self, value: float) -> None: ...

    def check(self, value: float) -> None:
        """Raise KnobError, one line, when `value` is not one this knob takes."""
        rng = self.range()
        if not rng.allows(value):
            allowed = ", ".join(num(c) for c in rng.choices) if rng.choices else f"{num(rng.low)}-{num(rng.high)}"
            raise KnobError(f"{self.name}: {num(value)} {self.unit} is outside its range {allowed} {self.unit}")

    def parts(self) -> list[Part]:
        """What this knob writes: by default one part, the knob itself."""
        return [KnobPart(self)]
