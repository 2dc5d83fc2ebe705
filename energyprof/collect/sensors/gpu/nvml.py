"""The NVML sensor: cumulative joules of each GPU CUDA can see, and its discovery.

What is read, best first, per GPU:

1. the energy counter, `nvmlDeviceGetTotalEnergyConsumption` (mJ since the driver loaded;
   Volta and newer). Exact over any span longer than its update period.
2. the *instant* power field (`NVML_FI_DEV_POWER_INSTANT`, mW), integrated by trapezoids.
3. `nvmlDeviceGetPowerUsage` (mW), integrated, only when neither exists: on Ampere and newer it
   is a 1 s moving average, so a GPU that has the instant field never uses it.

Numbering is numbering.py's, NVML calls nvml_device.py's, the process share share.py's.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ..base import FROZEN_GPU_S, FROZEN_PERIODS, Discovery, FrozenWatch, Sensor, SensorError, WrapCounter
from . import nvml_device
from .numbering import GpuInfo, cuda_bus_ids_from_torch, parse_bus_id, text, visible_order
from .nvml_device import GpuError, NvmlDevice, Session, error_text, init_note, load_binding
from .power_samples import SampleBuffer, to_intervals
from .share import SHARE_REFRESH_S, ProcessShare

DETECT_BUDGET_S = 0.3  # total time spent polling for update periods, all GPUs together
DETECT_POLL_S = 0.001
DEFAULT_UPDATE_PERIOD_S = 0.1  # A100/H100 refresh power about every 100 ms (FIELD-NOTES)
COUNTER_RANGE_MJ = 2**64  # an unsigned 64-bit value: kept as int, a float cannot hold it
BUSY_POWER_W = 1.0  # a GPU drawing more than this is doing something its energy counter must count

__all__ = ["NvmlSensor", "discover", "detect_update_periods", "GpuInfo", "parse_bus_id", "visible_order",
           "DEFAULT_UPDATE_PERIOD_S", "DETECT_BUDGET_S", "SHARE_REFRESH_S", "READING_LABELS"]


def set_binding(binding: Any) -> None:
    """Use this module object as the NVML binding from now on (tests inject a fake)."""
    nvml_device.BINDING = binding


def reader(device: NvmlDevice, kind: str) -> Callable[[], float]:
    """A zero-argument callable that returns the raw figure: mJ (counter, an int) or mW (power)."""
    if kind == "counter":
        return device.total_energy_mj  # exact integer arithmetic
    if kind == "instant":
        return device.instant_power_mw
    return device.average_power_mw


def choose_reading(device: NvmlDevice) -> tuple[str | None, str]:
    """Which figure this GPU offers (best first), and why the better ones are missing."""
    why = []
    try:
        device.total_energy_mj()
        return "counter", ""
    except GpuError as exc:  # NotSupported before Volta
        why.append(f"no energy counter ({_cause(exc)})")
    try:
        device.instant_power_mw()
        return "instant", "; ".join(why)
    except GpuError as exc:
        why.append("no instant power field" + (f" ({_cause(exc)})" if exc.code is not None else ""))
    try:
        device.average_power_mw()
        return "average", "; ".join(why)
    except GpuError as exc:
        why.append(f"no power reading ({_cause(exc)})")
    return None, "; ".join(why)


def _cause(exc: GpuError) -> str:
    return str(exc).split(": ", 1)[-1]


def detect_update_periods(readers: list[Callable[[], float]], budget_s: float = DETECT_BUDGET_S,
                          poll_s: float = DETECT_POLL_S) -> list[float | None]:
    """How often each figure changes: poll all of them together for at most `budget_s`.

    The period is the median gap between observed changes; None when fewer than two changes
    were seen (a constant power reading, or a slow counter). Stops early once every reader
    has shown three gaps. A reader that raises is given None (read() will report it).
    """
    changes: list[list[float]] = [[] for _ in readers]
    last: list[float | None] = [None] * len(readers)
    dead = [False] * len(readers)
    end = time.perf_counter() + budget_s
    while True:
        now = time.perf_counter()
        for i, r in enumerate(readers):
            if dead[i]:
                continue
            try:
                v = r()
            except Exception:  # noqa: BLE001
                dead[i] = True
                continue
            if last[i] is not None and v != last[i]:
                changes[i].append(now)
            last[i] = v
        if now >= end or all(dead[i] or len(changes[i]) >= 4 for i in range(len(readers))):
            break
        time.sleep(poll_s)
    out: list[float | None] = []
    for ch in changes:
        gaps = [b - a for a, b in zip(ch, ch[1:])]
        out.append(_median(gaps) if gaps else None)
    return out


READING_LABELS = {
    "counter": "energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ)",
    "instant": "instant power field (NVML_FI_DEV_POWER_INSTANT), integrated by trapezoids",
    "average": "nvmlDeviceGetPowerUsage (a 1 s average on Ampere and newer), integrated by trapezoids",
}


class NvmlSensor(Sensor):
    """Cumulative joules of one GPU, and this process's share of it (`process_share`)."""

    per_process_share = True

    def __init__(self, source_id: str, session: Session, gpu: GpuInfo, device: NvmlDevice, kind: str,
                 detail: dict[str, Any], update_period_s: float | None) -> None:
        super().__init__(id=source_id, component=source_id, method="measured", sensor="nvml", detail=detail,
                         update_period_s=update_period_s, tier="counter" if kind == "counter" else "integrated")
        self.gpu = gpu
        self.device = device
        self.kind = kind
        self.share = ProcessShare(device)
        self._session = session
        session.acquire()
        self._raw = reader(device, kind)
        self._counter: WrapCounter | None = None
        self._joules = 0.0
        self._last_t: int | None = None
        self._last_w = 0.0
        self._closed = False
        self.samples = SampleBuffer(device.nv, device.handle)  # the driver's power samples, for the kernel split
        period = update_period_s or DEFAULT_UPDATE_PERIOD_S
        # A counter is judged once it has stood still for two of its updates: then the driver is asked
        # whether the GPU draws power or is in use, and a counter flat over FROZEN_PERIODS updates of that
        # (FROZEN_GPU_S at least) is not a sensor. A counter that moves never costs the extra calls.
        self._busy = _GpuBusy(device)
        self._watch = FrozenWatch(f"the NVML energy counter of {source_id}", self._busy,
                                  max(FROZEN_PERIODS * period, FROZEN_GPU_S),
                                  int(2 * period * 1e9), "the driver said the GPU was in use or drew power for {busy:.2f} s")

    def _call(self) -> float:
        try:
            return self._raw()
        except GpuError as exc:  # GPU lost, driver gone, the field stopped answering
            raise SensorError(str(exc)) from None

    def start(self, t_ns: int) -> None:
        raw = self._call()
        if self.kind == "counter":
            self._counter = WrapCounter(raw, COUNTER_RANGE_MJ)
        else:
            self._joules = 0.0
            self._last_t = t_ns
            self._last_w = raw / 1000.0
        self.share.refreshed_at = -1e18

    def read(self, t_ns: int) -> float:
        joules = self._read(t_ns)
        self.samples.drain(t_ns)  # after the reading (a failure here never costs the energy); at most every DRAIN_NS
        return joules

    def power_intervals(self, t0_ns: int, t1_ns: int) -> tuple[list[tuple[int, int, float]], float] | None:
        """The driver's buffered power samples (nvmlDeviceGetSamples) over the span, with their median spacing;
        None with fewer than two, or once the buffer's cap dropped some (the run's end has none then)."""
        from .power_samples import median_spacing_ns

        buf = self.samples
        if buf is None or len(buf.samples) < 2 or buf.dropped:
            return None
        intervals = to_intervals(buf.samples, t0_ns, t1_ns)
        return (intervals, median_spacing_ns(buf.samples)) if intervals else None

    def _read(self, t_ns: int) -> float:
        if self.kind == "counter":
            raw = self._call()
            if self._counter is None:
                self._counter = WrapCounter(raw, COUNTER_RANGE_MJ)
            joules = self._counter.update(raw) / 1000.0
            if self._watch.saw(t_ns, raw) is not None:
                self.frozen = self._watch.why
            return joules
        watts = self._call() / 1000.0
        if self._last_t is None:
            self._last_t, self._last_w = t_ns, watts
            return 0.0
        dt = (t_ns - self._last_t) / 1e9
        if dt > 0:
            self._joules += 0.5 * (self._last_w + watts) * dt
            self._last_t, self._last_w = t_ns, watts
        return self._joules

    def fallback(self) -> Sensor | None:
        """A frozen counter's GPU read by its power (the instant field, else the average), integrated;
        None where the driver gives no power either (the GPU is then dropped)."""
        if self.kind != "counter":
            return None
        for kind in ("instant", "average"):
            try:
                watts = reader(self.device, kind)() / 1000.0
            except GpuError:
                continue
            if watts > 0:
                detail = {**self.detail, "reading": READING_LABELS[kind]}
                return NvmlSensor(self.id, self._session, self.gpu, self.device, kind, detail, self.update_period_s)
        return None

    def process_share(self) -> float:
        """This process's share of the GPU, in [0, 1]; never raises, never blocks for long (share.py)."""
        return self.share()

    @property
    def wraps_and_resets(self) -> tuple[int, int]:
        c = self._counter
        return (c.wraps, c.resets) if c is not None else (0, 0)

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        wraps, resets = self.wraps_and_resets
        if resets:
            out["detail"]["counter_resets"] = resets
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._session.release()


class _GpuBusy:
    """How long the driver has said the GPU was in use (utilisation above 0) or drawing power (above
    BUSY_POWER_W), in seconds, summed over the spans between the times it is asked."""

    def __init__(self, device: NvmlDevice) -> None:
        self.device = device
        self.last_ns: int | None = None
        self.total_s = 0.0

    def busy(self) -> bool:
        try:
            if self.device.utilization_gpu() > 0:
                return True
        except Exception:  # noqa: BLE001 - no utilisation figure: power says it
            pass
        for kind in ("instant", "average"):
            try:
                return reader(self.device, kind)() / 1000.0 > BUSY_POWER_W
            except GpuError:
                continue
        raise SensorError("the driver says neither utilisation nor power")

    def __call__(self, t_ns: int) -> float:
        busy = self.busy()
        if self.last_ns is not None and busy:
            self.total_s += (t_ns - self.last_ns) / 1e9
        self.last_ns = t_ns
        return self.total_s


def discover(binding: Any = None, env: dict[str, str] | None = None,
             detect_budget_s: float | None = None) -> Discovery:
    """One sensor per GPU CUDA can see, and a note for each one it cannot measure, and why."""
    found = Discovery()
    nv, why = load_binding(binding)
    if nv is None:
        found.notes.append(why or "NVML: unavailable")
        return found
    try:
        nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        found.notes.append(init_note(nv, exc))
        return found
    session = Session(nv)
    session.acquire()  # discovery's own hold, released below
    try:
        _discover(nv, session, found, env, DETECT_BUDGET_S if detect_budget_s is None else detect_budget_s)
    except Exception as exc:  # noqa: BLE001 - never let a driver quirk stop the program
        for s in found.sensors:
            s.close()
        found.sensors = []
        found.notes.append(f"NVML: GPU discovery failed ({error_text(exc)}), so no GPU is measured")
    finally:
        session.release()
    return found


def _discover(nv: Any, session: Session, found: Discovery, env: dict[str, str] | None, budget: float) -> None:
    count = int(nv.nvmlDeviceGetCount())
    if count == 0:
        found.notes.append("NVML: the driver is loaded but reports no GPU")
        return
    try:
        driver = text(nv.nvmlSystemGetDriverVersion())
    except Exception:  # noqa: BLE001
        driver = "unknown"
    gpus: list[GpuInfo] = []
    for i in range(count):
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
        except Exception as exc:  # noqa: BLE001
            found.notes.append(f"NVML: GPU {i} cannot be opened ({error_text(exc)}); not measured")
            continue
        try:
            bus_raw = nv.nvmlDeviceGetPciInfo(h).busId
        except Exception:  # noqa: BLE001
            bus_raw = ""
        gpus.append(GpuInfo(i, h, parse_bus_id(bus_raw), text(bus_raw).rstrip("\x00"),
                            _optional(lambda: text(nv.nvmlDeviceGetUUID(h)), ""),
                            _optional(lambda: text(nv.nvmlDeviceGetName(h)), f"GPU {i}")))
    visible, notes = visible_order(gpus, env, cuda_bus_ids_from_torch() if env is None else None)
    found.notes.extend(notes)
    planned: list[tuple[int, GpuInfo, NvmlDevice, str, str]] = []
    for cuda_index, g in enumerate(visible):
        label = f"gpu:{cuda_index} ({g.name}, {g.bus_id or 'bus id unknown'})"
        device = NvmlDevice(nv, g.handle, f"{g.name} ({g.bus_id})")
        if _optional(device.mig_enabled, False):
            found.notes.append(f"NVML: {label} is in MIG mode; MIG slices have no energy counter and the GPU's "
                               "total cannot be split between slices, so it is not measured")
            continue
        kind, why = choose_reading(device)
        if kind is None:
            found.notes.append(f"NVML: {label} offers no energy or power reading ({why}); not measured")
            continue
        if kind == "average":
            found.notes.append(f"NVML: {label} has no energy counter and no instant power field; integrating "
                               "nvmlDeviceGetPowerUsage, which newer drivers average over 1 s")
        planned.append((cuda_index, g, device, kind, why))
    if not planned:
        return
    periods = detect_update_periods([reader(device, kind) for _, _, device, kind, _ in planned], budget)
    for (cuda_index, g, device, kind, why), period in zip(planned, periods):
        detail: dict[str, Any] = {
            "name": g.name, "nvml_index": g.nvml_index, "cuda_index": cuda_index, "pci_bus_id": g.bus_id,
            "uuid": g.uuid, "power_limit_w": _optional(device.power_limit_w, None), "driver": driver,
            "reading": READING_LABELS[kind], "update_period_detected": period is not None,
        }
        if why:
            detail["why_not_counter"] = why
        found.sensors.append(NvmlSensor(f"gpu:{cuda_index}", session, g, device, kind, detail,
                                        period if period is not None else DEFAULT_UPDATE_PERIOD_S))


def _optional(fn: Callable[[], Any], default: Any) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - optional metadata: a missing field is not an error
        return default


def _median(values: list[float]) -> float:
    """statistics.median without importing statistics (fractions, decimal) at every run's discovery."""
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2
