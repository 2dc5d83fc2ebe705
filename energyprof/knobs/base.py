"""The one small interface every knob stands on: read, range, set, restore.

A knob is named `KIND:INDEX` (`gpu_power_limit:0`, `cpu_power_limit:0`, `cpu_max_freq:all`,
`jetson_power_mode:0`). Values are floats in the knob's unit (W, kHz, or a mode number). The first
`set()` remembers the value found, so `restore()` puts back what was there before energyprof
touched it, however many times it was set in between.
"""

from __future__ import annotations

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


class Knob(ABC):
    kind: str = ""
    unit: str = ""

    def __init__(self, index: str) -> None:
        self.index = index
        self.original: float | None = None

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

    def remember(self) -> None:
        """Keep the value found before the first change (what restore() puts back)."""
        if self.original is None:
            self.original = self.read()

    def restore_record(self) -> dict[str, Any]:
        """How another process puts the original back once this one is gone (the keeper): by default it
        finds the knob again by name; knobs that are files or commands say so directly."""
        return {"name": self.name, "kind": self.kind, "index": self.index, "value": self.original}

    def set(self, value: float) -> None:
        self.check(value)
        self.remember()
        self._write(value)

    def restore(self) -> None:
        if self.original is not None:
            self._write(self.original)
            self.original = None
