"""A counter that does not move while its component is busy is not a sensor (RAPL, perf, NVML).

A VM's perf `power/energy-psys/` read 0 J all run, labelled measured; a RAPL counter that never moved
while the CPU burnt gave "cpu 0 J measured"; an NVML counter that never moved gave 0 J with no note.
Busy is the machine's CPU time for RAPL and perf (burnt here, for real), the driver's utilisation or
power for NVML (an injected binding). Once judged, the source carries on with the model (estimated)
or the GPU's power readings, says so in a note and in its `replaces` detail, and never jumps."""

from __future__ import annotations

import os
import resource
import time

import pytest

from energyprof import load
from energyprof.collect.sensors import perf
from energyprof.collect.sensors.gpu import nvml
from energyprof.drive.profiler import Profiler

from conftest import run_cli
from knob_trees import wait_for
from test_nvml import FakeGpu, FakeNvml, _injected
from test_sensor_perf import pmu
from test_sensors import make_zone

# Burns until this process's own CPU clock reaches 0.6 s: at least that much of the machine's CPU
# time is busy while the counter is read, over twice what condemns a counter (base.FROZEN_CPU_S).
BURN = """
import resource
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
s = 0
while cpu() < 0.6:
    for i in range(10_000):
        s += i
"""


def _burn_cpu(seconds: float) -> None:
    start = resource.getrusage(resource.RUSAGE_SELF)
    while True:
        r = resource.getrusage(resource.RUSAGE_SELF)
        if r.ru_utime + r.ru_stime - start.ru_utime - start.ru_stime >= seconds:
            return
        sum(i for i in range(10_000))


def test_a_frozen_rapl_counter_is_not_measured(tmp_path):
    root = tmp_path / "powercap"
    make_zone(root, "intel-rapl:0", "package-0", energy_uj=123_456_789)  # never changes
    (tmp_path / "burn.py").write_text(BURN)
    res = run_cli(["-q", "--powercap-root", str(root), "--json", "p.json", "-o", "r.html", "burn.py"], tmp_path)
    assert res.returncode == 0, res.stderr
    p = load(tmp_path / "p.json")
    cpu = p.source("cpu")
    assert (cpu.method, cpu.sensor, cpu.tier) == ("estimated", "model", "model")
    assert cpu.detail["replaces"]["sensor"] == "rapl" and "did not move" in cpu.detail["replaces"]["why"]
    frozen = [n for n in p.notes if n["kind"] == "sensor-frozen"]
    assert len(frozen) == 1 and frozen[0]["source"] == "cpu" and "not a sensor" in frozen[0]["message"]
    assert p.totals["energy_j"]["cpu"] > 0  # the model's, from the moment the counter was judged


def test_a_moving_rapl_counter_stays_measured(tmp_path):
    """The same run with a counter that moves as power is drawn: nothing is judged."""
    from test_sensors import CounterWriter

    root = tmp_path / "powercap"
    zone = make_zone(root, "intel-rapl:0", "package-0")
    writer = CounterWriter(zone, 20.0, 262_143_328_850)
    writer.start()
    try:
        (tmp_path / "burn.py").write_text(BURN)
        res = run_cli(["-q", "--powercap-root", str(root), "--json", "p.json", "-o", "r.html", "burn.py"], tmp_path)
    finally:
        writer.stop.set()
        writer.join()
    assert res.returncode == 0, res.stderr
    p = load(tmp_path / "p.json")
    assert (p.source("cpu").method, p.source("cpu").sensor) == ("measured", "rapl")
    assert not [n for n in p.notes if n["kind"] == "sensor-frozen"]


def test_sensors_lists_a_frozen_counter_and_why(tmp_path):
    make_zone(tmp_path / "pc", "intel-rapl:0", "package-0", energy_uj=42)
    res = run_cli(["sensors", "--powercap-root", str(tmp_path / "pc")], tmp_path)
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if ln.lstrip().startswith("cpu "))
    assert "FROZEN" in line and "measured" not in line
    assert "not counting" in res.stdout and "did not move" in res.stdout


def test_a_frozen_perf_counter_is_not_measured(tmp_path, monkeypatch):
    # The stand-in: a `power` PMU described in sysfs whose event reads 0, always (as psys did on a VM).
    root = pmu(tmp_path / "power", events={"energy-pkg": ("event=0x02", "2.3283064365386962890625e-10")})
    monkeypatch.setenv("ENERGYPROF_PERF_ROOT", str(root))
    monkeypatch.setattr(perf, "open_event", lambda *a: os.open(os.devnull, os.O_RDONLY))
    prof = Profiler(quiet=True, summary=False, sensor=["perf"], sensor_interval=0.01)
    prof.start()
    try:
        _burn_cpu(0.6)
        assert wait_for(lambda: any(n["kind"] == "sensor-frozen" for n in prof._collector.notes), 30)
        _burn_cpu(0.05)
    finally:
        profile = prof.stop()
    cpu = profile.source("cpu")
    assert (cpu.method, cpu.sensor) == ("estimated", "model") and cpu.detail["replaces"]["sensor"] == "perf"
    assert any(n["kind"] == "sensor-frozen" and "power/energy-pkg/" in n["message"] for n in profile.notes)
    assert profile.totals["energy_j"]["cpu"] > 0


def test_a_frozen_nvml_counter_is_read_by_its_power(monkeypatch):
    gpu = FakeGpu(power_w=100.0)
    gpu.counter_override = 7_000_000  # mJ, flat, while the driver says the GPU draws 100 W
    gpu.processes = [os.getpid()]
    with _injected(FakeNvml([gpu])):
        prof = Profiler(quiet=True, summary=False, sensor=["nvml"], sensor_interval=0.01)
        prof.start()
        try:
            # judged after FROZEN_PERIODS update periods of a busy GPU: waited for, not timed
            assert wait_for(lambda: any(n["kind"] == "sensor-frozen" for n in prof._collector.notes), 30)
            at = next(n["at_s"] for n in prof._collector.notes if n["kind"] == "sensor-frozen")
            time.sleep(0.2)
        finally:
            profile = prof.stop()
    src = profile.source("gpu:0")
    assert src.tier == "integrated" and src.method == "measured" and "instant power" in src.detail["reading"]
    assert src.detail["replaces"]["tier"] == "counter" and "did not move" in src.detail["replaces"]["why"]
    assert at >= nvml.FROZEN_GPU_S
    # 0 J while the counter was read, then 100 W held: the power's integral from the moment it was judged
    assert profile.totals["energy_j"]["gpu:0"] == pytest.approx(100.0 * (profile.totals["duration_s"] - at), rel=0.1)


def test_a_frozen_nvml_counter_with_no_power_either_is_dropped(monkeypatch):
    gpu = FakeGpu(power_w=0.0)
    gpu.counter_override = 7_000_000
    monkeypatch.setattr(FakeNvml, "nvmlDeviceGetUtilizationRates", lambda self, g: type("U", (), {"gpu": 80})(),
                        raising=False)  # the driver says busy: 80% of the time a kernel ran
    with _injected(FakeNvml([gpu])):
        prof = Profiler(quiet=True, summary=False, sensor=["nvml"], sensor_interval=0.01)
        prof.start()
        try:
            assert wait_for(lambda: any(n["kind"] == "sensor-dropped" for n in prof._collector.notes), 30)
        finally:
            profile = prof.stop()
    note = next(n for n in profile.notes if n["kind"] == "sensor-dropped")
    assert note["source"] == "gpu:0" and "in use or drew power" in note["message"]
    assert "did not move" in profile.source("gpu:0").extra["frozen"]


def test_the_watch_condemns_only_a_still_counter_over_enough_busy_time():
    from energyprof.collect.sensors.base import FrozenWatch

    busy = {"s": 0.0}
    asked = []

    def busy_s(t_ns: int) -> float:
        asked.append(t_ns)
        return busy["s"]

    ms = 1_000_000
    w = FrozenWatch("c", busy_s, needed_s=0.25, quiet_ns=5 * ms, busy_text="busy {busy:.2f}")
    for k in range(100):  # moves at every read: never asks how busy, never condemned, whatever the load
        busy["s"] += 1.0
        assert w.saw(k * 10 * ms, float(k)) is None
    assert asked == []
    w.saw(1000 * ms, 5.0)
    w.saw(1002 * ms, 5.0)  # still within quiet_ns: not asked yet
    assert asked == []
    w.saw(1010 * ms, 5.0)  # asked: the base
    busy["s"] += 0.2
    assert w.saw(1020 * ms, 5.0) is None  # 0.2 busy-s < 0.25
    busy["s"] += 0.1
    assert "did not move in 0.03 s while busy 0.30" in w.saw(1030 * ms, 5.0)
    w2 = FrozenWatch("c", busy_s, needed_s=0.25, quiet_ns=5 * ms, busy_text="{busy}")
    w2.saw(0, 1.0)
    w2.saw(10 * ms, 1.0)
    busy["s"] += 10.0
    assert w2.saw(20 * ms, 2.0) is None  # it moved: judged afresh from here
    assert w2.saw(30 * ms, 2.0) is None and w2.saw(40 * ms, 2.0) is None  # idle since: not condemned
