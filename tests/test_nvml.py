"""The NVML sensor against a fake NVML binding: the hardware boundary is the only thing faked.

The fake answers with pynvml's function names and error conventions; each fake GPU draws a
known power, so every figure the sensor reports has an exact or tightly bounded answer.
"""

from __future__ import annotations

import math
import os
import time
from types import SimpleNamespace
from typing import Any

import pytest

from energyprof.drive.profiler import Profiler
from energyprof.collect.sensors.gpu import nvml, nvml_device
from energyprof.collect.sensors.base import SensorError


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {3: "Not Supported", 9: "Driver Not Loaded", 12: "NVML Shared Library Not Found",
                15: "GPU is lost"}.get(self.value, f"error {self.value}")


class FakeGpu:
    """One GPU drawing `power_w`; its counter (mJ) advances in steps of `period_s`."""

    def __init__(self, name: str = "NVIDIA H100 80GB HBM3", bus: str = "00000000:3B:00.0",
                 uuid: str = "GPU-aaaa", power_w: float = 100.0, period_s: float = 0.02,
                 counter: bool = True, instant: bool = True, mig: int | None = 0, limit_mw: int = 700_000) -> None:
        self.name, self.bus, self.uuid = name, bus, uuid
        self.power_w, self.period_s = power_w, period_s
        self.has_counter, self.has_instant, self.mig, self.limit_mw = counter, instant, mig, limit_mw
        self.clock = time.perf_counter  # a test may hand in a fake clock shared with the detector
        self.t0 = self.clock()
        self.base_mj = 5_000_000.0  # energy since "driver load", before we look
        self.counter_override: int | float | None = None  # a test sets the raw counter directly
        self.lost = False
        self.fail_after: int | None = None  # lose the GPU after this many energy/power reads
        self.reads = 0
        self.average_calls = 0
        self.processes: list[int] = []
        self.util: list[tuple[int, int]] = []  # (pid, smUtil)

    def _tick(self) -> None:
        self.reads += 1
        if self.fail_after is not None and self.reads > self.fail_after:
            self.lost = True
        if self.lost:
            raise NVMLError(15)

    def counter_mj(self) -> float:
        self._tick()
        if not self.has_counter:
            raise NVMLError(3)
        if self.counter_override is not None:
            return self.counter_override
        steps = math.floor((self.clock() - self.t0) / self.period_s)
        return self.base_mj + self.power_w * steps * self.period_s * 1000.0

    def power_mw(self) -> float:
        self._tick()
        return self.power_w * 1000.0


class FakeNvml:
    """A stand-in for the `pynvml` module."""

    NVMLError = NVMLError
    NVML_FI_DEV_POWER_INSTANT = 186
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_NO_PERMISSION = 4

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.inits = 0
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetName(self, g: FakeGpu) -> str:
        return g.name

    def nvmlDeviceGetUUID(self, g: FakeGpu) -> str:
        return g.uuid

    def nvmlDeviceGetPciInfo(self, g: FakeGpu) -> Any:
        return SimpleNamespace(busId=g.bus.encode())  # the real binding gives bytes

    def nvmlDeviceGetEnforcedPowerLimit(self, g: FakeGpu) -> int:
        return g.limit_mw

    def nvmlDeviceGetMigMode(self, g: FakeGpu) -> list[int]:
        if g.mig is None:
            raise NVMLError(3)
        return [g.mig, g.mig]

    def nvmlDeviceGetTotalEnergyConsumption(self, g: FakeGpu) -> float:
        return g.counter_mj()

    def nvmlDeviceGetFieldValues(self, g: FakeGpu, fields: list[int]) -> list[Any]:
        assert fields == [self.NVML_FI_DEV_POWER_INSTANT]
        if not g.has_instant:
            return [SimpleNamespace(nvmlReturn=3, valueType=1, value=SimpleNamespace(uiVal=0))]
        return [SimpleNamespace(nvmlReturn=0, valueType=1, value=SimpleNamespace(uiVal=g.power_mw()))]

    def nvmlDeviceGetPowerUsage(self, g: FakeGpu) -> float:
        g.average_calls += 1
        return g.power_mw()

    def nvmlDeviceGetComputeRunningProcesses(self, g: FakeGpu) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=0) for p in g.processes]

    def nvmlDeviceGetProcessUtilization(self, g: FakeGpu, ts: int) -> list[Any]:
        if not g.util:
            raise NVMLError(6)
        return [SimpleNamespace(pid=p, smUtil=u, memUtil=0, timeStamp=ts + 1) for p, u in g.util]


def found(fake: FakeNvml, env: dict[str, str] | None = None, budget: float = 0.05) -> Any:
    return nvml.discover(fake, env=env if env is not None else {}, detect_budget_s=budget)


# -- counters ------------------------------------------------------------------------------
def test_counter_reset_and_wrap_are_not_negative_energy() -> None:
    gpu = FakeGpu()
    d = found(FakeNvml([gpu]))
    (s,) = d.sensors
    assert s.detail["reading"].startswith("energy counter")
    gpu.counter_override = 1_000_000.0
    s.start(0)
    gpu.counter_override = 1_002_500.0
    assert s.read(1) == pytest.approx(2.5)
    gpu.counter_override = 400.0  # driver reloaded: the counter restarts near zero
    assert s.read(2) == pytest.approx(2.9)
    gpu.counter_override = 1_400.0
    assert s.read(3) == pytest.approx(3.9)
    assert s.describe()["detail"]["counter_resets"] == 1
    # a 64-bit wrap (theoretical, but the arithmetic must hold)
    gpu.counter_override = 2**64 - 1000
    s.start(0)
    gpu.counter_override = 500.0
    assert s.read(1) == pytest.approx(1.5, abs=1e-3)


class FakeClock:
    """perf_counter and sleep for the update-period detector: time moves only when it sleeps, so
    the detection's answers do not depend on how busy the machine is."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_metadata_and_update_period_are_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(nvml, "time", clock)
    gpu = FakeGpu(power_w=250.0, period_s=0.02)
    gpu.clock, gpu.t0 = clock.perf_counter, clock.now
    d = found(FakeNvml([gpu]), budget=0.3)
    (s,) = d.sensors
    desc = s.describe()
    assert desc["id"] == desc["component"] == "gpu:0"
    assert desc["method"] == "measured" and desc["sensor"] == "nvml"
    assert desc["detail"]["name"] == "NVIDIA H100 80GB HBM3"
    assert desc["detail"]["power_limit_w"] == 700.0
    assert desc["detail"]["driver"] == "550.54.15"
    assert desc["detail"]["pci_bus_id"] == "00000000:3B:00.0"
    assert desc["detail"]["update_period_detected"] is True
    assert desc["update_period_s"] == pytest.approx(0.02, abs=nvml.DETECT_POLL_S)  # to one poll


def test_detection_is_bounded_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(nvml, "time", clock)
    gpus = [FakeGpu(bus=f"00000000:{b:02X}:00.0", uuid=f"GPU-{b}", period_s=5.0) for b in (1, 2, 3, 4)]
    start = clock.now
    d = nvml.discover(FakeNvml(gpus), env={})  # the default budget, all GPUs polled together
    assert len(d.sensors) == 4
    # the budget is for all GPUs together, not per GPU: one budget and at most one more poll
    assert clock.now - start <= nvml.DETECT_BUDGET_S + nvml.DETECT_POLL_S + 1e-9
    # a counter that never moved during detection: the documented default, marked undetected
    assert all(s.update_period_s == nvml.DEFAULT_UPDATE_PERIOD_S for s in d.sensors)
    assert not any(s.detail["update_period_detected"] for s in d.sensors)


# -- power-only GPUs -----------------------------------------------------------------------
def test_power_only_gpu_integrates_instant_power_exactly() -> None:
    gpu = FakeGpu(counter=False, power_w=150.0)
    d = found(FakeNvml([gpu]))
    (s,) = d.sensors
    assert s.detail["reading"].startswith("instant power")
    assert "no energy counter" in s.detail["why_not_counter"]
    s.start(1_000_000_000)
    assert s.read(1_500_000_000) == pytest.approx(75.0, rel=1e-12)
    assert s.read(3_000_000_000) == pytest.approx(300.0, rel=1e-12)
    gpu.power_w = 50.0  # a step: the trapezoid charges the mean of the two ends
    assert s.read(4_000_000_000) == pytest.approx(300.0 + 100.0, rel=1e-12)
    assert gpu.average_calls == 0  # never the 1 s average when the instant field exists


def test_average_power_is_the_last_resort_and_says_so() -> None:
    gpu = FakeGpu(counter=False, instant=False, power_w=80.0)
    d = found(FakeNvml([gpu]))
    (s,) = d.sensors
    assert s.detail["reading"].startswith("nvmlDeviceGetPowerUsage")
    assert any("1 s" in n for n in d.notes)
    s.start(0)
    assert s.read(2_000_000_000) == pytest.approx(160.0)


def test_power_only_gpu_in_a_real_profile_is_power_times_duration() -> None:
    gpu = FakeGpu(counter=False, power_w=150.0)
    fake = FakeNvml([gpu])
    gpu.processes = [os.getpid()]
    with _injected(fake):
        prof = Profiler(quiet=True, summary=False)
        prof.start()
        _spin(0.3)
        profile = prof.stop()
    e = profile.totals["energy_j"]["gpu:0"]
    assert e == pytest.approx(150.0 * profile.totals["duration_s"], rel=1e-6)
    assert profile.source("gpu:0")["detail"]["name"] == "NVIDIA H100 80GB HBM3"
    # Every NVML session is closed with the profile: the sensors' one, and the settings' read (once
    # per process, so absent when an earlier test in this process made it).
    assert fake.shutdowns == fake.inits and fake.inits in (1, 2)


# -- numbering -----------------------------------------------------------------------------
def two_gpus() -> tuple[FakeGpu, FakeGpu]:
    # NVML's index 0 sits at the higher PCI address: NVML's order is not CUDA's.
    far = FakeGpu(name="NVIDIA A100-SXM4-40GB", bus="00000000:81:00.0", uuid="GPU-81ab", power_w=300.0)
    near = FakeGpu(name="NVIDIA A100-SXM4-40GB", bus="00000000:3B:00.0", uuid="GPU-3bcd", power_w=60.0)
    return far, near


def test_gpus_are_numbered_by_pci_bus_id() -> None:
    far, near = two_gpus()
    d = found(FakeNvml([far, near]), env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert [s.id for s in d.sensors] == ["gpu:0", "gpu:1"]
    assert [s.detail["pci_bus_id"] for s in d.sensors] == ["00000000:3B:00.0", "00000000:81:00.0"]
    assert [s.detail["nvml_index"] for s in d.sensors] == [1, 0]


@pytest.mark.parametrize("spec", ["1", "GPU-81", "1,7"])
def test_cuda_visible_devices_hides_a_gpu(spec: str) -> None:
    far, near = two_gpus()
    d = found(FakeNvml([far, near]), env={"CUDA_VISIBLE_DEVICES": spec})
    (s,) = d.sensors
    # CUDA index 1 in PCI order is the GPU at 81:00.0, NVML's index 0; it is cuda:0 now.
    assert s.id == "gpu:0"
    assert s.detail["pci_bus_id"] == "00000000:81:00.0" and s.detail["nvml_index"] == 0
    assert any("hides 1 of 2" in n for n in d.notes)
    # and the figures are that GPU's, not the other's
    far.counter_override = 1000.0
    s.start(0)
    far.counter_override = 301_000.0
    assert s.read(1) == pytest.approx(300.0)


def test_cuda_visible_devices_empty_or_invalid_hides_everything() -> None:
    far, near = two_gpus()
    assert found(FakeNvml([far, near]), env={"CUDA_VISIBLE_DEVICES": ""}).sensors == []
    d = found(FakeNvml([far, near]), env={"CUDA_VISIBLE_DEVICES": "-1"})
    assert d.sensors == [] and any("-1" in n for n in d.notes)


def test_cuda_numbering_from_cuda_itself_wins() -> None:
    far, near = two_gpus()
    gpus = [nvml.GpuInfo(0, far, nvml.parse_bus_id(far.bus), far.bus, far.uuid, far.name),
            nvml.GpuInfo(1, near, nvml.parse_bus_id(near.bus), near.bus, near.uuid, near.name)]
    # CUDA (fastest first, say) put the 81:00.0 GPU first; the env is then irrelevant
    visible, _ = nvml.visible_order(gpus, {"CUDA_VISIBLE_DEVICES": "0"}, cuda_bus_ids=[(0, 0x81, 0), (0, 0x3B, 0)])
    assert [g.nvml_index for g in visible] == [0, 1]


def test_mixed_models_without_pci_order_are_flagged() -> None:
    a = FakeGpu(name="NVIDIA A100", bus="00000000:01:00.0", uuid="GPU-1")
    b = FakeGpu(name="NVIDIA T4", bus="00000000:02:00.0", uuid="GPU-2")
    d = found(FakeNvml([a, b]), env={})
    assert len(d.sensors) == 2
    assert any("CUDA_DEVICE_ORDER" in n for n in d.notes)


# -- failures ------------------------------------------------------------------------------
def test_mig_gpu_gets_a_note_not_a_sensor() -> None:
    mig = FakeGpu(bus="00000000:01:00.0", uuid="GPU-1", mig=1)
    plain = FakeGpu(bus="00000000:02:00.0", uuid="GPU-2", mig=None)  # MIG not supported at all
    d = found(FakeNvml([mig, plain]))
    assert [s.detail["pci_bus_id"] for s in d.sensors] == ["00000000:02:00.0"]
    assert [s.id for s in d.sensors] == ["gpu:1"]  # CUDA's index of that GPU, not a renumbering
    assert any("MIG" in n and "gpu:0" in n for n in d.notes)


@pytest.mark.parametrize("code,words", [(9, "driver is not loaded"), (12, "no NVIDIA driver library")])
def test_missing_driver_is_a_note(code: int, words: str) -> None:
    d = found(FakeNvml([FakeGpu()], init_error=code))
    assert d.sensors == []
    assert len(d.notes) == 1 and words in d.notes[0]


def test_missing_binding_is_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setattr(nvml_device, "BINDING", None)
    monkeypatch.setattr(nvml_device, "DRIVER_PATHS", ("/",))  # as if a driver were loaded
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    d = nvml.discover()
    assert d.sensors == [] and "nvidia-ml-py is not installed" in d.notes[0]


def test_no_driver_is_a_note_without_importing_the_binding(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import sys

    monkeypatch.setattr(nvml_device, "BINDING", None)
    monkeypatch.setattr(nvml_device, "DRIVER_PATHS", (str(tmp_path / "no-driver"),))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # an import would say "not installed" instead
    d = nvml.discover()
    assert d.sensors == [] and "driver is not loaded" in d.notes[0]


def test_a_lost_gpu_raises_sensor_error() -> None:
    gpu = FakeGpu()
    (s,) = found(FakeNvml([gpu])).sensors
    s.start(0)
    gpu.lost = True
    with pytest.raises(SensorError, match="GPU is lost"):
        s.read(1)


def test_gpu_lost_mid_run_is_dropped_and_the_run_goes_on() -> None:
    far, near = two_gpus()
    far.processes = near.processes = [os.getpid()]
    fake = FakeNvml([far, near])
    with _injected(fake):
        prof = Profiler(quiet=True, summary=False, sensor_interval=0.01)
        prof.start()
        far.reads = 0
        far.fail_after = 10  # about 0.1 s into the run, at the 10 ms tick
        _spin(0.1)
        deadline = time.perf_counter() + 10.0
        while not far.lost and time.perf_counter() < deadline:  # a loaded machine ticks late
            time.sleep(0.01)
        time.sleep(0.1)  # the run goes on after the loss
        profile = prof.stop()
    # far is cuda:1 (PCI order); it is dropped with a note saying when and why
    dropped = [n for n in profile.notes if n.get("kind") == "sensor-dropped"]
    assert [n["source"] for n in dropped] == ["gpu:1"]
    assert "GPU is lost" in dropped[0]["message"]
    assert 0.05 < dropped[0]["at_s"] < profile.totals["duration_s"] - 0.05
    energy = profile.totals["energy_j"]
    assert energy["gpu:0"] == pytest.approx(60.0 * profile.totals["duration_s"], abs=60.0 * 0.05)
    assert energy["gpu:1"] <= 300.0 * (dropped[0]["at_s"] + 0.03)  # stopped counting when it was lost
    assert energy["cpu"] > 0  # the other sensors went on
    assert profile.meta["exit"]["status"] == "completed"


# -- process share -------------------------------------------------------------------------
def test_process_share_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu()
    (s,) = found(FakeNvml([gpu])).sensors
    me = os.getpid()

    def share() -> float:
        s.share.refreshed_at = -1e18  # skip the refresh throttle
        return s.process_share()

    monkeypatch.setattr(s.share, "uses_cuda", lambda: False)
    gpu.processes = [me]
    assert share() == 1.0
    gpu.processes = [me, 999_999_001]
    gpu.util = [(me, 30), (999_999_001, 90)]
    assert share() == pytest.approx(0.25)
    gpu.util = []  # no per-process utilisation: an equal split
    assert share() == pytest.approx(0.5)
    gpu.processes = [999_999_001]  # someone else's GPU, and we never loaded CUDA
    assert share() == 0.0
    gpu.processes = []
    assert share() == 0.0
    monkeypatch.setattr(s.share, "uses_cuda", lambda: True)
    assert share() == 1.0  # CUDA in use but not listed: a container hiding its host pid
    gpu.processes = [999_999_001, 999_999_002]
    assert share() == pytest.approx(0.5)


def test_process_share_is_throttled_and_never_raises() -> None:
    gpu = FakeGpu()
    fake = FakeNvml([gpu])
    (s,) = found(fake).sensors
    gpu.processes = [os.getpid()]
    assert s.process_share() == 1.0
    calls = []
    fake.nvmlDeviceGetComputeRunningProcesses = lambda g: calls.append(1) or []  # type: ignore[method-assign]
    for _ in range(100):
        assert s.process_share() == 1.0  # cached within SHARE_REFRESH_S: no NVML call
    assert calls == []
    s.share.refreshed_at = -1e18

    def boom(g: Any) -> Any:
        raise RuntimeError("driver hiccup")

    fake.nvmlDeviceGetComputeRunningProcesses = boom  # type: ignore[method-assign]
    assert 0.0 <= s.process_share() <= 1.0


def test_shared_gpu_charges_the_program_its_share() -> None:
    gpu = FakeGpu(power_w=200.0)
    me = os.getpid()
    gpu.processes = [me, 999_999_001]
    gpu.util = [(me, 25), (999_999_001, 75)]
    with _injected(FakeNvml([gpu])):
        prof = Profiler(quiet=True, summary=False)
        prof.start()
        _spin(0.3)
        profile = prof.stop()
    total = profile.totals["energy_j"]["gpu:0"]
    assert total > 0
    assert profile.totals["attributed_j"]["gpu:0"] == pytest.approx(0.25 * total, rel=1e-6)
    assert profile.totals["idle_j"]["gpu:0"] == pytest.approx(0.75 * total, rel=1e-6)


def test_a_hung_gpu_read_is_dropped_by_the_watchdog_and_the_run_goes_on():
    """A driver call that never returns (a wedged GPU) must not freeze the collector."""
    import threading

    from energyprof import Profiler

    release = threading.Event()

    class HangingGpu(FakeGpu):
        armed_at: int | None = None

        def counter_mj(self) -> float:
            # a few reads into the run (3 ticks: 0.15 s at the default 50 ms, however the
            # machine's load stretches them, still well inside the 1.5 s the run spins)
            if self.armed_at is not None and self.reads > self.armed_at + 3:
                release.wait()  # blocks until the test ends
            return super().counter_mj()

    gpu = HangingGpu()
    with _injected(FakeNvml([gpu])):
        prof = Profiler(sensor_timeout=0.3, quiet=True, powercap_root=None)
        t0 = time.perf_counter()
        prof.start()
        gpu.armed_at = gpu.reads  # hang some reads into the run, not during discovery
        _spin(1.5)
        profile = prof.stop()
        took = time.perf_counter() - t0
    release.set()
    assert took < 60.0  # a guard against blocking for good, not a timing: the hang itself never ends
    drops = [n for n in profile.notes if n["kind"] == "sensor-dropped"]
    # Dropped for the hang, or (on a loaded machine, with the spinning main thread holding the GIL)
    # already for an ordinary read that overran the 0.3 s timeout: either way once, and the run went on.
    assert [d["source"] for d in drops] == ["gpu:0"]
    assert "(hung)" in drops[0]["message"] or "(timeout 0.3 s)" in drops[0]["message"]
    assert drops[0]["at_s"] < profile.totals["duration_s"]  # inside the run; when depends on the machine's load
    # the CPU estimate was read to the end (a GIL-holding loop slows the ticks, not stops them)
    late = [t for t in profile.timeline["t_s"] if t > drops[0]["at_s"] + 0.1]
    assert len(late) > 3  # ticks went on after the drop
    assert profile.totals["energy_j"]["cpu"] > 0


# -- helpers -------------------------------------------------------------------------------
class _injected:
    """Make every discovery in this block use the fake binding (nvml_device.BINDING)."""

    def __init__(self, fake: FakeNvml) -> None:
        self.fake = fake

    def __enter__(self) -> FakeNvml:
        self.saved = (nvml_device.BINDING, nvml.DETECT_BUDGET_S)
        nvml.set_binding(self.fake)
        nvml.DETECT_BUDGET_S = 0.05
        return self.fake

    def __exit__(self, *exc: Any) -> None:
        nvml_device.BINDING, nvml.DETECT_BUDGET_S = self.saved


def _spin(seconds: float) -> int:
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n
