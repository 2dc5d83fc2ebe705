"""The one small interface every energy source implements.

A sensor reports *cumulative joules since it started*; it owns its hardware quirks
(wraparound, units, resets) so the attribution never sees a raw counter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class SensorError(RuntimeError):
    """A sensor that cannot go on; the collector drops it and notes why."""


@dataclass
class Sensor:
    id: str  # unique source id: "cpu", "dram", "gpu:0", ...
    component: str  # "cpu", "dram", "ram", "psys", "gpu:N"
    method: str  # "measured" | "estimated"
    sensor: str  # "rapl" | "model" | "replay" | "nvml"
    detail: dict[str, Any] = field(default_factory=dict)
    update_period_s: float | None = None  # how often the hardware refreshes the figure

    def read(self, t_ns: int) -> float:
        """Cumulative joules at perf_counter_ns `t_ns` (hardware sensors read 'now')."""
        raise NotImplementedError

    def start(self, t_ns: int) -> None:
        """Zero the cumulative figure at the start of profiling."""

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        out = {"id": self.id, "component": self.component, "method": self.method, "sensor": self.sensor,
               "detail": dict(self.detail)}
        if self.update_period_s is not None:
            out["update_period_s"] = self.update_period_s
        return out


@dataclass
class Discovery:
    """What was found, and why anything else was not (shown in the report's methodology)."""

    sensors: list[Sensor] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # one line each, for humans


class WrapCounter:
    """Turn a raw counter that wraps at `max_range` (and may reset) into a running total.

    A drop is a wrap when wrapping explains it with less than half the range; otherwise the
    counter was reset (driver reload, VM migration) and the new value counts from zero.
    """

    def __init__(self, first: float, max_range: float | None) -> None:
        self.last = first
        self.max_range = max_range
        self.total = 0.0
        self.wraps = 0
        self.resets = 0

    def update(self, raw: float) -> float:
        if raw >= self.last:
            self.total += raw - self.last
        elif self.max_range and (raw + self.max_range - self.last) < self.max_range / 2:
            self.total += raw + self.max_range - self.last
            self.wraps += 1
        else:
            self.total += raw
            self.resets += 1
        self.last = raw
        return self.total
