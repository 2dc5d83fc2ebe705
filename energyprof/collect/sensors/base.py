"""The one small interface every energy source implements.

A sensor reports *cumulative joules since it started*; it owns its hardware quirks
(wraparound, units, resets) so the attribution never sees a raw counter. Each one declares
what it is rather than being probed: its `tier` (a hardware energy counter, power samples
integrated over time, or a model) and its `update_period_s` (how often the hardware
refreshes the figure), both written into the profile's sources.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, ClassVar, Mapping

from ...record import field, record

#: How a source's joules come about, best first: a cumulative hardware counter; power samples
#: integrated over time (trapezoids of instantaneous values, or interval means times their
#: length); a model of the hardware (an estimate, never a measurement).
TIERS = ("counter", "integrated", "model")


class SensorError(RuntimeError):
    """A sensor that cannot go on; the collector drops it and notes why."""


@record
class Sensor:
    """One energy source: what it measures, how (measured or estimated) and through which backend."""

    id: str  # unique source id: "cpu", "dram", "gpu:0", ...
    component: str  # "cpu", "dram", "ram", "psys", "gpu:N"
    method: str  # "measured" | "estimated"
    sensor: str  # the backend: "rapl", "perf", "nvml", "amdsmi", "tegrastats", ... (sensors.BACKENDS)
    detail: dict[str, Any] = field(default_factory=dict)
    update_period_s: float | None = None  # how often the hardware refreshes the figure
    tier: str = "counter"  # one of TIERS
    #: why this counter is not a sensor: it stood still while its component was busy (FrozenWatch);
    #: the collector then reads `fallback()` in its place, or drops it, with a note
    frozen: str | None = None
    #: whether the sensor tells this process's share of its source (`process_share()`, a GPU's
    #: process list); otherwise the ledger's rules share it (CPU time, or all of a GPU)
    per_process_share: ClassVar[bool] = False

    def read(self, t_ns: int) -> float:
        """Cumulative joules at perf_counter_ns `t_ns` (hardware sensors read 'now')."""
        raise NotImplementedError

    def start(self, t_ns: int) -> None:
        """Zero the cumulative figure at the start of profiling."""

    def close(self) -> None:
        pass

    def fallback(self) -> Sensor | None:
        """What reads this source once its counter is found `frozen` (not started; None: nothing, dropped)."""
        return None

    def power_intervals(self, t0_ns: int, t1_ns: int) -> tuple[list[tuple[int, int, float]], float] | None:
        """The source's own power samples over [t0_ns, t1_ns] as (t0, t1, joules) intervals on energyprof's
        clock, with their median spacing (ns), where the sensor keeps any (NVML's buffered samples, finer
        than its readings); None where it keeps none, or they are not whole (the buffer dropped some)."""
        return None

    def describe(self) -> dict[str, Any]:
        out = {"id": self.id, "component": self.component, "method": self.method, "sensor": self.sensor,
               "detail": dict(self.detail)}
        if self.update_period_s is not None:
            out["update_period_s"] = self.update_period_s
        out["tier"] = self.tier
        return out


@record
class Discovery:
    """What was found, and why anything else was not (shown in the report's methodology)."""

    sensors: list[Sensor] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # one line each, for humans
    #: backend name -> the exact step that would enable it, for each backend that was looked for
    #: and not found (what `energyprof sensors` prints under "missing")
    missing: dict[str, str] = field(default_factory=dict)

    @classmethod
    def absent(cls, name: str, why: str, step: str, explicit: bool) -> Discovery:
        """Nothing found: the step that would enable the backend, and a note when it was asked for by name."""
        found = cls(missing={name: step})
        if explicit:
            found.notes.append(f"{name}: {why}; {step}")
        return found

    def extend(self, other: Discovery) -> None:
        self.sensors.extend(other.sensors)
        self.notes.extend(other.notes)
        for k, v in other.missing.items():
            self.missing.setdefault(k, v)


#: A counter is frozen when it stands still while its component is busy for this many of its update
#: periods, and for at least FROZEN_CPU_S of the machine's CPU time (a CPU counter) or FROZEN_GPU_S of a
#: GPU in use: /proc/stat counts in 10 ms ticks, a GPU's update period is detected from a few changes,
#: and a counter written by a program (a fake tree) may stall with it on a loaded machine, so a
#: counter is condemned only on a span far longer than its updates (a real RAPL counter moves every
#: millisecond, an NVML one about every 100 ms).
FROZEN_PERIODS = 5
FROZEN_CPU_S = 0.25
FROZEN_GPU_S = 1.0


class FrozenWatch:
    """Whether a cumulative counter stands still while its component is busy: then it is not a sensor.

    `busy_s(t_ns)` is a cumulative figure of how busy the component has been, in seconds: the
    machine's busy CPU time for RAPL and perf, the time the driver said the GPU was in use (its
    utilisation or power) for NVML. It is asked only once the counter has not moved for `quiet_ns`
    (a counter that moves at every read costs one comparison), and the counter is condemned once
    it has stood still while `needed_s` of busy time went by, over at least `quiet_ns` of wall time.
    """

    def __init__(self, what: str, busy_s: Callable[[int], float], needed_s: float, quiet_ns: int,
                 busy_text: str) -> None:
        self.what, self.busy_s, self.needed_s, self.quiet_ns, self.busy_text = what, busy_s, needed_s, quiet_ns, busy_text
        self.last: float | None = None
        self.moved_ns: int | None = None  # when the counter was last seen to move (or first read)
        self.base: tuple[int, float] | None = None  # (t_ns, busy_s) when the watch began asking
        self.why: str | None = None

    def saw(self, t_ns: int, raw: float) -> str | None:
        """One reading of the raw counter at `t_ns`; the reason it is frozen, once it is."""
        if raw != self.last or self.moved_ns is None:
            self.last, self.moved_ns, self.base = raw, t_ns, None
            return self.why
        if self.why is not None or t_ns - self.moved_ns < self.quiet_ns:
            return self.why
        try:
            busy = self.busy_s(t_ns)
        except Exception:  # noqa: BLE001 - no figure of how busy it is: nothing can be said
            return None
        if self.base is None:
            self.base = (t_ns, busy)
            return None
        t0, b0 = self.base
        if busy - b0 >= self.needed_s and t_ns - self.moved_ns >= self.quiet_ns:
            self.why = (f"{self.what} did not move in {(t_ns - self.moved_ns) / 1e9:.2f} s while "
                        f"{self.busy_text.format(busy=busy - b0)}: it counts nothing, so it is not a sensor")
        return self.why


def cpu_busy_s(t_ns: int) -> float:
    """The machine's busy CPU time, in CPU-seconds (all cores): how busy a CPU-class source was."""
    from .. import probes

    return probes.machine_busy_ns() / 1e9


def cpu_watch(what: str, update_period_s: float) -> FrozenWatch:
    """The watch of a CPU-class counter (RAPL, perf): busy is the machine's CPU time."""
    needed = max(FROZEN_PERIODS * update_period_s, FROZEN_CPU_S)
    return FrozenWatch(what, cpu_busy_s, needed, int(FROZEN_PERIODS * update_period_s * 1e9),
                       "the machine's CPUs were busy for {busy:.2f} CPU-s")


class Continued(Sensor):
    """A source read by another sensor from some moment on: its figure carries on from where the
    first left it (no jump), and it says what it replaces and why. Everything else is the new one's."""

    def __init__(self, old: Sensor, new: Sensor, t_ns: int, joules: float, at_s: float) -> None:
        detail = dict(new.detail)
        detail["replaces"] = {"sensor": old.sensor, "method": old.method, "tier": old.tier, "from_s": round(at_s, 3),
                              "why": old.frozen or ""}
        super().__init__(id=old.id, component=old.component, method=new.method, sensor=new.sensor, detail=detail,
                         update_period_s=new.update_period_s, tier=new.tier)
        self.inner = new
        self.offset = joules
        self.per_process_share = new.per_process_share  # type: ignore[misc]  (the one it continues with)
        new.start(t_ns)

    def read(self, t_ns: int) -> float:
        return self.offset + self.inner.read(t_ns)

    def process_share(self) -> float:
        return self.inner.process_share()  # type: ignore[attr-defined]

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # the new sensor's own surface (a GPU's share, its power samples)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


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


class PowerIntegrator:
    """Cumulative joules per channel from a stream of power readings, safe across threads.

    Two kinds of reading: `add_instant` (instantaneous watts at a time: trapezoids between
    readings) and `add_mean` (the mean watts over the interval that ended at a time: exact, mean
    x length). The interval is the tool's own `elapsed_ns` where it states one (powermetrics),
    since records can reach the reader late and bunched; else the time since the previous
    reading (macmon). `energy(channel, t_ns)` is the integral up to
    `t_ns`: up to the last reading, then the last power held (the stream lags the tick by up to
    one period; a later reading corrects the estimate, and the figure never steps back). A
    stream that has ended (`end()`) is not extrapolated.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._t: int | None = None
        self._w: dict[str, float] = {}
        self._j: dict[str, float] = {}
        self._shown: dict[str, float] = {}
        self.readings = 0
        self.ended = False
        self.first = threading.Event()  # set at the first reading (discovery waits for it)

    def add_instant(self, t_ns: int, watts: Mapping[str, float]) -> None:
        with self._lock:
            if self._t is not None and t_ns > self._t:
                dt = (t_ns - self._t) / 1e9
                for ch, w in watts.items():
                    self._j[ch] = self._j.get(ch, 0.0) + 0.5 * (self._w.get(ch, w) + w) * dt
            elif self._t is not None:
                return  # a reading out of order: the clock is monotonic, so it is a duplicate
            self._t = t_ns
            self._w = dict(watts)
            self.readings += 1
        self.first.set()

    def add_mean(self, t_ns: int, elapsed_ns: int | None, watts: Mapping[str, float]) -> None:
        with self._lock:
            if self._t is not None and t_ns <= self._t:
                return
            if elapsed_ns is not None:
                dt = elapsed_ns / 1e9
            else:  # since the previous reading; the first one only marks the start
                dt = (t_ns - self._t) / 1e9 if self._t is not None else 0.0
            for ch, w in watts.items():
                self._j[ch] = self._j.get(ch, 0.0) + w * dt
            self._t = t_ns
            self._w = dict(watts)
            self.readings += 1
        self.first.set()

    def end(self) -> None:
        with self._lock:
            self.ended = True

    def channels(self) -> list[str]:
        with self._lock:
            return list(self._w)

    def last_watts(self) -> dict[str, float]:
        with self._lock:
            return dict(self._w)

    def energy(self, channel: str, t_ns: int) -> float:
        with self._lock:
            j = self._j.get(channel, 0.0)
            if self._t is not None and not self.ended and t_ns > self._t:
                j += self._w.get(channel, 0.0) * (t_ns - self._t) / 1e9
            shown = max(j, self._shown.get(channel, 0.0))
            self._shown[channel] = shown
            return shown


class ChannelSensor(Sensor):
    """One channel (a rail, a component) of a shared power stream; `read` is a lookup, never I/O.

    The stream (a child tool's reader, or a polling thread) feeds one PowerIntegrator; every
    channel sensor of it holds a reference and the last one closed stops it.
    """

    def __init__(self, stream: Any, channel: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.channel = channel
        self._zero = 0.0
        stream.acquire()

    def start(self, t_ns: int) -> None:
        self._zero = self.stream.integrator.energy(self.channel, t_ns)

    def read(self, t_ns: int) -> float:
        if self.stream.failed is not None:
            raise SensorError(self.stream.failed)
        return self.stream.integrator.energy(self.channel, t_ns) - self._zero

    def close(self) -> None:
        self.stream.release()


def split_total(total: tuple[str, float] | None, parts: Mapping[str, float], other: str = "other") -> dict[str, float]:
    """Sources that never overlap: the measured parts, plus `other` = total - sum(parts)
    (clamped at 0: a part read a moment later than the total may exceed it), so that the
    sources add up to the total once. Without a total, the parts are the whole."""
    out = dict(parts)
    if total is not None:
        out[other] = max(0.0, total[1] - sum(parts.values()))
    return out
