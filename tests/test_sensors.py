"""Sensors on faked hardware: a fake sysfs powercap tree, a replayed trace, the model."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from energyprof.collect.sensors import discover, rapl
from energyprof.collect.sensors.base import WrapCounter
from energyprof.collect.sensors.estimate import lookup_tdp
from energyprof.collect.sensors.replay import TraceError, load_trace

from conftest import run_cli


def make_zone(root: Path, name: str, label: str, energy_uj: int = 0, max_uj: int = 262_143_328_850) -> Path:
    z = root / name
    z.mkdir(parents=True)
    (z / "name").write_text(label + "\n")
    (z / "energy_uj").write_text(f"{energy_uj}\n")
    (z / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return z


class CounterWriter(threading.Thread):
    """Advances a fake energy_uj at a known power, wrapping at max_energy_range_uj."""

    def __init__(self, zone: Path, watts: float, max_uj: int) -> None:
        super().__init__(daemon=True)
        self.zone, self.watts, self.max_uj = zone, watts, max_uj
        self.stop = threading.Event()
        self.t0 = time.perf_counter()
        self.t_end = self.t0
        self.max_gap = 0.0  # the longest time the file went unchanged: how stale a read can be

    def run(self) -> None:
        while not self.stop.is_set():
            self.write()
            time.sleep(0.002)
        self.write()

    def write(self) -> None:
        now = time.perf_counter()
        uj = int(self.watts * (now - self.t0) * 1e6) % self.max_uj
        tmp = self.zone / "energy_uj.tmp"
        tmp.write_text(f"{uj}\n")
        tmp.replace(self.zone / "energy_uj")
        self.max_gap = max(self.max_gap, now - self.t_end)
        self.t_end = now


def test_domains_found_by_name_not_index(tmp_path):
    make_zone(tmp_path, "intel-rapl:1", "package-0")
    make_zone(tmp_path, "intel-rapl:1:0", "core")
    make_zone(tmp_path, "intel-rapl:1:1", "dram")
    make_zone(tmp_path, "intel-rapl:0", "psys")
    make_zone(tmp_path, "intel-rapl:2", "package-1")
    make_zone(tmp_path, "intel-rapl:3", "package-1")  # duplicated per die (seen on AMD)
    found = rapl.discover(str(tmp_path))
    ids = sorted(s.id for s in found.sensors)
    assert ids == ["cpu:0", "cpu:1", "dram"]  # no core (inside the package), no psys, no duplicate
    assert any("psys" in n for n in found.notes)


def test_rapl_energy_with_several_wraps_is_power_times_duration(tmp_path, write_script):
    max_uj = 20_000_000  # 20 J range: wraps every 0.67 s at 30 W
    zone = make_zone(tmp_path / "powercap", "intel-rapl:0", "package-0", 0, max_uj)
    writer = CounterWriter(zone, 30.0, max_uj)
    writer.start()
    time.sleep(0.05)
    script = write_script("busy.py", """
        import time
        t = time.time()
        while time.time() - t < 2.1:
            pass
    """)
    t0 = time.perf_counter()
    res = run_cli(["--powercap-root", str(tmp_path / "powercap"), "--json", "p.json", "-o", "r.html",
                   str(script)], cwd=tmp_path)
    t1 = time.perf_counter()
    writer.stop.set()
    writer.join()
    assert res.returncode == 0, res.stderr
    from energyprof import load

    p = load(tmp_path / "p.json")
    src = p.source("cpu")
    assert src["sensor"] == "rapl" and src["method"] == "measured"
    duration = p.totals["duration_s"]
    assert 2.05 < duration < (t1 - t0)
    measured = p.totals["energy_j"]["cpu"]
    wrap_s = max_uj / 1e6 / 30.0
    tl = p.timeline  # one bucket per sensor reading interval (the run is far below the bucket limit)
    reader_gap = max(e - s for s, e in zip(tl["start_s"], tl["end_s"]))
    if reader_gap + writer.max_gap >= wrap_s:
        # the counter went round a whole range between two reads: no reader can count that wrap
        pytest.skip(f"the machine stalled the reads for {reader_gap:.2f} s + {writer.max_gap:.2f} s"
                    f" (a range is {wrap_s:.2f} s)")
    # Each read sees the counter as of the writer's last write, at most `max_gap` old; the energy
    # is the difference of two reads, so it is off by at most 30 W x max_gap (plus microjoule
    # truncation). A loaded machine makes the gap longer, and the bound with it.
    assert abs(measured - 30.0 * duration) <= 30.0 * writer.max_gap + 1e-3, (measured, duration, writer.max_gap)
    assert 30.0 * duration / (max_uj / 1e6) > 3  # the counter wrapped at least three times


def test_wrap_and_reset_rules():
    c = WrapCounter(900.0, 1000.0)
    assert c.update(950.0) == 50.0
    assert c.update(10.0) == 110.0  # wrapped: 950 -> 1000 -> 10
    assert c.wraps == 1 and c.resets == 0
    d = WrapCounter(400.0, 1000.0)
    d.update(100.0)  # wrapping would mean 700 units in one read, over half the range: a reset
    assert d.resets == 1 and d.total == 100.0


@pytest.mark.parametrize("kind", ["garbage", "directory"])
def test_unreadable_counter_falls_back_to_the_model_with_a_message(tmp_path, write_script, kind):
    root = tmp_path / "powercap"
    zone = make_zone(root, "intel-rapl:0", "package-0")
    (zone / "energy_uj").unlink()
    if kind == "garbage":
        (zone / "energy_uj").write_text("not a number\n")
    else:
        (zone / "energy_uj").mkdir()  # cannot be opened as a file, even by root
    found = discover(powercap_root=str(root), gpus=False)
    assert [s.sensor for s in found.sensors] == ["model", "model"]
    assert any("RAPL: cannot read" in n for n in found.notes)
    script = write_script("s.py", "print('hello')\n")
    res = run_cli(["--powercap-root", str(root), "--json", "p.json", "-o", "r.html", str(script)], cwd=tmp_path)
    assert res.returncode == 0 and res.stdout == "hello\n"
    assert "energyprof: RAPL: cannot read" in res.stderr
    assert "estimated" in res.stderr


def test_permission_denied_message_says_how_to_fix(tmp_path, monkeypatch):
    root = tmp_path / "powercap"
    make_zone(root, "intel-rapl:0", "package-0")
    real_open = os.open

    def deny(path, *a, **k):  # what a non-root user gets from a root-only energy_uj
        if str(path).endswith("energy_uj"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *a, **k)

    monkeypatch.setattr(os, "open", deny)
    found = rapl.discover(str(root))
    assert not found.sensors
    note = found.notes[0]
    assert "permission denied" in note and "chmod" in note and "5.10" in note


def test_powercap_root_from_environment(tmp_path, monkeypatch):
    make_zone(tmp_path, "intel-rapl:0", "package-0")
    monkeypatch.setenv("ENERGYPROF_POWERCAP_ROOT", str(tmp_path))
    assert [s.id for s in rapl.discover().sensors] == ["cpu"]


def test_replay_trace_is_exact_for_piecewise_constant_power(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("t_s,cpu,dram\n0,10,1\n2,20,2\n3,0,0\n")
    tr = load_trace(p)
    assert tr.energy_at("cpu", 1.0) == 10.0
    assert tr.energy_at("cpu", 2.5) == 30.0
    assert tr.energy_at("cpu", 10.0) == 40.0
    assert tr.energy_at("dram", 3.0) == 4.0


@pytest.mark.parametrize("text", ["", "t_s\n", "time,cpu\n0,1\n", "t_s,cpu\n0,abc\n", "t_s,cpu\n1,5\n0,5\n",
                                  "t_s,cpu\n0,-3\n"])
def test_bad_traces_are_refused(tmp_path, text):
    p = tmp_path / "t.csv"
    p.write_text(text)
    with pytest.raises(TraceError):
        load_trace(p)


def test_tdp_lookup_uses_codecarbons_table_and_refuses_a_guess():
    assert lookup_tdp("Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz")[0] == 150.0
    assert lookup_tdp("AMD EPYC 7763 64-Core Processor")[0] == 280.0
    assert lookup_tdp("Intel(R) Xeon(R) Processor") is None


def test_model_is_labelled_estimated_and_cpu_tdp_is_used(tmp_path):
    found = discover(powercap_root=str(tmp_path / "none"), cpu_tdp=42.0, gpus=False)
    cpu = [s for s in found.sensors if s.component == "cpu"][0]
    assert cpu.method == "estimated" and cpu.detail["tdp_w"] == 42.0 and cpu.detail["tdp_source"] == "--cpu-tdp"


def test_a_rapl_zone_keeps_its_file_open_but_never_reads_or_closes_a_reused_descriptor(tmp_path):
    """The counter's descriptor stays open between reads (a Monitor window reads every zone at both
    edges), checked before each read: a program that closes it and gets the same number for a file
    of its own keeps that file untouched, and a counter file replaced under its name is read anew."""
    zone = make_zone(tmp_path, "intel-rapl:0", "package-0", energy_uj=1_000_000)
    (sensor,) = rapl.discover(str(tmp_path)).sensors
    sensor.start(0)
    (zone / "energy_uj").write_text("3000000\n")  # written in place: the same file
    ms = 1_000_000  # reads a millisecond apart: each one reads the file (see the next test)
    assert sensor.read(1 * ms) == pytest.approx(2.0)
    fd = sensor._fd
    assert fd >= 0
    mine = tmp_path / "the program's file"
    mine.write_text("999999999999\n")
    opened = os.open(mine, os.O_RDWR)
    reused = os.dup2(opened, fd)  # the program closed the sensor's descriptor and its file got the number
    os.close(opened)
    try:
        assert reused == fd
        (zone / "energy_uj").write_text("4000000\n")
        assert sensor.read(2 * ms) == pytest.approx(3.0)  # the counter's file, opened again
        assert sensor._fd != reused
        tmp = zone / "energy_uj.tmp"  # replaced under its name, as an atomic writer does
        tmp.write_text("5000000\n")
        tmp.replace(zone / "energy_uj")
        assert sensor.read(3 * ms) == pytest.approx(4.0)
        sensor.close()
        os.fstat(reused)  # still open: never closed by the sensor
        assert os.pread(reused, 64, 0) == b"999999999999\n"
    finally:
        os.close(reused)


def test_a_rapl_reading_is_shared_within_half_the_counters_update_period(tmp_path):
    """The hardware adds to energy_uj about once a millisecond: reads less than 0.5 ms after the
    last one (a Monitor's windows back to back) give that reading, and one at 0.5 ms reads anew."""
    zone = make_zone(tmp_path, "intel-rapl:0", "package-0", energy_uj=1_000_000)
    (sensor,) = rapl.discover(str(tmp_path)).sensors
    sensor.start(10_000_000)
    (zone / "energy_uj").write_text("3000000\n")
    assert sensor.read(10_000_000 + rapl.REUSE_NS - 1) == 0.0  # within half a period of the start
    assert sensor.read(10_000_000 + rapl.REUSE_NS) == pytest.approx(2.0)
    (zone / "energy_uj").write_text("7000000\n")
    assert sensor.read(10_000_000 + 2 * rapl.REUSE_NS - 1) == pytest.approx(2.0)
    assert sensor.read(10_000_000 + 2 * rapl.REUSE_NS) == pytest.approx(6.0)
    assert sensor.update_period_s * 1e9 == 2 * rapl.REUSE_NS
    sensor.close()
