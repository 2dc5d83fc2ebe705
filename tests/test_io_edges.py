"""I/O at a window's own edges, in every path; stacked block devices counted once; disks that come and go.

A window's bytes were interpolated between the collector's ticks (a 64 MiB read after a cache drop read
43-63 MB of 67.1 MB under `python -m energyprof`, and nothing at all under `energy_profile()`). Each
window's edges now read the counters when the window begins and ends, in the program: /proc/self/io,
then the disks. The known answer is a 64 MiB file read whole, fast, inside a short window, after its
pages were evicted: read_bytes (what reached the disk on the program's behalf) is the counter tested; a
file system that keeps the file cached anyway (tmpfs) skips with the reason, and rchar, which counts
every byte read() returned whatever the cache, is held to the same answer."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conftest import run_cli

from energyprof.facts.blocks import read_io
from energyprof.analysis.io import io_in_span, read_rates
from energyprof.collect.io import IoRecorder, counted_disks

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/io and /proc/diskstats are Linux's")

SIZE = 64 << 20
KNOWN_MB = SIZE / 1e6  # 67.108864
READ = """
import os, time
fd = os.open(PATH, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
time.sleep(0.2)
with window("read"):
    while os.read(fd, 1 << 20):
        pass
time.sleep(0.2)
"""


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "data.bin"
    with open(data, "wb") as f:
        f.write(os.urandom(SIZE))
        f.flush()
        os.fsync(f.fileno())  # dirty pages are not evicted: written out first
    return data


def _rchar_mb(io: dict, start_s: float, end_s: float) -> float:
    """rchar's difference at the readings taken at the window's edges (present in the clock exactly)."""
    t, rchar = io["t_s"], io["process"]["rchar"]
    return (rchar[t.index(end_s)] - rchar[t.index(start_s)]) / 1e6


def _check(io: dict, start_s: float, end_s: float) -> None:
    assert start_s in io["t_s"] and end_s in io["t_s"]  # readings at the edges themselves
    rchar = _rchar_mb(io, start_s, end_s)
    assert rchar == pytest.approx(KNOWN_MB, rel=0.05)
    got = io_in_span(read_io(io), start_s, end_s)
    if got["process_read_mb"] < 0.5 * KNOWN_MB:
        pytest.skip(f"this file system kept the file cached after POSIX_FADV_DONTNEED ({got['process_read_mb']:.1f} MB"
                    f" from the disk; rchar {rchar:.1f} MB)")
    assert got["process_read_mb"] == pytest.approx(KNOWN_MB, rel=0.05)
    assert got["disk_read_mb"] >= 0.95 * KNOWN_MB  # other processes' reads can only add to the disk's


def test_a_known_read_in_a_short_window_supervised(tmp_path: Path) -> None:
    data = _data(tmp_path)
    (tmp_path / "s.py").write_text("import sys\nfrom energyprof.integrations.torch import window\nPATH = sys.argv[1]\n" + READ)
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    proc = run_cli(["--power-trace", "trace.csv", "-q", "--json", "p.json", "-o", "r.html", "s.py", str(data)],
                   tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((tmp_path / "p.json").read_text())
    read = next(w for w in saved["windows"] if w["name"] == "read")
    _check(saved["io"], read["start_s"], read["end_s"])
    assert saved["derived"]["windows_io"][0]["process_read_mb"] == pytest.approx(KNOWN_MB, rel=0.05)
    assert "counts the physical disks" in (tmp_path / "r.html").read_text()  # Methodology says which disks


def test_a_known_read_in_a_short_window_in_process(tmp_path: Path) -> None:
    from energyprof.drive.profiler import Profiler

    data = _data(tmp_path)
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    prof = Profiler(quiet=True, summary=False, power_trace=str(tmp_path / "trace.csv"))
    prof.start()
    try:
        exec(compile(READ, "read", "exec"), {"window": prof.window, "PATH": str(data), "__name__": "read"})
    finally:
        profile = prof.stop()
    io = profile.extra["io"]
    assert io["method"] == "measured" and io["window_edges"] == 2
    read = next(w for w in profile.windows if w.name == "read")
    _check(io, read.start_s, read.end_s)


def test_the_decorator_records_io(tmp_path: Path) -> None:
    from energyprof import energy_profile

    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")

    @energy_profile(quiet=True, summary=False, output=str(tmp_path / "r.html"), json=str(tmp_path / "p.json"),
                    power_trace=str(tmp_path / "trace.csv"))
    def write() -> None:
        with open(tmp_path / "out.bin", "wb") as f:
            f.write(b"x" * (4 << 20))

    write()
    io = json.loads((tmp_path / "p.json").read_text())["io"]
    assert io["method"] == "measured" and len(io["t_s"]) >= 2
    whole = io_in_span(read_io(io), float("-inf"), float("inf"))
    wchar = (io["process"]["wchar"][-1] - io["process"]["wchar"][0]) / 1e6
    assert wchar >= 4 * 1.048576 * 0.99 and whole is not None


# -- stacked devices, counted once -------------------------------------------------------------------
def _block(root: Path, name: str, slaves: tuple[str, ...] = (), holders: tuple[str, ...] = ()) -> None:
    d = root / "block" / name
    (d / "slaves").mkdir(parents=True)
    (d / "holders").mkdir()
    for s in slaves:
        (d / "slaves" / s).touch()
    for h in holders:
        (d / "holders" / h).touch()


def _stats(rows: dict[str, int]) -> str:
    """diskstats lines: name, then `sectors` read in one read, busy 7 ms."""
    return "".join(f"   8 {i} {name} 1 0 {sectors} 5 0 0 0 0 0 7 5 0 0 0 0\n" for i, (name, sectors) in enumerate(rows.items()))


def test_a_dm_volume_over_a_disk_is_counted_once(tmp_path: Path) -> None:
    sys_root, proc = tmp_path / "sys", tmp_path / "proc"
    _block(sys_root, "sda", holders=("dm-0",))
    _block(sys_root, "dm-0", slaves=("sda",))  # dm-crypt or LVM on the whole disk
    _block(sys_root, "nvme0n1", holders=("dm-1",))
    _block(sys_root, "dm-1", slaves=("nvme0n1p2",))  # LVM on a partition (not in /sys/block)
    _block(sys_root, "loop0")
    assert counted_disks(str(sys_root)) == {"sda", "nvme0n1"}
    proc.mkdir()
    (proc / "diskstats").write_text(_stats({"sda": 0, "dm-0": 0, "nvme0n1": 0, "nvme0n1p2": 0, "dm-1": 0, "loop0": 0}))
    rec = IoRecorder(lambda: None, proc_root=str(proc), sys_root=str(sys_root))
    rec.available = True
    rec(0)
    gib = 2 * 1024 * 1024  # sectors in 1 GiB: read once through dm-0, once through dm-1
    (proc / "diskstats").write_text(_stats({"sda": gib, "dm-0": gib, "nvme0n1": gib, "nvme0n1p2": gib, "dm-1": gib,
                                            "loop0": gib}))
    rec(1_000_000_000)
    fact = rec.fact(0)
    assert sorted(fact["disks"]) == ["nvme0n1", "sda"] and "physical disks" in fact["counted"]
    assert io_in_span(read_io(fact), 0.0, 1.0)["disk_read_mb"] == pytest.approx(2 * gib * 512 / 1e6)  # 2 GiB, not 4 or 6


# -- disks come and go ---------------------------------------------------------------------------------
def test_disks_that_come_and_go_between_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import energyprof.collect.io as cio

    monkeypatch.setattr(cio, "MAX_POINTS", 4)  # thinned on the way: every series, whatever its length
    sys_root, proc = tmp_path / "sys", tmp_path / "proc"
    _block(sys_root, "sda")
    _block(sys_root, "sdb")
    proc.mkdir()
    rec = IoRecorder(lambda: None, proc_root=str(proc), sys_root=str(sys_root))
    rec.available = True
    # sdb unplugged after the second reading, then plugged in again with its counters from 0; sdc appears
    steps = [{"sda": 0, "sdb": 100}, {"sda": 1000, "sdb": 300}, {"sda": 2000}, {"sda": 3000},
             {"sda": 4000, "sdb": 50}, {"sda": 5000, "sdb": 150, "sdc": 70}, {"sda": 6000, "sdb": 250, "sdc": 90}]
    for k, rows in enumerate(steps):
        if k == 5:
            _block(sys_root, "sdc")
        (proc / "diskstats").write_text(_stats(rows))
        rec(k * 1_000_000_000)  # raised IndexError before: a disk's series fell out of step with the clock
    fact = rec.fact(0)
    t = fact["t_s"]
    assert t[0] == 0.0 and t[-1] == 6.0 and len(t) <= 5
    for d in fact["disks"].values():
        assert all(len(series) == len(t) for series in d.values())
    whole = io_in_span(read_io(fact), 0.0, 6.0)
    # sda 6000; sdb 200 before it went, 50 from its return to its first reading, 200 after; sdc 90 since it
    # appeared (a disk first seen after the first reading began the run at 0): sectors, exact at the readings kept
    assert whole["disk_read_mb"] == pytest.approx((6000 + 200 + 50 + 200 + 90) * 512 / 1e6)
    assert read_rates(read_io(fact), 100) is not None


def test_a_profile_with_a_disk_gone_renders(tmp_path: Path) -> None:
    """A profile written before disks kept their own readings holds a vanished disk's shorter series
    (aligned with the first readings): its report is built, not an IndexError."""
    from energyprof.analysis.report import build
    from energyprof.render.charts import timeline_figure

    from test_io_timeline import _profile

    io = {"t_s": [0.0, 1.0, 2.0, 3.0], "process": {"read_bytes": [0, 0, 0, 0]}, "sector_bytes": 512,
          "disks": {"sda": {"reads": [0, 10, 20, 30], "read_sectors": [0, 100, 200, 300], "writes": [0] * 4,
                            "write_sectors": [0] * 4, "busy_ms": [0, 1, 2, 3]},
                    "sdb": {"reads": [0, 5], "read_sectors": [0, 50], "writes": [0, 0], "write_sectors": [0, 0],
                            "busy_ms": [0, 1]}}}
    assert io_in_span(read_io(io), 0.0, 3.0)["disk_read_mb"] == pytest.approx(350 * 512 / 1e6)
    assert read_rates(read_io(io), 100)["mb_s"] == pytest.approx([150 * 512 / 1e6, 100 * 512 / 1e6, 100 * 512 / 1e6])
    fig = timeline_figure(build(_profile(io)))
    assert any(tr["name"] == "disk read (MB/s)" for tr in fig["data"])


def test_window_edges_are_kept_exact_and_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import energyprof.collect.io as cio

    sys_root, proc = tmp_path / "sys", tmp_path / "proc"
    _block(sys_root, "sda")
    proc.mkdir()
    (proc / "diskstats").write_text(_stats({"sda": 0}))
    rec = IoRecorder(lambda: None, proc_root=str(proc), sys_root=str(sys_root))
    rec.available = True
    rec(0)
    (proc / "diskstats").write_text(_stats({"sda": 1000}))
    rec(10_000_000_000)
    # an edge at 2 s read 100 sectors, one at 3 s 700 (the program's own counters with them): exact there
    rec.edge(2_000_000_000, (0, 0, 0, 0, 51_200, 0), {"sda": (1, 100, 0, 0, 0)})
    rec.edge(3_000_000_000, (0, 0, 0, 0, 358_400, 0), {"sda": (1, 700, 0, 0, 0)})
    fact = rec.fact(0)
    assert fact["t_s"] == [0.0, 2.0, 3.0, 10.0] and fact["window_edges"] == 2
    span = io_in_span(read_io(fact), 2.0, 3.0)
    assert span["disk_read_mb"] == pytest.approx(600 * 512 / 1e6) and span["process_read_mb"] == pytest.approx(0.3072)
    monkeypatch.setattr(cio, "MAX_EDGES", 4)
    for k in range(10):
        rec.edge(4_000_000_000 + k, None, {"sda": (1, 800, 0, 0, 0)})
    fact = rec.fact(0)
    assert fact["edges_thinned"] and fact["window_edges"] <= 5
    assert all(len(v) == len(fact["t_s"]) for v in fact["disks"]["sda"].values())


def _burning(burnt: list[int]):
    """A stand-in for the edge's reading that burns 2 ms of this thread's CPU (whatever the load), saying how much."""
    import time

    def reading(*_a):
        t0 = time.thread_time_ns()
        while time.thread_time_ns() - t0 < 2_000_000:
            pass
        burnt.append(time.thread_time_ns() - t0)
        return (1, 2, 3, 4, 5, 6), {}

    return reading


def _charged_by(edge, fake) -> int:
    """The CPU ns an edge (`Agent._io_edge` or `Profiler._io_edge`, on `fake`) handed to the sampler as energyprof's."""
    from energyprof.agent import sampler

    before = sampler._charged[0]
    try:
        edge(fake, 123)
        return sampler._charged[0] - before
    finally:
        sampler._charged[0] = before


def test_an_edges_reading_is_charged_to_energyprof_not_the_program() -> None:
    """The counters read at a window's edge run on the program's thread: that thread's CPU for them
    goes to energyprof (the sampler's charge), as the kernel capture's does."""
    from energyprof.agent.supervised import Agent

    burnt: list[int] = []
    reading = _burning(burnt)

    events = []

    class Fake:
        _io = (reading, frozenset())
        spool = type("S", (), {"event": staticmethod(events.append)})()
        _io_read = getattr(Agent, "_io_read", None)

    charged = _charged_by(Agent._io_edge, Fake())
    assert len(events) == 1 and events[0].startswith("I\t123")
    assert charged >= burnt[0] >= 2_000_000


def test_an_in_process_edges_reading_is_charged_to_energyprof_not_the_program() -> None:
    """energy_profile()'s windows read the counters at their edges on the program's thread too: that CPU
    goes to energyprof (the sampler's charge), as under `python -m energyprof`."""
    from energyprof.drive.profiler import Profiler

    burnt: list[int] = []
    reading = _burning(burnt)

    class Fake:
        _io = type("R", (), {"read_edge": staticmethod(reading), "available": True})()

    charged = _charged_by(Profiler._io_edge, Fake())
    assert len(burnt) == 1 and charged >= burnt[0] >= 2_000_000


# -- --io off: nothing read ------------------------------------------------------------------------------------
WINDOWS = """
import sys
from energyprof.integrations.torch import window
for k in range(3):
    with window("w"):
        sum(range(1000))
print(sorted(m for m in ("energyprof.agent.iostat",) if m in sys.modules))
"""


@pytest.mark.parametrize("io", ["on", "off"])
def test_io_off_reads_no_counter_in_a_supervised_run(tmp_path: Path, io: str) -> None:
    """`python -m energyprof --io off`: the program's windows read no counter at their edges (the reader
    is never even loaded in the program), the supervisor reads none at its ticks, and the profile says
    I/O was off; with --io on (the default) the same program's edges are read."""
    (tmp_path / "s.py").write_text(WINDOWS)
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    proc = run_cli(["--io", io, "--power-trace", "trace.csv", "-q", "--json", "p.json", "-o", "r.html", "s.py"],
                   tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((tmp_path / "p.json").read_text())
    if io == "off":
        assert proc.stdout == "[]\n"  # the edges' reader never loaded: no edge was read
        assert saved["io"] == {"absent": "I/O is not recorded in this run (--io off)"}
        assert "I/O is not recorded in this run (--io off)" in (tmp_path / "r.html").read_text()
    else:
        assert proc.stdout == "['energyprof.agent.iostat']\n"
        assert saved["io"]["window_edges"] == 6


def test_io_off_is_a_choice_checked_before_the_program(tmp_path: Path) -> None:
    (tmp_path / "s.py").write_text("print('ran')\n")
    proc = run_cli(["--io", "sometimes", "s.py"], tmp_path, timeout=60)
    assert proc.returncode == 2 and "ran" not in proc.stdout and "--io" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_io_off_reads_nothing_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """energy_profile(io="off"): no counter read at the collector's ticks or at the windows' edges (every
    /proc and /sys read of the recorder goes through read_bytes or counted_disks: none is called), and
    the profile says I/O was off."""
    import energyprof.agent.iostat as iostat
    import energyprof.collect.io as cio
    from energyprof.drive.profiler import Profiler

    reads: list[str] = []

    def counting(path: str):
        reads.append(path)
        return None

    monkeypatch.setattr(cio, "read_bytes", counting)
    monkeypatch.setattr(iostat, "read_bytes", counting)
    monkeypatch.setattr(cio, "counted_disks", lambda *a: reads.append("/sys") or set())
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    prof = Profiler(quiet=True, summary=False, power_trace=str(tmp_path / "trace.csv"), sensor_interval=0.01, io="off")
    prof.start()
    try:
        for _ in range(3):
            with prof.window("w"):
                sum(range(1000))
    finally:
        profile = prof.stop()
    assert reads == [] and profile.extra["io"] == {"absent": cio.OFF}
