"""nvmlDeviceGetSamples: the driver's buffered power samples, against a fake NVML binding whose
samples have known times and powers, so each interval's joules are exact."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from energyprof.collect.sensors.gpu.power_samples import SampleBuffer, median_spacing_ns, to_intervals
from test_nvml import FakeGpu, FakeNvml, NVMLError, found

MS = 1_000_000


class SamplingNvml(FakeNvml):
    """FakeNvml with the driver's power sample ring: (Unix us, mW) pairs a test puts in."""

    NVML_TOTAL_POWER_SAMPLES = 0

    def __init__(self, gpus, ring=None, error=None):
        super().__init__(gpus)
        self.ring = ring or []
        self.error = error
        self.asked = []

    def nvmlDeviceGetSamples(self, g, kind, last_seen_us):
        assert kind == self.NVML_TOTAL_POWER_SAMPLES
        self.asked.append(last_seen_us)
        if self.error is not None:
            raise NVMLError(self.error)
        got = [SimpleNamespace(timeStamp=ts, sampleValue=SimpleNamespace(uiVal=mw)) for ts, mw in self.ring if ts > last_seen_us]
        return 1, got


def test_samples_become_intervals_of_known_joules():
    t0_us = time.time_ns() // 1000 - 1_000_000
    nv = SamplingNvml([FakeGpu()], ring=[(t0_us, 100_000), (t0_us + 100_000, 300_000), (t0_us + 200_000, 200_000)])
    buf = SampleBuffer(nv, nv.gpus[0])
    buf.drain()
    buf.drain()  # the second read asks only for samples after the last seen: none twice
    assert nv.asked == [0, t0_us + 200_000] and len(buf.samples) == 3
    t = [s[0] for s in buf.samples]
    assert t[1] - t[0] == 100 * MS and t[2] - t[1] == 100 * MS
    # the ticks' span: the first sample to 100 ms after the last
    ivs = to_intervals(buf.samples, t[0], t[2] + 100 * MS)
    assert [(b - a, round(j, 9)) for a, b, j in ivs] == [(100 * MS, 10.0), (100 * MS, 30.0), (100 * MS, 20.0)]
    assert median_spacing_ns(buf.samples) == 100 * MS
    # clipped to a span inside: each sample's power held over its part
    assert sum(j for _, _, j in to_intervals(buf.samples, t[0] + 50 * MS, t[1] + 50 * MS)) == pytest.approx(5.0 + 15.0)
    # perf_counter of a sample is its Unix time less the clocks' offset (to the drain's read, well under 50 ms)
    assert abs((t[0] + time.time_ns() - time.perf_counter_ns()) - t0_us * 1000) < 50 * MS


def test_no_binding_function_or_a_failure_turns_it_off_without_raising():
    buf = SampleBuffer(FakeNvml([FakeGpu()]), None)
    buf.drain()
    assert not buf.usable and "no nvmlDeviceGetSamples" in buf.why_not
    nv = SamplingNvml([FakeGpu()], error=3)
    buf = SampleBuffer(nv, nv.gpus[0])
    buf.drain()
    buf.drain()
    assert not buf.usable and "Not Supported" in buf.why_not and nv.asked == [0]


def test_the_nvml_sensor_drains_at_each_read_and_offers_the_intervals():
    from energyprof.collect.kernels.capture import driver_samples

    now_us = time.time_ns() // 1000
    ring = [(now_us - 400_000 + 20_000 * i, 100_000 + 10_000 * (i % 2)) for i in range(20)]  # 100 / 110 W every 20 ms
    nv = SamplingNvml([FakeGpu(power_w=105.0)], ring=ring)
    d = found(nv)
    (s,) = d.sensors
    s.start(time.perf_counter_ns())
    s.read(time.perf_counter_ns())
    assert len(s.samples.samples) == 20
    first, last = s.samples.samples[0][0], s.samples.samples[-1][0]
    ticks = [(first, first + 200 * MS, 0.0), (first + 200 * MS, last + 20 * MS, 0.0)]
    ivs, spacing = driver_samples(s, ticks, 100 * MS)
    assert spacing == 20 * MS and len(ivs) == 20
    assert sum(j for _, _, j in ivs) == pytest.approx(10 * 0.020 * 100 + 10 * 0.020 * 110)  # 42 J
    assert driver_samples(None, ticks, 100 * MS) is None  # no sensor of this process read the source
    # samples no closer together than the sensor's ticks are no finer than the ticks
    assert driver_samples(s, ticks, 20 * MS) is None
    s.samples.dropped = 1  # the buffer's cap was reached: the run's end has no samples, so none are used
    assert driver_samples(s, ticks, 100 * MS) is None
    from energyprof.collect.sensors.base import Sensor

    # a sensor that keeps no samples says so through the interface's declared method
    assert driver_samples(Sensor("gpu:0", "gpu:0", "measured", "replay"), ticks, 100 * MS) is None
    s.close()
