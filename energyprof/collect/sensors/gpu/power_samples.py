"""The driver's buffered power samples (`nvmlDeviceGetSamples`, NVML_TOTAL_POWER_SAMPLES): power
at the driver's own rate (every ~20-100 ms, by GPU), each with the CPU time it was taken at, read
since the last one seen. They give the kernel split finer power than the collector's ticks.

The driver keeps a short ring of samples. Draining it at every tick cost two NVML calls a tick (the
pynvml wrapper asks for the count, then the samples) for samples that come every 20-100 ms: the
sensor drains it every DRAIN_NS instead (two calls a second), and halves that period whenever a
drain finds a hole (a gap of more than two sample spacings after the last sample seen: the ring had
wrapped), down to every tick. Timestamps are Unix
microseconds; `to_intervals` puts them on energyprof's clock (perf_counter_ns) with the offset
taken at the drain. amdsmi offers no buffered power samples (its power reads are instant or
averaged), so an AMD GPU keeps the ticks' power.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

TOTAL_POWER_SAMPLES = 0  # nvmlSamplingType_t NVML_TOTAL_POWER_SAMPLES
MAX_SAMPLES = 300_000  # ~100 min at 20 ms (~30 MB): past this the split uses the ticks' power for the whole run
DRAIN_NS = 1_000_000_000  # the ring is drained at most this often (halved at each hole found)
_VALUE_FIELDS = ("uiVal", "ulVal", "ullVal", "dVal", "sllVal")


def _value(v: Any) -> float:
    for f in _VALUE_FIELDS:
        x = getattr(v, f, None)
        if x is not None:
            return float(x)
    return float(v)


class SampleBuffer:
    """One GPU's power samples as (perf_counter_ns, watts), drained from the driver at each tick."""

    def __init__(self, nv: Any, handle: Any) -> None:
        self.nv, self.handle = nv, handle
        self.samples: list[tuple[int, float]] = []
        self.last_us = 0
        self.usable = callable(getattr(nv, "nvmlDeviceGetSamples", None))
        self.why_not = "" if self.usable else "the NVML binding has no nvmlDeviceGetSamples"
        self.dropped = 0
        self.period_ns = DRAIN_NS
        self.holes = 0  # drains that found the ring had wrapped since the one before
        self._next_ns: int | None = None

    def drain(self, t_ns: int | None = None) -> None:
        """Read the samples since the last one seen; a failure turns the buffer off (never raises).
        With `t_ns` (a sensor tick's time), only when the drain period has passed since the last."""
        if not self.usable:
            return
        if t_ns is not None:
            if self._next_ns is not None and t_ns < self._next_ns:
                return
            self._next_ns = t_ns + self.period_ns
        before = self.last_us
        try:
            kind = getattr(self.nv, "NVML_TOTAL_POWER_SAMPLES", TOTAL_POWER_SAMPLES)
            _, got = self.nv.nvmlDeviceGetSamples(self.handle, kind, self.last_us)
            offset = time.time_ns() - time.perf_counter_ns()  # Unix - perf now; the two clocks tick together
        except Exception as exc:  # noqa: BLE001 - NVMLError (not supported, no data yet...), whatever the binding
            if "not found" in str(exc).lower() and not self.samples:  # NVML_ERROR_NOT_FOUND: no sample yet
                return
            self.usable, self.why_not = False, f"nvmlDeviceGetSamples failed ({exc})"
            return
        for s in sorted(got or (), key=lambda s: int(s.timeStamp)):
            ts = int(s.timeStamp)
            if ts <= self.last_us:
                continue
            self.last_us = ts
            if len(self.samples) >= MAX_SAMPLES:
                self.dropped += 1
                continue
            self.samples.append((ts * 1000 - offset, _value(s.sampleValue) / 1000.0))  # mW -> W
        self._check_hole(before, got)

    def _check_hole(self, before_us: int, got: Any) -> None:
        """A first new sample more than two spacings after the last one seen: the ring wrapped between
        drains. Drain twice as often from now on."""
        if not before_us or not got or len(self.samples) < 3:
            return
        first = min(int(s.timeStamp) for s in got)
        spacing = median_spacing_ns(self.samples[-64:]) / 1000.0
        if spacing > 0 and first > before_us and first - before_us > 2 * spacing:
            self.holes += 1
            self.period_ns = max(1, self.period_ns // 2)


def to_intervals(samples: Sequence[tuple[int, float]], t_lo: int, t_hi: int) -> list[tuple[int, int, float]]:
    """(t0, t1, joules) in [t_lo, t_hi]: each sample's power held until the next sample (the last
    until t_hi). Whether the driver's sample averages the period before or after it is not
    documented: the split's timing error is up to one sample period, which `period_ns` states."""
    out = []
    for i, (t, w) in enumerate(samples):
        end = samples[i + 1][0] if i + 1 < len(samples) else t_hi
        a, b = max(t, t_lo), min(end, t_hi)
        if b > a:
            out.append((a, b, w * (b - a) / 1e9))
    return out


def median_spacing_ns(samples: Sequence[tuple[int, float]]) -> float:
    gaps = sorted(b[0] - a[0] for a, b in zip(samples, samples[1:]) if b[0] > a[0])
    return float(gaps[len(gaps) // 2]) if gaps else 0.0
