"""The GPU machine's own CPU at rest: what energyprof asks of NVML and /proc at each sensor tick,
counted through an injected NVML binding (no wall time: the calls themselves are the cost)."""

from __future__ import annotations

import os
from collections import Counter

from energyprof.collect.sensors.gpu import share
from test_nvml import FakeGpu, found
from test_power_samples import SamplingNvml

MS = 1_000_000


class CountingNvml(SamplingNvml):
    """The fake binding, each NVML call counted by name."""

    def __init__(self, gpus, ring=None):
        super().__init__(gpus, ring=ring)
        self.calls: Counter[str] = Counter()

    def __getattribute__(self, name):
        value = object.__getattribute__(self, name)
        if name.startswith("nvml") and callable(value):
            calls = object.__getattribute__(self, "calls")

            def counted(*a, **k):
                calls[name] += 1
                return value(*a, **k)

            return counted
        return value

    def nvmlDeviceGetComputeRunningProcesses(self, g):
        from types import SimpleNamespace

        return [SimpleNamespace(pid=p, usedGpuMemory=0) for p in g.processes]


def _rest(monkeypatch, seconds: float = 20.0, tick_ms: int = 50, processes=None):
    """`seconds` of a program at rest on one GPU at the default sensor interval: per-tick reads and
    shares, on a fake clock; (NVML calls by name, family walks, ticks)."""
    now = [0.0]
    monkeypatch.setattr(share.time, "monotonic", lambda: now[0])
    walks = []
    real = share.own_pids
    monkeypatch.setattr(share, "own_pids", lambda: walks.append(1) or real())
    gpu = FakeGpu()
    gpu.processes = [os.getpid()] if processes is None else processes
    t0_us = 1_000
    nv = CountingNvml([gpu], ring=[(t0_us + 20_000 * k, 100_000) for k in range(2000)])
    (sensor,) = found(nv).sensors
    sensor.start(0)
    nv.calls.clear()
    ticks = int(seconds * 1000 / tick_ms)
    for k in range(1, ticks + 1):
        t = k * tick_ms * MS
        now[0] = t / 1e9
        sensor.read(t)
        sensor.process_share()
    sensor.close()
    return nv.calls, len(walks), ticks


def test_nvml_calls_per_tick_at_rest(monkeypatch):
    """20 s at rest, 400 ticks: the energy counter once a tick (the reading itself), the driver's
    power samples once a second (not every tick), the process list every SHARE_REFRESH_S, and the
    program's family walked in /proc once (not at every refresh)."""
    calls, walks, ticks = _rest(monkeypatch)
    assert calls["nvmlDeviceGetTotalEnergyConsumption"] == ticks
    assert calls["nvmlDeviceGetSamples"] <= 21  # was one a tick: 400
    assert calls["nvmlDeviceGetComputeRunningProcesses"] <= 41  # every 0.5 s
    assert walks == 1  # was one a refresh: 40, each reading a file per thread of each process
    assert calls["nvmlDeviceGetFieldValues"] <= 21  # the frozen-counter check's instant power, once a second
    per_tick = sum(n for name, n in calls.items() if name != "nvmlShutdown") / ticks
    assert per_tick <= 1.25  # was 2.1 (2.15 with the frozen-counter check), with a /proc walk every 10 ticks


def test_a_new_process_on_the_gpu_walks_the_family_again(monkeypatch):
    calls, walks, _ = _rest(monkeypatch, seconds=2.0, processes=[os.getpid(), 999_999])
    assert walks == 1  # 999999 is not ours: known as such after one walk, not walked for again


def test_a_hole_in_the_drained_samples_drains_more_often():
    from energyprof.collect.sensors.gpu.power_samples import DRAIN_NS, SampleBuffer

    ring = [(1_000 + 20_000 * k, 100_000) for k in range(10)]
    nv = SamplingNvml([FakeGpu()], ring=ring)
    buf = SampleBuffer(nv, nv.gpus[0])
    buf.drain(0)
    assert len(buf.samples) == 10 and buf.period_ns == DRAIN_NS
    buf.drain(DRAIN_NS // 2)  # not due: no call
    assert len(nv.asked) == 1
    nv.ring = [(1_000 + 20_000 * k, 100_000) for k in range(30, 40)]  # 20 samples lost to the ring
    buf.drain(DRAIN_NS)
    assert buf.holes == 1 and buf.period_ns == DRAIN_NS // 2 and len(nv.asked) == 2
