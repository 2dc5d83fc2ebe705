"""I/O on the sensors' clock: /proc/PID/io and /proc/diskstats counters read at each tick, kept in the
profile as read, and a window's MB read from them. Real reads of a real file after its pages are evicted."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conftest import run_cli

from energyprof.facts.blocks import read_io
from energyprof.analysis.io import io_in_span
from energyprof.collect.io import IoRecorder, read_diskstats

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/io and /proc/diskstats are Linux's")

MB = 64
CHUNK = 2 << 20
# 2 MB every 20 ms, the sensors read every 10 ms: a tick interval astride either end of the window
# holds at most one chunk, so the interpolated figure is off by at most 2 x 2 MB of 64 MB (6.25%).
SCRIPT = f"""\
import os, sys, time
from energyprof.integrations.torch import window
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
time.sleep(0.3)
with window("read"):
    while os.read(fd, {CHUNK}):
        time.sleep(0.02)
time.sleep(0.3)
with window("quiet"):
    time.sleep(0.3)
"""


def test_a_known_read_appears_in_its_window(tmp_path: Path) -> None:
    data = tmp_path / "data.bin"
    with open(data, "wb") as f:
        f.write(os.urandom(MB << 20))
        f.flush()
        os.fsync(f.fileno())  # dirty pages are not evicted: written out first
    (tmp_path / "s.py").write_text(SCRIPT)
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    proc = run_cli(["--power-trace", "trace.csv", "--sensor-interval", "0.01", "-q", "--json", "p.json", "-o", "r.html",
                    "s.py", str(data)], tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((tmp_path / "p.json").read_text())
    io = saved["io"]
    assert io["method"] == "measured" and len(io["t_s"]) == len(io["process"]["read_bytes"])
    whole = io_in_span(read_io(io), float("-inf"), float("inf"))
    if whole["process_read_mb"] < 0.1 * MB * 1.048576:
        pytest.skip(f"this file system kept the file cached after POSIX_FADV_DONTNEED ({whole['process_read_mb']:.1f} MB read)")
    read, quiet = (next(w for w in saved["windows"] if w["name"] == n) for n in ("read", "quiet"))
    got = io_in_span(read_io(io), read["start_s"], read["end_s"])
    assert got["process_read_mb"] == pytest.approx(MB * 1.048576, rel=0.10)
    assert got["disk_read_mb"] >= 0.9 * MB * 1.048576  # other processes' reads can only add to the disk's
    assert got["read_iops"] > 0
    assert io_in_span(read_io(io), quiet["start_s"], quiet["end_s"])["process_read_mb"] < 0.05 * MB
    assert saved["derived"]["windows_io"][0]["process_read_mb"] == pytest.approx(got["process_read_mb"])
    run = saved["derived"]["io"]  # the run's rates: over its readings' span, the run's (they were 0)
    assert run["read_mb_s"] == pytest.approx(run["disk_read_mb"] / (io["t_s"][-1] - io["t_s"][0]))
    assert run["read_mb_s"] > 0 and run["read_iops"] > 0 and run["disk_busy_share"] > 0
    html = (tmp_path / "r.html").read_text()
    assert "<th title=\"measured: /proc/diskstats, all processes\">disk read (MB)</th>" in html


def test_span_interpolates_cumulative_counters() -> None:
    io = {"t_s": [0.0, 1.0, 2.0], "sector_bytes": 512,
          "process": {"read_bytes": [0, 1_000_000, 3_000_000], "write_bytes": [0, 0, 0], "syscr": [0, 10, 30]},
          "disks": {"sda": {"reads": [5, 105, 305], "read_sectors": [0, 2000, 6000], "writes": [0, 0, 0],
                            "write_sectors": [0, 0, 0], "busy_ms": [0, 500, 1500]}}}
    got = io_in_span(read_io(io), 0.5, 1.5)
    assert got["process_read_mb"] == pytest.approx(1.5)  # 0.5 -> 2.0 MB cumulative
    assert got["disk_reads"] == pytest.approx(150) and got["read_iops"] == pytest.approx(150)
    assert got["disk_read_mb"] == pytest.approx(3000 * 512 / 1e6)
    assert got["disk_busy_share"] == pytest.approx(0.75)
    assert io_in_span(read_io(io), -5, -1)["process_read_mb"] == 0  # before the first reading: flat
    # the whole run, asked as (-inf, inf): its rates over the readings' span (an infinite span gave 0)
    run = io_in_span(read_io(io), float("-inf"), float("inf"))
    assert run["read_iops"] == pytest.approx(300 / 2.0) and run["read_mb_s"] == pytest.approx(6000 * 512 / 1e6 / 2.0)
    assert run["disk_busy_share"] == pytest.approx(0.75)
    assert io_in_span(read_io(io), 1.0, 5.0)["read_iops"] == pytest.approx(200 / 1.0)  # nothing is known past the last reading
    assert io_in_span(None, 0, 1) is None


def test_recorder_reads_fake_proc_and_holds_a_vanished_process(tmp_path: Path) -> None:
    (tmp_path / "proc/42").mkdir(parents=True)
    (tmp_path / "sys/block/sda").mkdir(parents=True)
    (tmp_path / "sys/block/loop0").mkdir(parents=True)
    stats = ("   8       0 sda 100 0 800 50 7 0 56 3 0 {busy} 53 0 0 0 0\n"
             "   8       1 sda1 100 0 800 50 7 0 56 3 0 40 53 0 0 0 0\n   7       0 loop0 9 0 9 0 0 0 0 0 0 1 1 0 0 0 0\n")
    (tmp_path / "proc/diskstats").write_text(stats.format(busy=40))
    (tmp_path / "proc/42/io").write_text("rchar: 10\nwchar: 2\nsyscr: 3\nsyscw: 1\nread_bytes: 4096\n"
                                         "write_bytes: 0\ncancelled_write_bytes: 0\n")
    rec = IoRecorder(lambda: 42, proc_root=str(tmp_path / "proc"), sys_root=str(tmp_path / "sys"))
    rec.available = True
    rec(1_000_000_000)
    (tmp_path / "proc/42/io").unlink()  # the process exited
    (tmp_path / "proc/diskstats").write_text(stats.format(busy=90))
    rec(2_000_000_000)
    fact = rec.fact(origin_ns=1_000_000_000)
    assert fact["t_s"] == [0.0, 1.0]
    assert fact["process"]["read_bytes"] == [4096, 4096]
    assert list(fact["disks"]) == ["sda"] and fact["disks"]["sda"]["busy_ms"] == [40, 90]
    assert read_diskstats({"sda"}, str(tmp_path / "proc"))["sda"]["read_sectors"] == 800


def test_a_long_run_is_thinned_and_stays_exact_at_the_readings_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import energyprof.collect.io as cio

    monkeypatch.setattr(cio, "MAX_POINTS", 10)
    (tmp_path / "proc/7").mkdir(parents=True)
    (tmp_path / "sys/block").mkdir(parents=True)
    (tmp_path / "proc/diskstats").write_text("")
    rec = IoRecorder(lambda: 7, proc_root=str(tmp_path / "proc"), sys_root=str(tmp_path / "sys"))
    rec.available = True
    for i in range(25):
        (tmp_path / "proc/7/io").write_text(f"read_bytes: {1000 * i}\nwrite_bytes: 0\n")
        rec(i * 1_000_000_000)
    fact = rec.fact(0)
    assert len(fact["t_s"]) <= 10 and fact["t_s"][0] == 0.0 and fact["t_s"][-1] == 24.0
    assert all(b == 1000 * t for t, b in zip(fact["t_s"], fact["process"]["read_bytes"]))
    assert io_in_span(read_io(fact), 0.0, 24.0)["process_read_mb"] == pytest.approx(0.024)
