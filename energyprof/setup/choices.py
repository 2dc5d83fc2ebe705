"""The options' names, choices and defaults, and their one error: what the command line's parser
and its `--help` need, without the Options class (a record: making it is work `--help` does
not need). options.py validates with them."""

from __future__ import annotations

SAMPLERS = ("threads", "pyinstrument")
MEMORY_MODES = ("rss", "exact", "off")
IO_MODES = ("on", "off")  # --io: the I/O counters (/proc/PID/io, /proc/diskstats) read, or none at all
OUTPUTS = ("json", "output", "speedscope", "folded", "csv", "pprof")  # the JSON first: it is the one to keep
#: The sensor backends `--sensor` may name (collect/sensors/ implements each one).
SENSORS = ("rapl", "perf", "nvml", "amdsmi", "tegrastats", "jtop", "powermetrics", "macmon", "model", "replay")
CARBON_OPTIONS = ("country", "region", "cloud", "carbon_intensity", "pue", "price_per_kwh", "currency")
DEFAULT_INTERVAL = 0.01  # seconds between stack samples
DEFAULT_SENSOR_INTERVAL = 0.05  # seconds between sensor readings


class OptionError(ValueError):
    """A bad option; its message is one line meant for the user."""


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")
