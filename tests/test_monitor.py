"""Monitor: windows measured from sensor readings at their edges, no stack sampling."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from energyprof import Measurement, Monitor
from energyprof.collect.sensors import rapl
from energyprof.core.ledger import IDLE_FLOOR
from energyprof.drive.monitor import cpu_share


@pytest.fixture
def trace40(tmp_path: Path) -> str:
    p = tmp_path / "t.csv"
    p.write_text("t_s,cpu\n0,40\n")
    return str(p)


def busy(seconds: float) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        pass


def test_a_window_at_constant_power_reads_power_times_its_time(trace40):
    with Monitor(power_trace=trace40) as mon:
        assert mon.poll_s is None  # a replayed trace needs no background reads
        with mon.window("w") as m:
            busy(0.3)
    assert isinstance(m, Measurement) and m.complete and m.estimated is False
    # The replayed trace integrates exactly: 40 W x the window's own time.
    assert m.energy_j["cpu"] == pytest.approx(40.0 * m.time_s, rel=1e-6)
    assert m.total_j == m.energy_j["cpu"]
    assert 0.0 <= m.program_energy_j["cpu"] <= m.energy_j["cpu"]
    assert m.carbon_g == pytest.approx(m.program_total_j / 3.6e6 * 475.0, rel=1e-12)


def test_nested_and_overlapping_windows(trace40):
    mon = Monitor(power_trace=trace40, idle="all", carbon_intensity=100.0)
    try:
        mon.begin_window("epoch", 0)
        mon.begin_window("a")
        busy(0.02)
        mon.begin_window("b")
        busy(0.02)
        a = mon.end_window("a")  # overlaps b: ends while b is still open
        busy(0.02)
        b = mon.end_window("b")
        mon.begin_window("step")
        mon.begin_window("step")  # one name twice: last opened ends first
        inner = mon.end_window("step")
        outer = mon.end_window("step")
        epoch = mon.end_window()
        with pytest.raises(KeyError):
            mon.end_window("never")
        run = mon.measure()
    finally:
        mon.close()
    for m in (a, b, inner, outer, epoch, run):
        assert m.energy_j["cpu"] == pytest.approx(40.0 * m.time_s, rel=1e-6)
        assert m.program_energy_j == m.energy_j  # idle="all": the program pays the machine
        assert m.carbon_g == pytest.approx(m.total_j / 3.6e6 * 100.0, rel=1e-12)
    assert (epoch.name, epoch.index) == ("epoch", 0)
    assert inner.time_s <= outer.time_s
    # Disjoint inside the epoch: "a" and the outer "step"; b starts inside a and ends after it.
    assert epoch.total_j >= a.total_j + outer.total_j
    assert run.time_s >= epoch.time_s


def test_estimated_sources_say_so(tmp_path):
    with Monitor(powercap_root=str(tmp_path / "none"), gpus=False) as mon:
        with mon.window("w") as m:
            busy(0.02)
    assert m.estimated is True
    assert set(m.energy_j) == {s["id"] for s in mon.sources}
    assert all(0.0 <= m.program_energy_j[k] <= m.energy_j[k] for k in m.energy_j)


def test_rapl_is_polled_by_an_invisible_thread_and_read_at_the_edges(tmp_path):
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "name").write_text("package-0\n")
    (zone / "energy_uj").write_text("100\n")
    (zone / "max_energy_range_uj").write_text("262143328850\n")
    before = threading.enumerate()
    mon = Monitor(powercap_root=str(tmp_path), gpus=False, poll_s=0.01)
    try:
        assert mon.poll_s == 0.01 and threading.enumerate() == before
        mon.begin_window("w")
        (zone / "energy_uj").write_text("2100100\n")
        time.sleep(rapl.REUSE_NS / 1e9)  # past a reading the edges may share (within the counter's update)
        m = mon.end_window("w")
    finally:
        mon.close()
    assert m.estimated is False
    assert m.energy_j["cpu"] == pytest.approx(2.1, rel=1e-12)


@pytest.mark.parametrize(("proc", "busy_ns", "capacity", "share"), [
    (1.0, 2.0, 10.0, 0.5),  # half of the busy CPU
    (3.0, 2.0, 10.0, 1.0),  # /proc/stat's 10 ms ticks lag the nanosecond clock: clamped
    (0.01, 0.02, 10.0, 0.01 / (IDLE_FLOOR * 10.0)),  # an idle machine: the floor is the denominator
    (0.0, 0.0, 0.0, 0.0),
])
def test_cpu_share_is_the_ledgers_rule(proc, busy_ns, capacity, share):
    assert cpu_share(proc, busy_ns, capacity) == pytest.approx(share, rel=1e-12)


def test_the_overhead_benchmark_runs_and_prints_its_table():
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "monitor.py"), "--quick"], capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(root)))
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("| Monitor")]
    assert len(rows) == 12 and all(float(line.split("|")[2]) > 0 for line in rows)


def test_a_gpu_window_is_the_drivers_figures_and_the_program_pays_its_share():
    import os

    from test_nvml import FakeGpu, FakeNvml, _injected

    shared = FakeGpu(power_w=200.0)
    me = os.getpid()
    shared.processes = [me, 999_999_001]
    shared.util = [(me, 25), (999_999_001, 75)]
    power_only = FakeGpu(counter=False, power_w=150.0, bus="00000000:81:00.0", uuid="GPU-bbbb")
    power_only.processes = [me]
    with _injected(FakeNvml([shared, power_only])):
        with Monitor(powercap_root="/nonexistent", cpu_tdp=10.0) as mon:
            assert mon.poll_s == 0.1  # a power-only GPU is integrated from polled power
            with mon.window("w") as m:
                busy(0.3)
    ids = {s["detail"]["uuid"]: s["id"] for s in mon.sources if s["component"].startswith("gpu")}
    a, b = ids["GPU-aaaa"], ids["GPU-bbbb"]
    assert m.energy_j[a] > 0
    assert m.program_energy_j[a] == pytest.approx(0.25 * m.energy_j[a], rel=1e-9)
    # Constant power, integrated by the trapezoid between the reads: exact.
    assert m.energy_j[b] == pytest.approx(150.0 * m.time_s, rel=1e-6)
    assert m.program_energy_j[b] == pytest.approx(m.energy_j[b], rel=1e-9)
    assert m.estimated is True  # the CPU is the model here


@pytest.mark.parametrize(("proc", "busy_ns"), [(1_000_000, 2_000_000), (3_000_000, 2_000_000), (10, 20), (0, 0),
                                              (-5, 1_000_000)])
def test_a_windows_program_share_is_cpu_share(trace40, proc, busy_ns):
    """The window's share is the one rule, cpu_share(), on the window as one interval."""
    with Monitor(power_trace=trace40) as mon:
        dt = 10_000_000
        a = (0, [0.0], 5_000_000, 7_000_000)
        b = (dt, [0.4], 5_000_000 + proc, 7_000_000 + busy_ns)
        m = mon._measure("w", None, a, b)
        expected = cpu_share(proc, busy_ns, dt * mon._cpus)
    assert m.energy_j["cpu"] == 0.4
    assert m.program_energy_j["cpu"] == pytest.approx(expected * 0.4, rel=1e-15, abs=0.0)


def test_a_program_that_closes_the_monitors_descriptors_keeps_its_own_files(tmp_path):
    """The /proc/stat descriptor a window reads lives in the program, which may close it
    (os.closerange) and get its number for a file of its own: the next window opens /proc/stat
    again and neither reads nor closes the program's file."""
    import os

    from energyprof.collect import probes

    with Monitor(powercap_root=str(tmp_path / "none"), gpus=False) as mon:
        with mon.window("before"):
            busy(0.005)
        if probes._STAT.fd is None:
            pytest.skip("no /proc here (psutil path)")
        number = probes._STAT.fd
        mine = tmp_path / "the program's"
        mine.write_text("cpu  not a number\n")
        opened = os.open(mine, os.O_RDONLY)
        fd = os.dup2(opened, number)  # the program closed it and its own file got the number
        os.close(opened)
        try:
            assert fd == number
            time.sleep(0.002)  # past the 1 ms a /proc/stat reading is reused
            with mon.window("after") as m:
                busy(0.005)
            assert 0.0 <= m.program_energy_j["cpu"] <= m.energy_j["cpu"]
            assert os.pread(fd, 64, 0) == b"cpu  not a number\n"  # still open, still the program's
        finally:
            os.close(fd)


def test_monitor_reads_the_named_sensors_or_refuses(tmp_path):
    """Defect: Monitor(sensor=[...]) was taken and ignored: with a readable RAPL zone and
    sensor=["model"], the windows were measured by RAPL."""
    from energyprof import OptionError

    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "name").write_text("package-0\n")
    (zone / "energy_uj").write_text("100\n")
    (zone / "max_energy_range_uj").write_text("262143328850\n")
    with Monitor(powercap_root=str(tmp_path), gpus=False, sensor=["model"], cpu_tdp=10.0) as mon:
        assert {s["sensor"] for s in mon.sources} == {"model"}
        with mon.window("w") as m:
            busy(0.02)
    assert m.estimated is True
    with Monitor(powercap_root=str(tmp_path), gpus=False, sensor=["rapl"], poll_s=0) as mon:
        assert [s["sensor"] for s in mon.sources] == ["rapl"]
    with pytest.raises(OptionError, match="--sensor rapl found no source"):
        Monitor(powercap_root=str(tmp_path / "none"), gpus=False, sensor=["rapl"])


@pytest.mark.parametrize("policy", ["share", "all"])
@pytest.mark.parametrize(("proc", "busy_ns"), [(1_000_000, 2_000_000), (3_000_000, 2_000_000), (10, 20), (0, 0)])
def test_a_monitor_window_is_the_ledgers_account_and_its_measurement_is_that_account(trace40, policy, proc, busy_ns):
    """A Monitor's window is the account the ledger gives the same readings taken as one interval,
    and its Measurement is that account under the Monitor's policy (under `all` the machine's
    busy CPU is not read, so the account holds `all` only and refuses the share)."""
    from energyprof.core.ledger import Ledger
    from energyprof.core.recording import Tick
    from energyprof.facts.policy import PolicyError, WindowAccount

    dt = 10_000_000
    a = (1_000, [2.0], 5_000_000, 7_000_000)
    b = (1_000 + dt, [2.4], 5_000_000 + proc, 7_000_000 + busy_ns)
    with Monitor(power_trace=trace40, idle=policy, carbon_intensity=100.0) as mon:
        acc = mon._account("w", 2, a, b)
        m = mon._measure("w", 2, a, b)
        led = Ledger(mon.sources, cpus=mon._cpus)
    led.add_tick(Tick(a[0], (a[1][0],), a[2], 0, a[3]))
    led.begin_window(a[0], "w", 2)
    led.end_window(b[0], "w")
    led.add_tick(Tick(b[0], (b[1][0],), b[2], 0, b[3]))
    led.finish()
    (ref,) = led.accounts()
    assert isinstance(acc, WindowAccount)
    assert (acc.name, acc.index, acc.start_ns, acc.end_ns, acc.sources, acc.done, acc.estimated) == \
        (ref.name, ref.index, ref.start_ns, ref.end_ns, ref.sources, ref.done, ref.estimated)
    assert acc.machine() == pytest.approx(ref.machine(), rel=1e-12) and acc.machine()["cpu"] == pytest.approx(0.4)
    assert acc.program(policy) == pytest.approx(ref.program(policy), rel=1e-12, abs=1e-15)
    if policy == "share":
        assert acc.program("all") == pytest.approx(ref.program("all"), rel=1e-12)
    else:
        with pytest.raises(PolicyError):
            acc.program("share")
    assert (m.name, m.index, m.time_s, m.estimated, m.complete) == ("w", 2, acc.time_s, acc.estimated, True)
    assert m.energy_j == acc.machine() and m.program_energy_j == acc.program(policy)
    assert m.carbon_g == pytest.approx(m.program_total_j / 3.6e6 * 100.0, rel=1e-12)


@pytest.mark.parametrize("policy", ["share", "all"])
def test_end_account_ends_a_window_as_its_account(trace40, policy):
    with Monitor(power_trace=trace40, idle=policy) as mon:
        mon.begin_window("epoch", 1)
        mon.begin_window("step")
        busy(0.02)
        step = mon.end_account("step")
        epoch = mon.end_window("epoch")
        with pytest.raises(KeyError):
            mon.end_account("step")
    assert (step.name, step.index, step.policies) == ("step", None, ("share", "all") if policy == "share" else ("all",))
    assert step.machine()["cpu"] == pytest.approx(40.0 * step.time_s, rel=1e-6)
    assert 0.0 <= step.program(policy)["cpu"] <= step.machine()["cpu"]
    assert step.program("all") == step.machine()  # the whole machine: a Monitor has no part of its own
    assert epoch.time_s > step.time_s and epoch.total_j > step.machine()["cpu"]
