"""Every user-facing option and its pure validation (types, choices, bounds), shared by CLI and API.

The API takes the CLI's long flag names as keyword arguments (`--sensor-interval` is
`sensor_interval=`). A bad value raises OptionError with a one-line message, before any
workload starts. Nothing here touches the file system: preflight.py checks paths and files.
"""

from __future__ import annotations

import math

from ..record import fields, record
from ..facts.policy import DEFAULT_POLICY
from ..facts.policy import IDLE_POLICIES
from .choices import CARBON_OPTIONS
from .choices import DEFAULT_INTERVAL
from .choices import DEFAULT_SENSOR_INTERVAL
from .choices import IO_MODES
from .choices import MEMORY_MODES
from .choices import OUTPUTS
from .choices import SAMPLERS
from .choices import SENSORS
from .choices import OptionError
from .choices import flag

__all__ = ["CARBON_OPTIONS", "IDLE_POLICIES", "MEMORY_MODES", "OUTPUTS", "SAMPLERS", "SENSORS", "OptionError", "Options",
           "flag", "parse_kernel_steps"]

#: (lowest, highest, unit) per number. Each bound is far beyond any real use and stops values that
#: would break the run (a 1e308 s sampling interval kills the sampler thread; an infinite price
#: prints inf): sampling and sensor periods up to a minute, checkpoints up to a day, a sensor
#: read may hang up to an hour before it is dropped, a CPU TDP up to 2 kW (the largest
#: server packages are ~500 W), PUE 1 to 5 (surveys report ~1.1 to ~2.5), grid intensity up to
#: 2,000 gCO2eq/kWh (lignite is ~1,200), a price up to 1,000,000 per kWh (room for any currency).
BOUNDS: dict[str, tuple[float, float, str]] = {
    "interval": (0.0005, 60.0, "s"),
    "sensor_interval": (0.0, 60.0, "s"),
    "checkpoint_interval": (0.0, 86400.0, "s"),
    "sensor_timeout": (0.0, 3600.0, "s"),
    "cpu_tdp": (0.0, 2000.0, "W"),
    "pue": (1.0, 5.0, ""),
    "carbon_intensity": (0.0, 2000.0, "gCO2eq/kWh"),
    "price_per_kwh": (0.0, 1_000_000.0, "per kWh"),
}
_STRICTLY_POSITIVE = {"sensor_interval", "checkpoint_interval", "sensor_timeout", "cpu_tdp"}


@record
class Options:
    """A run's options, validated on creation: the CLI's long flags as fields (`--sensor-interval` is
    `sensor_interval`)."""

    output: str | None = None
    json: str | None = None
    speedscope: str | None = None
    folded: str | None = None
    csv: str | None = None
    pprof: str | None = None
    mlflow: bool = False
    influx: str | None = None  # live export: InfluxDB (output/live/), http://HOST:8086/DB or ?org=&bucket=
    pushgateway: str | None = None  # live export: a Prometheus pushgateway, http://HOST:9091
    emissions_csv: str | None = None  # codecarbon's emissions.csv, appended to
    emissions_csv_windows: bool = False
    watch_cache: str | None = None  # a dataset folder: its page-cache residency at the run's and each tracked pass's ends
    # the passes a tracked loop (energyprof.torch.track) will make: a forecast of the run's total after each
    expect_epochs: int | None = None
    interval: float = DEFAULT_INTERVAL
    sensor_interval: float = DEFAULT_SENSOR_INTERVAL
    idle: str = DEFAULT_POLICY
    sampler: str = "threads"
    powercap_root: str | None = None
    power_trace: str | None = None
    cpu_tdp: float | None = None
    gpus: bool = True
    sensor: list[str] | None = None  # only these backends (SENSORS), in this order; None: chosen by the machine
    quiet: bool = False
    summary: bool = True
    # memory
    memory: str = "rss"
    memory_children: bool = False
    peak_reset: bool = True
    # I/O: "off" reads no counter at all (no /proc/PID/io, /proc/diskstats or /sys/block, at ticks or at window edges)
    io: str = "on"
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
    # the PyTorch profiler in the program: GPU joules on the launching lines. None: on by default, on a
    # schedule, when the program uses CUDA through PyTorch; False: off (--no-gpu-kernels)
    gpu_kernels: bool | None = None
    gpu_kernel_steps: str | None = None  # "EVERY:ACTIVE[:WINDOWS]": profile only some steps (bounded cost)
    gpu_kernel_trace: str | None = None  # a folder for each cycle's Chrome trace (gzipped), for users who want the file

    def __post_init__(self) -> None:
        for name, (low, high, unit) in BOUNDS.items():
            value = getattr(self, name)
            if value is not None:
                _bounded(name, value, low, high, unit)
        _choice("idle", self.idle, IDLE_POLICIES)
        _choice("sampler", self.sampler, SAMPLERS)
        _choice("memory", self.memory, MEMORY_MODES)
        _choice("io", self.io, IO_MODES)
        if self.sync not in (None, "cuda"):
            raise OptionError(f"--sync must be 'cuda' or left out, not {self.sync!r}")
        for name in OUTPUTS + ("emissions_csv", "checkpoint", "power_trace", "carbon_intensity_trace", "powercap_root"):
            path = getattr(self, name)
            if path is not None and (not isinstance(path, str) or not path.strip()):
                raise OptionError(f"{flag(name)} needs a file name, not {path!r}")
        if self.sensor is not None:
            self.sensor = [self.sensor] if isinstance(self.sensor, str) else list(self.sensor)
            for name in self.sensor:
                if name not in SENSORS:
                    raise OptionError(f"--sensor must be one of {', '.join(SENSORS)}, not {name!r}")
            if self.power_trace and "replay" not in self.sensor:
                raise OptionError("--power-trace replays a trace: add --sensor replay, or leave --sensor out")
            if "replay" in self.sensor and not self.power_trace:
                raise OptionError("--sensor replay needs --power-trace FILE")
        if self.expect_epochs is not None and (isinstance(self.expect_epochs, bool) or not isinstance(self.expect_epochs, int)
                                               or not 1 <= self.expect_epochs <= 10_000_000):
            raise OptionError(f"--expect-epochs must be a whole number from 1 to 10000000, not {self.expect_epochs!r}")
        if self.gpu_kernel_steps is not None:
            if not self.gpu_kernels:
                raise OptionError("--gpu-kernel-steps bounds --gpu-kernels' profiler: give --gpu-kernels too")
            parse_kernel_steps(self.gpu_kernel_steps)
        if self.gpu_kernel_trace is not None:
            if not self.gpu_kernels:
                raise OptionError("--gpu-kernel-trace writes --gpu-kernels' traces: give --gpu-kernels too")
            if not isinstance(self.gpu_kernel_trace, str) or not self.gpu_kernel_trace.strip():
                raise OptionError(f"--gpu-kernel-trace needs a folder, not {self.gpu_kernel_trace!r}")
        if self.influx is not None or self.pushgateway is not None:
            from .targets import TargetError, influx_target, pushgateway_target

            try:
                if self.influx is not None:
                    influx_target(self.influx)
                if self.pushgateway is not None:
                    pushgateway_target(self.pushgateway)
            except TargetError as exc:
                raise OptionError(str(exc)) from None
        chosen = [n for n in ("carbon_intensity", "carbon_intensity_trace", "cloud") if getattr(self, n) is not None]
        if len(chosen) > 1:
            raise OptionError("give only one of --carbon-intensity, --carbon-intensity-trace and --cloud")

    def carbon_settings(self) -> dict[str, object]:
        """The carbon and cost options as given (recorded in a profile's meta, so that a re-render
        starts from them; the trace's path is left out: it means nothing on another machine)."""
        return {k: getattr(self, k) for k in CARBON_OPTIONS if getattr(self, k) is not None}

    @classmethod
    def names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, object]) -> Options:
        unknown = set(kwargs) - cls.names()
        if unknown:
            raise OptionError(f"unknown option(s): {', '.join(sorted(unknown))}")
        return cls(**kwargs)  # type: ignore[arg-type]


def _bounded(name: str, value: object, low: float, high: float, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise OptionError(f"{flag(name)} must be a number, not {value!r}")
    if not low <= value <= high:
        lo = "> 0" if low == 0 and name in _STRICTLY_POSITIVE else f">= {low:g}"
        raise OptionError(f"{flag(name)} must be {lo} and <= {high:g} {unit}, not {value:g}".rstrip())
    if low == 0 and value == 0 and name in _STRICTLY_POSITIVE:
        raise OptionError(f"{flag(name)} must be > 0, not 0")


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise OptionError(f"{flag(name)} must be one of {', '.join(choices)}, not {value!r}")


def parse_kernel_steps(spec: str) -> tuple[int, int, int]:
    """--gpu-kernel-steps EVERY:ACTIVE[:WINDOWS]: (every, active, windows; 0 = no limit). The profiler
    runs for ACTIVE steps at the start of every EVERY steps, at most WINDOWS times."""
    parts = spec.split(":") if isinstance(spec, str) else []
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        nums = []
    if len(nums) not in (2, 3) or nums[0] < 1 or nums[1] < 1 or nums[1] > nums[0] or (len(nums) == 3 and nums[2] < 0):
        raise OptionError(f"--gpu-kernel-steps must be EVERY:ACTIVE[:WINDOWS] with 1 <= ACTIVE <= EVERY (e.g. 100:5:10),"
                          f" not {spec!r}")
    return nums[0], nums[1], nums[2] if len(nums) == 3 else 0
