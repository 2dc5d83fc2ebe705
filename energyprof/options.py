"""Every user-facing option, validated once, shared by the CLI and the Python API.

The API takes the CLI's long flag names as keyword arguments (`--sensor-interval` is
`sensor_interval=`). A bad value raises OptionError with a one-line message, before any
workload starts.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from pathlib import Path

IDLE_POLICIES = ("share", "all")
SAMPLERS = ("threads", "pyinstrument")
MEMORY_MODES = ("rss", "exact", "off")


class OptionError(ValueError):
    """A bad option; its message is one line meant for the user."""


@dataclass
class Options:
    output: str | None = None
    json: str | None = None
    speedscope: str | None = None
    folded: str | None = None
    csv: str | None = None
    interval: float = 0.005
    sensor_interval: float = 0.01
    idle: str = "share"
    sampler: str = "threads"
    powercap_root: str | None = None
    power_trace: str | None = None
    cpu_tdp: float | None = None
    gpus: bool = True
    quiet: bool = False
    summary: bool = True
    # memory
    memory: str = "rss"
    memory_children: bool = False
    peak_reset: bool = True
    # carbon and cost
    country: str | None = None
    region: str | None = None
    cloud: str | None = None
    carbon_intensity: float | None = None
    carbon_intensity_trace: str | None = None
    pue: float = 1.0
    price_per_kwh: float | None = None
    currency: str = "EUR"
    # robustness
    children: bool = True
    follow: bool = True
    checkpoint: str | None = None
    checkpoint_interval: float = 30.0
    sensor_timeout: float = 2.0
    # GPUs
    sync: str | None = None

    def __post_init__(self) -> None:
        for name in ("interval", "sensor_interval", "checkpoint_interval", "sensor_timeout"):
            _positive(name, getattr(self, name))
        if self.interval < 0.0005:
            raise OptionError("--interval must be at least 0.0005 s")
        for name in ("cpu_tdp", "carbon_intensity", "price_per_kwh"):
            value = getattr(self, name)
            if value is not None:
                _positive(name, value, allow_zero=name != "cpu_tdp")
        _positive("pue", self.pue)
        if self.pue < 1.0:
            raise OptionError(f"--pue must be >= 1.0 (a data centre cannot use less than its IT load), not {self.pue}")
        _choice("idle", self.idle, IDLE_POLICIES)
        _choice("sampler", self.sampler, SAMPLERS)
        _choice("memory", self.memory, MEMORY_MODES)
        if self.sync not in (None, "cuda"):
            raise OptionError(f"--sync must be 'cuda' or left out, not {self.sync!r}")
        for name in ("output", "json", "speedscope", "folded", "csv", "checkpoint"):
            path = getattr(self, name)
            if path is not None:
                check_writable(path, f"--{name}")
        for name in ("power_trace", "carbon_intensity_trace"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise OptionError(f"--{name.replace('_', '-')}: {path} is not a file")
        if self.power_trace is not None:
            from .sensors.replay import TraceError, load_trace

            try:
                load_trace(self.power_trace)
            except TraceError as exc:
                raise OptionError(str(exc)) from None
        if self.powercap_root is not None and not Path(self.powercap_root).is_dir():
            raise OptionError(f"--powercap-root: {self.powercap_root} is not a directory")
        self._check_carbon()

    def _check_carbon(self) -> None:
        chosen = [n for n in ("carbon_intensity", "carbon_intensity_trace", "cloud") if getattr(self, n) is not None]
        if len(chosen) > 1:
            raise OptionError("give only one of --carbon-intensity, --carbon-intensity-trace and --cloud")
        if self.country is not None or self.region is not None or self.cloud is not None \
                or self.carbon_intensity_trace is not None:
            try:
                from . import intensity
            except ImportError:
                return
            try:
                intensity.validate(self)
            except ValueError as exc:
                raise OptionError(str(exc)) from None

    @classmethod
    def names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, object]) -> Options:
        unknown = set(kwargs) - cls.names()
        if unknown:
            raise OptionError(f"unknown option(s): {', '.join(sorted(unknown))}")
        return cls(**kwargs)  # type: ignore[arg-type]


def _positive(name: str, value: float, allow_zero: bool = False) -> None:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise OptionError(f"{flag} must be a number, not {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise OptionError(f"{flag} must be {'>= 0' if allow_zero else '> 0'}, not {value}")


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise OptionError(f"--{name} must be one of {', '.join(choices)}, not {value!r}")


def check_writable(path: str, what: str) -> None:
    """Fail now, not after a ten-hour run, if an output cannot be written."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise OptionError(f"{what}: {path} is a directory")
    if not parent.is_dir():
        raise OptionError(f"{what}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise OptionError(f"{what}: cannot write to {path} (permission denied)")
